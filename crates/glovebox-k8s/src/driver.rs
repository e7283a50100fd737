//! Carries out the reconcile core's steps. One pass over a claim asks [`decide`] for the
//! next step, does it (a daemon call through [`DaemonApi`], a write through [`ClaimStore`]),
//! and asks again, until a step ends the pass. The Kubernetes controller and the simulation
//! run the same passes; only their [`ClaimStore`] differs (patches to the API server, or a
//! map in memory).
//!
//! Also here: the look at every node ([`Nodes::refresh`]) and the orphan sweep
//! ([`Nodes::sweep`]), both shared by the two drivers in the same way.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::join_all;

use crate::cluster::{ClusterView, NodeTarget, Transition};
use crate::daemon::{live_sandbox, DaemonApi};
use crate::reconcile::{
    after_create, after_inspect, decide, Binding, ClaimView, Created, Report, Step, MAX_TRIES, NODE_UNAVAILABLE,
};

/// Where a driver keeps claims: the writes a pass makes.
pub trait ClaimStore: Send + Sync {
    type Error: std::error::Error + Send + Sync + 'static;

    fn add_finalizer(&self, claim: &ClaimView) -> impl Future<Output = Result<(), Self::Error>> + Send;
    fn remove_finalizer(&self, claim: &ClaimView) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// Records that `binding`'s sandbox is the claim's, reachable at the node's `address`.
    fn bind(
        &self,
        claim: &ClaimView,
        binding: &Binding,
        address: &str,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// Writes the claim's `Ready` condition.
    fn report(&self, claim: &ClaimView, report: &Report) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// The nodes as the controller knows them, and the way to their daemons.
pub struct Nodes<D> {
    view: Mutex<ClusterView>,
    pub api: D,
}

impl<D: DaemonApi> Nodes<D> {
    pub fn new(view: ClusterView, api: D) -> Nodes<D> {
        Nodes { view: Mutex::new(view), api }
    }

    /// The view, for a decision (never held across an await).
    pub fn view(&self) -> MutexGuard<'_, ClusterView> {
        // A panic while holding the lock leaves the view as consistent as any update
        // (each is a few field writes); carry on with it.
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks at every node in `targets` (all at once), and returns what changed.
    pub async fn refresh(&self, targets: Vec<NodeTarget>) -> Vec<Transition> {
        let mut changes = self.view().set_targets(targets.clone(), Instant::now());
        let looks = targets.iter().map(|t| async move {
            let (began, wall) = (Instant::now(), SystemTime::now());
            (t.name.clone(), began, wall, self.api.observe(&t.url).await)
        });
        for (name, began, wall, result) in join_all(looks).await {
            let mut v = self.view();
            match result {
                Ok(obs) => changes.extend(v.observed(&name, obs, began, wall)),
                Err(e) => v.failed(&name, &e.to_string(), Instant::now()),
            }
        }
        changes.extend(self.view().tick(Instant::now()));
        changes
    }

    /// Destroys the sandboxes on up nodes that no claim holds (see `reconcile::holds`),
    /// made at least `min_age` ago; returns them as `(node, id)`.
    pub async fn sweep(
        &self,
        holds: impl Fn(Option<&str>, &str, &str) -> bool,
        min_age: Duration,
    ) -> Vec<(String, String)> {
        let orphans = self.view().orphans(holds, SystemTime::now(), min_age);
        let mut swept = Vec::new();
        for (node, id) in orphans {
            let Some(url) = self.view().url(&node).map(str::to_string) else { continue };
            match self.api.destroy(&url, &id).await {
                Ok(()) => {
                    self.view().removed(&node, &id, Instant::now());
                    tracing::info!(node = %node, sandbox = %id, "orphan sandbox destroyed");
                    swept.push((node, id));
                }
                Err(e) => tracing::warn!(node = %node, sandbox = %id, "orphan sandbox: {e}"),
            }
        }
        swept
    }
}

/// Runs one pass over `claim`; returns when to look at it again (`None`: only on a change).
pub async fn pass<S: ClaimStore, D: DaemonApi>(
    store: &S,
    nodes: &Nodes<D>,
    mut claim: ClaimView,
) -> Result<Option<Duration>, S::Error> {
    let mut tries = 0;
    // Every step but the last makes progress (a finalizer, a binding, a destroy, another
    // node); the bound is a guard against a decision loop, never reached in the tests.
    for _ in 0..(MAX_TRIES + 8) {
        let step = decide(&claim, &nodes.view());
        match step {
            Step::Ignore => return Ok(None),
            Step::Wait(d) => return Ok(Some(d)),
            Step::AddFinalizer => {
                store.add_finalizer(&claim).await?;
                claim.finalized = true;
            }
            Step::RemoveFinalizer => {
                store.remove_finalizer(&claim).await?;
                return Ok(None);
            }
            Step::Report { report, requeue } => {
                write(store, &mut claim, report).await?;
                return Ok(requeue);
            }
            Step::Adopt { node, sandbox } => bind(store, nodes, &mut claim, node, sandbox).await?,
            Step::Create { node, request } => {
                tries += 1;
                let Some(url) = nodes.view().url(&node).map(str::to_string) else { continue };
                nodes.view().begin_create(&node);
                let started = Instant::now();
                let answer = nodes.api.create(&url, &request).await;
                let made = answer.as_ref().ok().map(live_sandbox);
                nodes.view().end_create(&node, made.as_ref(), Instant::now());
                match after_create(&node, &answer) {
                    Created::Bound { sandbox } => {
                        tracing::info!(claim = %claim.name, node = %node, sandbox = %sandbox,
                            create_ms = started.elapsed().as_millis() as u64, "sandbox created");
                        bind(store, nodes, &mut claim, node, sandbox).await?;
                    }
                    Created::NodeDown { why } => {
                        tracing::warn!(claim = %claim.name, node = %node, "create: node did not answer: {why}");
                        nodes.view().failed(&node, &why, Instant::now());
                        if tries >= MAX_TRIES {
                            let r = Report {
                                ready: false,
                                reason: NODE_UNAVAILABLE,
                                message: format!("{MAX_TRIES} nodes in a row did not answer; last: {node}: {why}"),
                            };
                            write(store, &mut claim, r).await?;
                            return Ok(Some(Duration::from_secs(5)));
                        }
                    }
                    Created::Report { report, requeue } => {
                        write(store, &mut claim, report).await?;
                        return Ok(requeue);
                    }
                }
            }
            Step::Inspect { node, sandbox } => {
                let Some(url) = nodes.view().url(&node).map(str::to_string) else { continue };
                let answer = nodes.api.inspect(&url, &sandbox).await;
                if let Err(e) = &answer {
                    nodes.view().failed(&node, &e.to_string(), Instant::now());
                }
                let Some(b) = claim.binding.clone() else { continue };
                match after_inspect(&b, &answer) {
                    Step::Report { report, requeue } => {
                        write(store, &mut claim, report).await?;
                        return Ok(requeue);
                    }
                    Step::Wait(d) => return Ok(Some(d)),
                    other => unreachable_step(&other),
                }
            }
            Step::Destroy { node, sandbox } => {
                let Some(url) = nodes.view().url(&node).map(str::to_string) else { continue };
                match nodes.api.destroy(&url, &sandbox).await {
                    Ok(()) => {
                        nodes.view().removed(&node, &sandbox, Instant::now());
                        claim.binding = None;
                    }
                    Err(e) => {
                        nodes.view().failed(&node, &e.to_string(), Instant::now());
                        return Ok(Some(Duration::from_secs(2)));
                    }
                }
            }
        }
    }
    tracing::error!(claim = %claim.name, "reconcile: no end to the steps (a bug); looking again later");
    Ok(Some(Duration::from_secs(30)))
}

/// `after_inspect` answers with a report or a wait only; anything else is logged, not acted on.
fn unreachable_step(step: &Step) {
    tracing::error!(?step, "reconcile: unexpected step after an inspection (a bug)");
}

async fn write<S: ClaimStore>(store: &S, claim: &mut ClaimView, report: Report) -> Result<(), S::Error> {
    if !report.recorded_in(claim) {
        store.report(claim, &report).await?;
        claim.ready = Some(crate::reconcile::ReadyState {
            ready: report.ready,
            reason: report.reason.to_string(),
            message: report.message,
        });
    }
    Ok(())
}

async fn bind<S: ClaimStore, D: DaemonApi>(
    store: &S,
    nodes: &Nodes<D>,
    claim: &mut ClaimView,
    node: String,
    sandbox: String,
) -> Result<(), S::Error> {
    let address = nodes.view().address(&node).unwrap_or_default().to_string();
    let b = Binding { node, sandbox, bound_at: Some(SystemTime::now()) };
    store.bind(claim, &b, &address).await?;
    claim.binding = Some(b);
    Ok(())
}
