//! Files: `writeFiles` (a gzipped tar, unpacked here and written file by file through the
//! agent, which resolves every path inside the sandbox), `readFile` and `mkDir`.
//!
//! The archive's names are relative to `x-cwd` (the SDK's extract dir, `/`); a name with a
//! `..` component, an absolute name, or an entry that is neither a file nor a directory is
//! refused with 400 before anything is written.

use std::io::Read;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{body, sandbox, sandbox_path, ApiError, Vercel};
use crate::agent::NewFile;
use crate::ops;

/// Largest compressed upload.
pub const MAX_UPLOAD: usize = 256 << 20;
/// Most bytes one upload may unpack to (a small archive can inflate a thousandfold).
const MAX_UNPACKED: u64 = 1 << 30;

#[derive(Deserialize, Default)]
#[serde(default)]
struct PathReq {
    path: String,
    cwd: Option<String>,
}

pub async fn mkdir(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let r: PathReq = body(&b)?;
    let path = sandbox_path(&r.path, r.cwd.as_deref())?;
    ops::make_dir(&st.app.manager, &sb, path, None).await?;
    Ok(axum::Json(json!({})).into_response())
}

/// The file's bytes, streamed (`application/octet-stream`); 404 when there is none.
pub async fn read(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let r: PathReq = body(&b)?;
    let path = sandbox_path(&r.path, r.cwd.as_deref())?;
    let (info, stream) = ops::download(st.app.manager.clone(), sb, path).await?;
    let mut resp = ([(header::CONTENT_TYPE, "application/octet-stream")], Body::from_stream(stream)).into_response();
    if let Ok(v) = header::HeaderValue::from_str(&info.size.to_string()) {
        resp.headers_mut().insert(header::CONTENT_LENGTH, v);
    }
    Ok(resp)
}

/// One entry of an uploaded archive.
#[derive(Debug, PartialEq)]
enum Entry {
    Dir(String),
    File { path: String, mode: Option<u32>, data: Vec<u8> },
}

/// The entries of a gzipped tar, their names joined onto `base` (an absolute directory).
fn unpack(gz: &[u8], base: &str) -> Result<Vec<Entry>, ApiError> {
    let bad = |m: String| ApiError::bad(format!("archive: {m}"));
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    let mut out = Vec::new();
    let mut total = 0u64;
    for e in ar.entries().map_err(|e| bad(e.to_string()))? {
        let mut e = e.map_err(|e| bad(e.to_string()))?;
        let name = e.path().map_err(|e| bad(e.to_string()))?.to_string_lossy().into_owned();
        if name.starts_with('/') || name.split('/').any(|c| c == "..") {
            return Err(bad(format!("entry {name:?} must be relative, without '..'")));
        }
        let name = name.trim_start_matches("./").trim_end_matches('/');
        let path = if name.is_empty() || name == "." {
            base.to_string()
        } else {
            format!("{}/{name}", base.trim_end_matches('/'))
        };
        let kind = e.header().entry_type();
        if kind.is_dir() {
            out.push(Entry::Dir(path));
        } else if kind.is_file() {
            total = total.saturating_add(e.header().size().unwrap_or(0));
            if total > MAX_UNPACKED {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("archive unpacks to more than {MAX_UNPACKED} bytes"),
                ));
            }
            let mode = e.header().mode().ok().map(|m| m & 0o7777);
            let mut data = Vec::new();
            (&mut e).take(MAX_UNPACKED).read_to_end(&mut data).map_err(|e| bad(e.to_string()))?;
            out.push(Entry::File { path, mode, data });
        } else {
            return Err(ApiError::unsupported(&format!("archive entry {name:?} (only files and directories)")));
        }
    }
    Ok(out)
}

/// The directory a file path is in.
fn parent(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &p[..i],
    }
}

/// `writeFiles`: a gzipped tar whose names are relative to `x-cwd`.
pub async fn write(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let m = &st.app.manager;
    let base = h.get("x-cwd").and_then(|v| v.to_str().ok()).unwrap_or("/").to_string();
    if !base.starts_with('/') || base.split('/').any(|c| c == "..") {
        return Err(ApiError::bad("x-cwd must be an absolute directory without '..'"));
    }
    let entries = tokio::task::spawn_blocking(move || unpack(&b, &base))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", format!("unpack: {e}")))??;
    for e in entries {
        match e {
            Entry::Dir(p) => {
                ops::make_dir(m, &sb, p, None).await?;
            }
            Entry::File { path, mode, data } => {
                let dir = parent(&path);
                if dir != "/" {
                    ops::make_dir(m, &sb, dir.to_string(), None).await?;
                }
                let body = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from(data))]);
                ops::upload(m, &sb, path, NewFile::with_mode(mode), body).await?;
            }
        }
    }
    Ok(axum::Json(json!({})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tgz(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        for (name, data) in entries {
            let mut hd = tar::Header::new_gnu();
            hd.set_size(data.len() as u64);
            hd.set_mode(0o644);
            hd.set_entry_type(tar::EntryType::Regular);
            // Written raw, so a hostile name is kept as sent.
            let raw = &mut hd.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            hd.set_cksum();
            b.append(&hd, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn archives_unpack_under_the_base() {
        let e = unpack(&tgz(&[("vercel/sandbox/a.mjs", b"x")]), "/").unwrap();
        assert_eq!(
            e,
            vec![Entry::File { path: "/vercel/sandbox/a.mjs".into(), mode: Some(0o644), data: b"x".to_vec() }]
        );
        let e = unpack(&tgz(&[("b.txt", b"y")]), "/tmp").unwrap();
        assert!(matches!(&e[0], Entry::File { path, .. } if path == "/tmp/b.txt"));
    }

    #[test]
    fn escapes_and_junk_are_refused() {
        let e = unpack(&tgz(&[("../../etc/passwd", b"x")]), "/").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains(".."), "{}", e.message);
        assert_eq!(unpack(b"not gzip at all", "/").unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
    }
}
