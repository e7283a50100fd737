//! What Modal has around sandboxes and Glovebox does not: apps (a name and an id a sandbox
//! is created in; `App.lookup`, `app.run()`), the environment (only its image builder
//! version matters to the client), the client hello, the auth token, and ephemeral secrets
//! (`Secret.from_dict` given to an image build). Kept in memory: an app is a label.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use tonic::{Request, Response, Status};

use super::pb::api;
use super::{bounded_insert, caller_of, unsupported, Modal};
use crate::tenants::Caller;

/// The image builder version Glovebox answers (its debian_slim is what `images` maps).
pub const IMAGE_BUILDER_VERSION: &str = "2025.06";
/// Most apps and ephemeral secrets remembered.
const MAX_KEPT: usize = 4096;

#[derive(Clone)]
pub struct App {
    pub tenant: String,
    /// Made by `app.run()` (`AppCreate`): it stops when its client disconnects, and its
    /// sandboxes with it, as on Modal.
    pub ephemeral: bool,
}

/// A `Secret.from_dict`: its variables, and the tenant that made it.
struct Secret {
    tenant: String,
    env: BTreeMap<String, String>,
}

pub struct Apps {
    /// App id → app.
    apps: Mutex<HashMap<String, (u64, App)>>,
    /// (tenant, name) → app id.
    names: Mutex<HashMap<(String, String), String>>,
    /// Ephemeral apps whose client disconnected.
    stopped: Mutex<std::collections::HashSet<String>>,
    /// Bumped when an app stops.
    changed: tokio::sync::watch::Sender<u64>,
    /// Ephemeral secret id → the secret.
    secrets: Mutex<HashMap<String, (u64, Secret)>>,
}

impl Default for Apps {
    fn default() -> Apps {
        Apps {
            apps: Mutex::default(),
            names: Mutex::default(),
            stopped: Mutex::default(),
            changed: tokio::sync::watch::Sender::new(0),
            secrets: Mutex::default(),
        }
    }
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", crate::util::random_token(22))
}

impl Apps {
    fn create(&self, tenant: &str, ephemeral: bool) -> String {
        let id = new_id("ap");
        let mut apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        bounded_insert(&mut apps, id.clone(), App { tenant: tenant.to_string(), ephemeral }, MAX_KEPT);
        id
    }

    fn is_ephemeral(&self, id: &str) -> bool {
        self.apps.lock().unwrap_or_else(|p| p.into_inner()).get(id).is_some_and(|(_, a)| a.ephemeral)
    }

    fn stop(&self, id: &str) {
        let mut s = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() >= MAX_KEPT {
            s.clear();
        }
        s.insert(id.to_string());
        drop(s);
        self.changed.send_modify(|n| *n += 1);
    }

    fn stopped(&self, id: &str) -> bool {
        self.stopped.lock().unwrap_or_else(|p| p.into_inner()).contains(id)
    }

    /// The app `id` if `caller` may use it. An id this daemon does not know (another
    /// daemon's, or one forgotten) is taken as a new app of the caller's: an app is only a
    /// label here.
    pub fn check(&self, caller: &Caller, id: &str) -> Result<(), Status> {
        let apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        match apps.get(id) {
            Some((_, a)) if !caller.may_access(&a.tenant) => Err(Status::not_found(format!("app {id} not found"))),
            _ => Ok(()),
        }
    }

    /// The variables of ephemeral secret `id`, if `caller` made it.
    pub fn secret(&self, caller: &Caller, id: &str) -> Result<BTreeMap<String, String>, Status> {
        let s = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        match s.get(id) {
            Some((_, s)) if caller.may_access(&s.tenant) => Ok(s.env.clone()),
            _ => Err(unsupported(&format!(
                "secret {id}: named Secrets (Secret.from_name); pass Secret.from_dict or env"
            ))),
        }
    }
}

pub fn client_hello(_m: &Modal, _req: Request<()>) -> Result<Response<api::ClientHelloResponse>, Status> {
    Ok(Response::new(api::ClientHelloResponse {
        image_builder_version: IMAGE_BUILDER_VERSION.into(),
        ..Default::default()
    }))
}

