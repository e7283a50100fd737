//! E2B's snapshots over Glovebox's: `POST /sandboxes/{id}/snapshots` (`create_snapshot`),
//! `GET /snapshots` (`list_snapshots`), `DELETE /templates/{id}` (`delete_snapshot`), and a
//! create whose `templateID` is a snapshot id (see `control::create`).
//!
//! A Glovebox snapshot is the sandbox's files only (no process checkpoint on this host): what
//! E2B calls a filesystem snapshot (`mode="filesystem"`). A full snapshot (E2B's default) is
//! answered with the same files-only snapshot, as the fork is: sandboxes made from it start
//! with the files and nothing running.
//!
//! Invariants: a snapshot id is `snapshots/` and a Glovebox snapshot name ([`snapshot_name`]
//! is the one parser; anything else is refused before it reaches the store), so it can never
//! name a template (template names have no `/`); every call sees only the caller's tenant's
//! snapshots (another tenant's is "not found").

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use glovebox_proto::api::SnapshotInfo;
use serde::Deserialize;
use serde_json::{json, Value};

use super::control::{body, caller_for, cp_error};
use super::{check_api_key, E2b, RestError};
use crate::error::Error;
use crate::manager::NameTaken;
use crate::templates::store::valid_name;

/// What a snapshot id starts with: E2B's `namespace/` of a snapshot template.
pub const PREFIX: &str = "snapshots/";

pub fn routes() -> Router<E2b> {
    Router::new()
        .route("/sandboxes/{id}/snapshots", post(create))
        .route("/snapshots", get(list))
        .route("/templates/{id}", delete(remove))
}

/// The Glovebox snapshot name an E2B snapshot id names: `Ok(None)` when `id` is not a
/// snapshot id at all (a template's), an error when it claims to be one but its name is not
/// a valid snapshot name (`snapshots/../x`, `snapshots/A`, …).
pub fn snapshot_name(id: &str) -> Result<Option<&str>, RestError> {
    match id.strip_prefix(PREFIX) {
        None => Ok(None),
        Some(n) if valid_name(n) => Ok(Some(n)),
        Some(_) => Err(RestError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid snapshot id {id:?}: {PREFIX} and 1-63 characters of a-z 0-9 . _ -"),
        )),
    }
}

