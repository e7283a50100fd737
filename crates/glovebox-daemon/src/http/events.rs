//! `GET /v1/events` and `GET /v1/sandboxes/{id}/events`: a page of lifecycle events, or an
//! NDJSON stream that follows new ones (the events themselves are in `crate::events`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::Response;
use glovebox_proto::api::{EventList, LifecycleEvent};
use serde::Deserialize;

use super::error::ApiResult;
use super::extract::{json, ndjson, Path, Query};
use super::AppState;
use crate::error::Error;
use crate::events::{Filter, MAX_FOLLOW_S, MAX_PAGE};
use crate::tenants::Caller;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events with a larger sequence number.
    #[serde(default)]
    after: i64,
    #[serde(default)]
    limit: Option<usize>,
    /// Stream NDJSON: the backlog, then new events as they happen, until `timeout_s`.
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    timeout_s: Option<u64>,
}

fn answer(st: &AppState, sandbox_id: Option<String>, q: EventsQuery, keep: Filter) -> ApiResult<Response> {
    let ev = st.manager.events.clone();
    if q.follow {
        let secs = q.timeout_s.unwrap_or(300);
        if secs == 0 || secs > MAX_FOLLOW_S {
            return Err(Error::Invalid(format!("timeout_s must be between 1 and {MAX_FOLLOW_S}")).into());
        }
        let stream = ev.follow(sandbox_id, q.after, Duration::from_secs(secs), keep);
        return ndjson(Body::from_stream(stream));
    }
    let limit = q.limit.unwrap_or(MAX_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(Error::Invalid(format!("limit must be between 1 and {MAX_PAGE}")).into());
    }
    let events = ev.list(sandbox_id.as_deref(), q.after, limit)?.into_iter().filter(|e| keep(e)).collect();
    Ok(json(StatusCode::OK, &EventList { events }))
}

/// `GET /v1/events`: the caller's sandboxes' events (every tenant's for the admin).
pub async fn all(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Response> {
    let m = st.manager.clone();
    let keep: Filter = Arc::new(move |e: &LifecycleEvent| {
        caller.admin || m.owner_of(&e.sandbox_id).is_some_and(|o| caller.may_access(&o))
    });
    answer(&st, None, q, keep)
}

/// `GET /v1/sandboxes/{id}/events`: also for a sandbox that has ended.
pub async fn of_sandbox(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Response> {
    match st.manager.get(&id) {
        Ok(_) | Err(Error::Gone { .. }) => {}
        Err(e) => {
            let known = st.manager.store.sandbox(&id).ok().flatten().is_some();
            if !known {
                return Err(e.into());
            }
        }
    }
    // The auth layer already checked that the caller may address this sandbox.
    answer(&st, Some(id), q, Arc::new(|_: &LifecycleEvent| true))
}
