//! Daytona's control plane (`/daytona/api/sandbox…`) over the manager: create, get, list,
//! delete, start (resume), stop (pause, or delete for an ephemeral sandbox), network
//! settings. Field names are Daytona's (`networkBlockAll`, `autoStopInterval`, …).
//!
//! Mapping: a Daytona "stopped" sandbox is a paused one here (processes frozen, files and
//! memory kept, clocks stopped); `autoStopInterval` is the idle clock, pausing at its end,
//! or deleting when the sandbox is ephemeral (`autoDeleteInterval: 0`).

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use axum::Router;
use glovebox_proto::api::{
    AllowRule, CreateSandbox, EndReason, NetworkMode, NetworkPolicy, OnIdle, Resources, SandboxState, VolumeMount,
    MAX_TIMEOUT_S,
};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{caller_for, check_key, Daytona, DtError, TOOLBOX_PREFIX};
use crate::manager::Sb;

/// Daytona's documented defaults: 1 vCPU, 1 GiB of memory, 3 GiB of disk, auto-stop after
/// 15 idle minutes.
const DEFAULT_CPU: u64 = 1;
const DEFAULT_MEMORY_GB: u64 = 1;
const DEFAULT_DISK_GB: u64 = 3;
const DEFAULT_AUTO_STOP_MIN: u64 = 15;

pub fn routes() -> Router<Daytona> {
    Router::new()
        .route("/sandbox", post(create).get(list))
        .route("/sandbox/{id}", get(get_one).delete(delete))
        .route("/sandbox/{id}/start", post(start))
        .route("/sandbox/{id}/stop", post(stop))
        .route("/sandbox/{id}/labels", put(replace_labels))
        .route("/sandbox/{id}/autostop/{interval}", post(set_autostop))
        .route("/sandbox/{id}/network-settings", post(network_settings))
        .route("/sandbox/{id}/public/{public}", post(set_public))
        .route("/sandbox/{id}/toolbox-proxy-url", get(toolbox_proxy_url))
        .route("/sandbox/{id}/{*rest}", any(unsupported))
        .fallback(unsupported_api)
}

/// A JSON body, with a 400 for a malformed one.
fn body<T: for<'de> Deserialize<'de> + Default>(b: &Bytes) -> Result<T, DtError> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(b).map_err(|e| DtError::bad(format!("invalid body: {e}")))
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NewSandbox {
    name: Option<String>,
    snapshot: Option<String>,
    user: Option<String>,
    env: Option<BTreeMap<String, String>>,
    labels: Option<BTreeMap<String, String>>,
    public: Option<bool>,
    #[serde(flatten)]
    network: NetworkSettings,
    kvm: Option<bool>,
    outbound_proxy_url: Option<String>,
    cpu: Option<u64>,
    gpu: Option<u64>,
    memory: Option<u64>,
    disk: Option<u64>,
    auto_stop_interval: Option<i64>,
    auto_pause_interval: Option<i64>,
    auto_archive_interval: Option<i64>,
    auto_delete_interval: Option<i64>,
    ttl_minutes: Option<u64>,
    volumes: Option<Vec<DaytonaVolume>>,
    build_info: Option<Value>,
    secrets: Option<Vec<Value>>,
    linked_sandbox: Option<String>,
    spot: Option<bool>,
    gpu_type: Option<Value>,
}

/// A Daytona volume mount: a Glovebox volume (made with `glovebox volume create` or
/// `POST /v1/volumes`) named by `volumeId`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DaytonaVolume {
    volume_id: String,
    mount_path: String,
    subpath: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NetworkSettings {
    network_block_all: Option<bool>,
    network_allow_list: Option<String>,
    domain_allow_list: Option<String>,
}

/// A comma-separated list, blanks dropped.
fn items(list: &Option<String>) -> Vec<String> {
    list.as_deref().unwrap_or("").split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// An address or CIDR block (what `networkAllowList` takes).
fn is_cidr(s: &str) -> bool {
    let (ip, bits) = s.split_once('/').unwrap_or((s, "32"));
    ip.parse::<std::net::IpAddr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 128)
}

