//! Lifecycle events: every sandbox's creation, adoption by a restarted daemon, and end (with
//! its reason) go to the store, and from there to `GET /v1/events` and
//! `GET /v1/sandboxes/{id}/events` — lists, or NDJSON streams that follow new events.
//!
//! Invariants: an event is in the store before anyone is told of it (followers re-read the
//! store, so a slow follower misses nothing and holds no unbounded buffer); a follow stream
//! ends by itself after its `timeout_s`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use glovebox_proto::api::{EndReason, EventKind, LifecycleEvent, SandboxState};

use crate::error::Error;
use crate::store::{EventRecord, State as StoreState, Store};
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

    /// A receiver woken by every event recorded from now on (the Modal front-end's waits
    /// on a sandbox's end).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<i64> {
        self.last.subscribe()
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
    pub fn follow(
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

/// Which events a caller may see.
pub type Filter = Arc<dyn Fn(&LifecycleEvent) -> bool + Send + Sync>;
