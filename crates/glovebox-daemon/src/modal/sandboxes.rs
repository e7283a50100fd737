//! Sandboxes: create (V1 and V2 calls alike), task id, wait (a long poll on the sandbox's
//! end), terminate, list, tags, and the command router's address — over the manager.
//!
//! A Modal sandbox is one Glovebox sandbox; its id is the Glovebox id, its task id
//! `ta-<id>V` (the client reads the trailing `V` as "a V2 sandbox's task"). The app it was
//! created in, its working directory and its entrypoint are kept as metadata labels under
//! `modal.` (hidden from its tags).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use glovebox_proto::api::{AllowRule, CreateSandbox, EndReason, NetworkMode, NetworkPolicy, Resources};
use tonic::{Request, Response, Status};

use super::pb::api;
use super::pb::api::generic_result::GenericStatus;
use super::{caller_of, result, status, tag_map, unsupported, Modal};
use crate::manager::Sb;
use crate::tenants::Caller;

/// Labels this front-end keeps on a sandbox (not shown as tags).
pub const APP_KEY: &str = "modal.app_id";
pub const WORKDIR_KEY: &str = "modal.workdir";
pub const IMAGE_KEY: &str = "modal.image_id";
/// Longest a `SandboxWait` long poll is held.
const MAX_WAIT: Duration = Duration::from_secs(55);

/// The host:port the client reached the daemon at (`:authority`), set by `route`: the
/// command router's URL points there.
#[derive(Clone)]
pub struct Authority(pub String);

/// A Glovebox sandbox id as Modal shows it (the client checks the `sb` prefix).
pub fn modal_id(sandbox: &str) -> String {
    format!("sb-{sandbox}")
}

/// The Glovebox id inside a Modal sandbox id (`sb-<id>`), or the id as given.
pub fn glovebox_id(id: &str) -> &str {
    id.strip_prefix("sb-").unwrap_or(id)
}

pub fn task_id(sandbox: &str) -> String {
    format!("ta-{sandbox}V")
}

/// The sandbox id inside a task id (`ta-<id>V`), or the id as given.
pub fn sandbox_of_task(task: &str) -> &str {
    task.strip_prefix("ta-").and_then(|t| t.strip_suffix('V')).unwrap_or(task)
}

fn user_tags(md: &BTreeMap<String, String>) -> Vec<api::SandboxTag> {
    md.iter()
        .filter(|(k, _)| !k.starts_with("modal."))
        .map(|(k, v)| api::SandboxTag { tag_name: k.clone(), tag_value: v.clone() })
        .collect()
}

/// Modal's network access as a Glovebox policy: open (Modal's default) is allow-all,
/// blocked deny-all, an allow list of CIDRs and domains an allow-list.
fn policy(def: &api::Sandbox) -> Result<NetworkPolicy, Status> {
    use api::network_access::NetworkAccessType as T;
    let access = def.network_access.clone().unwrap_or_default();
    let kind = T::try_from(access.network_access_type).unwrap_or(T::Unspecified);
    let np = if def.block_network || kind == T::Blocked {
        NetworkPolicy { mode: NetworkMode::DenyAll, ..Default::default() }
    } else if kind == T::Allowlist {
        let allow: Vec<AllowRule> =
            access.allowed_cidrs.iter().chain(&access.allowed_domains).map(|s| AllowRule::from(s.as_str())).collect();
        if allow.is_empty() {
            NetworkPolicy { mode: NetworkMode::DenyAll, ..Default::default() }
        } else if access.allowed_domains.iter().any(|d| d == "*") {
            NetworkPolicy { mode: NetworkMode::AllowAll, ..Default::default() }
        } else {
            NetworkPolicy { mode: NetworkMode::AllowList, allow, deny: Vec::new() }
        }
    } else {
        NetworkPolicy { mode: NetworkMode::AllowAll, ..Default::default() }
    };
    glovebox_proto::policy::parse(&np).map_err(|e| Status::invalid_argument(format!("network access: {e}")))?;
    Ok(np)
}

