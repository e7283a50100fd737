//! Middleware that watches requests rather than answering them: a sandbox counts as busy
//! (for its idle clock) while a request on it is handled and while its response streams,
//! and every response is counted by status class.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::auth::sandbox_in_path;
use super::AppState;

/// Middleware on `/v1/sandboxes/{id}/…`: the sandbox is busy while the request is handled
/// and while its response body streams; so is the daemon's sandbox work, which pool refills
/// wait on.
pub async fn track(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let guard = sandbox_in_path(req.uri().path())
        .and_then(|id| st.manager.get(id).ok())
        .map(|sb| (sb.activity.guard(), st.manager.sandbox_work.guard()));
    let resp = next.run(req).await;
    let Some(guard) = guard else { return resp };
    if axum::body::HttpBody::size_hint(resp.body()).exact().is_some() {
        return resp; // a complete body: the request is over
    }
    let (parts, body) = resp.into_parts();
    let stream = body.into_data_stream();
    let guarded = futures_util::StreamExt::map(stream, move |chunk| {
        let _held = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(guarded))
}

/// Counts every response by status class (`glovebox_http_responses_total`).
pub async fn count_responses(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    st.manager.metrics.response(resp.status().as_u16());
    resp
}
