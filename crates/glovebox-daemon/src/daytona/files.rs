//! Daytona's toolbox file API over `ops`: every path is resolved by the agent inside the
//! sandbox (relative ones against its home), never on the host. Finding, searching and
//! changing permissions run `grep`, `find`, `chmod` and `chown` inside the sandbox as
//! argv commands (no shell between the user's strings and them).

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use glovebox_proto::agent::{ErrorCode, FileInfo, FileType};
use serde::Deserialize;
use serde_json::{json, Value};

use super::multipart;
use super::process::request;
use super::{Daytona, DtError, Tb};
use crate::agent::NewFile;
use crate::error::Error;
use crate::ops;

/// Most a file may hold to be edited by `replace` (it is read whole).
const MAX_REPLACE: usize = 64 << 20;

pub fn routes() -> Router<Daytona> {
    Router::new()
        .route("/files", get(list).delete(delete))
        .route("/files/info", get(info))
        .route("/files/folder", post(folder))
        .route("/files/move", post(rename))
        .route("/files/download", get(download))
        .route("/files/bulk-download", post(bulk_download))
        .route("/files/bulk-upload", post(bulk_upload))
        .route("/files/upload", post(upload_one))
        .route("/files/find", get(find))
        .route("/files/search", get(search))
        .route("/files/replace", post(replace))
        .route("/files/permissions", post(permissions))
}

type Q = Query<BTreeMap<String, String>>;

fn need<'a>(q: &'a BTreeMap<String, String>, k: &str) -> Result<&'a str, DtError> {
    q.get(k).map(String::as_str).filter(|v| !v.is_empty()).ok_or_else(|| DtError::bad(format!("{k} is required")))
}

/// `ls -l`'s mode string (`drwxr-xr-x`).
fn mode_string(kind: FileType, mode: u32) -> String {
    let t = match kind {
        FileType::Dir => 'd',
        FileType::Symlink => 'l',
        FileType::File => '-',
        FileType::Other => '?',
    };
    let bits = "rwxrwxrwx";
    std::iter::once(t)
        .chain(bits.chars().enumerate().map(|(i, c)| if mode & (0o400 >> i) != 0 { c } else { '-' }))
        .collect()
}

/// A file as Daytona describes one (owner and group by number: the agent reports ids).
fn file_view(f: &FileInfo) -> Value {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(f.mtime.max(0) as u64);
    let modified = crate::util::rfc3339(at);
    json!({
        "name": f.name,
        "path": f.path,
        "isDir": f.kind == FileType::Dir,
        "size": f.size,
        "mode": mode_string(f.kind, f.mode),
        "permissions": format!("{:04o}", f.mode & 0o7777),
        "owner": f.uid.to_string(),
        "group": f.gid.to_string(),
        "modTime": modified,
        "modifiedAt": modified,
    })
}

async fn list(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let path = q.get("path").cloned().unwrap_or_else(|| ".".into());
    let depth = match q.get("depth") {
        Some(d) => {
            d.parse::<u32>().ok().filter(|d| *d >= 1).ok_or_else(|| DtError::bad("depth must be a positive integer"))?
        }
        None => 1,
    };
    let entries = ops::list_dir(&st.app.manager, &tb.sb, path, depth).await?;
    Ok(axum::Json(entries.iter().map(file_view).collect::<Vec<_>>()).into_response())
}

async fn info(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let f = ops::stat(&st.app.manager, &tb.sb, need(&q, "path")?.to_string()).await?;
    Ok(axum::Json(file_view(&f)).into_response())
}

