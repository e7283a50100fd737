//! E2B's control plane: create, list, get, kill, timeout, connect, network — over the
//! manager. Field names are E2B's (`templateID`, `envVars`, `allowOut`, …).

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use glovebox_proto::api::{
    AllowRule, CreateSandbox, EndReason, NetworkMode, NetworkPolicy, Sandbox, DEFAULT_TIMEOUT_S,
};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{check_api_key, E2b, RestError, ENVD_VERSION};
use crate::error::Error;
use crate::tenants::Caller;
use crate::util::rfc3339;

/// E2B's name for "every IPv4 address" in allow and deny lists.
const ALL_TRAFFIC: &str = "0.0.0.0/0";

pub fn routes() -> Router<E2b> {
    Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/network", put(set_network))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/refreshes", post(unsupported))
}

/// The control plane's error mapping: a gone sandbox is a plain 404 here (the SDKs turn it
/// into their not-found exceptions).
pub(super) fn cp_error(e: Error) -> RestError {
    match e {
        Error::SandboxNotFound(id) | Error::Gone { id, .. } => {
            RestError::new(StatusCode::NOT_FOUND, format!("sandbox \"{id}\" not found"))
        }
        Error::NotFound { what: "template", name } => {
            RestError::new(StatusCode::NOT_FOUND, format!("template '{name}' not found"))
        }
        Error::TemplateNotBuilt { name, build_with } => {
            RestError::new(StatusCode::NOT_FOUND, format!("template '{name}' not found (build it with {build_with})"))
        }
        e => RestError::from(e),
    }
}

/// Checks the key and that its caller may address sandbox `id` (someone else's sandbox is
/// answered like one that never existed).
pub(super) fn caller_for(st: &E2b, h: &HeaderMap, id: &str) -> Result<Caller, RestError> {
    let caller = check_api_key(st, h)?;
    crate::http::authorize(&st.app.manager, &caller, id)
        .map_err(|_| cp_error(Error::SandboxNotFound(id.to_string())))?;
    Ok(caller)
}

/// A JSON body, with E2B's 400 shape for a malformed one.
pub(super) fn body<T: for<'de> Deserialize<'de> + Default>(b: &Bytes) -> Result<T, RestError> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(b).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, format!("invalid body: {e}")))
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NetworkConfig {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    rules: Option<Value>,
    egress_proxy: Option<Value>,
    dns_servers: Option<Vec<String>>,
    /// Only in updates.
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkConfig>,
    auto_pause: Option<bool>,
    /// `lifecycle.keep_memory`: `false` asks for a filesystem-only pause.
    auto_pause_memory: Option<bool>,
    /// `lifecycle.auto_resume`: whether traffic to a paused sandbox resumes it.
    auto_resume: Option<AutoResume>,
    volume_mounts: Option<Vec<Value>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AutoResume {
    enabled: bool,
}

/// E2B template names to Glovebox's.
fn template_name(t: &str) -> &str {
    match t {
        "" | "base" => "base",
        "code-interpreter" | "code-interpreter-v1" => "code-interpreter",
        other => other,
    }
}

/// E2B's network options as a Glovebox policy.
///
/// E2B lets `allowOut` win over `denyOut`; Glovebox lets deny win. The E2B idiom "nothing
/// but these" (`denyOut: [0.0.0.0/0]` or `allow_internet_access: false`, plus `allowOut`)
/// is Glovebox's allow-list mode; `allow_internet_access: true` is allow-all (minus
/// `denyOut`). When neither says yes, Glovebox's own default applies: deny-all.
fn policy(internet: Option<bool>, net: Option<&NetworkConfig>) -> Result<NetworkPolicy, RestError> {
    let (allow, mut deny) = match net {
        Some(n) => {
            if n.rules.as_ref().is_some_and(|r| !r.is_null() && r != &json!({})) {
                return Err(RestError::new(
                    StatusCode::BAD_REQUEST,
                    "network rules (request transforms) are not supported",
                ));
            }
            if n.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
                return Err(RestError::new(StatusCode::BAD_REQUEST, "an egress proxy is not supported"));
            }
            if n.dns_servers.is_some() {
                return Err(RestError::new(StatusCode::BAD_REQUEST, "custom DNS servers are not supported"));
            }
            (n.allow_out.clone().unwrap_or_default(), n.deny_out.clone().unwrap_or_default())
        }
        None => (Vec::new(), Vec::new()),
    };
    let deny_everything = deny.iter().any(|d| d == ALL_TRAFFIC) || internet != Some(true);
    deny.retain(|d| d != ALL_TRAFFIC);
    let np = if !deny_everything {
        NetworkPolicy { mode: NetworkMode::AllowAll, allow: Vec::new(), deny }
    } else if allow.is_empty() {
        NetworkPolicy { mode: NetworkMode::DenyAll, allow: Vec::new(), deny: Vec::new() }
    } else if allow.iter().any(|a| a == ALL_TRAFFIC) {
        NetworkPolicy { mode: NetworkMode::AllowAll, allow: Vec::new(), deny }
    } else {
        NetworkPolicy { mode: NetworkMode::AllowList, allow: allow.into_iter().map(AllowRule::from).collect(), deny }
    };
    glovebox_proto::policy::parse(&np).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, e))?;
    Ok(np)
}

