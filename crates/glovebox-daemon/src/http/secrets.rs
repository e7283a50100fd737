//! The `/v1/secrets` handlers: create or replace (POST with a name, PUT by path), list and
//! show metadata, delete. None returns a value.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use glovebox_proto::api::{PutSecret, SecretList};

use super::error::ApiResult;
use super::extract::{json, Json, Path};
use super::AppState;
use crate::error::Error;
use crate::tenants::Caller;

fn saved(st: &AppState, owner: &str, name: &str, value: &str) -> ApiResult<Response> {
    let new = st.manager.secrets.put(owner, name, value).map_err(Error::from)?;
    let info = st.manager.secrets.info(owner, name).map_err(Error::from)?;
    tracing::info!(tenant = owner, secret = name, new, "secret saved");
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    Ok(json(status, &info))
}

pub async fn create(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Json(req): Json<PutSecret>,
) -> ApiResult<Response> {
    let name = req.name.as_deref().ok_or_else(|| Error::Invalid("name is required".into()))?;
    saved(&st, &caller.tenant, name, &req.value)
}

pub async fn put(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
    Json(req): Json<PutSecret>,
) -> ApiResult<Response> {
    if req.name.as_deref().is_some_and(|n| n != name) {
        return Err(Error::Invalid("name in the body differs from the path".into()).into());
    }
    saved(&st, &caller.tenant, &name, &req.value)
}

pub async fn list(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> Response {
    json(StatusCode::OK, &SecretList { secrets: st.manager.secrets.list(&caller.tenant) })
}

pub async fn show(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.secrets.info(&caller.tenant, &name).map_err(Error::from)?))
}

pub async fn delete(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    st.manager.secrets.delete(&caller.tenant, &name).map_err(Error::from)?;
    tracing::info!(tenant = caller.tenant, secret = name, "secret deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}
