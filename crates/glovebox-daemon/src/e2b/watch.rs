//! envd's directory watching: `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (what
//! the Python SDK polls) and the streaming `WatchDir`, over the agent's inotify watches.
//!
//! Invariants: a watcher belongs to the sandbox that made it (another sandbox's token never
//! reaches it); watchers of sandboxes that ended are forgotten, and the number kept is
//! bounded. A poll returns every change finished before it was asked (the agent drains its
//! inotify queue first).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use glovebox_proto::agent::{FsEvent, FsOp};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, Code, RpcError};
use super::filesystem::entry;
use super::sandbox_path;
use crate::agent::DirWatch;
use crate::manager::{Manager, Sb};
use crate::ops;
use crate::util::random_token;

/// Most watchers kept at once (all sandboxes).
const MAX_WATCHERS: usize = 1024;
/// How often a `WatchDir` stream asks the agent for changes.
const STREAM_POLL: Duration = Duration::from_millis(100);

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchReq {
    path: String,
    recursive: bool,
    include_entry: bool,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct WatcherReq {
    watcher_id: String,
}

struct Watcher {
    /// The watched directory, absolute (event names are relative to it).
    path: String,
    include_entry: bool,
    watch: DirWatch,
}

/// A watcher and the sandbox it belongs to.
struct Entry {
    sandbox: String,
    watcher: Arc<tokio::sync::Mutex<Watcher>>,
}

/// The live watchers, by id.
#[derive(Clone, Default)]
pub struct Watchers(Arc<Mutex<HashMap<String, Entry>>>);

impl Watchers {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watcher `id` of sandbox `sb` (another sandbox's is "not found").
    fn get(&self, sb: &Sb, id: &str) -> Result<Arc<tokio::sync::Mutex<Watcher>>, RpcError> {
        self.map()
            .get(id)
            .filter(|e| e.sandbox == sb.id)
            .map(|e| e.watcher.clone())
            .ok_or_else(|| RpcError::new(Code::NotFound, format!("watcher {id} not found")))
    }
}

fn op_name(op: FsOp) -> &'static str {
    match op {
        FsOp::Create => "EVENT_TYPE_CREATE",
        FsOp::Write => "EVENT_TYPE_WRITE",
        FsOp::Remove => "EVENT_TYPE_REMOVE",
        FsOp::Rename => "EVENT_TYPE_RENAME",
        FsOp::Chmod => "EVENT_TYPE_CHMOD",
    }
}

/// envd's `FilesystemEvent`s; with `include_entry`, each carries the entry's info where the
/// path still exists (best effort, as envd).
async fn to_json(m: &Manager, sb: &Sb, dir: &str, include_entry: bool, events: Vec<FsEvent>) -> Vec<Value> {
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        let mut v = json!({ "name": e.name, "type": op_name(e.op) });
        if include_entry && !matches!(e.op, FsOp::Remove | FsOp::Rename) {
            if let Ok(info) = ops::stat(m, sb, format!("{}/{}", dir.trim_end_matches('/'), e.name)).await {
                v["entry"] = entry(&info);
            }
        }
        out.push(v);
    }
    out
}

async fn start(m: &Manager, sb: &Sb, req: &WatchReq) -> Result<(String, DirWatch), RpcError> {
    let path = sandbox_path(&req.path);
    let watch = ops::watch_dir(m, sb, path.clone(), req.recursive).await?;
    Ok((path, watch))
}

/// `CreateWatcher`: `{watcherId}`.
pub async fn create(ws: &Watchers, m: &Manager, sb: &Sb, req: WatchReq) -> Result<Value, RpcError> {
    {
        let mut map = ws.map();
        if map.len() >= MAX_WATCHERS {
            map.retain(|_, e| m.get(&e.sandbox).is_ok());
        }
        if map.len() >= MAX_WATCHERS {
            return Err(RpcError::new(Code::ResourceExhausted, format!("too many watchers (at most {MAX_WATCHERS})")));
        }
    }
    let (path, watch) = start(m, sb, &req).await?;
    let id = random_token(16);
    let watcher = Arc::new(tokio::sync::Mutex::new(Watcher { path, include_entry: req.include_entry, watch }));
    ws.map().insert(id.clone(), Entry { sandbox: sb.id.clone(), watcher });
    Ok(json!({ "watcherId": id }))
}

/// `GetWatcherEvents`: `{events}` since the last call.
pub async fn events(ws: &Watchers, m: &Manager, sb: &Sb, req: WatcherReq) -> Result<Value, RpcError> {
    let w = ws.get(sb, &req.watcher_id)?;
    let mut w = w.lock().await;
    let (events, _overflowed) = match ops::watch_events(m, sb, &mut w.watch).await {
        Ok(v) => v,
        Err(e) => {
            ws.map().remove(&req.watcher_id);
            return Err(e.into());
        }
    };
    let events = to_json(m, sb, &w.path, w.include_entry, events).await;
    Ok(json!({ "events": events }))
}

/// `RemoveWatcher`.
pub async fn remove(ws: &Watchers, sb: &Sb, req: WatcherReq) -> Result<Value, RpcError> {
    ws.get(sb, &req.watcher_id)?;
    ws.map().remove(&req.watcher_id);
    Ok(json!({}))
}

/// `WatchDir`: a start event, then the changes as they are seen, until the client leaves
/// or the sandbox ends.
pub async fn stream(m: Arc<Manager>, sb: Arc<Sb>, req: WatchReq) -> Response {
    let (path, mut watch) = match start(&m, &sb, &req).await {
        Ok(v) => v,
        Err(e) => return connect::stream_error(e),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(32);
    tokio::spawn(async move {
        if tx.send(connect::envelope(&json!({ "event": { "start": {} } }))).await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval(STREAM_POLL);
        loop {
            tick.tick().await;
            let events = match ops::watch_events(&m, &sb, &mut watch).await {
                Ok((events, _)) => events,
                Err(e) => {
                    let _ = tx.send(connect::end_stream(Some(&e.into()))).await;
                    return;
                }
            };
            if events.is_empty() {
                if tx.is_closed() {
                    return;
                }
                continue;
            }
            for ev in to_json(&m, &sb, &path, req.include_entry, events).await {
                if tx.send(connect::envelope(&json!({ "event": { "filesystem": ev } }))).await.is_err() {
                    return;
                }
            }
        }
    });
    let body = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
    connect::stream_response(Body::from_stream(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_envds() {
        assert_eq!(op_name(FsOp::Create), "EVENT_TYPE_CREATE");
        assert_eq!(op_name(FsOp::Write), "EVENT_TYPE_WRITE");
        assert_eq!(op_name(FsOp::Chmod), "EVENT_TYPE_CHMOD");
        let r: WatchReq = serde_json::from_str(r#"{"path":"d","recursive":true,"includeEntry":true}"#).unwrap();
        assert!(r.recursive && r.include_entry);
    }
}