/// Refuses what a definition asks for that Glovebox does not do.
fn refuse_unsupported(def: &api::Sandbox) -> Result<(), Status> {
    let refuse = |given: bool, what: &str| if given { Err(unsupported(what)) } else { Ok(()) };
    refuse(
        def.resources
            .as_ref()
            .is_some_and(|r| r.gpu_config.as_ref().is_some_and(|g| g.count > 0 || !g.gpu_type.is_empty())),
        "GPUs",
    )?;
    refuse(!def.volume_mounts.is_empty(), "Modal Volumes")?;
    refuse(!def.nfs_mounts.is_empty(), "network file systems")?;
    refuse(!def.cloud_bucket_mounts.is_empty() || !def.s3_mounts.is_empty(), "cloud bucket mounts")?;
    refuse(
        matches!(&def.open_ports_oneof, Some(api::sandbox::OpenPortsOneof::OpenPorts(p)) if !p.ports.is_empty()),
        "tunnels (encrypted_ports, unencrypted_ports, h2_ports)",
    )?;
    refuse(def.pty_info.is_some(), "a PTY for the sandbox (pty=True)")?;
    refuse(def.enable_snapshot, "memory snapshots")?;
    refuse(def.proxy_id.as_deref().is_some_and(|p| !p.is_empty()), "Modal Proxies")?;
    refuse(def.readiness_probe.is_some(), "readiness probes")?;
    refuse(!def.custom_domain.is_empty(), "custom domains")?;
    refuse(!def.inbound_cidr_allowlist.is_empty(), "inbound_cidr_allowlist")?;
    refuse(def.experimental_outbound_policy.is_some() || def.outbound_policy.is_some(), "outbound policies")?;
    refuse(def.include_oidc_identity_token || def.include_x509_svid, "identity tokens")?;
    refuse(def.i6pn_enabled, "i6pn networking")?;
    refuse(def.scheduler_placement.as_ref().is_some_and(|p| !p.regions.is_empty()), "choosing a region")?;
    refuse(def.name.as_deref().is_some_and(|n| !n.is_empty()), "named sandboxes")?;
    refuse(
        !def.mount_ids.is_empty(),
        "local files in images (add_local_file, add_local_dir, add_local_python_source)",
    )?;
    Ok(())
}

/// The environment of a new sandbox: its secrets (inline maps, or ephemeral secrets by id)
/// and its `env`, later ones winning.
fn env_of(
    m: &Modal,
    caller: &Caller,
    def: &api::Sandbox,
    sources: &[api::SecretSource],
    extra: Option<&api::StringMap>,
) -> Result<BTreeMap<String, String>, Status> {
    let mut env = BTreeMap::new();
    for id in &def.secret_ids {
        env.extend(m.inner.apps.secret(caller, id)?);
    }
    for s in sources {
        match &s.source {
            Some(api::secret_source::Source::Env(map)) => env.extend(map.contents.clone()),
            Some(api::secret_source::Source::SecretId(id)) => env.extend(m.inner.apps.secret(caller, id)?),
            None => {}
        }
    }
    for map in [extra, def.environment_variables.as_ref()].into_iter().flatten() {
        env.extend(map.contents.clone());
    }
    Ok(env)
}

/// Creates the sandbox a definition describes; returns it.
async fn create(
    m: &Modal,
    caller: &Caller,
    app_id: &str,
    def: &api::Sandbox,
    tags: &[api::SandboxTag],
    env: BTreeMap<String, String>,
) -> Result<Arc<Sb>, Status> {
    refuse_unsupported(def)?;
    if app_id.is_empty() {
        return Err(Status::invalid_argument("a sandbox needs an app (App.lookup(..., create_if_missing=True))"));
    }
    m.inner.apps.check(caller, app_id)?;
    let mut metadata = tag_map(tags);
    if metadata.keys().any(|k| k.starts_with("modal.")) {
        return Err(Status::invalid_argument("tags starting with `modal.` are reserved"));
    }
    metadata.insert(APP_KEY.into(), app_id.into());
    let template = m.image_template(caller, &def.image_id)?;
    if !def.image_id.is_empty() {
        metadata.insert(IMAGE_KEY.into(), def.image_id.clone());
    }
    let workdir = match def.workdir.as_deref().filter(|w| !w.is_empty()) {
        Some(w) if !w.starts_with('/') || w.split('/').any(|c| c == "..") => {
            return Err(Status::invalid_argument(format!("workdir must be absolute, without '..': {w:?}")))
        }
        Some(w) => {
            metadata.insert(WORKDIR_KEY.into(), w.to_string());
            Some(w.to_string())
        }
        None => None,
    };
    let r = def.resources.clone().unwrap_or_default();
    let milli = if r.milli_cpu_max > 0 { r.milli_cpu_max } else { r.milli_cpu };
    let memory = r.memory_mb_max.max(r.memory_mb);
    let resources = Resources {
        cpus: (milli > 0).then(|| f64::from(milli) / 1000.0),
        memory_mb: (memory > 0).then_some(u64::from(memory)),
        ..Default::default()
    };
    let req = CreateSandbox {
        template: Some(template),
        timeout_s: Some(u64::from(def.timeout_secs).max(1)),
        resources,
        env,
        metadata,
        network: policy(def)?,
        idle_timeout_s: def.idle_timeout_secs.map(u64::from).filter(|t| *t > 0),
        ..Default::default()
    };
    let mgr = m.manager();
    let sb = mgr.create_for(&caller.tenant, req).await.map_err(status)?;
    let setup = async {
        if let Some(w) = &workdir {
            crate::ops::make_dir(mgr, &sb, w.clone(), None).await?;
        }
        if !def.entrypoint_args.is_empty() {
            m.inner.execs.start_entrypoint(m, &sb, def.entrypoint_args.clone(), workdir.clone()).await?;
        }
        Ok::<_, crate::error::Error>(())
    };
    if let Err(e) = setup.await {
        mgr.destroy(&sb.id, EndReason::Error).await;
        return Err(status(e));
    }
    Ok(sb)
}

