//! `/v1/templates` handlers: parse, call, map errors (the work is in `builds` and
//! the manager's template methods).

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use glovebox_proto::api::{BuildLine, BuildTemplate, ErrorCode, LayersFreed, TemplateList};
use tokio_stream::StreamExt;

use super::auth::require_admin;
use super::error::{ApiError, ApiResult};
use super::extract::{json, ndjson, wants_ndjson, Json, Path};
use super::AppState;
use crate::builds as build;
use crate::tenants::Caller;

/// Templates are shared by every tenant of the host: building, deleting and collecting
/// them needs the admin key; any key can list and use them.
const ADMIN_ONLY: &str = "templates are built and removed with the admin API key";

/// `POST /v1/templates`: with `Accept: application/x-ndjson` the build log streams (one
/// `BuildLine` per line, the last `done` or `error`); otherwise the answer comes at the end
/// (201 + the template, or 422 `build_failed`).
pub async fn build(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    headers: HeaderMap,
    Json(req): Json<BuildTemplate>,
) -> ApiResult<Response> {
    require_admin(&caller, ADMIN_ONLY)?;
    let checked = build::check(req).map_err(|f| ApiError::new(ErrorCode::InvalidRequest, f.message))?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<BuildLine>(256);
    let m = st.manager.clone();
    let task = tokio::spawn(async move {
        let tx2 = tx.clone();
        if let Err(f) = build::run(m, checked, tx).await {
            let _ = tx2.send(f.into_line()).await;
        }
    });
    if wants_ndjson(&headers) {
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(|l| {
            let mut v = serde_json::to_vec(&l).unwrap_or_default();
            v.push(b'\n');
            Ok::<_, std::io::Error>(Bytes::from(v))
        });
        return ndjson(Body::from_stream(stream));
    }
    let mut last = None;
    while let Some(l) = rx.recv().await {
        if matches!(l, BuildLine::Done { .. } | BuildLine::Error { .. }) {
            last = Some(l);
        }
    }
    let _ = task.await;
    match last {
        Some(BuildLine::Done { template, .. }) => Ok(json(StatusCode::CREATED, &template)),
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
            Err(ApiError::new(ErrorCode::BuildFailed, msg))
        }
        _ => Err(ApiError::new(ErrorCode::Internal, "the build ended without a result")),
    }
}

pub async fn list(State(st): State<AppState>) -> Response {
    json(StatusCode::OK, &TemplateList { templates: st.manager.template_list() })
}

pub async fn get_one(State(st): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.template_get(&name)?))
}

pub async fn delete(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    require_admin(&caller, ADMIN_ONLY)?;
    let freed = st.manager.template_delete(&name).await?;
    Ok(json(StatusCode::OK, &LayersFreed { freed_bytes: freed }))
}

pub async fn gc(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> ApiResult<Response> {
    require_admin(&caller, ADMIN_ONLY)?;
    let freed = st.manager.template_gc().await;
    Ok(json(StatusCode::OK, &LayersFreed { freed_bytes: freed }))
}
