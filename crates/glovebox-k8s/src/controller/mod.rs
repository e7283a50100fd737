//! The Kubernetes side: kube-rs' controller runtime watches `SandboxClaim`s and runs one
//! reconcile pass (`driver::pass`) per change; a loop beside it lists the daemon pods and
//! nodes, looks at every Glovebox node, wakes every claim when a node is lost or comes
//! back, and sweeps orphan sandboxes against the controller's cache of claims.
//!
//! Only the replica that holds the `coordination.k8s.io/v1` Lease reconciles (`leader`,
//! decided by `crate::lease`): two reconciling at once would both place the same claim.

mod claims;
mod discover;
pub mod leader;
mod router;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::runtime::{watcher, Controller};
use kube::{Client, ResourceExt};
use thiserror::Error;
use tokio::sync::mpsc;

pub use claims::{view_of, with_ready, KubeClaims, MANAGER};
pub use discover::targets;
pub use router::objects as router_objects;

use crate::cluster::{ClusterView, NodeTarget};
use crate::crd::{SandboxClaim, SandboxTemplate, SandboxWarmPool};
use crate::daemon::DaemonApi;
use crate::driver::{pass, Nodes};
use crate::reconcile::{holds, Backing, ClaimView};
use crate::settings;

#[derive(Debug, Error)]
pub enum Error {
    #[error("kubernetes api: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Malformed(String),
    /// This replica stopped leading (the process exits; Kubernetes restarts it).
    #[error("lost the leader lease: {0}")]
    LostLease(String),
}

/// What the controller is told at start (the binary's flags).
#[derive(Debug, Clone)]
pub struct Config {
    /// The namespace whose claims it serves; all when `None`.
    pub namespace: Option<String>,
    /// Where the Glovebox daemon pods run, and their label selector.
    pub daemon_namespace: String,
    pub daemon_selector: String,
    /// The daemon's API port on its pod.
    pub daemon_port: u16,
    /// The ports of every claim's Service (the sandboxd ports the daemon serves).
    pub router_ports: Vec<(String, u16)>,
    /// How often every node is looked at.
    pub refresh: Duration,
    /// How long a node may be silent before its claims are told it is lost.
    pub grace: Duration,
    /// The sweep leaves sandboxes younger than this alone.
    pub orphan_age: Duration,
}

/// Shared by every reconcile.
pub struct Ctx<D> {
    pub client: Client,
    pub nodes: Nodes<D>,
    pub cfg: Config,
}

impl<D: DaemonApi> Ctx<D> {
    pub fn new(client: Client, api: D, cfg: Config) -> Ctx<D> {
        Ctx { client, nodes: Nodes::new(ClusterView::new(cfg.grace), api), cfg }
    }
}

/// What the claim's warm pool and template say: Glovebox's (with its settings) or not.
pub async fn backing_of(client: &Client, claim: &SandboxClaim) -> Result<Backing, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let pool_name = &claim.spec.warm_pool_ref.name;
    let Some(pool) = Api::<SandboxWarmPool>::namespaced(client.clone(), &ns).get_opt(pool_name).await? else {
        return Ok(Backing::PoolMissing(pool_name.clone()));
    };
    let tpl_name = &pool.spec.template_ref.name;
    let Some(tpl) = Api::<SandboxTemplate>::namespaced(client.clone(), &ns).get_opt(tpl_name).await? else {
        return Ok(Backing::TemplateMissing(tpl_name.clone()));
    };
    Ok(match settings::of_template(&tpl) {
        Ok(Some(s)) => Backing::Glovebox(s),
        Ok(None) => Backing::NotGlovebox,
        Err(e) => Backing::Invalid(format!("SandboxTemplate {tpl_name:?}: {e}")),
    })
}

/// One pass over `claim`.
pub async fn reconcile<D: DaemonApi>(claim: Arc<SandboxClaim>, ctx: Arc<Ctx<D>>) -> Result<Action, Error> {
    let ours = claim.finalizers().iter().any(|f| f == crate::crd::FINALIZER);
    let deleting = claim.metadata.deletion_timestamp.is_some();
    if deleting && !ours {
        return Ok(Action::await_change());
    }
    // A deletion needs only what the claim records; anything else, its template.
    let backing = if deleting { Backing::NotGlovebox } else { backing_of(&ctx.client, &claim).await? };
    let view = view_of(&claim, backing)?;
    let store = KubeClaims { client: ctx.client.clone(), claim: claim.clone(), ports: ctx.cfg.router_ports.clone() };
    let next = pass(&store, &ctx.nodes, view).await?;
    Ok(next.map_or_else(Action::await_change, Action::requeue))
}

