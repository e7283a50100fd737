//! OCI images as bases: an image archive in the build context (`docker save` or an OCI
//! image layout, as a tar) or an image in a registry (the distribution HTTP API, plain HTTP
//! to loopback registries). Each image layer becomes one store layer (id: a hash of its blob
//! digest), unpacked with its whiteouts turned into overlayfs ones: `.wh.NAME` → a 0/0
//! character device `NAME`, `.wh..wh..opq` → the directory marked opaque.
//!
//! Invariants: layer tars are hostile input: entries are unpacked by `tar`'s `unpack_in`
//! (nothing lands outside the layer directory, no symlink is followed out), device nodes and
//! fifos are skipped, owners kept as 0-based ids (lowers are id-mapped at mount time).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;

use serde_json::Value;
use sha2::Digest;

use super::store::{hash_parts, hex, Store};

/// What an image contributes to a template: its layers (top-most first) and config.
#[derive(Debug, Default, Clone)]
pub struct Image {
    pub layers: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub cmd: Option<Vec<String>>,
}

/// Largest blob read into memory (a layer or config).
const MAX_BLOB: u64 = 4 << 30;

fn layer_id(digest: &str) -> String {
    hash_parts(&[b"oci-layer-v1", digest.as_bytes()])
}

/// Reads the image in a tar archive at `path` (`docker save` or OCI layout).
pub fn from_archive(store: &Store, path: &Path) -> Result<Image, String> {
    let dir = store.scratch().map_err(|e| format!("scratch: {e}"))?;
    let r = from_archive_in(store, path, &dir);
    let _ = fs::remove_dir_all(&dir);
    r
}

fn from_archive_in(store: &Store, path: &Path, dir: &Path) -> Result<Image, String> {
    let f = fs::File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let mut a = tar::Archive::new(f);
    for e in a.entries().map_err(|e| format!("read archive: {e}"))? {
        let mut e = e.map_err(|e| format!("read archive: {e}"))?;
        if matches!(e.header().entry_type(), tar::EntryType::Regular | tar::EntryType::Directory) {
            e.unpack_in(dir).map_err(|e| format!("unpack archive: {e}"))?;
        }
    }
    let read_json = |rel: &str| -> Result<Value, String> {
        let p = super::context_path(dir, rel).ok_or_else(|| format!("bad path {rel:?} in the archive"))?;
        let b = fs::read(&p).map_err(|e| format!("{rel}: {e}"))?;
        serde_json::from_slice(&b).map_err(|e| format!("{rel}: {e}"))
    };
    // OCI layout: index.json → manifest blob → config + layers, all under blobs/<alg>/<hex>.
    let blob = |digest: &str| -> Result<String, String> {
        let (alg, h) = digest.split_once(':').ok_or_else(|| format!("bad digest {digest:?}"))?;
        if !alg.chars().all(|c| c.is_ascii_alphanumeric()) || !h.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("bad digest {digest:?}"));
        }
        Ok(format!("blobs/{alg}/{h}"))
    };
    let (config, layers): (Value, Vec<(String, String)>) = if dir.join("index.json").is_file() {
        let index = read_json("index.json")?;
        let mut desc = index["manifests"].get(0).cloned().ok_or("index.json lists no manifest")?;
        let mut manifest = read_json(&blob(desc["digest"].as_str().unwrap_or(""))?)?;
        // An index of manifests (multi-platform): take the linux/amd64 one, else the first.
        if manifest.get("manifests").is_some() {
            desc = pick_platform(&manifest).ok_or("image index lists no manifest")?;
            manifest = read_json(&blob(desc["digest"].as_str().unwrap_or(""))?)?;
        }
        let config = read_json(&blob(manifest["config"]["digest"].as_str().unwrap_or(""))?)?;
        let mut layers = Vec::new();
        for l in manifest["layers"].as_array().cloned().unwrap_or_default() {
            let d = l["digest"].as_str().ok_or("layer without a digest")?.to_string();
            layers.push((blob(&d)?, d));
        }
        (config, layers)
    } else if dir.join("manifest.json").is_file() {
        let m = read_json("manifest.json")?;
        let m0 = m.get(0).ok_or("manifest.json lists no image")?;
        let config = read_json(m0["Config"].as_str().ok_or("manifest.json: no Config")?)?;
        let mut layers = Vec::new();
        for l in m0["Layers"].as_array().cloned().unwrap_or_default() {
            let rel = l.as_str().ok_or("manifest.json: bad layer")?.to_string();
            // The digest of a docker-save layer is that of its file.
            let p = super::context_path(dir, &rel).ok_or("bad layer path")?;
            let d = format!("sha256:{}", file_sha256(&p)?);
            layers.push((rel, d));
        }
        (config, layers)
    } else {
        return Err("not an image archive (no index.json or manifest.json)".into());
    };
    let mut img = image_config(&config);
    for (rel, digest) in &layers {
        let id = layer_id(digest);
        if !store.has_layer(&id) {
            let p = super::context_path(dir, rel).ok_or("bad layer path")?;
            let f = fs::File::open(&p).map_err(|e| format!("{rel}: {e}"))?;
            let tree = store.scratch().map_err(|e| format!("scratch: {e}"))?;
            let r = unpack_layer(f, &tree.join("fs"));
            if let Err(e) = r {
                let _ = fs::remove_dir_all(&tree);
                return Err(e);
            }
            store
                .commit_layer(&id, &tree.join("fs"), None, &format!("oci layer {digest}"))
                .map_err(|e| e.to_string())?;
            let _ = fs::remove_dir_all(&tree);
        }
        img.layers.insert(0, id);
    }
    if img.layers.is_empty() {
        return Err("the image has no layers".into());
    }
    Ok(img)
}

