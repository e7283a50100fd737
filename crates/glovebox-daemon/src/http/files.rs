//! A sandbox's files: download, upload, remove, list, stat, mkdir, rename — all resolved by
//! the agent inside the sandbox (`ops`), never on the host.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{Entries, ErrorCode, MakeDir, Rename};
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{json, Json, Path, Query};
use super::AppState;
use crate::error::Error;
use crate::ops;

#[derive(Deserialize)]
pub struct PathQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    depth: Option<u32>,
    /// Octal file mode for uploads, e.g. `0755`.
    #[serde(default)]
    mode: Option<String>,
}

pub async fn download(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let (info, body) = ops::download(st.manager.clone(), sb, q.path).await?;
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, info.size)
        .body(Body::from_stream(body))
        .map_err(|e| Error::Internal(e.to_string()).into())
}

pub async fn upload(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    body: Body,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let mode = match &q.mode {
        Some(m) => Some(
            u32::from_str_radix(m.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, "mode must be octal, e.g. 0644"))?,
        ),
        None => None,
    };
    let mut stream = body.into_data_stream();
    match ops::upload(&st.manager, &sb, q.path, crate::agent::NewFile::with_mode(mode), &mut stream).await {
        Ok(info) => Ok(json(StatusCode::OK, &info)),
        Err(e) => {
            // E.g. the disk filled mid-upload: let the client finish sending, then answer.
            use futures_util::StreamExt;
            let go = async {
                let mut seen = 0usize;
                while let Some(Ok(c)) = stream.next().await {
                    seen += c.len();
                    if seen > 256 << 20 {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), go).await;
            Err(e.into())
        }
    }
}

pub async fn remove(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    ops::remove(&st.manager, &sb, q.path, q.recursive).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn list_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let depth = q.depth.unwrap_or(1);
    if depth == 0 || depth > 32 {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "depth must be between 1 and 32"));
    }
    let entries = ops::list_dir(&st.manager, &sb, q.path, depth).await?;
    Ok(json(StatusCode::OK, &Entries { entries }))
}

pub async fn stat(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ops::stat(&st.manager, &sb, q.path).await?))
}

pub async fn mkdir(State(st): State<AppState>, Path(id): Path<String>, Json(b): Json<MakeDir>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ops::make_dir(&st.manager, &sb, b.path, None).await?))
}

pub async fn rename(State(st): State<AppState>, Path(id): Path<String>, Json(b): Json<Rename>) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    Ok(json(StatusCode::OK, &ops::rename(&st.manager, &sb, b.from, b.to).await?))
}
