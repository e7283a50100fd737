//! The controller without an API server: claims live in memory ([`MemClaims`]), a work
//! queue with a few workers runs the same passes as the Kubernetes controller
//! (`driver::pass`) against real Glovebox daemons, and the same refresh and orphan sweep
//! look at the nodes. Agents submit claims at a fixed rate, wait for `Ready`, hold the
//! sandbox for a while and delete the claim — or delete it at once when it fails for good.
//! A node can be killed mid-run (a hook the caller supplies) and brought back afterwards,
//! when the sweep must destroy what it still holds. [`run`] returns what happened to every
//! claim; tests and `bench/scale-out` judge it.
//!
//! What this leaves out of a cluster: the API server's round trips (a watch event, a status
//! patch: milliseconds each) and the router; docs/scale-out.md says how to measure those.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::cluster::{ClusterView, NodeTarget, Transition};
use crate::daemon::DaemonApi;
use crate::driver::{pass, ClaimStore, Nodes};
use crate::reconcile::{holds, Backing, Binding, ClaimView, ReadyState, Report, TERMINAL};
use crate::settings::Settings;

/// The agents' side of the run.
#[derive(Debug, Clone)]
pub struct Workload {
    pub claims: usize,
    /// Claims submitted per second (evenly spaced).
    pub rate_per_s: f64,
    /// How long an agent keeps a ready sandbox: each claim holds for a time drawn evenly
    /// from `[hold / 2, 3 * hold / 2]` (seeded, so runs are alike).
    pub hold: Duration,
    pub seed: u64,
}

/// Kill `node` once `after_claims` claims have been submitted.
#[derive(Debug, Clone)]
pub struct KillPlan {
    pub node: String,
    pub after_claims: usize,
}

pub struct SimConfig {
    pub workload: Workload,
    pub nodes: Vec<NodeTarget>,
    pub settings: Settings,
    /// How often every node is looked at (the controller's scrape interval).
    pub refresh: Duration,
    /// How long a node may be silent before its claims are told it is lost.
    pub grace: Duration,
    /// Reconcile workers (passes run at once; never two on one claim).
    pub workers: usize,
    /// The orphan sweep leaves sandboxes younger than this alone.
    pub orphan_age: Duration,
    pub kill: Option<KillPlan>,
    /// Bound on each phase (claims; then the sweep after a rejoin).
    pub deadline: Duration,
}

/// What the caller does to nodes: kill one mid-run, and bring it back (with its target,
/// which may have changed) once every claim is gone.
pub struct Hooks {
    pub kill: Box<dyn FnOnce() + Send>,
    pub rejoin: Box<dyn FnOnce() -> Option<NodeTarget> + Send>,
}

/// What happened to one claim.
#[derive(Debug, Clone)]
pub struct ClaimOutcome {
    /// Submission order, from 0.
    pub index: usize,
    pub name: String,
    /// Every node a create for it was sent to, in order.
    pub tried: Vec<String>,
    /// The node its sandbox was bound to last.
    pub bound: Option<String>,
    /// From submission to the first `Ready=True` write.
    pub ready_after: Option<Duration>,
    /// Every `Ready` reason written, in order.
    pub reasons: Vec<String>,
    pub last_message: Option<String>,
    /// Deleted and released (its finalizer removed).
    pub gone: bool,
    /// Bound to the killed node when it was killed.
    pub on_killed_node: bool,
}

#[derive(Debug, Clone)]
pub struct SimReport {
    pub outcomes: Vec<ClaimOutcome>,
    pub killed: Option<String>,
    /// Since the start.
    pub killed_at: Option<Duration>,
    /// When the killed node was declared lost, since the kill.
    pub lost_after_kill: Option<Duration>,
    /// Orphans the sweep destroyed (after the rejoin, or during the run).
    pub swept: Vec<(String, String)>,
    /// The controller's sandboxes still listed on an up node at the end (should be none).
    pub leftover: Vec<(String, String)>,
    /// Wall time of the claims phase.
    pub claims_phase: Duration,
}

