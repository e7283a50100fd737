//! `/v1/templates` handlers: parse, call, map errors (the work is in `build` and the
//! manager's template methods).

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use glovebox_proto::api::{BuildLine, BuildTemplate, LayersFreed, TemplateList};
use tokio_stream::StreamExt;

use crate::api::{ApiError, AppState, Json, Path};
use crate::tenants::Caller;

/// Templates are shared by every tenant of the host: building, deleting and collecting
/// them needs the admin key; any key can list and use them.
fn require_admin(caller: &Caller) -> Result<(), ApiError> {
    if caller.admin {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "templates are built and removed with the admin API key"))
    }
}

fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response {
    (status, axum::Json(v)).into_response()
}

/// `POST /v1/templates`: with `Accept: application/x-ndjson` the build log streams (one
/// `BuildLine` per line, the last `done` or `error`); otherwise the answer comes at the end
/// (201 + the template, or 422 `build_failed`).
pub async fn build(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    headers: HeaderMap,
    Json(req): Json<BuildTemplate>,
) -> Response {
    if let Err(e) = require_admin(&caller) {
        return e.into_response();
    }
    let checked = match super::build::check(req) {
        Ok(c) => c,
        Err(f) => return ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", f.message).into_response(),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<BuildLine>(256);
    let m = st.manager.clone();
    let task = tokio::spawn(async move {
        let tx2 = tx.clone();
        if let Err(f) = super::build::run(m, checked, tx).await {
            let _ = tx2.send(f.into_line()).await;
        }
    });
    let streaming =
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("application/x-ndjson"));
    if streaming {
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(|l| {
            let mut v = serde_json::to_vec(&l).unwrap_or_default();
            v.push(b'\n');
            Ok::<_, std::io::Error>(Bytes::from(v))
        });
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/x-ndjson")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()).into_response()
            });
    }
    let mut last = None;
    while let Some(l) = rx.recv().await {
        if matches!(l, BuildLine::Done { .. } | BuildLine::Error { .. }) {
            last = Some(l);
        }
    }
    let _ = task.await;
    match last {
        Some(BuildLine::Done { template, .. }) => json(StatusCode::CREATED, &template),
        Some(BuildLine::Error { step, exit_code, message, output_tail, .. }) => {
            let mut msg = message;
            if let Some(s) = step {
                msg = format!("step {s}: {msg}");
            }
            if let Some(c) = exit_code {
                msg = format!("{msg} (exit code {c})");
            }
            if !output_tail.is_empty() {
                msg = format!("{msg}\n{output_tail}");
            }
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "build_failed", msg).into_response()
        }
        _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the build ended without a result")
            .into_response(),
    }
}

pub async fn list(State(st): State<AppState>) -> Response {
    json(StatusCode::OK, &TemplateList { templates: st.manager.template_list() })
}

pub async fn get_one(State(st): State<AppState>, Path(name): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &st.manager.template_get(&name)?))
}

pub async fn delete(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    require_admin(&caller)?;
    let freed = st.manager.template_delete(&name).await?;
    Ok(json(StatusCode::OK, &LayersFreed { freed_bytes: freed }))
}

pub async fn gc(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> Response {
    if let Err(e) = require_admin(&caller) {
        return e.into_response();
    }
    let freed = st.manager.template_gc().await;
    json(StatusCode::OK, &LayersFreed { freed_bytes: freed })
}