fn handle_metadata(app_id: &str) -> api::SandboxHandleMetadata {
    api::SandboxHandleMetadata { app_id: app_id.to_string(), ..Default::default() }
}

fn router_access(m: &Modal, caller: &Caller, authority: Option<&Authority>, sandbox: &str) -> api::CommandRouterAccess {
    let host = authority.map_or("127.0.0.1:7171", |a| a.0.as_str());
    api::CommandRouterAccess { jwt: m.inner.tokens.router_token(caller, sandbox), url: format!("http://{host}") }
}

pub async fn create_v2(
    m: &Modal,
    req: Request<api::SandboxCreateV2Request>,
) -> Result<Response<api::SandboxCreateV2Response>, Status> {
    let caller = caller_of(&req)?;
    let authority = req.extensions().get::<Authority>().cloned();
    let r = req.into_inner();
    let def = r.definition.unwrap_or_default();
    let env = env_of(m, &caller, &def, &r.secret_sources, r.ephemeral_secrets.as_ref())?;
    if !r.cloud_bucket_mount_credentials.is_empty() {
        return Err(unsupported("cloud bucket mounts"));
    }
    let sb = create(m, &caller, &r.app_id, &def, &r.tags, env).await?;
    Ok(Response::new(api::SandboxCreateV2Response {
        sandbox_id: modal_id(&sb.id),
        task_id: task_id(&sb.id),
        metadata: Some(handle_metadata(&r.app_id)),
        command_router_access: Some(router_access(m, &caller, authority.as_ref(), &sb.id)),
        ..Default::default()
    }))
}

pub async fn create_v1(
    m: &Modal,
    req: Request<api::SandboxCreateRequest>,
) -> Result<Response<api::SandboxCreateResponse>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    let def = r.definition.unwrap_or_default();
    let env = env_of(m, &caller, &def, &[], None)?;
    let sb = create(m, &caller, &r.app_id, &def, &r.tags, env).await?;
    Ok(Response::new(api::SandboxCreateResponse {
        sandbox_id: modal_id(&sb.id),
        metadata: Some(handle_metadata(&r.app_id)),
    }))
}

/// How a sandbox ended, as Modal reports it: the entrypoint's exit when it had one, else
/// the end's reason.
fn end_result(m: &Modal, id: &str, reason: EndReason) -> api::GenericResult {
    if let Some(r) = m.inner.execs.entrypoint_result(id) {
        return r;
    }
    let (s, code, why) = match reason {
        EndReason::Timeout => (GenericStatus::Timeout, 124, "the sandbox's timeout ran out"),
        EndReason::Killed => (GenericStatus::Terminated, 137, "terminated"),
        EndReason::Oom => (GenericStatus::KernelOomKill, 137, "killed by the out-of-memory killer"),
        EndReason::Idle => (GenericStatus::IdleTimeout, 137, "idle timeout"),
        EndReason::Error | EndReason::DaemonRestart => (GenericStatus::InternalFailure, 1, "the sandbox failed"),
    };
    result(s, code, why)
}

/// The live sandbox, or how it ended.
enum State {
    Live(Arc<Sb>),
    Ended(api::GenericResult),
}

fn state(m: &Modal, caller: &Caller, id: &str) -> Result<State, Status> {
    let id = glovebox_id(id);
    crate::http::authorize(m.manager(), caller, id).map_err(status)?;
    match m.manager().get(id) {
        Ok(sb) => Ok(State::Live(sb)),
        Err(crate::error::Error::Gone { reason, .. }) => Ok(State::Ended(end_result(m, id, reason))),
        Err(e) => Err(status(e)),
    }
}

