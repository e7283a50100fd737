//! Snapshots and forks: `POST /v1/sandboxes/{id}/snapshots`, `/v1/snapshots` (list, show,
//! delete) and `POST /v1/sandboxes/{id}/fork`. A tenant sees and uses only its own snapshots.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use glovebox_proto::api::{CreateSnapshot, ErrorCode, ForkSandbox, Forked, SnapshotList};

use super::error::{ApiError, ApiResult};
use super::extract::{json, Json, Path};
use super::AppState;
use crate::manager::NameTaken;
use crate::tenants::Caller;

pub async fn create(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(req): Json<CreateSnapshot>,
) -> ApiResult<Response> {
    let info = st.manager.snapshot(&caller.tenant, &id, &req.name, NameTaken::Refuse).await?;
    Ok(json(StatusCode::CREATED, &info))
}

pub async fn list(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> Response {
    json(StatusCode::OK, &SnapshotList { snapshots: st.manager.snapshot_list(&caller.tenant) })
}

pub async fn show(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.snapshot_get(&caller.tenant, &name)?))
}

/// Deletes the record at once; sandboxes started from it keep running (its layer goes with
/// the last of them).
pub async fn delete(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    st.manager.snapshot_delete(&caller.tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/sandboxes/{id}/fork` (body optional: none, `{}` or `{"count": N}`).
pub async fn fork(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let req: ForkSandbox = match body.iter().all(u8::is_ascii_whitespace) {
        true => ForkSandbox::default(),
        false => serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("fork body: {e}")))?,
    };
    let count = req.count.unwrap_or(1);
    let (snapshot, children) = st.manager.fork(&caller.tenant, &id, count).await?;
    let sandboxes = children.iter().map(|c| c.view()).collect();
    Ok(json(StatusCode::CREATED, &Forked { sandboxes, snapshot, processes_copied: false }))
}
