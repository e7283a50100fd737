//! The python-runtime API: what the `k8s-agent-sandbox` SDK speaks in its direct-URL,
//! gateway and tunnel modes (agent-sandbox's example runtime on port 8888, which sandboxd's
//! REST API replaces): `POST /execute`, `POST /upload` (a form), `GET /download/{path}`,
//! `GET /list/{path}`, `GET /exists/{path}`, and `GET /` as its health check.
//!
//! One difference, on purpose: `/execute` runs its command with `/bin/sh -c` (the SDK calls
//! it a shell command, and its sandboxd path wraps it so), where the example runtime splits
//! it into words without a shell.

use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use glovebox_proto::agent::{Command, FileType};
use glovebox_proto::api::{Encoding, ExecRequest, TimeBudget};
use serde::Deserialize;
use serde_json::json;

use super::paths;
use super::rest::{sandbox_path, HttpError, HttpResult};
use super::Target;
use crate::error::Error;
use crate::http::AppState;
use crate::ops;

pub fn routes() -> Router {
    Router::new()
        .route("/", get(alive))
        .route("/execute", post(execute))
        .route("/upload", post(upload_form))
        .route("/download/{*path}", get(download))
        .route("/list", get(list))
        .route("/list/", get(list))
        .route("/list/{*path}", get(list))
        .route("/exists/{*path}", get(exists))
}

async fn alive() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok", "message": "Sandbox Runtime is active." }))
}

#[derive(Deserialize)]
struct ExecuteBody {
    command: String,
    #[serde(default)]
    timeout_seconds: Option<f64>,
}

/// The command's time budget: the request's `timeout_seconds`, else how long the client
/// waits (`X-Sandbox-Timeout`, what the SDK sends the router), else the daemon's default.
fn budget(q: Option<f64>, h: &HeaderMap) -> HttpResult<TimeBudget> {
    let waits = h.get("x-sandbox-timeout").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<f64>().ok());
    let Some(secs) = q.or(waits) else { return Ok(TimeBudget::default()) };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(HttpError::invalid(format!("timeout_seconds must be a positive number, got {secs}")));
    }
    let ms = ((secs * 1000.0).ceil() as u64).clamp(1, TimeBudget::MAX_MS);
    TimeBudget::from_ms(ms).map_err(|e| HttpError::invalid(e.to_string()))
}

/// `POST /execute {command, timeout_seconds?}` → `{stdout, stderr, exit_code, timed_out}`,
/// in the sandbox's root.
async fn execute(
    Extension(st): Extension<AppState>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: axum::body::Bytes,
) -> HttpResult<Json<serde_json::Value>> {
    let q: ExecuteBody =
        serde_json::from_slice(&body).map_err(|e| HttpError::invalid(format!("expected {{\"command\": …}}: {e}")))?;
    if q.command.trim().is_empty() {
        return Err(HttpError::invalid("command must not be empty"));
    }
    let req = ExecRequest {
        cmd: Command::Argv(vec!["/bin/sh".into(), "-c".into(), q.command]),
        cwd: Some(paths::root(&t.sb)),
        env: Default::default(),
        stdin: None,
        stdin_base64: None,
        timeout_ms: Some(budget(q.timeout_seconds, &h)?),
        max_output_bytes: None,
        output_tail_bytes: None,
        encoding: Encoding::Utf8,
        background: false,
    };
    let r = ops::exec(&st.manager, &t.sb, req).await?;
    Ok(Json(json!({
        "stdout": r.stdout,
        "stderr": r.stderr,
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
    })))
}

