//! Sandboxes and sessions: create, get, list, update, stop, the live network policy and the
//! timeout — over the manager. Field names are Vercel's (`vcpus`, `networkPolicy`, …); times
//! are Unix milliseconds and durations milliseconds, as the SDK reads them.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{
    AllowRule, CreateSandbox, DomainAllow, EndReason, NetworkMode, NetworkPolicy, Resources, Sandbox, SandboxState,
    MAX_MEMORY_MB, MAX_TIMEOUT_S,
};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, check_key, now_ms, ports, sandbox, ApiError, Vercel, CWD};
use crate::util::parse_rfc3339;

/// Vercel's default sandbox lifetime (5 minutes), in ms.
const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// Vercel's memory rule: 2 GiB per vCPU.
const MB_PER_VCPU: u64 = 2048;
/// The metadata key the runtime a sandbox was asked with is kept under.
const RUNTIME_KEY: &str = "vercel.runtime";
/// The region every sandbox reports.
const REGION: &str = "glovebox";

#[derive(Deserialize, Default)]
#[serde(default)]
struct Res {
    vcpus: Option<f64>,
    memory: Option<u64>,
}

/// A create request. `projectId` (and the `teamId` query) are not read: Glovebox has no
/// teams or projects, the key decides who owns a sandbox.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NewSandbox {
    ports: Option<Value>,
    source: Option<Value>,
    timeout: Option<u64>,
    resources: Option<Res>,
    runtime: Option<String>,
    image: Option<String>,
    name: Option<String>,
    persistent: Option<bool>,
    network_policy: Option<Value>,
    network_id: Option<Value>,
    env: Option<BTreeMap<String, String>>,
    tags: Option<BTreeMap<String, String>>,
    snapshot_expiration: Option<Value>,
    keep_last_snapshots: Option<Value>,
    mounts: Option<Value>,
    region: Option<Value>,
    failover_regions: Option<Value>,
}

/// Vercel's runtimes, all served by the `base` template (the host's own /usr: whatever
/// `node` and `python3` the host has).
fn template_for(runtime: Option<&str>, image: Option<&str>) -> Result<String, ApiError> {
    match (runtime, image) {
        (Some(_), Some(_)) => Err(ApiError::bad("`runtime` and `image` cannot be used together")),
        (None, Some(i)) if !i.is_empty() => Ok(i.to_string()),
        (None | Some("node22" | "node24" | "python3.13"), _) => Ok("base".to_string()),
        (Some(r), _) => {
            Err(ApiError::bad(format!("unknown runtime {r:?} (Glovebox has node22, node24 and python3.13)")))
        }
    }
}

/// A request field Glovebox does not have: refused when given.
fn refuse_if(given: bool, what: &str) -> Result<(), ApiError> {
    if given {
        Err(ApiError::unsupported(what))
    } else {
        Ok(())
    }
}

fn is_set(v: &Option<Value>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_null() && v != &json!({}) && v != &json!([]))
}

