//! Exposed ports: reaching a server that listens inside a sandbox from the host, without
//! opening a host port and without giving the sandbox a network link it does not have.
//!
//! Invariants:
//! - A connection to port P of a sandbox is made from a short-lived thread that has joined
//!   that sandbox's network namespace and connects to `127.0.0.1:P` there; the socket belongs
//!   to that namespace, so traffic never crosses a host interface and a deny-all sandbox
//!   stays deny-all (it gains no route out).
//! - A port is private unless made public (alone, or with every port of its sandbox): a
//!   caller proves access with the owner's API key or a token. A port token is an HMAC
//!   (SHA-256) over the sandbox id and port with a per-daemon secret kept in
//!   `<data_dir>/preview-secret` (0600), so tokens survive restarts and one port's token opens
//!   no other port or sandbox. A signed token carries its expiry inside its HMAC, made with a
//!   key drawn at daemon start and never written down: it opens its port until it expires,
//!   is revoked, or the daemon restarts (which forgets revocations, so must forget the
//!   tokens too).
//! - What is public, granted or revoked lives in this daemon's memory only, per sandbox, and
//!   is forgotten when the sandbox ends; after a restart every port is private again (fail
//!   closed).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;

use crate::util::constant_time_eq;

/// How long a connect inside a sandbox may take (loopback: refused or accepted at once,
/// unless the listener's backlog is full).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default base domain of preview hosts: browsers resolve every `*.localhost` name to
/// the loopback address without DNS.
pub const DEFAULT_DOMAIN: &str = "localhost";

/// How a port token starts; a signed one (with an expiry) starts with [`SIGNED_PREFIX`].
const TOKEN_PREFIX: &str = "gbp_";
const SIGNED_PREFIX: &str = "gbs_";
/// Hex digits of an HMAC-SHA-256 tag.
const TAG_HEX: usize = 64;
/// Hex digits of a signed token's nonce (so two made in one second differ, and revoking one
/// leaves the other).
const NONCE_HEX: usize = 16;

/// What this daemon remembers of one live sandbox's ports.
#[derive(Default)]
struct SandboxPorts {
    /// Its exposed ports, each with whether it is public.
    exposed: BTreeMap<u16, bool>,
    /// Every port of it is public (a front-end's "public sandbox").
    all_public: bool,
    /// A token a front-end issued that opens every port of it (the E2B front-end's traffic
    /// access token).
    granted: Option<String>,
    /// Signed tokens revoked before their expiry, with that expiry (Unix seconds).
    revoked: BTreeMap<String, u64>,
}

/// The exposed ports of the live sandboxes and the secret their tokens are made with.
pub struct Ports {
    key: hmac::Key,
    /// Signs the signed tokens: drawn at start, so none outlives this process.
    signing: hmac::Key,
    /// The base domain of preview hosts (`P-<id>.<domain>`), lowercase, no dots around.
    domain: String,
    sandboxes: Mutex<BTreeMap<String, SandboxPorts>>,
}

/// Why a port could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("nothing listens on port {port} inside the sandbox: {source}")]
    NotListening { port: u16, source: io::Error },
    #[error("enter the sandbox's network namespace ({path}): {source}")]
    Namespace { path: String, source: io::Error },
}