pub fn get_task_id(
    m: &Modal,
    req: Request<api::SandboxGetTaskIdRequest>,
) -> Result<Response<api::SandboxGetTaskIdResponse>, Status> {
    let caller = caller_of(&req)?;
    let id = req.get_ref().sandbox_id.clone();
    Ok(Response::new(match state(m, &caller, &id)? {
        State::Live(sb) => api::SandboxGetTaskIdResponse { task_id: Some(task_id(&sb.id)), task_result: None },
        State::Ended(r) => api::SandboxGetTaskIdResponse { task_id: None, task_result: Some(r) },
    }))
}

/// A long poll: answers when the sandbox ends, or after `timeout` seconds (at most 55)
/// without a result.
pub async fn wait(
    m: &Modal,
    req: Request<api::SandboxWaitRequest>,
) -> Result<Response<api::SandboxWaitResponse>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    let limit = Duration::try_from_secs_f32(r.timeout.max(0.0)).unwrap_or(MAX_WAIT).min(MAX_WAIT);
    let deadline = tokio::time::Instant::now() + limit;
    let mut changes = m.manager().events.changes();
    let app = |sb: &Sb| sb.metadata().get(APP_KEY).cloned().unwrap_or_default();
    let mut app_id = String::new();
    loop {
        changes.borrow_and_update();
        match state(m, &caller, &r.sandbox_id)? {
            State::Ended(res) => {
                return Ok(Response::new(api::SandboxWaitResponse {
                    result: Some(res),
                    metadata: Some(handle_metadata(&app_id)),
                }))
            }
            State::Live(sb) => app_id = app(&sb),
        }
        // Woken by any lifecycle event (this sandbox's end among them), or an entrypoint's.
        let woke = tokio::select! {
            r = changes.changed() => r.is_ok(),
            _ = tokio::time::sleep_until(deadline) => false,
        };
        if !woke {
            return Ok(Response::new(api::SandboxWaitResponse {
                result: None,
                metadata: Some(handle_metadata(&app_id)),
            }));
        }
    }
}

pub async fn terminate(
    m: &Modal,
    req: Request<api::SandboxTerminateRequest>,
) -> Result<Response<api::SandboxTerminateResponse>, Status> {
    let caller = caller_of(&req)?;
    let id = req.get_ref().sandbox_id.clone();
    match state(m, &caller, &id)? {
        State::Ended(r) => Ok(Response::new(api::SandboxTerminateResponse { existing_result: Some(r) })),
        State::Live(sb) => {
            m.manager().destroy(&sb.id, EndReason::Killed).await;
            Ok(Response::new(api::SandboxTerminateResponse { existing_result: None }))
        }
    }
}

/// The caller's live sandboxes, newest first, filtered by app and tags; `before_timestamp`
/// pages (the client asks again before the oldest it got, until an empty page).
pub fn list(m: &Modal, req: Request<api::SandboxListRequest>) -> Result<Response<api::SandboxListResponse>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    let want = tag_map(&r.tags);
    let mut out = Vec::new();
    for s in m.manager().list_for(&caller).into_iter().rev() {
        let created = crate::util::parse_rfc3339(&s.created_at).unwrap_or(0.0);
        if r.before_timestamp > 0.0 && created >= r.before_timestamp {
            continue;
        }
        if !r.app_id.is_empty() && s.metadata.get(APP_KEY) != Some(&r.app_id) {
            continue;
        }
        if !want.iter().all(|(k, v)| s.metadata.get(k) == Some(v)) {
            continue;
        }
        let app_id = s.metadata.get(APP_KEY).cloned().unwrap_or_default();
        let expires = crate::util::parse_rfc3339(&s.expires_at).unwrap_or(created);
        out.push(api::SandboxInfo {
            id: modal_id(&s.id),
            created_at: created,
            task_info: Some(api::TaskInfo {
                id: task_id(&s.id),
                started_at: created,
                enqueued_at: created,
                sandbox_id: modal_id(&s.id),
                ..Default::default()
            }),
            app_id: app_id.clone(),
            tags: user_tags(&s.metadata),
            image_id: s.metadata.get(IMAGE_KEY).cloned().unwrap_or_default(),
            timeout_secs: (expires - created).max(0.0) as u32,
            metadata: Some(handle_metadata(&app_id)),
            ..Default::default()
        });
    }
    Ok(Response::new(api::SandboxListResponse { sandboxes: out }))
}

pub fn tags_get(
    m: &Modal,
    req: Request<api::SandboxTagsGetRequest>,
) -> Result<Response<api::SandboxTagsGetResponse>, Status> {
    let caller = caller_of(&req)?;
    let sb = m.sandbox(&caller, &req.get_ref().sandbox_id)?;
    Ok(Response::new(api::SandboxTagsGetResponse { tags: user_tags(&sb.metadata()) }))
}