/// Daytona's three egress options as a Glovebox policy. They are mutually exclusive, as in
/// Daytona. `networkBlockAll: false` alone is open egress (Glovebox's allow-all, as Daytona
/// "restores general outbound access"); none given is Glovebox's default, deny-all (where
/// Daytona's is open).
fn policy(n: &NetworkSettings) -> Result<NetworkPolicy, DtError> {
    let cidrs = items(&n.network_allow_list);
    let domains = items(&n.domain_allow_list);
    let given = [n.network_block_all == Some(true), n.network_allow_list.is_some(), n.domain_allow_list.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(DtError::bad(
            "networkBlockAll, networkAllowList and domainAllowList are mutually exclusive: give at most one",
        ));
    }
    if let Some(bad) = cidrs.iter().find(|c| !is_cidr(c)) {
        return Err(DtError::bad(format!("networkAllowList: {bad:?} is not an IP address or CIDR block")));
    }
    let allow: Vec<AllowRule> = cidrs.into_iter().chain(domains).map(AllowRule::from).collect();
    let np = if n.network_block_all == Some(false) && allow.is_empty() {
        NetworkPolicy { mode: NetworkMode::AllowAll, allow, deny: Vec::new() }
    } else if allow.is_empty() {
        NetworkPolicy { mode: NetworkMode::DenyAll, allow, deny: Vec::new() }
    } else {
        NetworkPolicy { mode: NetworkMode::AllowList, allow, deny: Vec::new() }
    };
    glovebox_proto::policy::parse(&np).map_err(DtError::bad)?;
    Ok(np)
}

/// Refuses what Glovebox does not do, naming it.
fn refuse_unsupported(req: &NewSandbox) -> Result<(), DtError> {
    let nonzero = |v: Option<i64>| v.is_some_and(|v| v > 0);
    let checks: [(bool, &str); 13] = [
        (req.name.is_some(), "naming a sandbox (sandboxes are addressed by id)"),
        (req.user.as_deref().is_some_and(|u| u != "root"), "choosing the OS user"),
        (req.kvm == Some(true), "KVM inside sandboxes"),
        (req.outbound_proxy_url.is_some(), "an outbound proxy"),
        (req.gpu.is_some_and(|g| g > 0) || req.gpu_type.as_ref().is_some_and(|g| !g.is_null()), "GPUs"),
        (req.spot == Some(true), "spot sandboxes"),
        (req.volumes.iter().flatten().any(|v| v.subpath.as_ref().is_some_and(|p| !p.is_empty())), "a volume subpath"),
        (
            req.build_info.as_ref().is_some_and(|b| !b.is_null()),
            "building an image at create (build a Glovebox template and pass its name as the snapshot)",
        ),
        (req.secrets.as_ref().is_some_and(|s| !s.is_empty()), "secrets"),
        (req.linked_sandbox.is_some(), "linked sandboxes"),
        (nonzero(req.auto_archive_interval), "auto-archive (a stopped sandbox stays paused until deleted)"),
        (nonzero(req.auto_delete_interval), "auto-delete after an interval (0, ephemeral, is supported)"),
        (
            nonzero(req.auto_stop_interval) && nonzero(req.auto_pause_interval),
            "both autoStopInterval and autoPauseInterval",
        ),
    ];
    match checks.iter().find(|(bad, _)| *bad) {
        Some((_, what)) => Err(DtError::unsupported(what)),
        None => Ok(()),
    }
}

fn gb(mb: u64) -> u64 {
    mb.div_ceil(1024)
}

/// The sandbox as Daytona describes one.
fn view(st: &Daytona, sb: &Sb, h: &HeaderMap, state: &str) -> Value {
    let s = sb.view();
    let ephemeral = sb.on_idle == OnIdle::Kill;
    let idle_min = sb.idle_timeout().map_or(0, |t| t.as_secs() / 60);
    let (mut cidrs, mut domains) = (Vec::new(), Vec::new());
    for r in &s.network.allow {
        let text = match r {
            AllowRule::Rule(s) => s.as_str(),
            AllowRule::Domain(d) => d.domain.as_str(),
        };
        if is_cidr(text) {
            cidrs.push(text);
        } else {
            domains.push(text);
        }
    }
    let list = |v: Vec<&str>| if v.is_empty() { Value::Null } else { json!(v.join(",")) };
    json!({
        "id": s.id,
        "organizationId": sb.tenant,
        "name": s.id,
        "snapshot": s.template,
        "user": "root",
        "env": sb.env,
        "labels": s.metadata,
        "public": st.app.manager.ports.all_public(&s.id),
        "networkBlockAll": s.network.mode == NetworkMode::DenyAll,
        "networkAllowList": list(cidrs),
        "domainAllowList": list(domains),
        "kvm": false,
        "target": "glovebox",
        "cpu": (s.limits.cpus.ceil() as u64).max(1),
        "gpu": 0,
        "memory": gb(s.limits.memory_mb),
        "disk": gb(s.limits.disk_mb),
        "state": state,
        "desiredState": state,
        "volumes": s.volumes.iter().map(|v| json!({ "volumeId": v.name, "mountPath": v.path })).collect::<Vec<_>>(),
        "autoStopInterval": idle_min,
        "autoPauseInterval": 0,
        "autoArchiveInterval": 0,
        "autoDeleteInterval": if ephemeral { 0 } else { -1 },
        "createdAt": s.created_at,
        "updatedAt": crate::util::rfc3339(std::time::SystemTime::now()),
        "toolboxProxyUrl": toolbox_url(h),
    })
}

