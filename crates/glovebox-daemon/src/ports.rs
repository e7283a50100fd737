//! Exposed ports: reaching a server that listens inside a sandbox from the host, without
//! opening a host port and without giving the sandbox a network link it does not have.
//!
//! Invariants:
//! - A connection to port P of a sandbox is made from a short-lived thread that has joined
//!   that sandbox's network namespace and connects to `127.0.0.1:P` there; the socket belongs
//!   to that namespace, so traffic never crosses a host interface and a deny-all sandbox
//!   stays deny-all (it gains no route out).
//! - A port is private unless made public: a caller proves access with the owner's API key
//!   or the port's token, an HMAC (SHA-256) over the sandbox id and port with a per-daemon
//!   secret kept in `<data_dir>/preview-secret` (0600), so tokens survive restarts and one
//!   port's token opens no other port or sandbox.
//! - Which ports are public lives in this daemon's memory only: after a restart every port
//!   is private again (fail closed).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use ring::hmac;

use crate::util::constant_time_eq;

/// How long a connect inside a sandbox may take (loopback: refused or accepted at once,
/// unless the listener's backlog is full).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default base domain of preview hosts: browsers resolve every `*.localhost` name to
/// the loopback address without DNS.
pub const DEFAULT_DOMAIN: &str = "localhost";

/// The exposed ports of the live sandboxes and the secret their tokens are made with.
pub struct Ports {
    key: hmac::Key,
    /// The base domain of preview hosts (`P-<id>.<domain>`), lowercase, no dots around.
    domain: String,
    /// Per sandbox: its exposed ports, each with whether it is public.
    exposed: Mutex<BTreeMap<String, BTreeMap<u16, bool>>>,
    /// Per sandbox: a token a front-end issued that opens every port of it (the E2B
    /// front-end's traffic access token).
    granted: Mutex<BTreeMap<String, String>>,
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
        Ports {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            domain: domain.trim_matches('.').to_ascii_lowercase(),
            exposed: Mutex::new(BTreeMap::new()),
            granted: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The token that opens port `port` of sandbox `id` (and nothing else).
    pub fn token(&self, id: &str, port: u16) -> String {
        let tag = hmac::sign(&self.key, format!("glovebox-port\0{id}\0{port}").as_bytes());
        let mut out = String::from("gbp_");
        for b in tag.as_ref() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    pub fn token_is(&self, id: &str, port: u16, given: &str) -> bool {
        constant_time_eq(self.token(id, port).as_bytes(), given.as_bytes())
    }

    /// The host a browser reaches port `port` of sandbox `id` at.
    pub fn host(&self, id: &str, port: u16) -> String {
        format!("{port}-{id}.{}", self.domain)
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

    /// Records port `port` of sandbox `id` as exposed, public or not.
    pub fn expose(&self, id: &str, port: u16, public: bool) {
        let mut e = self.exposed.lock().unwrap_or_else(|p| p.into_inner());
        e.entry(id.to_string()).or_default().insert(port, public);
    }

    pub fn is_public(&self, id: &str, port: u16) -> bool {
        let e = self.exposed.lock().unwrap_or_else(|p| p.into_inner());
        e.get(id).and_then(|ports| ports.get(&port)).copied().unwrap_or(false)
    }

    /// A sandbox's exposed ports, lowest first, each with whether it is public.
    pub fn of(&self, id: &str) -> Vec<(u16, bool)> {
        let e = self.exposed.lock().unwrap_or_else(|p| p.into_inner());
        e.get(id).map(|ports| ports.iter().map(|(p, public)| (*p, *public)).collect()).unwrap_or_default()
    }

    /// Forgets the ports and grants of every sandbox that is not `live` (ended ones).
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        let mut e = self.exposed.lock().unwrap_or_else(|p| p.into_inner());
        e.retain(|id, _| live(id));
        let mut g = self.granted.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|id, _| live(id));
    }

    /// Lets `token` open every port of sandbox `id` (a front-end's own per-sandbox token).
    pub fn grant(&self, id: &str, token: &str) {
        let mut g = self.granted.lock().unwrap_or_else(|p| p.into_inner());
        g.insert(id.to_string(), token.to_string());
    }

    /// Whether `given` is the token granted for sandbox `id`.
    pub fn is_granted(&self, id: &str, given: &str) -> bool {
        let g = self.granted.lock().unwrap_or_else(|p| p.into_inner());
        g.get(id).is_some_and(|t| constant_time_eq(t.as_bytes(), given.as_bytes()))
    }
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
    fn the_secret_is_kept_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let t = Ports::open(dir.path(), "localhost").unwrap().token("a", 1);
        assert_eq!(Ports::open(dir.path(), "localhost").unwrap().token("a", 1), t);
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir.path().join("preview-secret")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}
