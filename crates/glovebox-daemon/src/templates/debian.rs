//! `FROM debian:<suite>[-slim]`: a Debian root built with Debian's own `debootstrap` from
//! the configured archive (`GLOVEBOX_DEBIAN_MIRROR`, default the Debian CDN), cached as a
//! base layer keyed by (suite, variant, mirror).
//!
//! debootstrap runs on the host as root (it needs chroot and mknod) but only executes
//! packages from the Debian archive, verified against the keyring Debian ships; nothing of
//! the spec runs here. `GLOVEBOX_BASE_CACHE`, if set, is a directory where finished bases
//! are kept across data directories (tests and CI share one debootstrap per run).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::store::{hash_parts, Store};

pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Suites accepted after `debian:`.
const SUITES: &[&str] = &["bookworm", "trixie", "bullseye"];

/// `debian:bookworm` → (`bookworm`, slim = false). None if `from` is not a Debian base.
pub fn parse_ref(from: &str) -> Option<Result<(String, bool), String>> {
    let rest = from.strip_prefix("debian:")?;
    let (suite, slim) = match rest.strip_suffix("-slim") {
        Some(s) => (s, true),
        None => (rest, false),
    };
    if SUITES.contains(&suite) {
        Some(Ok((suite.to_string(), slim)))
    } else {
        Some(Err(format!("unknown Debian suite {suite:?} (known: {})", SUITES.join(", "))))
    }
}

pub fn mirror() -> String {
    std::env::var("GLOVEBOX_DEBIAN_MIRROR").ok().filter(|m| !m.is_empty()).unwrap_or_else(|| DEFAULT_MIRROR.into())
}

fn layer_id(suite: &str, slim: bool, mirror: &str) -> String {
    hash_parts(&[b"debootstrap-minbase-v1", suite.as_bytes(), if slim { b"slim" } else { b"full" }, mirror.as_bytes()])
}

/// The host's local CA certificates (`GLOVEBOX_EXTRA_CA_DIR`, default
/// `/usr/local/share/ca-certificates`): hosts behind a TLS-inspecting proxy need them for
/// `apt`/`pip` in builds, as the host's own tools do. Certificates are public; only
/// world-readable `*.crt` files are taken.
fn extra_cas() -> Vec<(String, Vec<u8>)> {
    let dir = std::env::var_os("GLOVEBOX_EXTRA_CA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/share/ca-certificates"));
    let mut v = Vec::new();
    if let Ok(rd) = fs::read_dir(&dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(md) = fs::metadata(e.path()) else { continue };
            if name.ends_with(".crt") && md.is_file() && md.permissions().mode() & 0o004 != 0 && md.len() < (1 << 20) {
                if let Ok(b) = fs::read(e.path()) {
                    v.push((name, b));
                }
            }
        }
    }
    v.sort();
    v
}

/// Base layers are kept by GC (they cost a download to remake).
pub fn is_base_layer(store: &Store, id: &str) -> bool {
    fs::read_to_string(store.layer_fs(id).with_file_name("meta.json")).is_ok_and(|m| m.contains("\"step\":\"base "))
}

