//! `/v1/sandboxes` and a sandbox's own resources: create, list, get, kill, pause and
//! resume, its lifetime, labels and idle timeout, keep-alive, network policy, egress log and
//! metrics.

use std::collections::BTreeMap;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{
    CreateSandbox, EgressLog, EndReason, ErrorCode, NetworkPolicy, SandboxList, SetTimeout, UpdateSandbox,
};
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{json, Json, Path, Query};
use super::AppState;
use crate::tenants::Caller;

pub async fn create(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateSandbox>,
) -> ApiResult<Response> {
    if let Some(t) = &req.template {
        crate::builds::ensure_shipped(&st.manager, t)?;
    }
    let sb = st.manager.create_for(&caller.tenant, req).await?;
    Ok(json(StatusCode::CREATED, &sb.view()))
}

#[derive(Deserialize)]
pub struct ListQuery {
    /// `key=value` metadata filters, comma separated.
    #[serde(default)]
    metadata: Option<String>,
}

pub async fn list(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Response> {
    let mut filters = BTreeMap::new();
    if let Some(m) = &q.metadata {
        for pair in m.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, "metadata filter must be key=value"))?;
            filters.insert(k.to_string(), v.to_string());
        }
    }
    let sandboxes = st
        .manager
        .list_for(&caller)
        .into_iter()
        .filter(|s| filters.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    Ok(json(StatusCode::OK, &SandboxList { sandboxes }))
}

pub async fn get_one(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.get(&id)?.view()))
}

pub async fn kill(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    st.manager.get(&id)?;
    st.manager.destroy(&id, EndReason::Killed).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/sandboxes/{id}/pause`: idempotent (a paused sandbox answers as it is).
pub async fn pause(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    // Freezing waits (bounded) for the kernel to report every process stopped.
    let m = st.manager.clone();
    let sb = tokio::task::spawn_blocking(move || m.pause(&id))
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("pause: {e}")))??;
    Ok(json(StatusCode::OK, &sb.view()))
}

/// `POST /v1/sandboxes/{id}/resume`: idempotent (a running sandbox answers as it is).
pub async fn resume(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.resume(&id)?.view()))
}

pub async fn set_timeout(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(t): Json<SetTimeout>,
) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.set_timeout(&id, t.timeout_s)?.view()))
}

pub async fn update(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(u): Json<UpdateSandbox>,
) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.update(&id, u.metadata, u.idle_timeout_s)?.view()))
}

pub async fn keepalive(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    sb.activity.touch();
    Ok(json(StatusCode::OK, &sb.view()))
}

pub async fn metrics(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let mut m = sb.metrics();
    // A paused sandbox's agent answers nothing (its cgroup's figures are read all the same).
    if sb.clock.paused().is_some() {
        return Ok(json(StatusCode::OK, &m));
    }
    if let Ok(u) = sb.agent().usage().await {
        m.disk_used_bytes = u.disk_used_bytes;
    }
    Ok(json(StatusCode::OK, &m))
}

pub async fn set_network(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(p): Json<NetworkPolicy>,
) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.set_network(&id, p).await?.view()))
}

pub async fn egress_log(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let unlisted = sb.egress.unlisted.load(std::sync::atomic::Ordering::Relaxed);
    Ok(json(StatusCode::OK, &EgressLog { entries: sb.egress.entries(), unlisted }))
}