impl SimReport {
    /// Claims per node they were first sent to, among claims `indices` (submission order).
    pub fn spread(&self, indices: std::ops::Range<usize>) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for o in self.outcomes.iter().filter(|o| indices.contains(&o.index)) {
            if let Some(n) = o.tried.first() {
                *m.entry(n.clone()).or_default() += 1;
            }
        }
        m
    }

    pub fn ready_latencies(&self) -> Vec<Duration> {
        let mut v: Vec<Duration> = self.outcomes.iter().filter_map(|o| o.ready_after).collect();
        v.sort();
        v
    }
}

/// The `q` quantile (0..=1) of sorted samples, interpolated between closest ranks.
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    let frac = pos - lo as f64;
    let a = sorted[lo].as_secs_f64();
    let b = sorted[hi].as_secs_f64();
    Some(Duration::from_secs_f64(a + (b - a) * frac))
}

struct Entry {
    index: usize,
    view: ClaimView,
    submitted: Instant,
    ready_at: Option<Instant>,
    tried: Vec<String>,
    reasons: Vec<String>,
    gone: bool,
    on_killed_node: bool,
    busy: bool,
    dirty: bool,
    tx: watch::Sender<Option<ReadyState>>,
}

/// Claims in memory, written as the API server would keep them.
#[derive(Default)]
pub struct MemClaims {
    inner: Mutex<BTreeMap<String, Entry>>,
}

impl MemClaims {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        // Entries are a few fields each, consistent after any single update.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with<T>(&self, uid: &str, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        self.lock().get_mut(uid).map(f)
    }

    fn views(&self) -> BTreeMap<String, ClaimView> {
        self.lock().iter().filter(|(_, e)| !e.gone).map(|(k, e)| (k.clone(), e.view.clone())).collect()
    }

    /// Notes that a create for `uid` goes to `node`.
    fn tried(&self, uid: &str, node: &str) {
        self.with(uid, |e| e.tried.push(node.to_string()));
    }
}

impl ClaimStore for MemClaims {
    type Error = Infallible;

    async fn add_finalizer(&self, claim: &ClaimView) -> Result<(), Infallible> {
        self.with(&claim.uid, |e| e.view.finalized = true);
        Ok(())
    }

    async fn remove_finalizer(&self, claim: &ClaimView) -> Result<(), Infallible> {
        self.with(&claim.uid, |e| {
            e.view.finalized = false;
            // A deleted object goes once its last finalizer does.
            if e.view.deleting {
                e.gone = true;
                e.tx.send_replace(e.view.ready.clone());
            }
        });
        Ok(())
    }

    async fn bind(&self, claim: &ClaimView, b: &Binding, _address: &str) -> Result<(), Infallible> {
        self.with(&claim.uid, |e| e.view.binding = Some(b.clone()));
        Ok(())
    }

    async fn report(&self, claim: &ClaimView, r: &Report) -> Result<(), Infallible> {
        self.with(&claim.uid, |e| {
            let state = ReadyState { ready: r.ready, reason: r.reason.to_string(), message: r.message.clone() };
            if r.ready && e.ready_at.is_none() {
                e.ready_at = Some(Instant::now());
            }
            e.reasons.push(r.reason.to_string());
            e.view.ready = Some(state.clone());
            e.tx.send_replace(Some(state));
        });
        Ok(())
    }
}

/// A daemon API that notes in the claims where each create went (for the report).
struct Noting<D> {
    inner: D,
    claims: Arc<MemClaims>,
}

impl<D: DaemonApi> DaemonApi for Noting<D> {
    async fn create(
        &self,
        url: &str,
        req: &glovebox_proto::api::CreateSandbox,
    ) -> Result<glovebox_proto::api::Sandbox, crate::daemon::DaemonError> {
        if let Some(uid) = req.metadata.get(crate::crd::META_CLAIM_UID) {
            self.claims.tried(uid, url);
        }
        self.inner.create(url, req).await
    }
    async fn destroy(&self, url: &str, id: &str) -> Result<(), crate::daemon::DaemonError> {
        self.inner.destroy(url, id).await
    }
    async fn inspect(&self, url: &str, id: &str) -> Result<crate::daemon::Inspection, crate::daemon::DaemonError> {
        self.inner.inspect(url, id).await
    }
    async fn observe(&self, url: &str) -> Result<crate::cluster::Observation, crate::daemon::DaemonError> {
        self.inner.observe(url).await
    }
}