impl Ports {
    /// Reads the secret in `data_dir` (made on first use) for a daemon whose preview hosts
    /// end in `domain`.
    pub fn open(data_dir: &Path, domain: &str) -> io::Result<Ports> {
        if !valid_domain(domain) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("preview domain {domain:?} is not a host name (e.g. localhost, preview.glovebox.test)"),
            ));
        }
        let path = data_dir.join("preview-secret");
        let secret = match fs::read(&path) {
            Ok(s) if s.len() >= 32 => s,
            Ok(_) => return Err(io::Error::other(format!("{} is shorter than 32 bytes", path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut s = vec![0u8; 32];
                getrandom::fill(&mut s).map_err(|e| io::Error::other(format!("randomness: {e}")))?;
                // Written whole or not at all (temp file + rename): a cut secret would be read
                // back as a short one. A data dir that cannot hold it (full, read-only) costs
                // only token stability across restarts, so the daemon runs on a fresh secret.
                if let Err(e) = write_whole(&path, &s) {
                    tracing::warn!(
                        "preview secret {}: {e}; preview tokens will change when the daemon restarts",
                        path.display()
                    );
                }
                s
            }
            Err(e) => return Err(e),
        };
        Ok(Ports::with_secret(&secret, domain))
    }

    pub fn with_secret(secret: &[u8], domain: &str) -> Ports {
        let mut boot = [0u8; 32];
        if getrandom::fill(&mut boot).is_err() {
            // No randomness: the secret's HMAC of this process and moment is as unknowable
            // to others and as short-lived.
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let label = format!("glovebox-signing\0{}\0{now}", std::process::id());
            boot.copy_from_slice(hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), label.as_bytes()).as_ref());
        }
        Ports {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            signing: hmac::Key::new(hmac::HMAC_SHA256, &boot),
            domain: domain.trim_matches('.').to_ascii_lowercase(),
            sandboxes: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The token that opens port `port` of sandbox `id` (and nothing else).
    pub fn token(&self, id: &str, port: u16) -> String {
        format!("{TOKEN_PREFIX}{}", tag(&self.key, &format!("glovebox-port\0{id}\0{port}")))
    }

    /// A token of its own that opens port `port` of sandbox `id` until `expires` (Unix
    /// seconds), unless revoked before: `gbs_<expires>_<nonce>_<tag>`.
    pub fn signed_token(&self, id: &str, port: u16, expires: u64) -> String {
        let mut n = [0u8; NONCE_HEX / 2];
        if getrandom::fill(&mut n).is_err() {
            // Without randomness, a counter still makes each token of this process its own.
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_be_bytes();
        }
        let nonce: String = n.iter().map(|b| format!("{b:02x}")).collect();
        self.signed_with(id, port, expires, &nonce)
    }

    fn signed_with(&self, id: &str, port: u16, expires: u64, nonce: &str) -> String {
        let tag = tag(&self.signing, &format!("glovebox-signed\0{id}\0{port}\0{expires}\0{nonce}"));
        format!("{SIGNED_PREFIX}{expires}_{nonce}_{tag}")
    }

    /// The expiry of `given` if it is a signed token this daemon made for port `port` of
    /// sandbox `id` (expired or not).
    fn signed_expiry(&self, id: &str, port: u16, given: &str) -> Option<u64> {
        let (exp, nonce, _) = signed_parts(given)?;
        let exp: u64 = exp.parse().ok()?;
        constant_time_eq(self.signed_with(id, port, exp, nonce).as_bytes(), given.as_bytes()).then_some(exp)
    }

    pub fn token_is(&self, id: &str, port: u16, given: &str) -> bool {
        constant_time_eq(self.token(id, port).as_bytes(), given.as_bytes())
    }

    /// Whether `given` opens port `port` of sandbox `id` now: its port token, or a signed
    /// token for it that has neither expired nor been revoked.
    pub fn opens(&self, id: &str, port: u16, given: &str) -> bool {
        self.opens_at(id, port, given, unix_now())
    }

    fn opens_at(&self, id: &str, port: u16, given: &str, now: u64) -> bool {
        if given.starts_with(TOKEN_PREFIX) {
            return self.token_is(id, port, given);
        }
        match self.signed_expiry(id, port, given) {
            Some(exp) if exp > now => !self.lock().get(id).is_some_and(|s| s.revoked.contains_key(given)),
            _ => false,
        }
    }

    /// Revokes a signed token of port `port` of sandbox `id` before its expiry; false when
    /// `given` is no signed token of that port.
    pub fn revoke(&self, id: &str, port: u16, given: &str) -> bool {
        let Some(exp) = self.signed_expiry(id, port, given) else { return false };
        let now = unix_now();
        let mut all = self.lock();
        let revoked = &mut all.entry(id.to_string()).or_default().revoked;
        revoked.retain(|_, e| *e > now);
        if exp > now {
            revoked.insert(given.to_string(), exp);
        }
        true
    }

    /// The host a browser reaches port `port` of sandbox `id` at.
    pub fn host(&self, id: &str, port: u16) -> String {
        format!("{port}-{id}.{}", self.domain)
    }

    /// [`Ports::host`] with the port of `api_host` (the `Host` an API request came in with,
    /// `127.0.0.1:7171`), so the name works from where the caller stands.
    pub fn host_via(&self, id: &str, port: u16, api_host: &str) -> String {
        with_listen_port(self.host(id, port), api_host)
    }

    /// The preview domain with the port of `api_host` (`localhost:7171`).
    pub fn domain_via(&self, api_host: &str) -> String {
        with_listen_port(self.domain.clone(), api_host)
    }

    /// The sandbox and port a `Host` header names (`P-<id>.<domain>`, any `:port` after it),
    /// if it is a preview host of this daemon.
    pub fn parse_host(&self, host: &str) -> Option<(String, u16)> {
        let name =
            host.rsplit_once(':').map_or(host, |(h, p)| if p.bytes().all(|b| b.is_ascii_digit()) { h } else { host });
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let label = name.strip_suffix(&self.domain)?.strip_suffix('.')?;
        let (port, id) = label.split_once('-')?;
        let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
        let id_ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        id_ok.then(|| (id.to_string(), port))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, SandboxPorts>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records port `port` of sandbox `id` as exposed, public or not.
    pub fn expose(&self, id: &str, port: u16, public: bool) {
        self.lock().entry(id.to_string()).or_default().exposed.insert(port, public);
    }

    /// Takes port `port` of sandbox `id` off the exposed list (its token still opens it, as
    /// it opens any port: the list says what was asked for, the token decides access).
    pub fn unexpose(&self, id: &str, port: u16) {
        if let Some(s) = self.lock().get_mut(id) {
            s.exposed.remove(&port);
        }
    }

    /// Makes every port of sandbox `id` public, or takes that back (ports made public one by
    /// one stay so).
    pub fn set_all_public(&self, id: &str, public: bool) {
        self.lock().entry(id.to_string()).or_default().all_public = public;
    }

    pub fn all_public(&self, id: &str) -> bool {
        self.lock().get(id).is_some_and(|s| s.all_public)
    }

    pub fn is_public(&self, id: &str, port: u16) -> bool {
        self.lock().get(id).is_some_and(|s| s.all_public || s.exposed.get(&port).copied().unwrap_or(false))
    }

    /// A sandbox's exposed ports, lowest first, each with whether it is public.
    pub fn of(&self, id: &str) -> Vec<(u16, bool)> {
        self.lock()
            .get(id)
            .map(|s| s.exposed.iter().map(|(p, public)| (*p, *public || s.all_public)).collect())
            .unwrap_or_default()
    }

    /// Forgets everything about sandbox `id` (it ended).
    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Forgets the ports and grants of every sandbox that is not `live` (ended ones).
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|id, _| live(id));
    }

    /// Lets `token` open every port of sandbox `id` (a front-end's own per-sandbox token).
    pub fn grant(&self, id: &str, token: &str) {
        self.lock().entry(id.to_string()).or_default().granted = Some(token.to_string());
    }

    /// Whether `given` is the token granted for sandbox `id`.
    pub fn is_granted(&self, id: &str, given: &str) -> bool {
        self.lock()
            .get(id)
            .and_then(|s| s.granted.as_deref())
            .is_some_and(|t| constant_time_eq(t.as_bytes(), given.as_bytes()))
    }
}