/// Replaces the user's tags (the `modal.` labels stay).
pub fn tags_set(m: &Modal, req: Request<api::SandboxTagsSetRequest>) -> Result<Response<()>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    let sb = m.sandbox(&caller, &r.sandbox_id)?;
    let new = tag_map(&r.tags);
    if new.keys().any(|k| k.starts_with("modal.")) {
        return Err(Status::invalid_argument("tags starting with `modal.` are reserved"));
    }
    let mut md: BTreeMap<String, String> = sb.metadata().into_iter().filter(|(k, _)| k.starts_with("modal.")).collect();
    md.extend(new);
    m.manager().update(&sb.id, Some(md), None).map_err(status)?;
    Ok(Response::new(()))
}

/// Where the command router of a sandbox is (this daemon) and a token for it.
pub fn router_access_v2(
    m: &Modal,
    req: Request<api::SandboxGetCommandRouterAccessRequest>,
) -> Result<Response<api::SandboxGetCommandRouterAccessResponse>, Status> {
    use api::sandbox_get_command_router_access_request::Target;
    let caller = caller_of(&req)?;
    let authority = req.extensions().get::<Authority>().cloned();
    let id = match &req.get_ref().target {
        Some(Target::SandboxId(s)) => s.clone(),
        Some(Target::TaskId(t)) => sandbox_of_task(t).to_string(),
        None => return Err(Status::invalid_argument("sandbox_id or task_id is required")),
    };
    let sb = m.sandbox(&caller, &id)?;
    let a = router_access(m, &caller, authority.as_ref(), &sb.id);
    Ok(Response::new(api::SandboxGetCommandRouterAccessResponse { jwt: a.jwt, url: a.url, ..Default::default() }))
}

pub fn router_access_v1(
    m: &Modal,
    req: Request<api::TaskGetCommandRouterAccessRequest>,
) -> Result<Response<api::TaskGetCommandRouterAccessResponse>, Status> {
    let caller = caller_of(&req)?;
    let authority = req.extensions().get::<Authority>().cloned();
    let sb = m.sandbox(&caller, sandbox_of_task(&req.get_ref().task_id))?;
    let a = router_access(m, &caller, authority.as_ref(), &sb.id);
    Ok(Response::new(api::TaskGetCommandRouterAccessResponse { jwt: a.jwt, url: a.url }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::network_access::NetworkAccessType as T;

    fn def(kind: T, cidrs: &[&str], domains: &[&str]) -> api::Sandbox {
        api::Sandbox {
            network_access: Some(api::NetworkAccess {
                network_access_type: kind as i32,
                allowed_cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
                allowed_domains: domains.iter().map(|s| s.to_string()).collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn network_access_maps_to_policies() {
        assert_eq!(policy(&def(T::Open, &[], &[])).unwrap().mode, NetworkMode::AllowAll);
        assert_eq!(policy(&api::Sandbox::default()).unwrap().mode, NetworkMode::AllowAll, "Modal's default is open");
        assert_eq!(policy(&def(T::Blocked, &[], &[])).unwrap().mode, NetworkMode::DenyAll);
        let legacy = api::Sandbox { block_network: true, ..Default::default() };
        assert_eq!(policy(&legacy).unwrap().mode, NetworkMode::DenyAll);
        let list = policy(&def(T::Allowlist, &["198.51.100.0/24"], &["api.good.test"])).unwrap();
        assert_eq!(list.mode, NetworkMode::AllowList);
        assert_eq!(list.allow, vec![AllowRule::from("198.51.100.0/24"), AllowRule::from("api.good.test")]);
        assert_eq!(policy(&def(T::Allowlist, &[], &[])).unwrap().mode, NetworkMode::DenyAll, "an empty list blocks");
        assert!(policy(&def(T::Allowlist, &["not a cidr!"], &[])).is_err());
    }

    #[test]
    fn task_ids_carry_the_sandbox() {
        assert_eq!(task_id("abc"), "ta-abcV");
        assert_eq!(sandbox_of_task("ta-abcV"), "abc");
        assert_eq!(sandbox_of_task("abc"), "abc");
        assert_eq!(modal_id("abc"), "sb-abc");
        assert_eq!(glovebox_id("sb-abc"), "abc");
    }

    #[test]
    fn unsupported_definitions_are_refused_by_name() {
        let gpu = api::Sandbox {
            resources: Some(api::Resources {
                gpu_config: Some(api::GpuConfig { count: 1, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = refuse_unsupported(&gpu).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("GPUs"), "{}", e.message());
        assert!(refuse_unsupported(&api::Sandbox::default()).is_ok());
    }
}