/// A failed pass is tried again in 5 s (the controller runtime backs off further on its own
/// only for watch errors).
pub fn error_policy<D>(claim: Arc<SandboxClaim>, e: &Error, _: Arc<Ctx<D>>) -> Action {
    tracing::warn!(claim = %claim.name_any(), "reconcile: {e}");
    Action::requeue(Duration::from_secs(5))
}

/// The daemon pods and nodes, listed.
pub async fn list_targets(client: &Client, cfg: &Config) -> Result<Vec<NodeTarget>, Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), &cfg.daemon_namespace)
        .list(&ListParams::default().labels(&cfg.daemon_selector))
        .await?;
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await?;
    Ok(targets(&pods.items, &nodes.items, cfg.daemon_port))
}

/// The claims in the controller's cache, as the sweep needs them (by uid).
fn cached_views(store: &Store<SandboxClaim>) -> std::collections::BTreeMap<String, ClaimView> {
    store.state().iter().filter_map(|c| view_of(c, Backing::NotGlovebox).ok()).map(|v| (v.uid.clone(), v)).collect()
}

/// Every `refresh`: list the nodes, look at them, wake every claim on a change, sweep.
async fn watch_nodes<D: DaemonApi>(ctx: Arc<Ctx<D>>, store: Store<SandboxClaim>, wake: mpsc::Sender<()>) {
    let mut tick = tokio::time::interval(ctx.cfg.refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_list: Option<Vec<NodeTarget>> = None;
    loop {
        tick.tick().await;
        let targets = match list_targets(&ctx.client, &ctx.cfg).await {
            Ok(t) => t,
            Err(e) => {
                // Without a list the nodes are looked at where they were: an API server
                // outage says nothing about them.
                tracing::warn!("listing the Glovebox daemon pods: {e}");
                match &last_list {
                    Some(t) => t.clone(),
                    None => continue,
                }
            }
        };
        last_list = Some(targets.clone());
        let changes = ctx.nodes.refresh(targets).await;
        for c in &changes {
            tracing::info!(?c, "glovebox node");
        }
        if !changes.is_empty() {
            // Full means a wake is already queued.
            let _ = wake.try_send(());
        }
        // The cache is only complete once the watch has listed every claim.
        if store.wait_until_ready().await.is_ok() {
            let views = cached_views(&store);
            let holds_fn = |uid: Option<&str>, node: &str, id: &str| holds(uid.and_then(|u| views.get(u)), node, id);
            ctx.nodes.sweep(holds_fn, ctx.cfg.orphan_age).await;
        }
    }
}

/// Runs the controller until SIGTERM or SIGINT.
pub async fn run<D: DaemonApi>(client: Client, api: D, cfg: Config) -> Result<(), Error> {
    let claims: Api<SandboxClaim> = match &cfg.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ctx = Arc::new(Ctx::new(client.clone(), api, cfg));
    // A first look at the nodes before any claim is placed.
    let began = Instant::now();
    match list_targets(&client, &ctx.cfg).await {
        Ok(t) => {
            ctx.nodes.refresh(t).await;
        }
        Err(e) => tracing::warn!("listing the Glovebox daemon pods: {e}"),
    }
    tracing::info!(took_ms = began.elapsed().as_millis() as u64, nodes = ctx.nodes.view().nodes.len(), "nodes listed");

    let controller = Controller::new(claims, watcher::Config::default());
    let (wake_tx, mut wake_rx) = mpsc::channel::<()>(1);
    let watcher_task = tokio::spawn(watch_nodes(ctx.clone(), controller.store(), wake_tx));
    let wakes = futures_util::stream::poll_fn(move |cx| wake_rx.poll_recv(cx));
    controller
        .reconcile_all_on(wakes)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("controller: {e}");
            }
        })
        .await;
    watcher_task.abort();
    Ok(())
}
