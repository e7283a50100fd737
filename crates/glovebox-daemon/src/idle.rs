//! Activity of a sandbox, for the idle clock.
//!
//! A sandbox is active while any of these holds: an API request on it is being handled, a
//! response of it is still streaming (exec and code streams, downloads), a command runs in
//! it (foreground or background; language kernels waiting for cells do not count), or it
//! got a request or a keep-alive within its `idle_timeout_s`. Only a sandbox idle by every
//! one of these measures for the whole period is stopped (reason `idle`).
//!
//! Invariant: every guard handed out is dropped exactly once (it is an RAII value), so the
//! busy count cannot stay raised by a request that ended.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::api::AppState;

#[derive(Debug)]
pub struct Activity {
    busy: AtomicUsize,
    last: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { busy: AtomicUsize::new(0), last: Mutex::new(Instant::now()) }
    }
}

/// Held while something is using the sandbox.
pub struct Guard(Arc<Activity>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    pub fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    pub fn guard(self: &Arc<Self>) -> Guard {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.touch();
        Guard(self.clone())
    }

    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) > 0
    }

    pub fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether any command other than a language kernel runs in the sandbox (asked of its
/// agent; an agent that does not answer counts as busy, the death watch handles a dead one).
pub async fn commands_running(_m: &crate::manager::Manager, sb: &crate::manager::Sb) -> bool {
    use glovebox_proto::agent::Command;
    match sb.agent().list().await {
        Ok(commands) => commands.iter().any(|c| {
            let kernel = match &c.cmd {
                Command::Argv(v) => v.iter().any(|a| a.starts_with(crate::code::KERNEL_DIR)),
                Command::Shell(s) => s.contains(crate::code::KERNEL_DIR),
            };
            c.running && !kernel
        }),
        Err(_) => true,
    }
}

/// Middleware on `/v1/sandboxes/{id}/…`: the sandbox is busy while the request is handled
/// and while its response body streams; so is the daemon's sandbox work, which pool refills
/// wait on.
pub async fn track(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let guard = sandbox_id(req.uri().path())
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

fn sandbox_id(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/sandboxes/").or_else(|| path.strip_prefix("/sandboxes/"))?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_keep_busy_until_dropped() {
        let a = Arc::new(Activity::default());
        assert!(!a.busy());
        let t0 = a.last();
        let g1 = a.guard();
        let g2 = a.guard();
        assert!(a.busy());
        drop(g1);
        assert!(a.busy());
        drop(g2);
        assert!(!a.busy());
        assert!(a.last() >= t0);
    }

    #[test]
    fn sandbox_ids_from_paths() {
        assert_eq!(sandbox_id("/v1/sandboxes/abc/exec"), Some("abc"));
        assert_eq!(sandbox_id("/sandboxes/abc"), Some("abc"));
        assert_eq!(sandbox_id("/v1/sandboxes"), None);
        assert_eq!(sandbox_id("/v1/sandboxes/"), None);
        assert_eq!(sandbox_id("/v1/events"), None);
    }
}
