//! Keys, tenants' quotas, metered usage, and the daemon-wide Prometheus metrics (the admin's).

use axum::extract::{Extension, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{CreateKey, CreatedKey, ErrorCode, KeyList, TenantQuota, UsageReport};
use serde::Deserialize;

use super::auth::require_admin;
use super::error::{ApiError, ApiResult};
use super::extract::{json, Json, Path, Query};
use super::AppState;
use crate::error::Error;
use crate::tenants::Caller;

const ADMIN_ONLY: &str = "this needs the admin API key";

pub async fn prometheus(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> ApiResult<Response> {
    // Daemon-wide numbers cover every tenant: the operator's.
    require_admin(&caller, ADMIN_ONLY)?;
    let body = st.manager.metrics.render(st.manager.live_count(), st.manager.warm_count());
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response())
}

pub async fn create_key(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Json(req): Json<CreateKey>,
) -> ApiResult<Response> {
    require_admin(&caller, ADMIN_ONLY)?;
    let (key, info) = st.manager.tenants.create_key(&req.tenant, req.name)?;
    Ok(json(StatusCode::CREATED, &CreatedKey { key, info }))
}

pub async fn list_keys(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> ApiResult<Response> {
    require_admin(&caller, ADMIN_ONLY)?;
    Ok(json(StatusCode::OK, &KeyList { keys: st.manager.tenants.list_keys() }))
}

pub async fn revoke_key(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(kid): Path<String>,
) -> ApiResult<Response> {
    require_admin(&caller, ADMIN_ONLY)?;
    Ok(json(StatusCode::OK, &st.manager.tenants.revoke_key(&kid)?))
}

pub async fn get_quota(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(tenant): Path<String>,
) -> ApiResult<Response> {
    if !caller.may_access(&tenant) {
        return Err(ApiError::new(ErrorCode::Forbidden, "a key may only read its own tenant's quota"));
    }
    Ok(json(StatusCode::OK, &st.manager.tenants.quota(&tenant)))
}

pub async fn set_quota(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(tenant): Path<String>,
    Json(q): Json<TenantQuota>,
) -> ApiResult<Response> {
    require_admin(&caller, ADMIN_ONLY)?;
    Ok(json(StatusCode::OK, &st.manager.tenants.set_quota(&tenant, q)?))
}

pub async fn sandbox_usage(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    match st.manager.usage_of(&id) {
        Some(u) => Ok(json(StatusCode::OK, &u)),
        None => Err(Error::SandboxNotFound(id).into()),
    }
}

#[derive(Deserialize)]
pub struct UsageQuery {
    #[serde(default)]
    tenant: Option<String>,
}

pub async fn usage_report(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Query(q): Query<UsageQuery>,
) -> ApiResult<Response> {
    let tenant = match (&q.tenant, caller.admin) {
        (Some(t), true) => Some(t.as_str()),
        (None, true) => None,
        (Some(t), false) if *t != caller.tenant => {
            return Err(ApiError::new(ErrorCode::Forbidden, "a key may only read its own tenant's usage"))
        }
        _ => Some(caller.tenant.as_str()),
    };
    Ok(json(StatusCode::OK, &UsageReport { tenants: st.manager.usage_report(tenant) }))
}