fn pick_platform(index: &Value) -> Option<Value> {
    let ms = index["manifests"].as_array()?;
    ms.iter()
        .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == "amd64")
        .or_else(|| ms.first())
        .cloned()
}

fn file_sha256(p: &Path) -> Result<String, String> {
    let mut f = fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Env, WorkingDir, User, Cmd/Entrypoint of an image config.
fn image_config(config: &Value) -> Image {
    let c = &config["config"];
    let mut img = Image::default();
    for e in c["Env"].as_array().cloned().unwrap_or_default() {
        if let Some((k, v)) = e.as_str().and_then(|s| s.split_once('=')) {
            img.env.insert(k.to_string(), v.to_string());
        }
    }
    img.workdir = c["WorkingDir"].as_str().filter(|s| !s.is_empty()).map(String::from);
    img.user = c["User"].as_str().filter(|s| !s.is_empty()).map(String::from);
    let strs =
        |v: &Value| v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect::<Vec<_>>());
    let mut cmd = strs(&c["Entrypoint"]).unwrap_or_default();
    cmd.extend(strs(&c["Cmd"]).unwrap_or_default());
    // An image's default command is usually a shell or a server; sandboxes start idle, so
    // only keep it when the spec asks (via CMD). Recorded for reference only.
    let _ = cmd;
    img
}

/// Unpacks one layer blob (tar, optionally gzip) into `dst`, turning whiteouts into
/// overlayfs ones.
pub fn unpack_layer(r: impl Read, dst: &Path) -> Result<(), String> {
    fs::create_dir_all(dst).map_err(|e| e.to_string())?;
    let mut r = std::io::BufReader::new(r.take(MAX_BLOB));
    let gz = {
        let b = std::io::BufRead::fill_buf(&mut r).map_err(|e| e.to_string())?;
        b.starts_with(&[0x1f, 0x8b])
    };
    let input: Box<dyn Read> = if gz { Box::new(flate2::read::GzDecoder::new(r)) } else { Box::new(r) };
    let mut a = tar::Archive::new(input);
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(true);
    a.set_unpack_xattrs(false);
    a.set_overwrite(true);
    for e in a.entries().map_err(|e| format!("layer: {e}"))? {
        let mut e = e.map_err(|e| format!("layer: {e}"))?;
        let path = e.path().map_err(|e| format!("layer: {e}"))?.into_owned();
        let name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        if let Some(hidden) = name.strip_prefix(".wh.") {
            let parent = path.parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let pdir = safe_mkdirs(dst, &parent).ok_or_else(|| format!("bad whiteout path {path:?}"))?;
            if hidden == ".wh..opq" {
                set_opaque(&pdir)?;
            } else if !hidden.is_empty() && !hidden.contains('/') && hidden != "." && hidden != ".." {
                whiteout(&pdir.join(hidden))?;
            }
            continue;
        }
        match e.header().entry_type() {
            tar::EntryType::Regular
            | tar::EntryType::Directory
            | tar::EntryType::Symlink
            | tar::EntryType::Link
            | tar::EntryType::Continuous => {
                e.unpack_in(dst)
                    .map_err(|err| format!("layer entry {path:?}: {err} ({:?})", std::error::Error::source(&err)))?;
            }
            // Device nodes, fifos: a sandbox's /dev is its own; nothing else needs them.
            _ => {}
        }
    }
    Ok(())
}

