//! envd's `filesystem.Filesystem` service and its REST `/files` transfer endpoints, over the
//! agent's file requests (paths are resolved by the agent, inside the sandbox).
//!
//! Files and directories made through this API belong to the user the request names
//! (`user`, uid 1000, or `root`), else to root, the user sandbox processes run as here. File metadata are the file's `user.e2b.*` extended
//! attributes (keys lowercased), set by the agent on the new file before it is put in place.
//! `Content-Encoding: gzip` uploads are inflated here as they stream (in small steps, so a
//! small body cannot balloon in memory), and downloads are deflated when the client accepts
//! gzip.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use glovebox_proto::agent::{ErrorCode, FileInfo, FileType, Owner};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, Code, RpcError};
use super::{sandbox_path, user_owner, watch, At, E2b, RestError, ENVD_PORT};
use crate::agent::NewFile;
use crate::error::Error;
use crate::http::multipart;
use crate::manager::{Manager, Sb};
use crate::ops;

#[derive(Deserialize, Default)]
#[serde(default)]
struct PathReq {
    path: String,
    depth: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct MoveReq {
    source: String,
    destination: String,
}

pub async fn rpc(
    State(st): State<E2b>,
    At(sb): At<ENVD_PORT>,
    Path(method): Path<String>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    let m = &st.app.manager;
    let owner = match user_owner(super::basic_user(&h).as_deref()) {
        Ok(o) => o,
        Err(e) => return connect::unary_response::<Value>(Err(RpcError::new(Code::InvalidArgument, e))),
    };
    let r = match method.as_str() {
        "Stat" => match connect::unary_request::<PathReq>(&h, &body) {
            Ok(p) => stat(m, &sb, &p.path).await.map(|e| json!({ "entry": e })),
            Err(e) => Err(e),
        },
        "ListDir" => match connect::unary_request::<PathReq>(&h, &body) {
            Ok(p) => list_dir(m, &sb, &p.path, p.depth.unwrap_or(1)).await,
            Err(e) => Err(e),
        },
        "MakeDir" => match connect::unary_request::<PathReq>(&h, &body) {
            Ok(p) => make_dir(m, &sb, &p.path, owner).await,
            Err(e) => Err(e),
        },
        "Move" => match connect::unary_request::<MoveReq>(&h, &body) {
            Ok(p) => rename(m, &sb, &p).await,
            Err(e) => Err(e),
        },
        "Remove" => match connect::unary_request::<PathReq>(&h, &body) {
            Ok(p) => remove(m, &sb, &p.path).await,
            Err(e) => Err(e),
        },
        "WatchDir" => {
            return match connect::stream_request::<watch::WatchReq>(&h, &body) {
                Ok(p) => watch::stream(st.app.manager.clone(), sb, p).await,
                Err(e) => connect::stream_error(e),
            }
        }
        "CreateWatcher" => match connect::unary_request::<watch::WatchReq>(&h, &body) {
            Ok(p) => watch::create(&st.watchers, m, &sb, p).await,
            Err(e) => Err(e),
        },
        "GetWatcherEvents" => match connect::unary_request::<watch::WatcherReq>(&h, &body) {
            Ok(p) => watch::events(&st.watchers, m, &sb, p).await,
            Err(e) => Err(e),
        },
        "RemoveWatcher" => match connect::unary_request::<watch::WatcherReq>(&h, &body) {
            Ok(p) => watch::remove(&st.watchers, &sb, p).await,
            Err(e) => Err(e),
        },
        _ => Err(RpcError::new(Code::Unimplemented, format!("no method {method}"))),
    };
    connect::unary_response(r)
}

/// `-rwxr-xr-x`-style permissions, as envd reports them.
fn permissions(kind: FileType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileType::Dir => 'd',
        FileType::Symlink => 'L',
        _ => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// The name of a uid or gid: the two accounts every sandbox has (see `glovebox-jail`'s
/// `/etc/passwd`), else the number.
fn owner(id: u32) -> String {
    match id {
        0 => "root".to_string(),
        super::USER_ID => "user".to_string(),
        n => n.to_string(),
    }
}

/// Metadata key prefix among a file's extended attributes.
const METADATA_XATTR: &str = "user.e2b.";
/// Upload headers that carry metadata.
const METADATA_HEADER: &str = "x-metadata-";

/// A file's metadata: its `user.e2b.*` attributes without the prefix.
fn metadata(i: &FileInfo) -> Option<Value> {
    let m: serde_json::Map<String, Value> =
        i.xattrs.iter().filter_map(|(k, v)| Some((k.strip_prefix(METADATA_XATTR)?.to_string(), json!(v)))).collect();
    (!m.is_empty()).then_some(Value::Object(m))
}

/// The metadata an upload carries as `X-Metadata-<key>` headers, as attributes to set.
/// Header names are tokens already (lowercase here); values must be printable ASCII.
fn metadata_xattrs(h: &HeaderMap) -> Result<std::collections::BTreeMap<String, String>, RestError> {
    let mut out = std::collections::BTreeMap::new();
    for (name, value) in h {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else { continue };
        if key.is_empty() {
            return Err(RestError::new(StatusCode::BAD_REQUEST, "a metadata key is empty"));
        }
        let v =
            value.to_str().ok().filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b))).ok_or_else(|| {
                RestError::new(StatusCode::BAD_REQUEST, format!("metadata {key:?}: not printable ASCII"))
            })?;
        out.insert(format!("{METADATA_XATTR}{key}"), v.to_string());
    }
    Ok(out)
}

