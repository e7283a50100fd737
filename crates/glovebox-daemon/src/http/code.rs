//! The code interpreter's routes: run a cell (answer at the end or as an NDJSON stream),
//! and create, list, restart and remove language contexts.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{ContextList, CreateContext, RunCode};

use super::error::ApiResult;
use super::extract::{json, ndjson, wants_ndjson, Json, Path};
use super::AppState;
use crate::error::Error;

pub async fn run_code(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<RunCode>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    if wants_ndjson(&headers) {
        let stream = crate::code::run_code_stream(st.manager.clone(), sb, req)?;
        return ndjson(Body::from_stream(stream));
    }
    Ok(json(StatusCode::OK, &crate::code::run_code(&st.manager, &sb, req).await?))
}

pub async fn create_context(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(req): Json<CreateContext>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let k = crate::code::create_context(&st.manager, &sb, req.language, req.cwd).await?;
    Ok(json(StatusCode::CREATED, &k.view()))
}

pub async fn list_contexts(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ContextList { contexts: sb.kernels.list() }))
}

pub async fn restart_context(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, String)>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let k = sb.kernels.get(&cid).ok_or_else(|| Error::NotFound { what: "context", name: cid.clone() })?;
    k.restart(&sb.target()).await?;
    Ok(json(StatusCode::OK, &k.view()))
}

pub async fn remove_context(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, String)>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let k = sb.kernels.remove(&cid).ok_or_else(|| Error::NotFound { what: "context", name: cid.clone() })?;
    k.shutdown(&sb.target()).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}