/// `dst/rel`, creating missing directories; None if a component is not a real directory
/// (a symlink planted by an earlier entry must not lead out).
fn safe_mkdirs(dst: &Path, rel: &str) -> Option<std::path::PathBuf> {
    let mut p = dst.to_path_buf();
    for c in rel.split('/') {
        match c {
            "" | "." => continue,
            ".." => return None,
            c => p.push(c),
        }
        match fs::symlink_metadata(&p) {
            Ok(md) if md.is_dir() => {}
            Err(_) => fs::create_dir(&p).ok()?,
            Ok(_) => return None,
        }
    }
    Some(p)
}

fn whiteout(p: &Path) -> Result<(), String> {
    if let Ok(md) = fs::symlink_metadata(p) {
        if md.is_dir() {
            fs::remove_dir_all(p).map_err(|e| e.to_string())?;
        } else {
            fs::remove_file(p).map_err(|e| e.to_string())?;
        }
    }
    rustix::fs::mknodat(rustix::fs::CWD, p, rustix::fs::FileType::CharacterDevice, rustix::fs::Mode::empty(), 0)
        .map_err(|e| format!("whiteout {}: {e}", p.display()))
}

fn set_opaque(dir: &Path) -> Result<(), String> {
    rustix::fs::lsetxattr(dir, "trusted.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
        .map_err(|e| format!("opaque {}: {e}", dir.display()))
}

/// `HOST[:PORT]/NAME[:TAG|@DIGEST]` → (registry, repository, reference).
pub fn parse_image_ref(r: &str) -> Option<(String, String, String)> {
    let (host, rest) = r.split_once('/')?;
    if !(host.contains('.') || host.contains(':') || host == "localhost") {
        return None;
    }
    let (repo, reference) = if let Some((n, d)) = rest.split_once('@') {
        (n.to_string(), d.to_string())
    } else {
        match rest.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n.to_string(), t.to_string()),
            _ => (rest.to_string(), "latest".to_string()),
        }
    };
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c));
    (ok(&repo) && ok(&reference) && !repo.contains("..")).then(|| (host.to_string(), repo, reference))
}