/// Daytona's name for the sandbox's state.
fn state_of(sb: &Sb) -> &'static str {
    match sb.view().state {
        SandboxState::Starting => "starting",
        SandboxState::Running => "started",
        SandboxState::Paused => "stopped",
        SandboxState::Stopped | SandboxState::Killed => "destroyed",
    }
}

/// This daemon's toolbox, as the client reached it.
fn toolbox_url(h: &HeaderMap) -> String {
    let host = h.get(axum::http::header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1");
    format!("http://{host}{TOOLBOX_PREFIX}")
}

fn dto(st: &Daytona, sb: &Sb, h: &HeaderMap) -> Response {
    axum::Json(view(st, sb, h, state_of(sb))).into_response()
}

async fn create(State(st): State<Daytona>, h: HeaderMap, b: Bytes) -> Result<Response, DtError> {
    let caller = check_key(&st, &h)?;
    let req: NewSandbox = body(&b)?;
    refuse_unsupported(&req)?;
    let network = policy(&req.network)?;
    let ephemeral = req.auto_delete_interval == Some(0);
    let minutes = |v: i64| u64::try_from(v).map_err(|_| DtError::bad("intervals must not be negative"));
    let idle_min = match (req.auto_stop_interval, req.auto_pause_interval) {
        (_, Some(p)) if p > 0 => minutes(p)?,
        (Some(s), _) => minutes(s)?,
        (None, _) => DEFAULT_AUTO_STOP_MIN,
    };
    let lifetime = match req.ttl_minutes {
        Some(0) | None => MAX_TIMEOUT_S,
        Some(t) => t.saturating_mul(60).min(MAX_TIMEOUT_S),
    };
    let template = req.snapshot.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "base".into());
    let gib = |v: Option<u64>, d: u64| v.unwrap_or(d).saturating_mul(1024);
    let create = CreateSandbox {
        template: Some(template.clone()),
        timeout_s: Some(lifetime),
        resources: Resources {
            cpus: Some(req.cpu.unwrap_or(DEFAULT_CPU) as f64),
            memory_mb: Some(gib(req.memory, DEFAULT_MEMORY_GB)),
            disk_mb: Some(gib(req.disk, DEFAULT_DISK_GB)),
            pids: None,
        },
        env: req.env.unwrap_or_default(),
        metadata: req.labels.unwrap_or_default(),
        network,
        idle_timeout_s: (idle_min > 0).then(|| idle_min.saturating_mul(60).min(MAX_TIMEOUT_S)),
        on_idle: Some(if ephemeral { OnIdle::Kill } else { OnIdle::Pause }),
        volumes: req
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| VolumeMount { name: v.volume_id, path: v.mount_path, read_only: false })
            .collect(),
        auto_resume: None,
        snapshot: None,
        isolation: None,
    };
    crate::builds::ensure_shipped(&st.app.manager, &template)?;
    let sb = st.app.manager.create_for(&caller.tenant, create).await?;
    if req.public == Some(true) {
        crate::http::change_live(&st.app, &sb.id, |ports| ports.set_all_public(&sb.id, true))?;
    }
    Ok(dto(&st, &sb, &h))
}

async fn get_one(State(st): State<Daytona>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    let sb = st.app.manager.get(&id)?;
    Ok(dto(&st, &sb, &h))
}