/// envd's `EntryInfo` (proto3 JSON: camelCase, int64 as a string, enums by name).
pub(super) fn entry(i: &FileInfo) -> Value {
    let kind = match i.kind {
        FileType::File => "FILE_TYPE_FILE",
        FileType::Dir => "FILE_TYPE_DIRECTORY",
        FileType::Symlink => "FILE_TYPE_SYMLINK",
        FileType::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(i.mtime.max(0) as u64);
    let mut v = json!({
        "name": i.name,
        "type": kind,
        "path": i.path,
        "size": i.size.to_string(),
        "mode": i.mode & 0o7777,
        "permissions": permissions(i.kind, i.mode),
        "owner": owner(i.uid),
        "group": owner(i.gid),
        "modifiedTime": crate::util::rfc3339(mtime),
        "isSymlink": i.kind == FileType::Symlink,
    });
    if let Some(t) = &i.target {
        v["symlinkTarget"] = json!(t);
    }
    if let Some(md) = metadata(i) {
        v["metadata"] = md;
    }
    v
}

/// Where a symlink at `path` points, as an absolute sandbox path (a string: the agent
/// resolves it, inside the sandbox).
fn link_target(path: &str, target: &str) -> String {
    if target.starts_with('/') {
        return target.to_string();
    }
    let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// envd's `Stat`: a symlink is described by what it points to (its type and details) with
/// `symlinkTarget` the absolute path of that; a dangling link is described as itself.
async fn stat(m: &Manager, sb: &Sb, path: &str) -> Result<Value, RpcError> {
    let path = sandbox_path(path);
    let info = ops::stat(m, sb, path.clone()).await?;
    let Some(target) = info.target.as_deref().filter(|_| info.kind == FileType::Symlink) else {
        return Ok(entry(&info));
    };
    let target = link_target(&path, target);
    match ops::stat(m, sb, target.clone()).await {
        Ok(t) => {
            let mut v = entry(&FileInfo { name: info.name.clone(), path: info.path.clone(), target: None, ..t });
            v["symlinkTarget"] = json!(target);
            Ok(v)
        }
        Err(Error::File { code: ErrorCode::NotFound, .. }) => Ok(entry(&info)),
        Err(e) => Err(e.into()),
    }
}

async fn list_dir(m: &Manager, sb: &Sb, path: &str, depth: u32) -> Result<Value, RpcError> {
    let depth = depth.clamp(1, 32);
    let entries = ops::list_dir(m, sb, sandbox_path(path), depth).await?;
    Ok(json!({ "entries": entries.iter().map(entry).collect::<Vec<_>>() }))
}

/// `MakeDir` with envd's answer for a directory that is already there.
async fn make_dir(m: &Manager, sb: &Sb, path: &str, owner: Option<Owner>) -> Result<Value, RpcError> {
    let path = sandbox_path(path);
    match ops::stat(m, sb, path.clone()).await {
        Ok(_) => return Err(RpcError::new(Code::AlreadyExists, format!("{path} already exists"))),
        Err(Error::File { code: ErrorCode::NotFound, .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(json!({ "entry": entry(&ops::make_dir(m, sb, path, owner).await?) }))
}

async fn rename(m: &Manager, sb: &Sb, p: &MoveReq) -> Result<Value, RpcError> {
    let to = ops::rename(m, sb, sandbox_path(&p.source), sandbox_path(&p.destination)).await?;
    Ok(json!({ "entry": entry(&to) }))
}

/// `Remove`: like envd, a path that is not there is already removed.
async fn remove(m: &Manager, sb: &Sb, path: &str) -> Result<Value, RpcError> {
    match ops::remove(m, sb, sandbox_path(path), true).await {
        Ok(()) | Err(Error::File { code: ErrorCode::NotFound, .. }) => Ok(json!({})),
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct FileQuery {
    path: Option<String>,
    username: Option<String>,
}

impl FileQuery {
    /// The owner of what the request makes: the `username` parameter's, else the
    /// `Authorization: Basic` user's, else none asked for.
    fn owner(&self, h: &HeaderMap) -> Result<Option<Owner>, RestError> {
        let name = self.username.clone().filter(|u| !u.is_empty()).or_else(|| super::basic_user(h));
        user_owner(name.as_deref()).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, e))
    }
}

/// Whether the client takes a gzip body (`Accept-Encoding: gzip`, with a non-zero q).
fn accepts_gzip(h: &HeaderMap) -> bool {
    h.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|e| {
        let mut it = e.split(';').map(str::trim);
        it.next().is_some_and(|c| c.eq_ignore_ascii_case("gzip")) && !it.any(|p| p.replace(' ', "") == "q=0")
    })
}

/// `GET /files?path=…`: the file's bytes (gzip-compressed when the client accepts it).
pub async fn download(
    State(st): State<E2b>,
    At(sb): At<ENVD_PORT>,
    Query(q): Query<FileQuery>,
    h: HeaderMap,
) -> Result<Response, RestError> {
    q.owner(&h)?;
    let path = q.path.ok_or_else(|| RestError::new(StatusCode::BAD_REQUEST, "path is required"))?;
    let (info, body) = ops::download(st.app.manager.clone(), sb, sandbox_path(&path)).await?;
    if accepts_gzip(&h) {
        return Ok((
            [(header::CONTENT_TYPE, "application/octet-stream"), (header::CONTENT_ENCODING, "gzip")],
            Body::from_stream(super::gzip::compress(body)),
        )
            .into_response());
    }
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, info.size.to_string()),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

/// `POST /files`: one file as `application/octet-stream` (path in the query), or files as
/// `multipart/form-data` parts (each part's filename its path, unless the query names the
/// one file's path). Answers `[{"name", "type", "path"}]`.
pub async fn upload(
    State(st): State<E2b>,
    At(sb): At<ENVD_PORT>,
    Query(q): Query<FileQuery>,
    h: HeaderMap,
    body: Body,
) -> Result<Response, RestError> {
    let m = &st.app.manager;
    let ct = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let gzipped = match h.get(header::CONTENT_ENCODING).map(|e| e.as_bytes().to_ascii_lowercase()) {
        None => false,
        Some(e) if e == b"identity" => false,
        Some(e) if e == b"gzip" => true,
        Some(_) => {
            crate::http::drain(body).await;
            return Err(RestError::new(StatusCode::BAD_REQUEST, "unsupported Content-Encoding (gzip or identity)"));
        }
    };
    let new = match (q.owner(&h), metadata_xattrs(&h)) {
        (Ok(owner), Ok(xattrs)) => NewFile { mode: None, owner, xattrs },
        (Err(e), _) | (_, Err(e)) => {
            crate::http::drain(body).await;
            return Err(e);
        }
    };
    let body: super::gzip::BodyStream = if gzipped {
        Box::pin(super::gzip::decompress(body.into_data_stream()))
    } else {
        Box::pin(body.into_data_stream().map(|c| c.map_err(|e| e.to_string())))
    };
    let written = |i: &FileInfo| {
        let mut v = json!({ "name": i.name, "type": "file", "path": i.path });
        if let Some(md) = metadata(i) {
            v["metadata"] = md;
        }
        v
    };
    if let Some(boundary) = multipart::boundary(&ct) {
        let bad = |e: multipart::Malformed| RestError::new(StatusCode::BAD_REQUEST, e.to_string());
        let mut mp = multipart::Reader::new(body, &boundary);
        let mut out = Vec::new();
        while let Some(filename) = mp.next_part().await.map_err(bad)? {
            let path = match (&q.path, out.is_empty()) {
                (Some(p), true) => p.clone(),
                _ => filename.ok_or_else(|| RestError::new(StatusCode::BAD_REQUEST, "a part has no filename"))?,
            };
            let chunks = futures_util::stream::unfold(&mut mp, |mp| async move {
                match mp.chunk().await {
                    Ok(Some(c)) => Some((Ok::<_, String>(c), mp)),
                    Ok(None) => None,
                    Err(e) => Some((Err(e.to_string()), mp)),
                }
            });
            let info = ops::upload(m, &sb, sandbox_path(&path), new.clone(), Box::pin(chunks)).await?;
            out.push(written(&info));
        }
        if out.is_empty() {
            return Err(RestError::new(StatusCode::BAD_REQUEST, "no file in the upload"));
        }
        return Ok(axum::Json(out).into_response());
    }
    let Some(path) = q.path else {
        body.for_each(|_| async {}).await;
        return Err(RestError::new(StatusCode::BAD_REQUEST, "path is required"));
    };
    let info = ops::upload(m, &sb, sandbox_path(&path), new, body).await?;
    Ok(axum::Json(vec![written(&info)]).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlink_targets_are_absolute() {
        assert_eq!(link_target("/home/user/d/l", "t.txt"), "/home/user/d/t.txt");
        assert_eq!(link_target("/home/user/d/l", "../x/./t"), "/home/user/x/t");
        assert_eq!(link_target("/home/user/d/l", "/etc/passwd"), "/etc/passwd");
        assert_eq!(link_target("/l", "../../t"), "/t");
    }

    #[test]
    fn metadata_headers_and_attributes() {
        let mut h = HeaderMap::new();
        h.insert("x-metadata-author", "mish".parse().unwrap());
        h.insert("content-type", "text/plain".parse().unwrap());
        let x = metadata_xattrs(&h).unwrap();
        assert_eq!(x.into_iter().collect::<Vec<_>>(), vec![("user.e2b.author".to_string(), "mish".to_string())]);
        h.insert("x-metadata-bad", axum::http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
        assert_eq!(metadata_xattrs(&h).unwrap_err().status, StatusCode::BAD_REQUEST);
        let mut i = FileInfo {
            path: "/f".into(),
            name: "f".into(),
            kind: FileType::File,
            size: 0,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            mtime: 0,
            target: None,
            xattrs: Default::default(),
        };
        assert_eq!(metadata(&i), None);
        i.xattrs.insert("user.e2b.k".into(), "v".into());
        i.xattrs.insert("user.other".into(), "w".into());
        assert_eq!(metadata(&i), Some(json!({ "k": "v" })));
        assert_eq!(entry(&i)["owner"], "user");
    }

    #[test]
    fn gzip_is_accepted_unless_refused() {
        let h = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT_ENCODING, v.parse().unwrap());
            h
        };
        assert!(accepts_gzip(&h("gzip")));
        assert!(accepts_gzip(&h("br, gzip;q=0.5")));
        assert!(!accepts_gzip(&h("gzip;q=0")));
        assert!(!accepts_gzip(&h("identity")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn permissions_are_shown() {
        assert_eq!(permissions(FileType::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileType::File, 0o640), "-rw-r-----");
    }
}
