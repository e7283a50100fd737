//! Lifecycle events: every sandbox's creation, adoption by a restarted daemon, and end (with
//! its reason) go to the store, and from there to `GET /v1/events` and
//! `GET /v1/sandboxes/{id}/events` — lists, or NDJSON streams that follow new events.
//!
//! Invariants: an event is in the store before anyone is told of it (followers re-read the
//! store, so a slow follower misses nothing and holds no unbounded buffer); a follow stream
//! ends by itself after its `timeout_s`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use glovebox_proto::api::{EndReason, EventKind, EventList, LifecycleEvent, SandboxState};
use serde::Deserialize;

use crate::api::{ApiError, AppState, Path, Query};
use crate::error::Error;
use crate::store::{EventRecord, State as StoreState, Store};
use crate::tenants::Caller;
use crate::util::rfc3339;

/// Most events one list answer (or one read of a follow stream) returns.
pub const MAX_PAGE: usize = 1000;
/// Longest a follow stream stays open.
pub const MAX_FOLLOW_S: u64 = 3600;

pub struct Events {
    store: Arc<Store>,
    /// The newest sequence number, for followers to wake on.
    last: tokio::sync::watch::Sender<i64>,
}

impl Events {
    pub fn new(store: Arc<Store>) -> Events {
        Events { store, last: tokio::sync::watch::Sender::new(0) }
    }

    /// Records an event; a store failure is logged (the sandbox goes on regardless).
    pub fn record(&self, sandbox_id: &str, kind: EventKind, reason: Option<EndReason>, detail: Option<&str>) {
        let k = kind_str(kind);
        match self.store.add_event(sandbox_id, k, reason.map(EndReason::as_str), detail) {
            Ok(e) => self.published(&e),
            Err(e) => tracing::error!(sandbox = %sandbox_id, "store event {k}: {e}"),
        }
    }

    /// Writes an event on `c` (inside another write's [`Store::transaction`]); followers
    /// learn of it from [`Events::published`], once the transaction has committed.
    pub fn add_on(
        c: &rusqlite::Connection,
        sandbox_id: &str,
        kind: EventKind,
        reason: Option<EndReason>,
        detail: Option<&str>,
    ) -> rusqlite::Result<EventRecord> {
        crate::store::add_event_on(c, sandbox_id, kind_str(kind), reason.map(EndReason::as_str), detail)
    }

    /// Wakes the followers for an event now in the store.
    pub fn published(&self, e: &EventRecord) {
        self.last.send_replace(e.seq);
    }

    pub fn list(
        &self,
        sandbox_id: Option<&str>,
        after: i64,
        limit: usize,
    ) -> crate::error::Result<Vec<LifecycleEvent>> {
        let rows = self.store.events(sandbox_id, after, limit).map_err(|e| Error::Internal(format!("events: {e}")))?;
        Ok(rows.into_iter().filter_map(view).collect())
    }

    /// NDJSON lines of the events after `after` that `keep` lets through, then of new ones
    /// as they happen, for `duration`.
    fn follow(
        self: Arc<Self>,
        sandbox_id: Option<String>,
        after: i64,
        duration: Duration,
        keep: Filter,
    ) -> impl futures_util::Stream<Item = std::result::Result<Bytes, std::io::Error>> {
        let end = Instant::now() + duration;
        let rx = self.last.subscribe();
        futures_util::stream::unfold((self, rx, after), move |(ev, mut rx, mut after)| {
            let sandbox_id = sandbox_id.clone();
            let keep = keep.clone();
            async move {
                loop {
                    rx.borrow_and_update();
                    let page = match ev.list(sandbox_id.as_deref(), after, MAX_PAGE) {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::error!("follow events: {e}");
                            return None;
                        }
                    };
                    if let Some(last) = page.last() {
                        after = last.seq;
                        let mut out = Vec::new();
                        for e in page.iter().filter(|e| keep(e)) {
                            if let Ok(mut l) = serde_json::to_vec(e) {
                                l.push(b'\n');
                                out.extend_from_slice(&l);
                            }
                        }
                        if out.is_empty() {
                            continue;
                        }
                        return Some((Ok(Bytes::from(out)), (ev, rx, after)));
                    }
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    match tokio::time::timeout(left, rx.changed()).await {
                        Ok(Ok(())) => continue,
                        _ => return None,
                    }
                }
            }
        })
    }
}

fn kind_str(k: EventKind) -> &'static str {
    match k {
        EventKind::Created => "created",
        EventKind::Adopted => "adopted",
        EventKind::Ended => "ended",
    }
}

fn view(r: EventRecord) -> Option<LifecycleEvent> {
    let kind = match r.kind.as_str() {
        "created" => EventKind::Created,
        "adopted" => EventKind::Adopted,
        "ended" => EventKind::Ended,
        _ => return None, // a kind from a newer daemon: skipped, not misreported
    };
    let reason = r.reason.as_deref().and_then(EndReason::parse);
    let state = match (kind, reason) {
        (EventKind::Ended, Some(r)) => match StoreState::ended(r) {
            StoreState::Stopped => SandboxState::Stopped,
            _ => SandboxState::Killed,
        },
        (EventKind::Ended, None) => SandboxState::Killed,
        _ => SandboxState::Running,
    };
    Some(LifecycleEvent {
        seq: r.seq,
        time: rfc3339(r.time),
        sandbox_id: r.sandbox_id,
        kind,
        state,
        reason,
        detail: r.detail,
    })
}

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

/// Which events a caller may see.
type Filter = Arc<dyn Fn(&LifecycleEvent) -> bool + Send + Sync>;

fn answer(st: &AppState, sandbox_id: Option<String>, q: EventsQuery, keep: Filter) -> Result<Response, ApiError> {
    let ev = st.manager.events.clone();
    if q.follow {
        let secs = q.timeout_s.unwrap_or(300);
        if secs == 0 || secs > MAX_FOLLOW_S {
            return Err(Error::Invalid(format!("timeout_s must be between 1 and {MAX_FOLLOW_S}")).into());
        }
        let stream = ev.follow(sandbox_id, q.after, Duration::from_secs(secs), keep);
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/x-ndjson")
            .body(Body::from_stream(stream))
            .map_err(|e| Error::Internal(e.to_string()).into());
    }
    let limit = q.limit.unwrap_or(MAX_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(Error::Invalid(format!("limit must be between 1 and {MAX_PAGE}")).into());
    }
    let events = ev.list(sandbox_id.as_deref(), q.after, limit)?.into_iter().filter(|e| keep(e)).collect();
    Ok((StatusCode::OK, axum::Json(EventList { events })).into_response())
}

/// `GET /v1/events`: the caller's sandboxes' events (every tenant's for the admin).
pub async fn all(
    Extension(caller): Extension<Caller>,
    State(st): State<AppState>,
    Query(q): Query<EventsQuery>,
) -> Result<Response, ApiError> {
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
) -> Result<Response, ApiError> {
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
