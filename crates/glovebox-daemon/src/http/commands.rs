//! Commands in a sandbox: run one (answer at the end, as an NDJSON stream, or in the
//! background), list them, read a result, signal one, feed its stdin.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{Encoding, ErrorCode, ExecRequest, SignalRequest};
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{json, ndjson, wants_ndjson, Json, Path, Query};
use super::AppState;
use crate::error::Error;
use crate::ops;

pub async fn exec(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ExecRequest>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    if req.background {
        let cmd = req.cmd.clone();
        let started = ops::exec_background(&st.manager, &sb, req).await?;
        crate::manager::records::watch_background(st.manager.clone(), sb.clone(), started.id, cmd);
        return Ok(json(StatusCode::ACCEPTED, &started));
    }
    if wants_ndjson(&headers) {
        let stream = ops::exec_stream(st.manager.clone(), sb, req).await?;
        return ndjson(Body::from_stream(stream));
    }
    Ok(json(StatusCode::OK, &ops::exec(&st.manager, &sb, req).await?))
}

pub async fn list(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ops::list_commands(&st.manager, &sb).await?))
}

#[derive(Deserialize)]
pub struct ResultQuery {
    #[serde(default)]
    wait: bool,
    #[serde(default)]
    encoding: Encoding,
}

pub async fn result(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, u64)>,
    Query(q): Query<ResultQuery>,
) -> ApiResult<Response> {
    // A record outlives the agent's memory of the command, and the sandbox.
    let stored = || crate::manager::records::stored_result(&st.manager, &id, cid, q.encoding);
    let sb = match st.manager.get(&id) {
        Ok(sb) => sb,
        Err(e) => return stored().await.map(|r| json(StatusCode::OK, &r)).ok_or_else(|| e.into()),
    };
    match ops::command_result(&st.manager, &sb, cid, q.wait, q.encoding).await {
        Ok(r) => Ok(json(StatusCode::OK, &r)),
        Err(e @ (Error::NotFound { .. } | Error::Gone { .. })) => {
            stored().await.map(|r| json(StatusCode::OK, &r)).ok_or_else(|| e.into())
        }
        Err(e) => Err(e.into()),
    }
}

pub async fn signal(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, u64)>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let req: SignalRequest = if body.iter().all(|b| b.is_ascii_whitespace()) {
        SignalRequest { signal: None }
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.to_string()))?
    };
    let sig = req.signal.unwrap_or(libc::SIGKILL);
    ops::signal(&st.manager, &sb, cid, sig).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
pub struct StdinQuery {
    #[serde(default)]
    close: bool,
}

pub async fn stdin(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, u64)>,
    Query(q): Query<StdinQuery>,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    ops::send_stdin(&st.manager, &sb, cid, &body, q.close).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
