//! Middleware that watches requests rather than answering them: a sandbox counts as busy
//! (for its idle clock) while a request that uses it (reaches its processes, or changes it)
//! is handled and while its response streams, a
//! paused sandbox is resumed by any request that reaches its processes (and such a request
//! still waiting when the sandbox is paused is answered at once), and every response is
//! counted by status class.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::sandbox_in_path;
use super::error::ApiError;
use super::AppState;
use crate::error::Error;

/// A sandbox's routes that reach its processes (through its agent): a request on one
/// resumes a paused sandbox first. The others (its view, clocks, metrics, network policy,
/// events, pause and resume themselves) are answered by the daemon alone.
const REACH_PROCESSES: [&str; 7] = ["exec", "commands", "files", "code", "contexts", "keepalive", "pty"];

/// Middleware on `/v1/sandboxes/{id}/…`: the sandbox is busy while the request is handled
/// and while its response body streams; so is the daemon's sandbox work, which pool refills
/// wait on. A paused sandbox is resumed first if the route reaches its processes.
pub async fn track(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let sb = sandbox_in_path(path).and_then(|id| st.manager.get(id).ok());
    let mut observed_only = false;
    let mut paused_meanwhile = None;
    if let Some(sb) = &sb {
        let route = path.split(&format!("/{}/", sb.id)).nth(1).and_then(|r| r.split('/').next());
        let reaches = route.is_some_and(|r| REACH_PROCESSES.contains(&r));
        if reaches {
            if let Err(e) = st.manager.wake_for_request(sb) {
                return ApiError::from(e).into_response();
            }
            paused_meanwhile = Some((sb.id.clone(), sb.clock.paused_meanwhile()));
        }
        observed_only = !reaches && is_read(req.method());
    }
    // Watching a sandbox (its view, metrics, events, egress log, usage: what a dashboard
    // polls) is not using it: only requests that reach its processes or change it are
    // activity for its idle clock.
    let guard = sb.map(|sb| ((!observed_only).then(|| sb.activity.guard()), st.manager.sandbox_work.guard()));
    // Paused while the request waits on its processes: they answer only after a resume, so
    // the request is answered now (409 `sandbox_paused`), as if its client had hung up; what
    // it started stays frozen with the sandbox and goes on when it resumes.
    let resp = match paused_meanwhile {
        None => next.run(req).await,
        Some((id, paused)) => tokio::select! {
            r = next.run(req) => r,
            () = paused => ApiError::from(Error::PausedMeanwhile(id)).into_response(),
        },
    };
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

fn is_read(m: &axum::http::Method) -> bool {
    *m == axum::http::Method::GET || *m == axum::http::Method::HEAD
}

/// Counts every response by status class (`glovebox_http_responses_total`).
pub async fn count_responses(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    st.manager.metrics.response(resp.status().as_u16());
    resp
}