/// Vercel's network policy (`{"mode"}` or `{"allow", "subnets"}`) as a Glovebox policy.
///
/// `allow` is a list of domains, or a map from domain to rules whose `transform` headers the
/// proxy injects (credential brokering; the values never enter the sandbox). `"*"` alone is
/// allow-all. Rules that match on requests, forward or answer directly are refused.
pub(super) fn policy(v: &Value) -> Result<NetworkPolicy, ApiError> {
    let bad = |m: String| ApiError::bad(format!("networkPolicy: {m}"));
    let obj = v.as_object().ok_or_else(|| bad("must be an object".into()))?;
    if let Some(mode) = obj.get("mode") {
        return match mode.as_str() {
            Some("allow-all") => Ok(NetworkPolicy { mode: NetworkMode::AllowAll, ..Default::default() }),
            Some("deny-all") => Ok(NetworkPolicy { mode: NetworkMode::DenyAll, ..Default::default() }),
            _ => Err(bad(format!("unknown mode {mode}"))),
        };
    }
    for k in obj.keys() {
        if k != "allow" && k != "subnets" {
            return Err(bad(format!("unknown field {k:?}")));
        }
    }
    let mut allow = Vec::new();
    let mut everything = false;
    match obj.get("allow") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for d in list {
                let d = d.as_str().ok_or_else(|| bad("allow entries must be strings".into()))?;
                if d == "*" {
                    everything = true;
                } else {
                    allow.push(AllowRule::from(d));
                }
            }
        }
        Some(Value::Object(map)) => {
            for (domain, rules) in map {
                let rules = rules.as_array().ok_or_else(|| bad(format!("rules of {domain:?} must be a list")))?;
                let mut headers = BTreeMap::new();
                for r in rules {
                    let r = r.as_object().ok_or_else(|| bad("a rule must be an object".into()))?;
                    for k in r.keys() {
                        match k.as_str() {
                            "transform" => {}
                            "match" | "forwardURL" | "response" => {
                                return Err(ApiError::unsupported(&format!("a network rule's {k:?}")))
                            }
                            other => return Err(bad(format!("unknown rule field {other:?}"))),
                        }
                    }
                    let transforms = r.get("transform").and_then(Value::as_array).cloned().unwrap_or_default();
                    for t in transforms {
                        let h = t.get("headers").and_then(Value::as_object).cloned().unwrap_or_default();
                        for (name, value) in h {
                            let value =
                                value.as_str().ok_or_else(|| bad(format!("header {name:?} must be a string")))?;
                            headers.insert(name, value.to_string());
                        }
                    }
                }
                if domain == "*" {
                    if !headers.is_empty() {
                        return Err(ApiError::unsupported("brokering headers for every domain (\"*\")"));
                    }
                    everything = true;
                } else if headers.is_empty() {
                    allow.push(AllowRule::from(domain.as_str()));
                } else {
                    allow.push(AllowRule::Domain(DomainAllow { domain: domain.clone(), inject_headers: headers }));
                }
            }
        }
        Some(_) => return Err(bad("allow must be a list or an object".into())),
    }
    let strings = |k: &str| -> Result<Vec<String>, ApiError> {
        let Some(v) = obj.get("subnets").and_then(|s| s.get(k)) else { return Ok(Vec::new()) };
        serde_json::from_value(v.clone()).map_err(|_| bad(format!("subnets.{k} must be a list of CIDRs")))
    };
    let (subnets_allow, deny) = (strings("allow")?, strings("deny")?);
    allow.extend(subnets_allow.into_iter().map(AllowRule::from));
    let np = if everything {
        if allow.iter().any(|r| matches!(r, AllowRule::Domain(_))) {
            return Err(ApiError::unsupported("brokered domains together with \"*\" (list the domains instead)"));
        }
        NetworkPolicy { mode: NetworkMode::AllowAll, allow: Vec::new(), deny }
    } else if allow.is_empty() {
        if !deny.is_empty() {
            return Err(bad("subnets.deny needs something allowed".into()));
        }
        NetworkPolicy { mode: NetworkMode::DenyAll, allow, deny }
    } else {
        NetworkPolicy { mode: NetworkMode::AllowList, allow, deny }
    };
    glovebox_proto::policy::parse(&np).map_err(|e| bad(e.to_string()))?;
    Ok(np)
}

