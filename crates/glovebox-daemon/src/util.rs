//! Small pieces with no better home: ids, secrets, time formatting.

use std::time::{SystemTime, UNIX_EPOCH};

/// A random lowercase alphanumeric string (ids: 16 chars ≈ 82 bits; keys: 40 chars).
pub fn random_token(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 64];
    while out.len() < len {
        // getrandom only fails if the OS has no entropy source at all; then an id cannot be
        // made safely and the caller's request fails loudly rather than using weak ids.
        if getrandom::fill(&mut buf).is_err() {
            panic!("no OS randomness available");
        }
        for b in buf {
            // 252 = 7 * 36: reject the tail to keep the distribution uniform.
            if b < 252 && out.len() < len {
                out.push(ALPHABET[(b % 36) as usize] as char);
            }
        }
    }
    out
}

/// The shape of every API key the daemon makes: `e2b_` and 40 lowercase hex digits
/// (160 random bits). E2B's SDKs refuse, before sending anything, a key that is not `e2b_`
/// followed by hex, so keys in this shape work with Glovebox's SDKs and E2B's alike.
pub const KEY_PREFIX: &str = "e2b_";

/// A fresh API key (see [`KEY_PREFIX`]).
pub fn random_key() -> String {
    let mut bytes = [0u8; 20];
    if getrandom::fill(&mut bytes).is_err() {
        panic!("no OS randomness available");
    }
    let mut key = String::with_capacity(KEY_PREFIX.len() + 40);
    key.push_str(KEY_PREFIX);
    for b in bytes {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

/// Compares secrets without leaking where they differ through timing.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// RFC 3339 in UTC with millisecond precision, e.g. `2026-12-01T07:05:01.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, dd) = civil_from_days(days);
    format!("{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, (rem / 60) % 60, rem % 60, d.subsec_millis())
}

/// Seconds since the epoch of an RFC 3339 time (`2026-12-04T17:38:31.539Z`, any fraction,
/// `Z` or a `±HH:MM` offset); `None` if it is not one.
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let num = |a: usize, b: usize| s.get(a..b).filter(|t| t.bytes().all(|c| c.is_ascii_digit()))?.parse::<i64>().ok();
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let seps = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if !seps.iter().all(|(i, c)| s.as_bytes().get(*i) == Some(c))
        || !matches!(s.as_bytes().get(10), Some(b'T' | b't' | b' '))
    {
        return None;
    }
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut frac = 0.0;
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        frac = format!("0.{}", &r[..n]).parse::<f64>().ok()?;
        rest = &r[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let t = &rest[1..];
            if t.len() != 5 || t.as_bytes()[2] != b':' {
                return None;
            }
            sign * (t[..2].parse::<i64>().ok()? * 3600 + t[3..].parse::<i64>().ok()? * 60)
        }
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    Some((days * 86_400 + h * 3600 + mi * 60 + sec - offset) as f64 + frac)
}

/// (year, month, day) to days since 1970-01-01 (the inverse of `civil_from_days`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Locks `m`. Poisoning only follows a panic while holding the lock; the data it guards is
/// kept consistent by every holder, so it is used as it is.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Command output as the API returns it: UTF-8 (lossy) or base64.
pub fn encode(b: &[u8], enc: glovebox_proto::api::Encoding) -> String {
    use base64::Engine;
    match enc {
        glovebox_proto::api::Encoding::Utf8 => String::from_utf8_lossy(b).into_owned(),
        glovebox_proto::api::Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(b),
    }
}

/// Whether `path` (still) names the file open as `f`, not one made in its place since (a
/// lock taken on an open file counts only while its path names it).
pub(crate) fn path_names_file(path: &std::path::Path, f: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00.250Z"), Some(951_782_400.25));
        assert_eq!(parse_rfc3339("2026-12-01T09:05:01+02:00"), Some(1_796_108_701.0));
        assert_eq!(parse_rfc3339("2026-12-01T07:05:01.5-00:00"), Some(1_796_108_701.5));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00"), None);
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(951_782_400_250)), "2000-02-29T00:00:00.250Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_796_108_701)), "2026-12-01T07:05:01.000Z");
    }

    #[test]
    fn tokens_are_random_and_well_formed() {
        let a = random_token(16);
        let b = random_token(16);
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
        assert!(a.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
    }

    #[test]
    fn eq_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