/// Whether `s` has the shape of a token this module makes (port or signed), whoever it is
/// for: what a preview request may carry as its first path segment.
pub fn looks_like_token(s: &str) -> bool {
    match s.strip_prefix(TOKEN_PREFIX) {
        Some(tag) => is_hex(tag, TAG_HEX),
        None => signed_parts(s).is_some(),
    }
}

/// The expiry, nonce and tag of a signed token's shape (`gbs_<digits>_<16 hex>_<64 hex>`).
fn signed_parts(s: &str) -> Option<(&str, &str, &str)> {
    let mut parts = s.strip_prefix(SIGNED_PREFIX)?.split('_');
    let (exp, nonce, tag) = (parts.next()?, parts.next()?, parts.next()?);
    let exp_ok = !exp.is_empty() && exp.len() <= 20 && exp.bytes().all(|b| b.is_ascii_digit());
    (parts.next().is_none() && exp_ok && is_hex(nonce, NONCE_HEX) && is_hex(tag, TAG_HEX)).then_some((exp, nonce, tag))
}

/// Whether `s` is `len` lowercase hex digits.
fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The HMAC-SHA-256 of `msg` under `key`, in lowercase hex.
fn tag(key: &hmac::Key, msg: &str) -> String {
    hmac::sign(key, msg.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// `name` followed by the `:port` of `api_host`, when it has one.
fn with_listen_port(name: String, api_host: &str) -> String {
    match api_host.rsplit_once(':').map(|(_, p)| p).filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
        Some(p) => format!("{name}:{p}"),
        None => name,
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Whether `domain` can end preview host names: dot-separated labels of letters, digits and
/// `-`, none empty.
fn valid_domain(domain: &str) -> bool {
    let d = domain.trim_matches('.');
    !d.is_empty()
        && d.len() <= 200
        && d.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

/// A connection to `127.0.0.1:port` inside the network namespace of the process `pid` (a
/// sandbox's PID 1), non-blocking, ready for tokio. Blocking: run it off the runtime.
pub fn connect(pid: i32, port: u16) -> Result<TcpStream, ConnectError> {
    let path = format!("/proc/{pid}/ns/net");
    let ns = fs::File::open(&path).map_err(|source| ConnectError::Namespace { path: path.clone(), source })?;
    // The thread joins the namespace and ends with the connect, so no other thread's
    // namespace changes; the socket stays in the namespace it was made in.
    let joined = std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
                .map_err(|e| ConnectError::Namespace { path: path.clone(), source: e.into() })?;
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                .map_err(|source| ConnectError::NotListening { port, source })
        })
        .join()
    });
    let stream = joined.map_err(|_| ConnectError::Namespace {
        path: path.clone(),
        source: io::Error::other("namespace thread panicked"),
    })??;
    stream.set_nonblocking(true).map_err(|source| ConnectError::NotListening { port, source })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Writes `bytes` to `path` (0600) through a temp file and a rename, removing the temp file
/// when any step fails.
fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let done = (|| {
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if done.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_one_port_of_one_sandbox() {
        let p = Ports::with_secret(&[7; 32], "localhost");
        let t = p.token("abc", 8000);
        assert!(t.starts_with("gbp_") && t.len() == 4 + 64, "{t}");
        assert!(p.token_is("abc", 8000, &t));
        assert!(!p.token_is("abc", 8001, &t));
        assert!(!p.token_is("abd", 8000, &t));
        assert!(!p.token_is("abc", 8000, &t[..t.len() - 1]));
        let other = Ports::with_secret(&[8; 32], "localhost");
        assert!(!other.token_is("abc", 8000, &t), "another daemon's secret makes other tokens");
    }

    #[test]
    fn a_data_dir_that_cannot_hold_the_secret_still_gives_working_ports() {
        let d = tempfile::tempdir().unwrap();
        // The secret's directory does not exist: the write fails, the daemon still starts.
        let gone = d.path().join("missing");
        let p = Ports::open(&gone, "localhost").unwrap();
        assert!(p.token_is("abc", 8000, &p.token("abc", 8000)));
        assert!(!gone.exists(), "nothing was written");
        // A writable one keeps the same secret across opens, whole, 0600, with no temp file left.
        let a = Ports::open(d.path(), "localhost").unwrap();
        let b = Ports::open(d.path(), "localhost").unwrap();
        assert_eq!(a.token("x", 1), b.token("x", 1));
        assert_eq!(fs::read(d.path().join("preview-secret")).unwrap().len(), 32);
        assert!(!d.path().join("preview-secret.tmp").exists());
    }

    #[test]
    fn preview_hosts_parse() {
        let p = Ports::with_secret(&[1; 32], ".Preview.Example.");
        assert_eq!(p.domain(), "preview.example");
        assert_eq!(p.parse_host("8000-abc.preview.example:7171"), Some(("abc".into(), 8000)));
        assert_eq!(p.parse_host("8000-ABC.Preview.Example"), Some(("abc".into(), 8000)));
        assert_eq!(p.parse_host(&p.host("x1", 3000)), Some(("x1".into(), 3000)));
        for bad in [
            "preview.example",
            "abc.preview.example",
            "0-abc.preview.example",
            "70000-abc.preview.example",
            "8000-.preview.example",
            "8000-abc.evil.example",
            "8000-abc.xpreview.example",
            "8000-a.b.preview.example",
            "127.0.0.1:7171",
        ] {
            assert_eq!(p.parse_host(bad), None, "{bad}");
        }
    }

    #[test]
    fn preview_domains_are_host_names() {
        for ok in ["localhost", "preview.glovebox.test", "a-b.c1"] {
            assert!(valid_domain(ok), "{ok}");
        }
        for bad in ["", ".", "a..b", "a b", "exa_mple.test", "x:80", "*.glovebox.test"] {
            assert!(!valid_domain(bad), "{bad}");
        }
    }

    #[test]
    fn exposed_ports_are_private_until_made_public() {
        let p = Ports::with_secret(&[1; 32], "localhost");
        assert!(!p.is_public("a", 80));
        p.expose("a", 80, false);
        p.expose("a", 22, true);
        assert_eq!(p.of("a"), vec![(22, true), (80, false)]);
        assert!(p.is_public("a", 22) && !p.is_public("a", 80));
        p.grant("a", "tok");
        assert!(p.is_granted("a", "tok") && !p.is_granted("a", "to") && !p.is_granted("b", "tok"));
        p.retain(|id| id == "b");
        assert!(p.of("a").is_empty() && !p.is_public("a", 22));
        assert!(!p.is_granted("a", "tok"), "an ended sandbox's grant goes with it");
    }

    #[test]
    fn signed_tokens_expire_and_can_be_revoked() {
        let p = Ports::with_secret(&[1; 32], "localhost");
        let now = unix_now();
        let t = p.signed_token("a", 80, now + 60);
        assert!(looks_like_token(&t), "{t}");
        assert!(p.opens("a", 80, &t));
        assert!(!p.opens("a", 81, &t) && !p.opens("b", 80, &t), "one port of one sandbox");
        assert!(!p.opens_at("a", 80, &t, now + 60), "expired at its expiry");
        let forged = t.replacen(&format!("{}", now + 60), &format!("{}", now + 6000), 1);
        assert!(looks_like_token(&forged) && !p.opens("a", 80, &forged), "the expiry is inside the HMAC");
        let twin = p.signed_token("a", 80, now + 60);
        assert!(twin != t && p.opens("a", 80, &twin), "two made in one second differ");
        assert!(!p.token_is("a", 80, &t) && p.opens("a", 80, &p.token("a", 80)));
        let restarted = Ports::with_secret(&[1; 32], "localhost");
        assert!(!restarted.opens("a", 80, &t), "signed tokens die with the daemon");
        assert!(restarted.opens("a", 80, &p.token("a", 80)), "port tokens survive it");
        let other = p.signed_token("a", 80, now + 120);
        assert!(!p.revoke("a", 81, &t) && !p.revoke("a", 80, &p.token("a", 80)));
        assert!(p.revoke("a", 80, &t));
        assert!(!p.opens("a", 80, &t) && p.opens("a", 80, &other), "only the revoked one");
        assert!(p.opens("a", 80, &twin), "its twin of the same second too");
        p.forget("a");
        assert!(!p.all_public("a"));
    }

    #[test]
    fn a_public_sandbox_opens_every_port() {
        let p = Ports::with_secret(&[1; 32], "localhost");
        p.expose("a", 80, false);
        p.set_all_public("a", true);
        assert!(p.is_public("a", 80) && p.is_public("a", 9999) && !p.is_public("b", 80));
        assert_eq!(p.of("a"), vec![(80, true)]);
        p.set_all_public("a", false);
        assert!(!p.is_public("a", 9999) && !p.is_public("a", 80));
        p.expose("a", 81, true);
        p.unexpose("a", 80);
        assert_eq!(p.of("a"), vec![(81, true)]);
        p.set_all_public("a", true);
        p.forget("a");
        assert!(!p.is_public("a", 9999) && p.of("a").is_empty(), "forgotten when it ends");
    }

    #[test]
    fn token_shapes_and_hosts_via_the_api_host() {
        let p = Ports::with_secret(&[1; 32], "localhost");
        assert!(looks_like_token(&p.token("a", 1)));
        let signed = p.signed_token("a", 1, 5);
        assert!(looks_like_token(&signed), "{signed}");
        let cut = &signed[..signed.len() - 1];
        let extra = format!("{signed}_00");
        for bad in
            ["", "gbp_", "gbp_xyz", "gbs_1_", "gbs__0123", "gbs_x_", "index.html", &p.token("a", 1)[..60], cut, &extra]
        {
            assert!(!looks_like_token(bad), "{bad}");
        }
        assert!(!looks_like_token(&p.token("a", 1).to_uppercase()));
        assert_eq!(p.host_via("x", 80, "127.0.0.1:7171"), "80-x.localhost:7171");
        assert_eq!(p.host_via("x", 80, "glovebox.test"), "80-x.localhost");
        assert_eq!(p.host_via("x", 80, "[::1]:9"), "80-x.localhost:9");
        assert_eq!(p.domain_via("h:7171"), "localhost:7171");
        assert_eq!(p.domain_via("h:"), "localhost");
    }

    #[test]
    fn the_secret_is_kept_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let t = Ports::open(dir.path(), "localhost").unwrap().token("a", 1);
        assert_eq!(Ports::open(dir.path(), "localhost").unwrap().token("a", 1), t);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir.path().join("preview-secret")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}