/// A Glovebox policy as Vercel's API shows one: a mode, or the "custom" form listing the
/// allowed domains and, for brokered ones, the header names (never values).
fn policy_view(np: &NetworkPolicy) -> Value {
    match np.mode {
        NetworkMode::AllowAll if np.deny.is_empty() => json!({ "mode": "allow-all" }),
        NetworkMode::DenyAll => json!({ "mode": "deny-all" }),
        _ => {
            let mut domains = Vec::new();
            let mut cidrs = Vec::new();
            let mut injection = Vec::new();
            for r in &np.allow {
                match r {
                    AllowRule::Rule(s) if s.parse::<std::net::IpAddr>().is_ok() || s.contains('/') => {
                        cidrs.push(s.clone())
                    }
                    AllowRule::Rule(s) => domains.push(s.clone()),
                    AllowRule::Domain(d) => {
                        domains.push(d.domain.clone());
                        injection.push(
                            json!({ "domain": d.domain, "headerNames": d.inject_headers.keys().collect::<Vec<_>>() }),
                        );
                    }
                }
            }
            if np.mode == NetworkMode::AllowAll {
                domains.push("*".into());
            }
            json!({
                "mode": "custom",
                "allowedDomains": domains,
                "allowedCIDRs": cidrs,
                "deniedCIDRs": np.deny,
                "injectionRules": injection,
            })
        }
    }
}

fn ms_of(t: &str) -> u64 {
    parse_rfc3339(t).map_or(0, |s| (s * 1000.0) as u64)
}

fn status(s: SandboxState) -> &'static str {
    match s {
        SandboxState::Starting => "pending",
        // A paused sandbox resumes on any request: running, as far as the SDK can tell.
        SandboxState::Running | SandboxState::Paused => "running",
        SandboxState::Stopped => "stopped",
        SandboxState::Killed => "failed",
    }
}

fn runtime_of(s: &Sandbox) -> Value {
    s.metadata.get(RUNTIME_KEY).map_or(Value::Null, |r| json!(r))
}

/// The session (Vercel's running VM) that a Glovebox sandbox is.
fn session(s: &Sandbox, status_override: Option<&str>) -> Value {
    let created = ms_of(&s.created_at);
    let timeout = ms_of(&s.expires_at).saturating_sub(created);
    let mut v = json!({
        "id": s.id,
        "memory": s.limits.memory_mb,
        "vcpus": s.limits.cpus,
        "region": REGION,
        "timeout": timeout,
        "status": status_override.unwrap_or(status(s.state)),
        "requestedAt": created,
        "startedAt": created,
        "createdAt": created,
        "updatedAt": now_ms(),
        "cwd": CWD,
        "networkPolicy": policy_view(&s.network),
    });
    if let Some(r) = s.metadata.get(RUNTIME_KEY) {
        v["runtime"] = json!(r);
    }
    if status_override == Some("stopped") {
        v["stoppedAt"] = json!(now_ms());
    }
    v
}

/// The sandbox (Vercel's durable name and config) that a Glovebox sandbox is.
fn sandbox_view(s: &Sandbox, status_override: Option<&str>) -> Value {
    let created = ms_of(&s.created_at);
    let tags: BTreeMap<&String, &String> = s.metadata.iter().filter(|(k, _)| k.as_str() != RUNTIME_KEY).collect();
    let mut v = json!({
        "name": s.id,
        "persistent": false,
        "region": REGION,
        "vcpus": s.limits.cpus,
        "memory": s.limits.memory_mb,
        "timeout": ms_of(&s.expires_at).saturating_sub(created),
        "networkPolicy": policy_view(&s.network),
        "createdAt": created,
        "updatedAt": now_ms(),
        "currentSessionId": s.id,
        "status": status_override.unwrap_or(status(s.state)),
        "cwd": CWD,
        "tags": tags,
    });
    if let Value::String(r) = runtime_of(s) {
        v["runtime"] = json!(r);
    }
    v
}

fn full(st: &Vercel, h: &HeaderMap, s: &Sandbox) -> Value {
    json!({ "sandbox": sandbox_view(s, None), "session": session(s, None), "routes": ports::routes(st, h, &s.id) })
}

/// A request's `ports`, checked (none given: none).
fn ports_of(v: &Option<Value>) -> Result<Option<Vec<u16>>, ApiError> {
    match v {
        Some(v) if !v.is_null() => ports::parse(v).map(Some),
        _ => Ok(None),
    }
}