/// What E2B's `network` looks like for a policy.
fn network_view(np: &NetworkPolicy) -> Value {
    let mut deny = np.deny.clone();
    if np.mode != NetworkMode::AllowAll {
        deny.insert(0, ALL_TRAFFIC.to_string());
    }
    let allow: Vec<&str> = np
        .allow
        .iter()
        .map(|r| match r {
            AllowRule::Rule(s) => s.as_str(),
            AllowRule::Domain(d) => d.domain.as_str(),
        })
        .collect();
    json!({ "allowOut": allow, "denyOut": deny })
}

/// The body create and connect answer with. `domain` is the daemon's preview domain with
/// the port the request came in on, so the SDKs' `get_host(port)` (`{port}-{id}.{domain}`)
/// names the daemon's preview host of that port.
fn created(st: &E2b, s: &Sandbox, h: &HeaderMap) -> Value {
    let token = st.token_for(&s.id);
    let daemon = h.get(axum::http::header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let domain = st.app.manager.ports.domain_via(daemon);
    json!({
        "domain": domain,
        "sandboxID": s.id,
        "templateID": s.template,
        "clientID": "glovebox",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "trafficAccessToken": token,
    })
}

fn listed(s: &Sandbox) -> Value {
    json!({
        "sandboxID": s.id,
        "templateID": s.template,
        "clientID": "glovebox",
        "startedAt": s.created_at,
        "endAt": s.expires_at,
        "cpuCount": (s.limits.cpus.ceil() as u64).max(1),
        "memoryMB": s.limits.memory_mb,
        "diskSizeMB": s.limits.disk_mb,
        "metadata": s.metadata,
        "state": s.state.as_str(),
        "envdVersion": ENVD_VERSION,
    })
}

async fn create(State(st): State<E2b>, h: HeaderMap, b: Bytes) -> Result<Response, RestError> {
    let caller = check_api_key(&st, &h)?;
    let req: NewSandbox = body(&b)?;
    // `mcp` (not read here) configures the gateway a template ships (E2B's `mcp-gateway` template); the SDK
    // starts it itself right after create (`mcp-gateway --config …` in the sandbox). No
    // Glovebox template ships one, so that start fails and the SDK kills the sandbox and
    // raises "Failed to start MCP gateway: …", as E2B does for a template without it.
    if req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(RestError::new(StatusCode::BAD_REQUEST, "volumes are not supported by Glovebox"));
    }
    let network = policy(req.allow_internet_access, req.network.as_ref())?;
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_S);
    // autoPause: at the end of `timeout` without activity the sandbox is paused, not killed
    // (its lifetime is then the longest there is).
    let auto_pause = req.auto_pause == Some(true);
    if auto_pause && req.auto_pause_memory == Some(false) {
        return Err(RestError::new(
            StatusCode::BAD_REQUEST,
            "a filesystem-only pause (keep_memory: false) is not supported by Glovebox: a pause keeps the memory",
        ));
    }
    // A snapshot id starts the sandbox on that snapshot (its files, its template).
    let snapshot = super::snapshots::snapshot_name(&req.template_id)?.map(str::to_string);
    let create = CreateSandbox {
        template: snapshot.is_none().then(|| template_name(&req.template_id).to_string()),
        timeout_s: Some(if auto_pause { glovebox_proto::api::MAX_TIMEOUT_S } else { timeout }),
        resources: Default::default(),
        env: req.env_vars.unwrap_or_default(),
        metadata: req.metadata.unwrap_or_default(),
        network,
        idle_timeout_s: auto_pause.then_some(timeout),
        on_idle: auto_pause.then_some(glovebox_proto::api::OnIdle::Pause),
        volumes: Vec::new(),
        // E2B resumes a paused sandbox on traffic only when asked to (`auto_resume`); an
        // explicit `connect` always does.
        auto_resume: Some(req.auto_resume.is_some_and(|a| a.enabled)),
        snapshot: snapshot.clone(),
        isolation: None,
    };
    if snapshot.is_none() {
        crate::builds::ensure_shipped(&st.app.manager, template_name(&req.template_id)).map_err(cp_error)?;
    }
    let sb = st
        .app
        .manager
        .create_for(&caller.tenant, create)
        .await
        .map_err(|e| super::snapshots::create_error(&req.template_id, e))?;
    Ok((StatusCode::CREATED, axum::Json(created(&st, &sb.view(), &h))).into_response())
}