/// `POST /upload`: a form whose file part's filename is the path under the root.
async fn upload_form(
    Extension(st): Extension<AppState>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> HttpResult<Json<serde_json::Value>> {
    use futures_util::StreamExt;
    let ct = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let Some(boundary) = crate::http::multipart::boundary(&ct) else {
        crate::http::drain(body).await;
        return Err(HttpError::invalid("expected a multipart/form-data upload with a `file` part"));
    };
    // The path is in the part's header: read the form here, then write its first file.
    let bad = |e: crate::http::multipart::Malformed| HttpError::invalid(e.to_string());
    let mut form = crate::http::multipart::Reader::new(body.into_data_stream(), &boundary);
    let name = form.next_part().await.map_err(bad)?.flatten();
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Err(HttpError::invalid("the form's file part has no filename (the path to write)"));
    };
    let path = sandbox_path(&t, &name)?;
    let chunks = futures_util::stream::unfold(&mut form, |f| async move {
        match f.chunk().await {
            Ok(Some(c)) => Some((Ok::<_, String>(c), f)),
            Ok(None) => None,
            Err(e) => Some((Err(e.to_string()), f)),
        }
    });
    ops::upload(&st.manager, &t.sb, path, crate::agent::NewFile::with_mode(None), chunks.boxed()).await?;
    while form.next_part().await.map_err(bad)?.is_some() {}
    Ok(Json(json!({ "message": format!("File '{name}' uploaded successfully.") })))
}

/// `GET /download/{path}`: a file's bytes; 404 for anything that is not a file.
async fn download(
    Extension(st): Extension<AppState>,
    Extension(t): Extension<Target>,
    Path(given): Path<String>,
) -> HttpResult<Response> {
    let path = sandbox_path(&t, &given)?;
    let m = &st.manager;
    let not_found = || HttpError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "File not found");
    match ops::stat(m, &t.sb, path.clone()).await {
        Ok(i) if i.kind == FileType::File => {}
        Ok(_) | Err(Error::File { code: glovebox_proto::agent::ErrorCode::NotFound, .. }) => return Err(not_found()),
        Err(e) => return Err(e.into()),
    }
    let (info, stream) = ops::download(m.clone(), t.sb.clone(), path).await?;
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
        (header::CONTENT_LENGTH, info.size.to_string()),
    ];
    Ok((headers, Body::from_stream(stream)).into_response())
}

/// `GET /list/{path}`: `[{name, size, type, mod_time}]`; 404 if it is not a directory.
async fn list(
    Extension(st): Extension<AppState>,
    Extension(t): Extension<Target>,
    p: Option<Path<String>>,
) -> HttpResult<Json<serde_json::Value>> {
    let path = sandbox_path(&t, &p.map(|Path(p)| p).unwrap_or_default())?;
    let m = &st.manager;
    let not_dir = || HttpError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "Path is not a directory");
    match ops::stat(m, &t.sb, path.clone()).await {
        Ok(i) if i.kind == FileType::Dir => {}
        Ok(_) | Err(Error::File { code: glovebox_proto::agent::ErrorCode::NotFound, .. }) => return Err(not_dir()),
        Err(e) => return Err(e.into()),
    }
    let entries = ops::list_dir(m, &t.sb, path, 1).await?;
    let entries: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({
                "name": e.name,
                "size": e.size,
                "type": if e.kind == FileType::Dir { "directory" } else { "file" },
                "mod_time": e.mtime,
            })
        })
        .collect();
    Ok(Json(json!(entries)))
}

/// `GET /exists/{path}` → `{path, exists}`.
async fn exists(
    Extension(st): Extension<AppState>,
    Extension(t): Extension<Target>,
    Path(given): Path<String>,
) -> HttpResult<Json<serde_json::Value>> {
    let path = sandbox_path(&t, &given)?;
    let exists = match ops::stat(&st.manager, &t.sb, path).await {
        Ok(_) => true,
        Err(Error::File { code: glovebox_proto::agent::ErrorCode::NotFound, .. }) => false,
        Err(e) => return Err(e.into()),
    };
    Ok(Json(json!({ "path": given, "exists": exists })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_come_from_the_request_then_the_client() {
        let mut h = HeaderMap::new();
        assert_eq!(budget(None, &h).unwrap(), TimeBudget::default());
        h.insert("x-sandbox-timeout", "60".parse().unwrap());
        assert_eq!(budget(None, &h).unwrap().as_ms(), 60_000);
        assert_eq!(budget(Some(1.5), &h).unwrap().as_ms(), 1500);
        assert!(budget(Some(0.0), &h).is_err());
        assert!(budget(Some(f64::NAN), &h).is_err());
    }
}