/// Pulls an image from a registry (distribution API v2). Only plain HTTP to a loopback
/// registry for now; other registries need TLS and token auth (not built yet).
pub async fn pull(store: &Store, r: &str, log: &(dyn Fn(String) + Send + Sync)) -> Result<Image, String> {
    let (host, repo, reference) = parse_image_ref(r).ok_or_else(|| {
        format!(
            "unknown base {r:?} (use host, debian:<suite>[-slim], oci-archive:<path in context> or HOST:PORT/NAME:TAG)"
        )
    })?;
    let addr: std::net::SocketAddr = tokio::net::lookup_host(&host)
        .await
        .map_err(|e| format!("registry {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("registry {host}: no address"))?;
    if !addr.ip().is_loopback() {
        return Err(format!("registry {host}: only loopback registries over plain HTTP are supported so far"));
    }
    let accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, \
                  application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json";
    log(format!("pulling {repo}:{reference} from {host}"));
    let mut manifest: Value =
        serde_json::from_slice(&http_get(addr, &host, &format!("/v2/{repo}/manifests/{reference}"), accept).await?)
            .map_err(|e| format!("manifest: {e}"))?;
    if manifest.get("manifests").is_some() {
        let d = pick_platform(&manifest).ok_or("image index lists no manifest")?;
        let digest = d["digest"].as_str().ok_or("bad index")?;
        manifest =
            serde_json::from_slice(&http_get(addr, &host, &format!("/v2/{repo}/manifests/{digest}"), accept).await?)
                .map_err(|e| format!("manifest: {e}"))?;
    }
    let get_blob = |digest: String| {
        let (host, repo) = (host.clone(), repo.clone());
        async move {
            let b = http_get(addr, &host, &format!("/v2/{repo}/blobs/{digest}"), "*/*").await?;
            let want = digest.strip_prefix("sha256:").ok_or_else(|| format!("unsupported digest {digest}"))?;
            if hex(&sha2::Sha256::digest(&b)) != want {
                return Err(format!("blob {digest}: digest mismatch"));
            }
            Ok::<_, String>(b)
        }
    };
    let cfg_digest = manifest["config"]["digest"].as_str().ok_or("manifest without config")?.to_string();
    let config: Value = serde_json::from_slice(&get_blob(cfg_digest).await?).map_err(|e| format!("config: {e}"))?;
    let mut img = image_config(&config);
    for l in manifest["layers"].as_array().cloned().unwrap_or_default() {
        let digest = l["digest"].as_str().ok_or("layer without digest")?.to_string();
        let id = layer_id(&digest);
        if !store.has_layer(&id) {
            log(format!("layer {digest}"));
            let b = get_blob(digest.clone()).await?;
            let tree = store.scratch().map_err(|e| format!("scratch: {e}"))?;
            let (t2, s2, d2, id2) = (tree.clone(), store.clone(), digest.clone(), id.clone());
            let r = tokio::task::spawn_blocking(move || {
                unpack_layer(&b[..], &t2.join("fs"))?;
                s2.commit_layer(&id2, &t2.join("fs"), None, &format!("oci layer {d2}")).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())?;
            let _ = fs::remove_dir_all(&tree);
            r?;
        }
        img.layers.insert(0, id);
    }
    if img.layers.is_empty() {
        return Err("the image has no layers".into());
    }
    Ok(img)
}

/// One HTTP/1.1 GET (Connection: close), following up to 3 redirects on the same host;
/// returns the body of a 200.
async fn http_get(addr: std::net::SocketAddr, host: &str, path: &str, accept: &str) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut path = path.to_string();
    for _ in 0..4 {
        let mut s = tokio::time::timeout(std::time::Duration::from_secs(10), tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| format!("registry {host}: connect timed out"))?
            .map_err(|e| format!("registry {host}: {e}"))?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: {accept}\r\nConnection: close\r\nUser-Agent: glovebox\r\n\r\n");
        s.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(600), (&mut s).take(MAX_BLOB).read_to_end(&mut buf))
            .await
            .map_err(|_| format!("registry {host}: read timed out"))?
            .map_err(|e| e.to_string())?;
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").ok_or("bad HTTP response")?;
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let body = buf[end + 4..].to_vec();
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .ok_or("bad status line")?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())))
            .collect();
        let hdr = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        if (300..400).contains(&status) {
            let loc = hdr("location").ok_or("redirect without location")?;
            path = match loc.strip_prefix("http://") {
                Some(rest) => format!("/{}", rest.split_once('/').map(|x| x.1).unwrap_or("")),
                None if loc.starts_with('/') => loc,
                None => return Err(format!("unsupported redirect to {loc}")),
            };
            continue;
        }
        let body = if hdr("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
            dechunk(&body)?
        } else {
            body
        };
        if status != 200 {
            return Err(format!(
                "registry {host}: GET {path}: HTTP {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            ));
        }
        return Ok(body);
    }
    Err("too many redirects".into())
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n").ok_or("bad chunked body")?;
        let size_s = String::from_utf8_lossy(&b[..nl]);
        let size =
            usize::from_str_radix(size_s.split(';').next().unwrap_or("").trim(), 16).map_err(|_| "bad chunk size")?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            return Err("truncated chunked body".into());
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_refs() {
        assert_eq!(
            parse_image_ref("127.0.0.1:5000/tiny:v1"),
            Some(("127.0.0.1:5000".into(), "tiny".into(), "v1".into()))
        );
        assert_eq!(parse_image_ref("localhost/a/b"), Some(("localhost".into(), "a/b".into(), "latest".into())));
        assert_eq!(parse_image_ref("python:3"), None);
        assert_eq!(parse_image_ref("reg.io/x/../y:1"), None);
    }

    #[test]
    fn dechunks() {
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(), b"abcde");
        assert!(dechunk(b"5\r\nab").is_err());
    }

    #[test]
    fn layer_whiteouts() {
        let d = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |name: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1);
            h.set_size(data.len() as u64);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, name, data).unwrap();
        };
        add("etc/hello", b"hi");
        add("etc/.wh.gone", b"");
        add("var/.wh..wh..opq", b"");
        let data = b.into_inner().unwrap();
        let dst = d.path().join("fs");
        unpack_layer(&data[..], &dst).unwrap();
        assert_eq!(fs::read(dst.join("etc/hello")).unwrap(), b"hi");
        use std::os::unix::fs::FileTypeExt;
        let wh = fs::symlink_metadata(dst.join("etc/gone")).unwrap();
        assert!(wh.file_type().is_char_device());
        let mut v = [0u8; 4];
        let n = rustix::fs::lgetxattr(dst.join("var"), "trusted.overlay.opaque", &mut v).unwrap();
        assert_eq!(&v[..n], b"y");
    }
}