pub fn auth_token_get(
    m: &Modal,
    req: Request<api::AuthTokenGetRequest>,
) -> Result<Response<api::AuthTokenGetResponse>, Status> {
    let caller = caller_of(&req)?;
    Ok(Response::new(api::AuthTokenGetResponse { token: m.inner.tokens.auth_token(&caller) }))
}

/// One environment, `main`, whose image builder version is Glovebox's.
pub fn environment_get_or_create(
    _m: &Modal,
    req: Request<api::EnvironmentGetOrCreateRequest>,
) -> Result<Response<api::EnvironmentGetOrCreateResponse>, Status> {
    let name = match req.get_ref().deployment_name.as_str() {
        "" | "main" => "main",
        other => return Err(unsupported(&format!("environment {other:?} (Glovebox has one, `main`)"))),
    };
    Ok(Response::new(api::EnvironmentGetOrCreateResponse {
        environment_id: "en-glovebox".into(),
        metadata: Some(api::EnvironmentMetadata {
            name: name.into(),
            settings: Some(api::EnvironmentSettings {
                image_builder_version: IMAGE_BUILDER_VERSION.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }))
}

/// `App.lookup(name, create_if_missing=…)`: one app per name and tenant.
pub fn app_get_or_create(
    m: &Modal,
    req: Request<api::AppGetOrCreateRequest>,
) -> Result<Response<api::AppGetOrCreateResponse>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    if r.app_name.is_empty() {
        return Err(Status::invalid_argument("app_name must not be empty"));
    }
    let apps = &m.inner.apps;
    let key = (caller.tenant.clone(), r.app_name.clone());
    let mut names = apps.names.lock().unwrap_or_else(|p| p.into_inner());
    let known =
        names.get(&key).cloned().filter(|id| apps.apps.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id));
    let app_id = match known {
        Some(id) => id,
        None if r.object_creation_type == api::ObjectCreationType::CreateIfMissing as i32 => {
            let id = apps.create(&caller.tenant, false);
            if names.len() >= MAX_KEPT {
                names.clear();
            }
            names.insert(key, id.clone());
            id
        }
        None => return Err(Status::not_found(format!("app {:?} not found", r.app_name))),
    };
    Ok(Response::new(api::AppGetOrCreateResponse { app_id, ..Default::default() }))
}

/// `app.run()`: an ephemeral app.
pub fn app_create(m: &Modal, req: Request<api::AppCreateRequest>) -> Result<Response<api::AppCreateResponse>, Status> {
    let caller = caller_of(&req)?;
    let app_id = m.inner.apps.create(&caller.tenant, true);
    Ok(Response::new(api::AppCreateResponse { app_id, ..Default::default() }))
}

/// An ephemeral app's layout: nothing is deployed in it.
pub fn app_get_layout(
    m: &Modal,
    req: Request<api::AppGetLayoutRequest>,
) -> Result<Response<api::AppGetLayoutResponse>, Status> {
    let caller = caller_of(&req)?;
    m.inner.apps.check(&caller, &req.get_ref().app_id)?;
    Ok(Response::new(api::AppGetLayoutResponse { app_layout: Some(Default::default()) }))
}

pub fn app_publish(
    m: &Modal,
    req: Request<api::AppPublishRequest>,
) -> Result<Response<api::AppPublishResponse>, Status> {
    let caller = caller_of(&req)?;
    let r = req.get_ref();
    m.inner.apps.check(&caller, &r.app_id)?;
    if !r.function_ids.is_empty() || !r.class_ids.is_empty() {
        return Err(unsupported("deploying Modal Functions and classes"));
    }
    Ok(Response::new(api::AppPublishResponse { deployed_at: super::now_s(), ..Default::default() }))
}

pub fn app_heartbeat(m: &Modal, req: Request<api::AppHeartbeatRequest>) -> Result<Response<()>, Status> {
    let caller = caller_of(&req)?;
    m.inner.apps.check(&caller, &req.get_ref().app_id)?;
    Ok(Response::new(()))
}

/// The client left its app. An ephemeral one (`app.run()`) stops, and its sandboxes are
/// terminated, as on Modal; sandboxes of an app looked up by name live on to their own
/// timeouts.
pub async fn app_client_disconnect(
    m: &Modal,
    req: Request<api::AppClientDisconnectRequest>,
) -> Result<Response<()>, Status> {
    let caller = caller_of(&req)?;
    let id = req.get_ref().app_id.clone();
    m.inner.apps.check(&caller, &id)?;
    if m.inner.apps.is_ephemeral(&id) {
        let mgr = m.manager();
        for s in mgr.list_for(&caller) {
            if s.metadata.get(super::sandboxes::APP_KEY) == Some(&id) {
                mgr.destroy(&s.id, glovebox_proto::api::EndReason::Killed).await;
            }
        }
        m.inner.apps.stop(&id);
    }
    Ok(Response::new(()))
}

/// An app's logs, as `app.run()` follows them with output enabled: Glovebox has none to
/// send (a sandbox's output is read from it), so the stream says "done" once the app has
/// stopped, or ends after `timeout` seconds (the client asks again).
pub fn app_get_logs(
    m: &Modal,
    req: Request<api::AppGetLogsRequest>,
) -> Result<Response<super::Stream<api::TaskLogsBatch>>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    if !r.sandbox_id.is_empty() || !r.task_id.is_empty() || !r.function_id.is_empty() || !r.function_call_id.is_empty()
    {
        return Err(unsupported("logs of sandboxes and functions (Sandbox.logs, modal container logs)"));
    }
    m.inner.apps.check(&caller, &r.app_id)?;
    let limit = std::time::Duration::from_secs_f32(r.timeout.clamp(0.0, 55.0));
    let deadline = tokio::time::Instant::now() + limit;
    let (m, id) = (m.clone(), r.app_id);
    let mut rx = m.inner.apps.changed.subscribe();
    let s = async_stream_once(async move {
        loop {
            rx.borrow_and_update();
            if m.inner.apps.stopped(&id) {
                return Some(api::TaskLogsBatch { app_done: true, ..Default::default() });
            }
            tokio::select! {
                c = rx.changed() => if c.is_err() { return None },
                _ = tokio::time::sleep_until(deadline) => return None,
            }
        }
    });
    Ok(Response::new(s))
}

/// A stream of at most one item.
fn async_stream_once<T: Send + 'static>(
    f: impl std::future::Future<Output = Option<T>> + Send + 'static,
) -> super::Stream<T> {
    use futures_util::StreamExt;
    Box::pin(futures_util::stream::once(f).filter_map(|x| std::future::ready(x.map(Ok))))
}

/// `Secret.from_dict(...)` (ephemeral, its variables given): remembered for the image
/// builds that name it. Named secrets are refused: Glovebox's stored secrets never enter a
/// sandbox (they are for brokered headers, docs/network.md).
pub fn secret_get_or_create(
    m: &Modal,
    req: Request<api::SecretGetOrCreateRequest>,
) -> Result<Response<api::SecretGetOrCreateResponse>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    let ephemeral = r.object_creation_type == api::ObjectCreationType::Ephemeral as i32
        || r.object_creation_type == api::ObjectCreationType::AnonymousOwnedByApp as i32;
    if !ephemeral || !r.deployment_name.is_empty() {
        return Err(unsupported("named Secrets (Secret.from_name; pass Secret.from_dict or env instead)"));
    }
    let id = new_id("st");
    let env: BTreeMap<String, String> = r.env_dict.into_iter().collect();
    let mut s = m.inner.apps.secrets.lock().unwrap_or_else(|p| p.into_inner());
    bounded_insert(&mut s, id.clone(), Secret { tenant: caller.tenant, env }, MAX_KEPT);
    Ok(Response::new(api::SecretGetOrCreateResponse { secret_id: id, ..Default::default() }))
}
