//! The `/v1/volumes` handlers: create (with a size cap), list, show, delete, and the sweep of
//! what interrupted creates and dead daemons left. A tenant sees only its own volumes.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use glovebox_proto::api::{CreateVolume, VolumeList, VolumesSwept};

use super::error::ApiResult;
use super::extract::{json, Json, Path};
use super::AppState;
use crate::error::Error;
use crate::tenants::Caller;

/// Runs blocking volume work (mkfs, mount, unmount, removal) off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Internal(format!("volume task: {e}")).into())
}

pub async fn create(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Json(req): Json<CreateVolume>,
) -> ApiResult<Response> {
    let vols = st.manager.volumes.clone();
    let tenant = caller.tenant.clone();
    let info = blocking(move || vols.create(&tenant, &req)).await?.map_err(Error::from)?;
    tracing::info!(tenant = caller.tenant, volume = info.name, size_mb = info.size_mb, "volume created");
    Ok(json(StatusCode::CREATED, &info))
}

pub async fn list(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> Response {
    json(StatusCode::OK, &VolumeList { volumes: st.manager.volumes.list(&caller.tenant) })
}

pub async fn show(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    Ok(json(StatusCode::OK, &st.manager.volumes.info(&caller.tenant, &name).map_err(Error::from)?))
}

pub async fn delete(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    let (vols, tenant, n) = (st.manager.volumes.clone(), caller.tenant.clone(), name.clone());
    blocking(move || vols.delete(&tenant, &n)).await?.map_err(Error::from)?;
    tracing::info!(tenant = caller.tenant, volume = name, "volume deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/volumes/gc` (admin): unmounts host mounts no live sandbox uses and removes
/// volumes whose create was interrupted; answers what it removed.
pub async fn gc(Extension(caller): Extension<Caller>, State(st): State<AppState>) -> ApiResult<Response> {
    super::auth::require_admin(&caller, "the volume sweep needs the admin API key")?;
    let vols = st.manager.volumes.clone();
    let swept = blocking(move || vols.sweep()).await?;
    Ok(json(StatusCode::OK, &VolumesSwept { swept }))
}