/// `GET /sandbox`: the caller's sandboxes, oldest first, filtered by `labels` (JSON),
/// `states`, `snapshots` (templates) and an `id` (or `name`) prefix, in pages of `limit` (default 100) continued by `cursor`
/// (the last id of the page before). Filters Glovebox cannot apply are refused by name.
async fn list(
    State(st): State<Daytona>,
    h: HeaderMap,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, DtError> {
    let caller = check_key(&st, &h)?;
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    let (mut states, mut snapshots, mut prefix): (Vec<&str>, Vec<&str>, String) =
        (Vec::new(), Vec::new(), String::new());
    let (mut limit, mut cursor) = (100usize, None);
    for (k, v) in &q {
        match k.as_str() {
            "labels" => {
                labels =
                    serde_json::from_str(v).map_err(|e| DtError::bad(format!("labels must be a JSON object: {e}")))?
            }
            "states" => states.push(v.as_str()),
            "snapshots" => snapshots.push(v.as_str()),
            // A sandbox's name is its id here.
            "id" | "name" => prefix = v.to_lowercase(),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|l| (1..=200).contains(l))
                    .ok_or_else(|| DtError::bad("limit must be 1 to 200"))?
            }
            "cursor" => cursor = Some(v.as_str()),
            // Every sandbox here is neither errored-and-deleted nor a warm-pool spare.
            "includeErroredDeleted" | "includeWarm" => {}
            other => return Err(DtError::unsupported(&format!("the list filter {other:?}"))),
        }
    }
    let all: Vec<Value> = st
        .app
        .manager
        .list_for(&caller)
        .iter()
        .filter(|s| labels.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .filter(|s| s.id.to_lowercase().starts_with(&prefix))
        .filter(|s| snapshots.is_empty() || snapshots.contains(&s.template.as_str()))
        .filter_map(|s| st.app.manager.get(&s.id).ok())
        .map(|sb| view(&st, &sb, &h, state_of(&sb)))
        .filter(|v| states.is_empty() || states.iter().any(|s| v["state"] == *s))
        .collect();
    let from = match cursor {
        Some(c) => all.iter().position(|v| v["id"] == c).map_or(all.len(), |i| i + 1),
        None => 0,
    };
    let page: Vec<Value> = all[from..].iter().take(limit).cloned().collect();
    let next = match page.last() {
        Some(last) if from + page.len() < all.len() => last["id"].clone(),
        _ => Value::Null,
    };
    Ok(axum::Json(json!({ "items": page, "nextCursor": next })).into_response())
}

async fn delete(State(st): State<Daytona>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    let sb = st.app.manager.get(&id)?;
    st.app.manager.destroy(&id, EndReason::Killed).await;
    Ok(axum::Json(view(&st, &sb, &h, "destroyed")).into_response())
}

async fn start(State(st): State<Daytona>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    let sb = st.app.manager.get(&id)?;
    st.app.manager.resume_sb(&sb)?;
    Ok(dto(&st, &sb, &h))
}

/// `stop`: pauses the sandbox (its files and processes kept); an ephemeral one is deleted,
/// as Daytona deletes ephemeral sandboxes when they stop.
async fn stop(State(st): State<Daytona>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    let sb = st.app.manager.get(&id)?;
    if sb.on_idle == OnIdle::Kill {
        st.app.manager.destroy(&id, EndReason::Killed).await;
        return Ok(axum::Json(view(&st, &sb, &h, "destroyed")).into_response());
    }
    let m = st.app.manager.clone();
    let paused = sb.clone();
    tokio::task::spawn_blocking(move || m.pause_sb(&paused))
        .await
        .map_err(|e| DtError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("stop: {e}")))??;
    Ok(dto(&st, &sb, &h))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Labels {
    labels: BTreeMap<String, String>,
}

/// Replaces the sandbox's labels (the whole set), live.
async fn replace_labels(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    let l: Labels = body(&b)?;
    let sb = st.app.manager.update(&id, Some(l.labels), None)?;
    Ok(axum::Json(json!({ "labels": sb.metadata() })).into_response())
}

/// Sets the auto-stop interval (minutes; 0 turns the idle clock off), live: the idle clock
/// uses it from its next check on. What the clock does at the end (stop, or delete for an
/// ephemeral sandbox) stays as created.
async fn set_autostop(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path((id, interval)): Path<(String, String)>,
) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    let want = interval.parse::<u64>().map_err(|_| DtError::bad("interval must be a non-negative integer"))?;
    let sb = st.app.manager.update(&id, None, Some(want.saturating_mul(60).min(MAX_TIMEOUT_S)))?;
    Ok(dto(&st, &sb, &h))
}