/// The E2B snapshot id of Glovebox snapshot `name`.
pub fn snapshot_id(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// E2B's `SnapshotInfo`: the id, and the names it goes by (the same, as there are no tags).
fn view(s: &SnapshotInfo) -> Value {
    let id = snapshot_id(&s.name);
    json!({ "snapshotID": id, "names": [id] })
}

/// The error of a snapshot that is not there, in E2B's 404 shape.
fn not_found(id: &str) -> RestError {
    RestError::new(StatusCode::NOT_FOUND, format!("snapshot '{id}' not found"))
}

/// A create from snapshot `id`'s errors: an unknown snapshot is E2B's 404 of the template id.
pub fn create_error(id: &str, e: Error) -> RestError {
    match e {
        Error::NotFound { what: "snapshot", .. } => not_found(id),
        e => cp_error(e),
    }
}

/// E2B's body. Its `memory` ("memory too", E2B's default) is not read: every snapshot here
/// is files only (see the module docs).
#[derive(Deserialize, Default)]
#[serde(default)]
struct NewSnapshot {
    name: Option<String>,
}

/// `create_snapshot(name=None)`: the sandbox's files as a snapshot (201). A name the caller
/// already has moves to the new snapshot, as E2B assigns a new build to the existing snapshot
/// template; without a name one is made up.
async fn create(State(st): State<E2b>, h: HeaderMap, Path(id): Path<String>, b: Bytes) -> Result<Response, RestError> {
    let caller = caller_for(&st, &h, &id)?;
    let req: NewSnapshot = body(&b)?;
    let (name, taken) = match req.name.as_deref().filter(|n| !n.is_empty()) {
        // The name as given, or as the id a list answered.
        Some(n) => (n.strip_prefix(PREFIX).unwrap_or(n).to_string(), NameTaken::Replace),
        None => (format!("snap-{}", crate::util::random_token(12)), NameTaken::Refuse),
    };
    let info = st.app.manager.snapshot(&caller.tenant, &id, &name, taken).await.map_err(cp_error)?;
    Ok((StatusCode::CREATED, axum::Json(view(&info))).into_response())
}

/// `list_snapshots(sandbox_id=…, name=…, limit=…)`: the caller's snapshots, newest first,
/// those of one sandbox or of one name (or id); pages of `limit`, the last id of a page as
/// its `x-next-token`.
async fn list(
    State(st): State<E2b>,
    h: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, RestError> {
    let caller = check_api_key(&st, &h)?;
    let limit = super::control::page_limit(&q)?;
    let mut all = st.app.manager.snapshot_list(&caller.tenant);
    // RFC 3339 UTC strings of one format order like the instants.
    all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| a.name.cmp(&b.name)));
    let after = match q.get("nextToken") {
        Some(t) => all.iter().position(|s| snapshot_id(&s.name) == *t).map(|i| i + 1).unwrap_or(all.len()),
        None => 0,
    };
    let name = q.get("name").map(|n| n.strip_prefix(PREFIX).unwrap_or(n));
    let page: Vec<&SnapshotInfo> = all[after..]
        .iter()
        .filter(|s| q.get("sandboxID").is_none_or(|id| s.source_sandbox == *id))
        .filter(|s| name.is_none_or(|n| s.name == n))
        .take(limit.saturating_add(1))
        .collect();
    let more = page.len() > limit;
    let page = &page[..page.len().min(limit)];
    let mut r = axum::Json(page.iter().map(|s| view(s)).collect::<Vec<_>>()).into_response();
    if let Some(last) = page.last().filter(|_| more) {
        if let Ok(v) = HeaderValue::from_str(&snapshot_id(&last.name)) {
            r.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(r)
}

/// `delete_snapshot(id)` (E2B deletes the snapshot template): 204, or 404 when the caller has
/// no such snapshot (the SDK answers `False`). Deferred as Glovebox's delete is: sandboxes
/// started from it keep running. A template id is not deleted here (templates are managed
/// with `glovebox template`).
async fn remove(State(st): State<E2b>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, RestError> {
    let caller = check_api_key(&st, &h)?;
    let Some(name) = snapshot_name(&id)? else {
        return match st.app.manager.template(&id) {
            Ok(_) => Err(RestError::new(
                StatusCode::BAD_REQUEST,
                format!("template '{id}' is not a snapshot: delete templates with `glovebox template rm`"),
            )),
            Err(_) => Err(RestError::new(StatusCode::NOT_FOUND, format!("template '{id}' not found"))),
        };
    };
    match st.app.manager.snapshot_delete(&caller.tenant, name).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(Error::NotFound { what: "snapshot", .. }) => Err(not_found(&id)),
        Err(e) => Err(cp_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_map_to_valid_names_only() {
        assert_eq!(snapshot_name("snapshots/snap-1").unwrap(), Some("snap-1"));
        assert_eq!(snapshot_name(&snapshot_id("a.b_c")).unwrap(), Some("a.b_c"));
        // Templates are not snapshots.
        for t in ["base", "code-interpreter-v1", "snapshots", "snapshot/x"] {
            assert_eq!(snapshot_name(t).unwrap(), None, "{t}");
        }
        // Claims to be one, with no valid name: refused, never looked up.
        for bad in ["snapshots/", "snapshots/../x", "snapshots/a/b", "snapshots/.x", "snapshots/A", "snapshots/x:tag"] {
            assert_eq!(snapshot_name(bad).unwrap_err().status, StatusCode::BAD_REQUEST, "{bad}");
        }
        assert!(snapshot_name(&format!("snapshots/{}", "a".repeat(64))).is_err());
    }
}