struct Sim<D> {
    claims: Arc<MemClaims>,
    nodes: Nodes<Noting<D>>,
    queue: mpsc::UnboundedSender<String>,
}

impl<D: DaemonApi> Sim<D> {
    fn enqueue(&self, uid: &str) {
        // The receiver lives as long as the run; a send after it is a no-op.
        let _ = self.queue.send(uid.to_string());
    }

    /// One worker's share of the queue: a pass per claim, never two at once on one claim.
    async fn work(self: Arc<Self>, rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>>) {
        loop {
            let Some(uid) = rx.lock().await.recv().await else { return };
            let view = self.claims.with(&uid, |e| {
                if e.gone {
                    return None;
                }
                if e.busy {
                    e.dirty = true;
                    return None;
                }
                e.busy = true;
                Some(e.view.clone())
            });
            let Some(Some(view)) = view else { continue };
            let requeue = match pass(&*self.claims, &self.nodes, view).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let again = self.claims.with(&uid, |e| {
                e.busy = false;
                std::mem::take(&mut e.dirty)
            });
            if again == Some(true) {
                self.enqueue(&uid);
            }
            if let Some(d) = requeue {
                let me = self.clone();
                let uid = uid.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    me.enqueue(&uid);
                });
            }
        }
    }

    /// One agent: submit, wait for Ready (or a terminal failure), hold, delete.
    async fn agent(self: Arc<Self>, i: usize, hold: Duration, settings: Settings, deadline: Instant) {
        let uid = format!("uid-{i:04}-{:08x}", crate::placement::spread_key(&i.to_string()) as u32);
        let name = format!("sandbox-claim-{i:04}");
        let (tx, mut rx) = watch::channel(None);
        let view = ClaimView {
            namespace: "sim".into(),
            name,
            uid: uid.clone(),
            deleting: false,
            finalized: false,
            backing: Backing::Glovebox(settings),
            env: Vec::new(),
            binding: None,
            ready: None,
        };
        let entry = Entry {
            index: i,
            view,
            submitted: Instant::now(),
            ready_at: None,
            tried: Vec::new(),
            reasons: Vec::new(),
            gone: false,
            on_killed_node: false,
            busy: false,
            dirty: false,
            tx,
        };
        self.claims.lock().insert(uid.clone(), entry);
        self.enqueue(&uid);
        let settled = tokio::time::timeout_at(deadline.into(), async {
            loop {
                let now = rx.borrow_and_update().clone();
                match now {
                    Some(r) if r.ready => return true,
                    Some(r) if TERMINAL.contains(&r.reason.as_str()) => return false,
                    _ => {}
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await;
        if settled == Ok(true) {
            // Holding: the sandbox is the agent's until it is done, or its claim fails.
            let _ = tokio::time::timeout(hold, async {
                loop {
                    if rx.changed().await.is_err() {
                        return;
                    }
                    if rx.borrow().as_ref().is_some_and(|r| !r.ready) {
                        return;
                    }
                }
            })
            .await;
        }
        let unfinalized = self.claims.with(&uid, |e| {
            e.view.deleting = true;
            if !e.view.finalized {
                e.gone = true;
            }
            e.gone
        });
        if unfinalized == Some(false) {
            self.enqueue(&uid);
        }
    }
}

fn hold_of(w: &Workload, i: usize) -> Duration {
    let x = crate::placement::spread_key(&format!("{}-{i}", w.seed)) % 1000;
    w.hold.mul_f64(0.5 + x as f64 / 1000.0)
}

/// Runs the simulation against the daemons in `cfg.nodes` (`api` reaches them).
pub async fn run<D: DaemonApi>(cfg: SimConfig, api: D, hooks: Hooks) -> SimReport {
    let claims = Arc::new(MemClaims::default());
    let nodes = Nodes::new(ClusterView::new(cfg.grace), Noting { inner: api, claims: claims.clone() });
    let (tx, rx) = mpsc::unbounded_channel();
    let sim = Arc::new(Sim { claims: claims.clone(), nodes, queue: tx });
    let url_to_name: BTreeMap<String, String> = cfg.nodes.iter().map(|t| (t.url.clone(), t.name.clone())).collect();
    let mut targets = cfg.nodes.clone();

    // The first look at the nodes, before any claim (the controller's start).
    sim.nodes.refresh(targets.clone()).await;

    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let workers: Vec<_> = (0..cfg.workers.max(1)).map(|_| tokio::spawn(sim.clone().work(rx.clone()))).collect();

    let start = Instant::now();
    let deadline = start + cfg.deadline;
    let (stop_tx, stop_rx) = watch::channel(false);
    let lost_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let swept: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let refresher = tokio::spawn(refresh_loop(
        sim.clone(),
        targets.clone(),
        cfg.refresh,
        cfg.orphan_age,
        cfg.kill.as_ref().map(|k| k.node.clone()),
        lost_at.clone(),
        swept.clone(),
        stop_rx,
    ));

    let mut agents = Vec::new();
    let mut kill = Some(hooks.kill);
    let mut killed_at = None;
    let gap = Duration::from_secs_f64(1.0 / cfg.workload.rate_per_s.max(0.001));
    for i in 0..cfg.workload.claims {
        tokio::time::sleep_until((start + gap * i as u32).into()).await;
        if let Some(plan) = cfg.kill.as_ref().filter(|p| p.after_claims == i) {
            if let Some(k) = kill.take() {
                mark_on_node(&claims, &plan.node);
                k();
                killed_at = Some(Instant::now());
                tracing::info!(node = %plan.node, "simulation: node killed");
            }
        }
        let hold = hold_of(&cfg.workload, i);
        agents.push(tokio::spawn(sim.clone().agent(i, hold, cfg.settings.clone(), deadline)));
    }
    for a in agents {
        let _ = a.await;
    }
    // Every claim deleted; wait (bounded) until each is released.
    while Instant::now() < deadline && claims.lock().values().any(|e| !e.gone) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let claims_phase = start.elapsed();

    // The killed node comes back: what it still holds belongs to no claim, and is swept.
    if cfg.kill.is_some() {
        let rejoin = hooks.rejoin;
        if let Ok(Some(t)) = tokio::task::spawn_blocking(rejoin).await {
            if let Some(old) = targets.iter_mut().find(|o| o.name == t.name) {
                *old = t;
            }
        }
    }
    let _ = stop_tx.send(true);
    let _ = refresher.await;
    let sweep_deadline = Instant::now() + cfg.deadline;
    loop {
        sim.nodes.refresh(targets.clone()).await;
        let views = claims.views();
        let holds_fn = |uid: Option<&str>, node: &str, id: &str| holds(uid.and_then(|u| views.get(u)), node, id);
        let done = sim.nodes.sweep(holds_fn, Duration::ZERO).await;
        swept.lock().unwrap_or_else(|p| p.into_inner()).extend(done);
        let left = leftovers(&sim.nodes.view());
        if left.is_empty() || Instant::now() >= sweep_deadline {
            break;
        }
        tokio::time::sleep(cfg.refresh).await;
    }
    let leftover = leftovers(&sim.nodes.view());
    for w in workers {
        w.abort();
    }

    let outcomes = claims
        .lock()
        .values()
        .map(|e| ClaimOutcome {
            index: e.index,
            name: e.view.name.clone(),
            tried: e.tried.iter().map(|u| url_to_name.get(u).cloned().unwrap_or_else(|| u.clone())).collect(),
            bound: e.view.binding.as_ref().map(|b| b.node.clone()),
            ready_after: e.ready_at.map(|t| t.duration_since(e.submitted)),
            reasons: e.reasons.clone(),
            last_message: e.view.ready.as_ref().map(|r| r.message.clone()),
            gone: e.gone,
            on_killed_node: e.on_killed_node,
        })
        .collect();
    let swept = std::mem::take(&mut *swept.lock().unwrap_or_else(|p| p.into_inner()));
    let lost = *lost_at.lock().unwrap_or_else(|p| p.into_inner());
    SimReport {
        outcomes,
        killed: cfg.kill.map(|k| k.node),
        killed_at: killed_at.map(|t| t.duration_since(start)),
        lost_after_kill: match (killed_at, lost) {
            (Some(k), Some(l)) => Some(l.saturating_duration_since(k)),
            _ => None,
        },
        swept,
        leftover,
        claims_phase,
    }
}

fn mark_on_node(claims: &MemClaims, node: &str) {
    for e in claims.lock().values_mut() {
        if !e.gone && e.view.binding.as_ref().is_some_and(|b| b.node == node) {
            e.on_killed_node = true;
        }
    }
}

fn leftovers(v: &ClusterView) -> Vec<(String, String)> {
    let up = v.nodes.values().filter(|n| n.health == crate::cluster::Health::Up);
    up.flat_map(|n| n.live.keys().map(|id| (n.target.name.clone(), id.clone()))).collect()
}

#[allow(clippy::too_many_arguments)]
async fn refresh_loop<D: DaemonApi>(
    sim: Arc<Sim<D>>,
    targets: Vec<NodeTarget>,
    every: Duration,
    orphan_age: Duration,
    watched: Option<String>,
    lost_at: Arc<Mutex<Option<Instant>>>,
    swept: Arc<Mutex<Vec<(String, String)>>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let changes = sim.nodes.refresh(targets.clone()).await;
        let mut everyone = false;
        for c in &changes {
            tracing::info!(?c, "simulation: node transition");
            if let Transition::Lost(n) = c {
                if watched.as_deref() == Some(n.as_str()) {
                    lost_at.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
                }
            }
            everyone = true;
        }
        let views = sim.claims.views();
        if everyone {
            // As `Controller::reconcile_all_on`: every claim gets a pass.
            for uid in views.keys() {
                sim.enqueue(uid);
            }
        }
        let holds_fn = |uid: Option<&str>, node: &str, id: &str| holds(uid.and_then(|u| views.get(u)), node, id);
        let done = sim.nodes.sweep(holds_fn, orphan_age).await;
        swept.lock().unwrap_or_else(|p| p.into_inner()).extend(done);
    }
}

/// Claims per node as `node: count` pairs, and whether every count is within `tolerance`
/// (a fraction, 0.1 for ±10 %) of an even share.
pub fn within_even(spread: &BTreeMap<String, usize>, nodes: usize, tolerance: f64) -> bool {
    let total: usize = spread.values().sum();
    if nodes == 0 || total == 0 {
        return false;
    }
    let even = total as f64 / nodes as f64;
    spread.len() == nodes && spread.values().all(|&c| (c as f64 - even).abs() <= even * tolerance)
}

/// The distinct reasons claims ended with, counted.
pub fn reason_counts(outcomes: &[ClaimOutcome]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for o in outcomes {
        let last = o.reasons.last().cloned().unwrap_or_else(|| "(none)".into());
        *m.entry(last).or_default() += 1;
    }
    m
}

/// Names of the nodes in `outcomes`' placements.
pub fn nodes_used(outcomes: &[ClaimOutcome]) -> BTreeSet<String> {
    outcomes.iter().flat_map(|o| o.tried.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let ms = |v: &[u64]| v.iter().map(|m| Duration::from_millis(*m)).collect::<Vec<_>>();
        let s = ms(&[1, 2, 3, 4, 5]);
        assert_eq!(quantile(&s, 0.5), Some(Duration::from_millis(3)));
        assert_eq!(quantile(&s, 1.0), Some(Duration::from_millis(5)));
        assert_eq!(quantile(&ms(&[10, 20]), 0.5), Some(Duration::from_millis(15)));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn evenness() {
        let m = |v: &[usize]| v.iter().enumerate().map(|(i, c)| (format!("n{i}"), *c)).collect::<BTreeMap<_, _>>();
        assert!(within_even(&m(&[100, 100, 100]), 3, 0.1));
        assert!(within_even(&m(&[109, 95, 96]), 3, 0.1));
        assert!(!within_even(&m(&[111, 95, 94]), 3, 0.1));
        assert!(!within_even(&m(&[150, 150]), 3, 0.1), "a node with nothing fails");
    }

    #[test]
    fn holds_are_spread_around_the_mean() {
        let w = Workload { claims: 1000, rate_per_s: 1.0, hold: Duration::from_secs(2), seed: 7 };
        let hs: Vec<Duration> = (0..1000).map(|i| hold_of(&w, i)).collect();
        assert!(hs.iter().all(|h| *h >= Duration::from_secs(1) && *h < Duration::from_secs(3)));
        let mean = hs.iter().sum::<Duration>() / 1000;
        assert!(mean > Duration::from_millis(1900) && mean < Duration::from_millis(2100), "{mean:?}");
    }
}