async fn delete(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let recursive = q.get("recursive").is_some_and(|r| r == "true");
    ops::remove(&st.app.manager, &tb.sb, need(&q, "path")?.to_string(), recursive).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Runs argv `cmd` in the sandbox; its output, or a 400 with what it printed.
async fn run(st: &Daytona, tb: &Tb, cmd: Vec<String>, ok_codes: &[i32]) -> Result<(i32, String), DtError> {
    let what = cmd[0].clone();
    let r = ops::exec(&st.app.manager, &tb.sb, request(cmd, None, BTreeMap::new(), Some(60))?).await?;
    if !ok_codes.contains(&r.exit_code) || r.timed_out {
        return Err(DtError::bad(format!("{what}: {}", r.stderr.trim())));
    }
    Ok((r.exit_code, r.stdout))
}

fn check_mode(mode: &str) -> Result<(), DtError> {
    if mode.is_empty() || mode.len() > 4 || !mode.chars().all(|c| ('0'..='7').contains(&c)) {
        return Err(DtError::bad(format!("mode must be octal digits (like 755), got {mode:?}")));
    }
    Ok(())
}

async fn folder(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let path = need(&q, "path")?.to_string();
    let mode = q.get("mode").filter(|m| !m.is_empty());
    if let Some(m) = mode {
        check_mode(m)?;
    }
    let made = ops::make_dir(&st.app.manager, &tb.sb, path, None).await?;
    if let Some(m) = mode {
        run(&st, &tb, vec!["chmod".into(), m.clone(), "--".into(), made.path], &[0]).await?;
    }
    Ok(StatusCode::CREATED.into_response())
}

async fn rename(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let (from, to) = (need(&q, "source")?.to_string(), need(&q, "destination")?.to_string());
    ops::rename(&st.app.manager, &tb.sb, from, to).await?;
    Ok(StatusCode::OK.into_response())
}

/// `chmod` and `chown` inside the sandbox (each only when asked).
async fn permissions(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let path = need(&q, "path")?.to_string();
    // Resolved by the agent first: a missing file is its 404, not a tool's message.
    let f = ops::stat(&st.app.manager, &tb.sb, path).await?;
    if let Some(m) = q.get("mode").filter(|m| !m.is_empty()) {
        check_mode(m)?;
        run(&st, &tb, vec!["chmod".into(), m.clone(), "--".into(), f.path.clone()], &[0]).await?;
    }
    let owner = q.get("owner").filter(|o| !o.is_empty());
    let group = q.get("group").filter(|g| !g.is_empty());
    let spec = match (owner, group) {
        (Some(o), Some(g)) => Some(format!("{o}:{g}")),
        (Some(o), None) => Some(o.clone()),
        (None, Some(g)) => Some(format!(":{g}")),
        (None, None) => None,
    };
    if let Some(spec) = spec {
        run(&st, &tb, vec!["chown".into(), spec, "--".into(), f.path], &[0]).await?;
    }
    Ok(StatusCode::OK.into_response())
}

/// A file's whole content (up to `max` bytes).
async fn read_all(st: &Daytona, tb: &Tb, path: String, max: usize) -> Result<Vec<u8>, DtError> {
    let (info, body) = ops::download(st.app.manager.clone(), tb.sb.clone(), path.clone()).await?;
    let mut body = std::pin::pin!(body);
    if info.kind == FileType::Dir {
        return Err(DtError::from(Error::File {
            code: ErrorCode::IsADirectory,
            message: format!("{path} is a directory"),
        }));
    }
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| DtError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("reading {path}: {e}")))?;
        if out.len() + chunk.len() > max {
            return Err(DtError::bad(format!("{path} is larger than {max} bytes")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Writes `data` to `path`, making its missing parent directories.
async fn write_all(st: &Daytona, tb: &Tb, path: &str, data: Vec<u8>) -> Result<FileInfo, DtError> {
    let once = |d: Vec<u8>| futures_util::stream::iter([Ok::<Bytes, std::convert::Infallible>(Bytes::from(d))]);
    match ops::upload(&st.app.manager, &tb.sb, path.to_string(), NewFile::default(), once(data.clone())).await {
        Err(Error::File { code: ErrorCode::NotFound, .. }) => {
            let parent = match path.rsplit_once('/') {
                Some(("", _)) | None => return Err(DtError::bad(format!("cannot write {path}"))),
                Some((p, _)) => p.to_string(),
            };
            ops::make_dir(&st.app.manager, &tb.sb, parent, None).await?;
            Ok(ops::upload(&st.app.manager, &tb.sb, path.to_string(), NewFile::default(), once(data)).await?)
        }
        other => Ok(other?),
    }
}

async fn download(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let path = need(&q, "path")?.to_string();
    let (info, body) = ops::download(st.app.manager.clone(), tb.sb.clone(), path).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, info.size.to_string()),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

#[derive(Deserialize)]
struct Paths {
    paths: Vec<String>,
}

/// `bulk-download`: a form with one `file` part per path found, an `error` part (Daytona's
/// error JSON) per path not, each named by the path as asked.
async fn bulk_download(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Paths = serde_json::from_slice(&b).map_err(|e| DtError::bad(format!("invalid body: {e}")))?;
    let mut w = multipart::Writer::new();
    for p in &req.paths {
        match read_all(&st, &tb, p.clone(), usize::MAX).await {
            Ok(data) => w.part("file", p, "application/octet-stream", &data),
            Err(e) => {
                let body = json!({
                    "message": e.message,
                    "statusCode": e.status.as_u16(),
                    "code": e.code,
                    "source": e.source,
                });
                w.part("error", p, "application/json", body.to_string().as_bytes());
            }
        }
    }
    let (ct, body) = w.finish();
    Ok(([(header::CONTENT_TYPE, ct)], body).into_response())
}

fn form(h: &HeaderMap, b: &Bytes) -> Result<Vec<multipart::Part>, DtError> {
    let ct = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let boundary = multipart::boundary(ct).ok_or_else(|| DtError::bad("expected multipart/form-data"))?;
    multipart::parse(b, &boundary).map_err(DtError::bad)
}

/// `bulk-upload`: parts `files[i].path` (the destination) and `files[i].file` (the bytes).
async fn bulk_upload(State(st): State<Daytona>, tb: Tb, h: HeaderMap, b: Bytes) -> Result<Response, DtError> {
    let parts = form(&h, &b)?;
    let mut paths = BTreeMap::new();
    let mut files = BTreeMap::new();
    for p in parts {
        let Some(rest) = p.name.strip_prefix("files[") else { continue };
        let Some((i, field)) = rest.split_once("].") else { continue };
        match field {
            "path" => {
                paths
                    .insert(i.to_string(), String::from_utf8(p.data).map_err(|_| DtError::bad("a path is not UTF-8"))?);
            }
            "file" => {
                files.insert(i.to_string(), p.data);
            }
            _ => {}
        }
    }
    if files.is_empty() {
        return Err(DtError::bad("no files[i].file parts in the form"));
    }
    for (i, data) in files {
        let path = paths.get(&i).ok_or_else(|| DtError::bad(format!("files[{i}].path is missing")))?;
        write_all(&st, &tb, path, data).await?;
    }
    Ok(StatusCode::OK.into_response())
}

/// `upload`: one file (part `file`) to the query's `path`.
async fn upload_one(
    State(st): State<Daytona>,
    tb: Tb,
    Query(q): Q,
    h: HeaderMap,
    b: Bytes,
) -> Result<Response, DtError> {
    let path = need(&q, "path")?.to_string();
    let part =
        form(&h, &b)?.into_iter().find(|p| p.name == "file").ok_or_else(|| DtError::bad("no file part in the form"))?;
    write_all(&st, &tb, &path, part.data).await?;
    Ok(StatusCode::OK.into_response())
}

/// `find`: lines matching `pattern` (a grep basic regular expression) under `path`.
async fn find(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let (path, pattern) = (need(&q, "path")?.to_string(), need(&q, "pattern")?.to_string());
    let cmd = vec!["grep".into(), "-rnIHZ".into(), "-e".into(), pattern, "--".into(), path];
    let (_, out) = run(&st, &tb, cmd, &[0, 1]).await?;
    let matches: Vec<Value> = out
        .lines()
        .filter_map(|l| {
            let (file, rest) = l.split_once('\0')?;
            let (line, content) = rest.split_once(':')?;
            Some(json!({ "file": file, "line": line.parse::<u64>().ok()?, "content": content }))
        })
        .collect();
    Ok(axum::Json(matches).into_response())
}

/// `search`: files under `path` whose names match the glob `pattern`.
async fn search(State(st): State<Daytona>, tb: Tb, Query(q): Q) -> Result<Response, DtError> {
    let (path, pattern) = (need(&q, "path")?.to_string(), need(&q, "pattern")?.to_string());
    // find takes a leading '-' as an expression (`-delete`), not a path.
    if path.starts_with('-') {
        return Err(DtError::bad("path must not start with '-'"));
    }
    let (_, out) = run(&st, &tb, vec!["find".into(), path, "-name".into(), pattern], &[0, 1]).await?;
    Ok(axum::Json(json!({ "files": out.lines().collect::<Vec<_>>() })).into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Replace {
    files: Vec<String>,
    pattern: String,
    new_value: String,
}

/// `replace`: every occurrence of the text `pattern` in each file (literal, not a regular
/// expression), each file's outcome reported on its own.
async fn replace(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Replace = serde_json::from_slice(&b).map_err(|e| DtError::bad(format!("invalid body: {e}")))?;
    if req.pattern.is_empty() {
        return Err(DtError::bad("pattern must not be empty"));
    }
    let mut results = Vec::new();
    for f in &req.files {
        let outcome = async {
            let data = read_all(&st, &tb, f.clone(), MAX_REPLACE).await?;
            let text = String::from_utf8(data).map_err(|_| DtError::bad(format!("{f} is not UTF-8 text")))?;
            write_all(&st, &tb, f, text.replace(&req.pattern, &req.new_value).into_bytes()).await
        }
        .await;
        results.push(match outcome {
            Ok(_) => json!({ "file": f, "success": true }),
            Err(e) => json!({ "file": f, "success": false, "error": e.message }),
        });
    }
    Ok(axum::Json(results).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_like_ls() {
        assert_eq!(mode_string(FileType::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(FileType::File, 0o640), "-rw-r-----");
        assert!(check_mode("755").is_ok());
        assert!(check_mode("7a5").is_err());
        assert!(check_mode("").is_err());
    }
}
