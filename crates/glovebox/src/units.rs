//! Human-friendly sizes (`512M`, `2G`) and durations (`2s`, `500ms`, `10m`).

use anyhow::{bail, Result};

/// A size in MiB: plain numbers are MiB; suffixes K, M, G, T (powers of 1024; `KiB`, `MB`
/// and the like are accepted as the same).
pub fn size_mb(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: f64 = num.parse().map_err(|_| anyhow::anyhow!("bad size {s:?} (try 512M or 2G)"))?;
    let mib = match unit.trim().to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
        "" | "m" => n,
        "k" => n / 1024.0,
        "g" => n * 1024.0,
        "t" => n * 1024.0 * 1024.0,
        _ => bail!("bad size unit in {s:?} (use K, M, G or T)"),
    };
    if !(mib.is_finite() && mib >= 1.0) {
        bail!("size {s:?} is below 1 MiB");
    }
    Ok(mib.round() as u64)
}

/// A command's or cell's time budget (`--timeout`), as a duration (`0`: no limit of its own).
pub fn budget(s: &str) -> Result<glovebox_proto::api::TimeBudget> {
    Ok(glovebox_proto::api::TimeBudget::from_ms(duration_ms(s)?)?)
}

/// A duration in milliseconds: `500ms`, `2s`, `1.5m`, `1h`; a plain number is seconds.
pub fn duration_ms(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: f64 = num.parse().map_err(|_| anyhow::anyhow!("bad duration {s:?} (try 2s, 500ms or 5m)"))?;
    let ms = match unit.trim() {
        "ms" => n,
        "" | "s" => n * 1000.0,
        "m" | "min" => n * 60_000.0,
        "h" => n * 3_600_000.0,
        _ => bail!("bad duration unit in {s:?} (use ms, s, m or h)"),
    };
    if !(ms.is_finite() && ms >= 0.0) {
        bail!("bad duration {s:?}");
    }
    Ok(ms.round() as u64)
}

pub fn duration_s(s: &str) -> Result<u64> {
    Ok(duration_ms(s)?.div_ceil(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size_mb("512").unwrap(), 512);
        assert_eq!(size_mb("512M").unwrap(), 512);
        assert_eq!(size_mb("2G").unwrap(), 2048);
        assert_eq!(size_mb("2GiB").unwrap(), 2048);
        assert_eq!(size_mb("1024k").unwrap(), 1);
        assert!(size_mb("12Q").is_err());
        assert!(size_mb("-1").is_err());
        assert!(size_mb("0").is_err());
        assert!(size_mb("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(duration_ms("2s").unwrap(), 2000);
        assert_eq!(duration_ms("2").unwrap(), 2000);
        assert_eq!(duration_ms("250ms").unwrap(), 250);
        assert_eq!(duration_ms("1.5m").unwrap(), 90_000);
        assert_eq!(duration_s("1500ms").unwrap(), 2);
        assert!(duration_ms("2 days").is_err());
        assert!(duration_ms("abc").is_err());
    }
}