/// Replaces the sandbox's egress policy live (the same three exclusive options as create).
async fn network_settings(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    let n: NetworkSettings = body(&b)?;
    let np = policy(&n)?;
    let sb = st.app.manager.set_network(&id, np).await?;
    Ok(dto(&st, &sb, &h))
}

/// `set_public(bool)`: every port of the sandbox opens without a token (its preview links
/// are public), or is private again (ports made public one by one through Glovebox's own
/// API stay public).
async fn set_public(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path((id, public)): Path<(String, String)>,
) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    let public: bool = public.parse().map_err(|_| DtError::bad("isPublic must be true or false"))?;
    let sb = st.app.manager.get(&id)?;
    crate::http::change_live(&st.app, &id, |ports| ports.set_all_public(&id, public))?;
    Ok(dto(&st, &sb, &h))
}

async fn toolbox_proxy_url(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    st.app.manager.get(&id)?;
    Ok(axum::Json(json!({ "url": toolbox_url(&h) })).into_response())
}

async fn unsupported(
    State(st): State<Daytona>,
    h: HeaderMap,
    Path((id, rest)): Path<(String, String)>,
) -> Result<Response, DtError> {
    caller_for(&st, &h, &id)?;
    st.app.manager.get(&id)?;
    let what = rest.split('/').next().unwrap_or_default();
    Err(DtError::unsupported(&format!("the sandbox operation {what:?}")))
}

async fn unsupported_api(State(st): State<Daytona>, h: HeaderMap, uri: axum::http::Uri) -> Result<Response, DtError> {
    check_key(&st, &h)?;
    Err(DtError::unsupported(&format!("the API endpoint {}", uri.path())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(block: Option<bool>, cidrs: Option<&str>, domains: Option<&str>) -> NetworkSettings {
        NetworkSettings {
            network_block_all: block,
            network_allow_list: cidrs.map(str::to_string),
            domain_allow_list: domains.map(str::to_string),
        }
    }

    #[test]
    fn egress_options_are_exclusive_and_map_to_policies() {
        assert_eq!(policy(&net(None, None, None)).unwrap().mode, NetworkMode::DenyAll);
        assert_eq!(policy(&net(Some(true), None, None)).unwrap().mode, NetworkMode::DenyAll);
        assert_eq!(policy(&net(Some(false), None, None)).unwrap().mode, NetworkMode::AllowAll);
        let p = policy(&net(None, Some("10.0.0.0/8, 192.0.2.7"), None)).unwrap();
        assert_eq!((p.mode, p.allow.len()), (NetworkMode::AllowList, 2));
        let p = policy(&net(Some(false), None, Some("api.good.test"))).unwrap();
        assert_eq!(p.allow, vec![AllowRule::from("api.good.test")]);
        let e = policy(&net(Some(true), Some("10.0.0.0/8"), None)).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("mutually exclusive"));
        assert!(policy(&net(None, Some("10.0.0.0/8"), Some("a.example"))).is_err());
        assert!(policy(&net(None, Some("good.test"), None)).is_err());
    }

    #[test]
    fn unsupported_options_are_refused_by_name() {
        let vol = |sub: Option<&str>| DaytonaVolume {
            volume_id: "v".into(),
            mount_path: "/data".into(),
            subpath: sub.map(str::to_string),
        };
        let req = NewSandbox { volumes: Some(vec![vol(Some("a/b"))]), ..Default::default() };
        let e = refuse_unsupported(&req).unwrap_err();
        assert!(e.message.contains("subpath"), "{}", e.message);
        assert!(refuse_unsupported(&NewSandbox { volumes: Some(vec![vol(None)]), ..Default::default() }).is_ok());
        assert!(refuse_unsupported(&NewSandbox { auto_delete_interval: Some(0), ..Default::default() }).is_ok());
        assert!(refuse_unsupported(&NewSandbox { auto_delete_interval: Some(-1), ..Default::default() }).is_ok());
        assert!(refuse_unsupported(&NewSandbox { auto_delete_interval: Some(5), ..Default::default() }).is_err());
    }
}