pub async fn create(State(st): State<Vercel>, h: HeaderMap, b: Bytes) -> Result<Response, ApiError> {
    let caller = check_key(&st, &h)?;
    let req: NewSandbox = body(&b)?;
    let exposed = ports_of(&req.ports)?;
    refuse_if(is_set(&req.source), "a source (git, tarball or snapshot)")?;
    refuse_if(req.name.as_ref().is_some_and(|n| !n.is_empty()), "naming a sandbox (its name is its Glovebox id)")?;
    refuse_if(req.persistent == Some(true), "a persistent sandbox (stop ends it; pass persistent: false)")?;
    refuse_if(is_set(&req.network_id), "networkId")?;
    refuse_if(is_set(&req.snapshot_expiration) || is_set(&req.keep_last_snapshots), "snapshots")?;
    refuse_if(is_set(&req.mounts), "drives (mounts)")?;
    refuse_if(is_set(&req.region) || is_set(&req.failover_regions), "choosing a region")?;
    let template = template_for(req.runtime.as_deref(), req.image.as_deref())?;
    let network = match &req.network_policy {
        Some(v) if !v.is_null() => policy(v)?,
        // Vercel's default: the internet is open.
        _ => NetworkPolicy { mode: NetworkMode::AllowAll, ..Default::default() },
    };
    let timeout_ms = req.timeout.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_S * 1000 {
        return Err(ApiError::bad(format!("timeout must be between 1 and {} ms", MAX_TIMEOUT_S * 1000)));
    }
    let resources = match req.resources {
        Some(r) => {
            let memory = match (r.memory, r.vcpus) {
                (Some(m), _) => Some(m),
                (None, Some(v)) if v.is_finite() && v > 0.0 => {
                    Some(((v * MB_PER_VCPU as f64) as u64).min(MAX_MEMORY_MB))
                }
                _ => None,
            };
            Resources { cpus: r.vcpus, memory_mb: memory, ..Default::default() }
        }
        None => Resources::default(),
    };
    let mut metadata = req.tags.unwrap_or_default();
    if metadata.contains_key(RUNTIME_KEY) {
        return Err(ApiError::bad(format!("tag {RUNTIME_KEY:?} is reserved")));
    }
    if let Some(r) = &req.runtime {
        metadata.insert(RUNTIME_KEY.into(), r.clone());
    }
    let create = CreateSandbox {
        template: Some(template.clone()),
        timeout_s: Some(timeout_ms.div_ceil(1000)),
        resources,
        env: req.env.unwrap_or_default(),
        metadata,
        network,
        idle_timeout_s: None,
        on_idle: None,
        volumes: Vec::new(),
        auto_resume: None,
        snapshot: None,
        isolation: None,
    };
    let m = &st.app.manager;
    crate::builds::ensure_shipped(m, &template)?;
    let sb = m.create_for(&caller.tenant, create).await?;
    // The working directory every command starts in.
    if let Err(e) = crate::ops::make_dir(m, &sb, CWD.to_string(), None).await {
        m.destroy(&sb.id, EndReason::Error).await;
        return Err(e.into());
    }
    if let Some(p) = exposed {
        ports::set(&st, &sb.id, &p)?;
    }
    Ok(axum::Json(full(&st, &h, &sb.view())).into_response())
}

pub async fn get_one(State(st): State<Vercel>, h: HeaderMap, Path(name): Path<String>) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &name).map_err(|e| match e.status.as_u16() {
        // No resuming here: an ended sandbox is gone for good.
        410 => ApiError::new(axum::http::StatusCode::NOT_FOUND, "sandbox_not_found", e.message),
        _ => e,
    })?;
    Ok(axum::Json(full(&st, &h, &sb.view())).into_response())
}