/// `a=b&c=d` (E2B's `metadata` query: pairs, each side percent-encoded once more).
fn metadata_filter(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(&percent_decode(k)), percent_decode(&percent_decode(v)))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).and_then(|c| hex(*c)), b.get(i + 2).and_then(|c| hex(*c))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn list(
    State(st): State<E2b>,
    h: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, RestError> {
    let caller = check_api_key(&st, &h)?;
    let filters = q.get("metadata").map(|m| metadata_filter(m)).unwrap_or_default();
    let states: Option<Vec<&str>> = q.get("state").map(|s| s.split(',').map(str::trim).collect());
    let template = q.get("template").map(|t| template_name(t).to_string());
    let limit = page_limit(&q)?;
    let started_after = match q.get("startedAfter") {
        Some(t) => Some(
            crate::util::parse_rfc3339(t)
                .ok_or_else(|| RestError::new(StatusCode::BAD_REQUEST, "startedAfter must be an RFC 3339 time"))?,
        ),
        None => None,
    };
    // Newest first unless `order=asc`; the next token is the last id of a page.
    let mut all = st.app.manager.list_for(&caller);
    if q.get("order").is_none_or(|o| o != "asc") {
        all.reverse();
    }
    let after = match q.get("nextToken") {
        Some(t) => all.iter().position(|s| &s.id == t).map(|i| i + 1).unwrap_or(all.len()),
        None => 0,
    };
    let page: Vec<&Sandbox> = all[after..]
        .iter()
        .filter(|s| states.as_ref().is_none_or(|w| w.contains(&s.state.as_str())))
        .filter(|s| filters.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .filter(|s| template.as_ref().is_none_or(|t| &s.template == t))
        .filter(|s| started_after.is_none_or(|a| crate::util::parse_rfc3339(&s.created_at).is_some_and(|c| c >= a)))
        .take(limit.saturating_add(1))
        .collect();
    let more = page.len() > limit;
    let page = &page[..page.len().min(limit)];
    let mut r = axum::Json(page.iter().map(|s| listed(s)).collect::<Vec<_>>()).into_response();
    if let Some(last) = page.last().filter(|_| more) {
        if let Ok(v) = axum::http::HeaderValue::from_str(&last.id) {
            r.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(r)
}

async fn get_one(State(st): State<E2b>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, RestError> {
    caller_for(&st, &h, &id)?;
    let s = st.app.manager.get(&id).map_err(cp_error)?.view();
    let mut v = listed(&s);
    v["envdAccessToken"] = json!(st.token_for(&s.id));
    v["allowInternetAccess"] = json!(s.network.mode == NetworkMode::AllowAll);
    v["network"] = network_view(&s.network);
    Ok(axum::Json(v).into_response())
}

async fn kill(State(st): State<E2b>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, RestError> {
    caller_for(&st, &h, &id)?;
    st.app.manager.get(&id).map_err(cp_error)?;
    st.app.manager.destroy(&id, EndReason::Killed).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Timeout {
    timeout: Option<u64>,
}

async fn set_timeout(
    State(st): State<E2b>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, RestError> {
    caller_for(&st, &h, &id)?;
    let t: Timeout = body(&b)?;
    let Some(secs) = t.timeout else {
        return Err(RestError::new(StatusCode::BAD_REQUEST, "timeout is required"));
    };
    let sb = st.app.manager.get(&id).map_err(cp_error)?;
    if sb.on_idle == glovebox_proto::api::OnIdle::Pause {
        // An auto-pause sandbox's E2B timeout is its idle clock (see `create`); 0 means "time
        // out now", which pauses it.
        if secs == 0 {
            let m = st.app.manager.clone();
            tokio::task::spawn_blocking(move || m.pause_sb(&sb))
                .await
                .map_err(|e| RestError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("pause: {e}")))?
                .map_err(cp_error)?;
        } else {
            st.app.manager.update(&id, None, Some(secs)).map_err(cp_error)?;
        }
    } else if secs == 0 {
        // "Time out now": the sandbox ends as its lifetime clock would end it.
        st.app.manager.destroy(&id, EndReason::Timeout).await;
    } else {
        st.app.manager.set_timeout(&id, secs).map_err(cp_error)?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `pause`: freezes the sandbox (204); one already paused answers 409, as E2B's does (its
/// SDKs read that as "already paused"). The body's snapshot options do not apply: a pause
/// here always keeps the memory.
async fn pause(State(st): State<E2b>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, RestError> {
    caller_for(&st, &h, &id)?;
    let sb = st.app.manager.get(&id).map_err(cp_error)?;
    let m = st.app.manager.clone();
    let paused = tokio::task::spawn_blocking(move || m.pause_sb(&sb))
        .await
        .map_err(|e| RestError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("pause: {e}")))?
        .map_err(cp_error)?;
    if !paused {
        return Err(RestError::new(StatusCode::CONFLICT, format!("sandbox {id} is already paused")));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `resume` (E2B's older call; `connect` does the same): resumes a paused sandbox and
/// answers its connection details (201).
async fn resume(State(st): State<E2b>, h: HeaderMap, Path(id): Path<String>, b: Bytes) -> Result<Response, RestError> {
    let (s, _) = wake(&st, &h, &id, &b)?;
    Ok((StatusCode::CREATED, axum::Json(created(&st, &s, &h))).into_response())
}

/// `connect`: the sandbox's connection details, resuming it if it was paused (201, else
/// 200); a `timeout` longer than what is left extends its life (never shortens it, as in E2B).
async fn connect(State(st): State<E2b>, h: HeaderMap, Path(id): Path<String>, b: Bytes) -> Result<Response, RestError> {
    let (s, resumed) = wake(&st, &h, &id, &b)?;
    let status = if resumed { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(created(&st, &s, &h))).into_response())
}

/// Resumes the sandbox `id` if paused (whether it was) and applies the body's `timeout`.
fn wake(st: &E2b, h: &HeaderMap, id: &str, b: &Bytes) -> Result<(Sandbox, bool), RestError> {
    caller_for(st, h, id)?;
    let t: Timeout = body(b)?;
    let sb = st.app.manager.get(id).map_err(cp_error)?;
    let resumed = st.app.manager.resume_sb(&sb).map_err(cp_error)?;
    let mut s = sb.view();
    if let Some(secs) = t.timeout {
        let wanted = rfc3339(std::time::SystemTime::now() + std::time::Duration::from_secs(secs));
        // Same format, so the strings order like the instants.
        if wanted > s.expires_at {
            s = st.app.manager.set_timeout(id, secs).map_err(cp_error)?.view();
        }
    }
    Ok((s, resumed))
}

async fn set_network(
    State(st): State<E2b>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, RestError> {
    caller_for(&st, &h, &id)?;
    let n: NetworkConfig = body(&b)?;
    let np = policy(n.allow_internet_access, Some(&n))?;
    st.app.manager.set_network(&id, np).await.map_err(cp_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// How far past a range's end a sample still counts: E2B aligns metrics to 5 s collection
/// buckets and takes whole seconds.
const METRICS_BUCKET_S: u64 = 5;

/// The sandbox's metrics: one sample taken now (no history is kept), returned when it falls
/// in the asked range (`start`, `end`: Unix seconds), so a range before the sandbox existed
/// is empty.
async fn metrics(
    State(st): State<E2b>,
    h: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, RestError> {
    caller_for(&st, &h, &id)?;
    let bound = |k: &str| match q.get(k) {
        Some(v) => v
            .parse::<u64>()
            .map(Some)
            .map_err(|_| RestError::new(StatusCode::BAD_REQUEST, format!("{k} must be Unix seconds"))),
        None => Ok(None),
    };
    let (start, end) = (bound("start")?, bound("end")?);
    let sb = st.app.manager.get(&id).map_err(cp_error)?;
    let now = std::time::SystemTime::now();
    let unix = now.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    if start.is_some_and(|s| unix < s) || end.is_some_and(|e| unix > e + METRICS_BUCKET_S) {
        return Ok(axum::Json(json!([])).into_response());
    }
    let m = sb.metrics();
    Ok(axum::Json(json!([{
        "timestamp": rfc3339(now),
        "timestampUnix": unix,
        "cpuCount": (sb.limits.cpus.ceil() as u64).max(1),
        "cpuUsedPct": m.cpu_percent,
        "memUsed": m.memory_used_bytes,
        "memTotal": m.memory_limit_bytes,
        "memCache": 0,
        "diskUsed": m.disk_used_bytes,
        "diskTotal": m.disk_limit_bytes,
    }]))
    .into_response())
}

async fn unsupported(State(st): State<E2b>, h: HeaderMap) -> Result<Response, RestError> {
    check_api_key(&st, &h)?;
    Err(RestError::new(
        StatusCode::NOT_IMPLEMENTED,
        "refreshes are not supported by Glovebox (set_timeout extends a sandbox's life)",
    ))
}

/// E2B's fork body: children's lifetime in seconds, and how many.
#[derive(Debug, Default, Deserialize)]
struct ForkBody {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// `fork`: the native fork (files, policy, limits, env and labels copied; processes are not),
/// answered as E2B's list of `{sandbox}` results (201). All or nothing here: a child that
/// cannot start fails the whole request.
async fn fork(State(st): State<E2b>, h: HeaderMap, Path(id): Path<String>, b: Bytes) -> Result<Response, RestError> {
    let caller = caller_for(&st, &h, &id)?;
    let f: ForkBody = body(&b)?;
    let (_, kids) = st.app.manager.fork(&caller.tenant, &id, f.count.unwrap_or(1)).await.map_err(cp_error)?;
    let mut out = Vec::new();
    for k in kids {
        let s = match f.timeout {
            Some(secs) => st.app.manager.set_timeout(&k.id, secs).map_err(cp_error)?.view(),
            None => k.view(),
        };
        out.push(json!({ "sandbox": created(&st, &s, &h) }));
    }
    Ok((StatusCode::CREATED, axum::Json(Value::Array(out))).into_response())
}

/// A listing's `limit` query parameter: a positive integer, unbounded when absent.
pub(super) fn page_limit(q: &BTreeMap<String, String>) -> Result<usize, RestError> {
    match q.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| *l > 0)
            .ok_or_else(|| RestError::new(StatusCode::BAD_REQUEST, "limit must be a positive integer")),
        None => Ok(usize::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(allow: &[&str], deny: &[&str]) -> NetworkConfig {
        NetworkConfig {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn network_options_map_to_policies() {
        assert_eq!(policy(None, None).unwrap().mode, NetworkMode::DenyAll);
        assert_eq!(policy(Some(false), None).unwrap().mode, NetworkMode::DenyAll);
        let all = policy(Some(true), Some(&net(&[], &["198.51.100.0/24"]))).unwrap();
        assert_eq!((all.mode, all.deny.clone()), (NetworkMode::AllowAll, vec!["198.51.100.0/24".to_string()]));
        let only = policy(None, Some(&net(&["203.0.113.10", "api.good.test"], &[ALL_TRAFFIC]))).unwrap();
        assert_eq!(only.mode, NetworkMode::AllowList);
        assert_eq!(only.allow, vec![AllowRule::from("203.0.113.10"), AllowRule::from("api.good.test")]);
        assert!(only.deny.is_empty());
        let closed = policy(Some(false), Some(&net(&["203.0.113.10"], &[]))).unwrap();
        assert_eq!(closed.mode, NetworkMode::AllowList);
        assert!(policy(Some(true), Some(&net(&["not a rule!"], &[ALL_TRAFFIC]))).is_err());
    }

    #[test]
    fn metadata_filters_are_decoded_twice() {
        // Python: urlencode({quote(k): quote(v)}), then the query encoding (undone by axum).
        let f = metadata_filter("user=alice%25201&run=r%252F1");
        assert_eq!(f.get("user").map(String::as_str), Some("alice 1"));
        assert_eq!(f.get("run").map(String::as_str), Some("r/1"));
    }

    #[test]
    fn templates_map() {
        assert_eq!(template_name("code-interpreter-v1"), "code-interpreter");
        assert_eq!(template_name("base"), "base");
        assert_eq!(template_name("mine"), "mine");
    }
}