/// The layer id of the base, building it if needed. `log` receives progress lines.
pub async fn ensure(
    store: &Store,
    suite: &str,
    slim: bool,
    scratch: &Path,
    log: &(dyn Fn(String) + Send + Sync),
) -> Result<String, String> {
    let mirror = mirror();
    let id = layer_id(suite, slim, &mirror);
    if store.has_layer(&id) {
        return Ok(id);
    }
    let step = format!("base debian:{suite}{} from {mirror}", if slim { "-slim" } else { "" });
    let cache = std::env::var_os("GLOVEBOX_BASE_CACHE").map(PathBuf::from).map(|c| c.join(&id));
    // One debootstrap per base at a time, also across daemons sharing the cache.
    let _lock = match &cache {
        Some(c) => Some(lock_file(c.with_extension("lock")).await?),
        None => None,
    };
    if let Some(c) = &cache {
        if c.join("rootfs").is_dir() && c.join("done").is_file() {
            log(format!("using the cached {step}"));
            let link = scratch.join(format!("base-{id}"));
            std::os::unix::fs::symlink(c.join("rootfs"), &link).map_err(|e| format!("link cached base: {e}"))?;
            store.commit_layer(&id, &link, None, &step).map_err(|e| format!("save base layer: {e}"))?;
            return Ok(id);
        }
    }
    let exe = ["/usr/sbin/debootstrap", "/sbin/debootstrap", "/usr/bin/debootstrap"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or("debootstrap is not installed (apt-get install debootstrap)")?;
    let target = match &cache {
        Some(c) => {
            let _ = fs::remove_dir_all(c);
            fs::create_dir_all(c).map_err(|e| format!("base cache: {e}"))?;
            c.join("rootfs")
        }
        None => scratch.join(format!("debootstrap-{id}")),
    };
    log(format!("debootstrap {suite} (minbase) from {mirror}"));
    let t0 = std::time::Instant::now();
    let out = tokio::process::Command::new(exe)
        .args(["--variant=minbase", "--merged-usr", suite])
        .arg(&target)
        .arg(&mirror)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("run debootstrap: {e}"))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        let _ = fs::remove_dir_all(&target);
        return Err(format!(
            "debootstrap failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    log(format!("debootstrap done in {:.0} s", t0.elapsed().as_secs_f64()));
    finish_root(&target, slim).map_err(|e| format!("prepare the Debian root: {e}"))?;
    let tree = match &cache {
        Some(c) => {
            fs::write(c.join("done"), &step).map_err(|e| format!("base cache: {e}"))?;
            let link = scratch.join(format!("base-{id}"));
            std::os::unix::fs::symlink(&target, &link).map_err(|e| format!("link base: {e}"))?;
            link
        }
        None => target,
    };
    store.commit_layer(&id, &tree, None, &step).map_err(|e| format!("save base layer: {e}"))?;
    Ok(id)
}

/// The base's layers, top-most first: the Debian root and, when the host has local CA
/// certificates, a thin layer with them (kept apart so a new certificate does not cost a new
/// debootstrap).
pub async fn ensure_layers(
    store: &Store,
    suite: &str,
    slim: bool,
    scratch: &Path,
    log: &(dyn Fn(String) + Send + Sync),
) -> Result<Vec<String>, String> {
    let root = ensure(store, suite, slim, scratch, log).await?;
    let cas = extra_cas();
    if cas.is_empty() {
        return Ok(vec![root]);
    }
    let mut parts: Vec<&[u8]> = vec![b"host-ca-v1", root.as_bytes()];
    for (n, c) in &cas {
        parts.push(n.as_bytes());
        parts.push(c);
    }
    let id = hash_parts(&parts);
    if !store.has_layer(&id) {
        let tree = scratch.join(format!("ca-{id}"));
        let local = tree.join("usr/local/share/ca-certificates");
        let mk = || -> std::io::Result<()> {
            fs::create_dir_all(&local)?;
            for (name, body) in &cas {
                fs::write(local.join(name), body)?;
                fs::set_permissions(local.join(name), fs::Permissions::from_mode(0o644))?;
            }
            Ok(())
        };
        mk().map_err(|e| format!("CA layer: {e}"))?;
        log(format!("adding {} local CA certificate(s) of the host", cas.len()));
        store
            .commit_layer(&id, &tree, Some(&root), "base host CA certificates")
            .map_err(|e| format!("CA layer: {e}"))?;
    }
    Ok(vec![id, root])
}

/// An exclusive `flock` on `path` (created), held while the returned file is open.
async fn lock_file(path: PathBuf) -> Result<fs::File, String> {
    tokio::task::spawn_blocking(move || {
        if let Some(d) = path.parent() {
            fs::create_dir_all(d).map_err(|e| format!("base cache: {e}"))?;
        }
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("base cache lock: {e}"))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| format!("base cache lock: {e}"))?;
        Ok(f)
    })
    .await
    .map_err(|e| format!("base cache lock: {e}"))?
}

/// Makes a fresh debootstrap root fit for sandboxes: no host resolver or hostname in it,
/// apt that works without setuid (commands run without capabilities), slim trimming.
fn finish_root(root: &Path, slim: bool) -> std::io::Result<()> {
    let etc = root.join("etc");
    for (name, body) in [
        ("resolv.conf", ""),
        ("hostname", "glovebox\n"),
        ("hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tglovebox\n"),
    ] {
        let p = etc.join(name);
        let _ = fs::remove_file(&p);
        fs::write(&p, body)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
    }
    // apt drops to the `_apt` user for downloads, which needs setuid; sandboxes have none.
    fs::write(
        etc.join("apt/apt.conf.d/00glovebox"),
        "APT::Sandbox::User \"root\";\nAPT::Install-Recommends \"false\";\nAcquire::Retries \"3\";\n",
    )?;
    fs::write(etc.join("dpkg/dpkg.cfg.d/00glovebox"), "force-unsafe-io\n")?;
    let _ = fs::remove_dir_all(root.join("var/cache/apt/archives"));
    fs::create_dir_all(root.join("var/cache/apt/archives/partial"))?;
    let _ = fs::remove_dir_all(root.join("var/lib/apt/lists"));
    fs::create_dir_all(root.join("var/lib/apt/lists/partial"))?;
    if slim {
        for d in ["usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"] {
            let p = root.join(d);
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p)?;
        }
    }
    fs::create_dir_all(root.join("home/user"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs() {
        assert_eq!(parse_ref("debian:bookworm"), Some(Ok(("bookworm".into(), false))));
        assert_eq!(parse_ref("debian:bookworm-slim"), Some(Ok(("bookworm".into(), true))));
        assert!(matches!(parse_ref("debian:sid2"), Some(Err(_))));
        assert_eq!(parse_ref("host"), None);
        assert_ne!(layer_id("bookworm", false, "m"), layer_id("bookworm", true, "m"));
        assert_ne!(layer_id("bookworm", false, "m"), layer_id("bookworm", false, "n"));
    }
}