pub async fn get_session(State(st): State<Vercel>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, ApiError> {
    let s = sandbox(&st, &h, &id)?.view();
    Ok(axum::Json(json!({ "session": session(&s, None), "routes": ports::routes(&st, &h, &id) })).into_response())
}

pub async fn list(State(st): State<Vercel>, h: HeaderMap) -> Result<Response, ApiError> {
    let caller = check_key(&st, &h)?;
    let all: Vec<Value> = st.app.manager.list_for(&caller).iter().map(|s| sandbox_view(s, None)).collect();
    Ok(axum::Json(json!({ "pagination": { "count": all.len(), "next": null }, "sandboxes": all })).into_response())
}

pub async fn list_sessions(State(st): State<Vercel>, h: HeaderMap) -> Result<Response, ApiError> {
    let caller = check_key(&st, &h)?;
    let all: Vec<Value> = st.app.manager.list_for(&caller).iter().map(|s| session(s, None)).collect();
    Ok(axum::Json(json!({ "pagination": { "count": all.len(), "next": null }, "sessions": all })).into_response())
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Update {
    persistent: Option<bool>,
    resources: Option<Value>,
    timeout: Option<u64>,
    network_policy: Option<Value>,
    network_id: Option<Value>,
    tags: Option<Value>,
    ports: Option<Value>,
    snapshot_expiration: Option<Value>,
    keep_last_snapshots: Option<Value>,
    current_snapshot_id: Option<Value>,
    region: Option<Value>,
    failover_regions: Option<Value>,
    mounts: Option<Value>,
}

/// `PATCH`: the network policy applies to the running sandbox at once; what Glovebox cannot
/// change on a live sandbox (resources, tags, …) is refused.
pub async fn update(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path(name): Path<String>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &name)?;
    let u: Update = body(&b)?;
    refuse_if(u.persistent == Some(true), "a persistent sandbox")?;
    refuse_if(is_set(&u.resources), "changing resources of a running sandbox")?;
    refuse_if(is_set(&u.tags), "changing tags")?;
    refuse_if(is_set(&u.network_id), "networkId")?;
    refuse_if(
        is_set(&u.snapshot_expiration) || is_set(&u.keep_last_snapshots) || is_set(&u.current_snapshot_id),
        "snapshots",
    )?;
    refuse_if(is_set(&u.region) || is_set(&u.failover_regions), "choosing a region")?;
    refuse_if(is_set(&u.mounts), "drives (mounts)")?;
    let np = match &u.network_policy {
        Some(v) if !v.is_null() => Some(policy(v)?),
        _ => None,
    };
    // As on Vercel, `timeout` is the sandbox's setting for sessions to come and does not
    // move the running one's deadline: the SDK follows an increase with `extend-timeout`.
    // Glovebox has no next session, so only the bounds are checked.
    if u.timeout.is_some_and(|t| t == 0 || t > MAX_TIMEOUT_S * 1000) {
        return Err(ApiError::bad(format!("timeout must be between 1 and {} ms", MAX_TIMEOUT_S * 1000)));
    }
    let exposed = ports_of(&u.ports)?;
    if let Some(np) = np {
        st.app.manager.set_network(&sb.id, np).await?;
    }
    if let Some(p) = exposed {
        ports::set(&st, &sb.id, &p)?;
    }
    let routes = ports::routes(&st, &h, &sb.id);
    Ok(axum::Json(json!({ "sandbox": sandbox_view(&sb.view(), None), "routes": routes })).into_response())
}

/// A lifetime of `ms` from the sandbox's creation, as Vercel counts it.
fn set_timeout_ms(st: &Vercel, id: &str, ms: u64) -> Result<(), ApiError> {
    let sb = st.app.manager.get(id)?;
    let created = ms_of(&sb.view().created_at);
    let end = created.saturating_add(ms);
    let left = end.saturating_sub(now_ms());
    if ms == 0 || ms > MAX_TIMEOUT_S * 1000 || left == 0 {
        return Err(ApiError::bad(format!(
            "timeout must end in the future and be at most {} ms",
            MAX_TIMEOUT_S * 1000
        )));
    }
    st.app.manager.set_timeout(id, left.div_ceil(1000))?;
    Ok(())
}

pub async fn delete(State(st): State<Vercel>, h: HeaderMap, Path(name): Path<String>) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &name)?;
    let s = sb.view();
    st.app.manager.destroy(&sb.id, EndReason::Killed).await;
    st.forget(&sb.id);
    Ok(axum::Json(json!({ "sandbox": sandbox_view(&s, Some("stopped")) })).into_response())
}

/// `stop`: the sandbox ends (Glovebox keeps nothing of a stopped sandbox).
pub async fn stop(State(st): State<Vercel>, h: HeaderMap, Path(id): Path<String>) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let s = sb.view();
    st.app.manager.destroy(&sb.id, EndReason::Killed).await;
    st.forget(&sb.id);
    Ok(axum::Json(json!({ "session": session(&s, Some("stopped")), "sandbox": sandbox_view(&s, Some("stopped")) }))
        .into_response())
}

/// The live network update: the new policy applies to new connections at once.
pub async fn network_policy(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let v: Value = body(&b)?;
    let np = policy(&v)?;
    let sb = st.app.manager.set_network(&sb.id, np).await?;
    Ok(axum::Json(json!({ "session": session(&sb.view(), None) })).into_response())
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Extend {
    duration: Option<u64>,
}

pub async fn extend_timeout(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let e: Extend = body(&b)?;
    let Some(d) = e.duration.filter(|d| *d > 0) else {
        return Err(ApiError::bad("duration (ms, > 0) is required"));
    };
    let s = sb.view();
    let current = ms_of(&s.expires_at).saturating_sub(ms_of(&s.created_at));
    set_timeout_ms(&st, &sb.id, current.saturating_add(d))?;
    Ok(axum::Json(json!({ "session": session(&st.app.manager.get(&sb.id)?.view(), None) })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_map() {
        assert_eq!(policy(&json!({"mode": "deny-all"})).unwrap().mode, NetworkMode::DenyAll);
        assert_eq!(policy(&json!({"mode": "allow-all"})).unwrap().mode, NetworkMode::AllowAll);
        assert!(policy(&json!({"mode": "sometimes"})).is_err());
        let list = policy(&json!({"allow": ["api.good.test", "*.other.test"]})).unwrap();
        assert_eq!(list.mode, NetworkMode::AllowList);
        assert_eq!(list.allow, vec![AllowRule::from("api.good.test"), AllowRule::from("*.other.test")]);
        let brokered =
            policy(&json!({"allow": {"api.good.test": [{"transform": [{"headers": {"Authorization": "Bearer s"}}]}]}}))
                .unwrap();
        match &brokered.allow[0] {
            AllowRule::Domain(d) => {
                assert_eq!(d.inject_headers.get("Authorization").map(String::as_str), Some("Bearer s"))
            }
            other => panic!("{other:?}"),
        }
        let view = policy_view(&brokered);
        assert_eq!(view["injectionRules"][0]["headerNames"], json!(["Authorization"]));
        assert!(!view.to_string().contains("Bearer s"), "values are never shown");
        assert!(policy(&json!({"allow": {"a.test": [{"forwardURL": "http://x"}]}})).is_err());
        assert!(policy(&json!({"allow": {"*": [{"transform": [{"headers": {"A": "b"}}]}]}})).is_err());
        assert_eq!(policy(&json!({"allow": ["*"]})).unwrap().mode, NetworkMode::AllowAll);
        assert_eq!(policy(&json!({})).unwrap().mode, NetworkMode::DenyAll);
        assert!(policy(&json!({"allow": ["not a domain!"]})).is_err());
    }

    #[test]
    fn runtimes_map_to_templates() {
        assert_eq!(template_for(Some("node22"), None).unwrap(), "base");
        assert_eq!(template_for(Some("python3.13"), None).unwrap(), "base");
        assert_eq!(template_for(None, None).unwrap(), "base");
        assert_eq!(template_for(None, Some("code-interpreter")).unwrap(), "code-interpreter");
        assert!(template_for(Some("ruby3"), None).is_err());
    }
}
