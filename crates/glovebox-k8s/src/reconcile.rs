//! The reconcile core (pure): given what a claim records and what the controller knows of
//! the nodes, the one next step — add the finalizer, create the sandbox on the least-loaded
//! node, take over a sandbox made for it before a restart, look again at a sandbox a listing
//! lacks, destroy it, release the claim, or write the claim's `Ready` condition. The
//! outcome of a step that talked to a daemon comes back through [`after_create`] and
//! [`after_inspect`]. The drivers (`driver`: the Kubernetes controller and the simulation)
//! only carry steps out; every decision is here, with its tests.
//!
//! Reasons a claim can show (`Ready` condition):
//!
//! | status | reason | when | the controller then |
//! | --- | --- | --- | --- |
//! | True | `SandboxReady` | its sandbox is live on an up node | checks it again every resync |
//! | False | `NoGloveboxNode` | no node is up, schedulable and answering | retries in 5 s |
//! | False | `QuotaExceeded` | the node refused: a tenant quota | retries in 15 s |
//! | False | `NodeUnavailable` | three nodes in a row did not answer the create | retries in 5 s |
//! | False | `CreateFailed` | the node could not start the sandbox | retries in 10 s |
//! | False | `TemplateNotFound` / `WarmPoolNotFound` | an object the claim leads to is missing | retries in 30 s |
//! | False | `InvalidTemplate` | the template's Glovebox settings are wrong, or the node refused them | retries in 60 s |
//! | False | `EnvVarsInjectionRejected` | the claim sets env the template does not allow | — (terminal) |
//! | False | `NodeLost` | its node was silent for the grace period: the sandbox and its state are gone | — (terminal) |
//! | False | `SandboxEnded` | its sandbox ended on the node (lifetime, OOM, …) | — (terminal) |

use std::time::{Duration, SystemTime};

use glovebox_proto::api::{CreateSandbox, EndReason, ErrorCode, Sandbox};

use crate::cluster::{ClusterView, NodeStanding};
use crate::crd::{MANAGED_BY, META_CLAIM, META_CLAIM_UID, META_MANAGED_BY, META_NAMESPACE, META_SANDBOX_NAME};
use crate::daemon::{DaemonError, Inspection};
use crate::placement::{pick, spread_key};
use crate::settings::{merge_env, Settings};

pub const READY: &str = "SandboxReady";
pub const NO_NODE: &str = "NoGloveboxNode";
pub const QUOTA: &str = "QuotaExceeded";
pub const NODE_UNAVAILABLE: &str = "NodeUnavailable";
pub const CREATE_FAILED: &str = "CreateFailed";
pub const TEMPLATE_NOT_FOUND: &str = "TemplateNotFound";
pub const POOL_NOT_FOUND: &str = "WarmPoolNotFound";
pub const INVALID_TEMPLATE: &str = "InvalidTemplate";
pub const ENV_REJECTED: &str = "EnvVarsInjectionRejected";
pub const NODE_LOST: &str = "NodeLost";
pub const SANDBOX_ENDED: &str = "SandboxEnded";

/// Reasons after which the claim's sandbox is gone for good: nothing more is done for it
/// but the release of its finalizer when it is deleted.
pub const TERMINAL: [&str; 3] = [NODE_LOST, SANDBOX_ENDED, ENV_REJECTED];

/// How often a ready claim is looked at again when nothing else wakes it.
pub const RESYNC: Duration = Duration::from_secs(60);
/// How many nodes one pass tries before it reports `NodeUnavailable`.
pub const MAX_TRIES: usize = 3;

/// What the claim leads to through its warm pool and template.
#[derive(Debug, Clone, PartialEq)]
pub enum Backing {
    Glovebox(Settings),
    /// Another runtime's (not ours to touch).
    NotGlovebox,
    PoolMissing(String),
    TemplateMissing(String),
    /// Glovebox's, but its settings cannot be read.
    Invalid(String),
}

/// Where a claim's sandbox is, as the claim records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub node: String,
    pub sandbox: String,
    pub bound_at: Option<SystemTime>,
}

/// The claim's `Ready` condition as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyState {
    pub ready: bool,
    pub reason: String,
    pub message: String,
}

/// A claim, as the core needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub deleting: bool,
    /// Whether it carries the controller's finalizer.
    pub finalized: bool,
    pub backing: Backing,
    /// The claim's own `spec.env`.
    pub env: Vec<(String, String)>,
    pub binding: Option<Binding>,
    pub ready: Option<ReadyState>,
}

impl ClaimView {
    /// The name agent-sandbox's router and SDK reach the sandbox by (`status.sandbox.name`,
    /// and the headless Service the router resolves): the claim's own name when it is a
    /// DNS-1035 label, as agent-sandbox names a cold-started sandbox, else one made from its
    /// uid.
    pub fn sandbox_name(&self) -> String {
        let n = &self.name;
        let label = !n.is_empty()
            && n.len() <= 63
            && n.starts_with(|c: char| c.is_ascii_lowercase())
            && !n.ends_with('-')
            && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if label {
            return n.clone();
        }
        let uid: String = self.uid.chars().filter(|c| c.is_ascii_alphanumeric()).take(20).collect();
        format!("gb-{}", uid.to_ascii_lowercase())
    }

    fn is_terminal(&self) -> bool {
        self.ready.as_ref().is_some_and(|r| !r.ready && TERMINAL.contains(&r.reason.as_str()))
    }
}

/// The `Ready` condition to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Report {
    fn yes(message: String) -> Report {
        Report { ready: true, reason: READY, message }
    }
    fn no(reason: &'static str, message: String) -> Report {
        Report { ready: false, reason, message }
    }

    /// Whether the claim already records exactly this.
    pub fn recorded_in(&self, claim: &ClaimView) -> bool {
        claim
            .ready
            .as_ref()
            .is_some_and(|r| r.ready == self.ready && r.reason == self.reason && r.message == self.message)
    }
}

/// The next thing to do for a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Not the controller's claim (or nothing of its own on it): leave it alone.
    Ignore,
    AddFinalizer,
    Create {
        node: String,
        request: Box<CreateSandbox>,
    },
    /// Record a sandbox found on `node` for this claim as its own.
    Adopt {
        node: String,
        sandbox: String,
    },
    /// A node's listing lacks the claim's sandbox: ask the node.
    Inspect {
        node: String,
        sandbox: String,
    },
    Destroy {
        node: String,
        sandbox: String,
    },
    RemoveFinalizer,
    /// Write `Ready` (when it differs from what is recorded) and end the pass.
    Report {
        report: Report,
        requeue: Option<Duration>,
    },
    /// Nothing to write; look again after this long.
    Wait(Duration),
}

fn report(report: Report, requeue: Option<Duration>) -> Step {
    Step::Report { report, requeue }
}

/// The next step for `claim`, given the nodes as `view` has them.
pub fn decide(claim: &ClaimView, view: &ClusterView) -> Step {
    if claim.deleting {
        return decide_deletion(claim, view);
    }
    let settings = match &claim.backing {
        Backing::NotGlovebox => return Step::Ignore,
        Backing::PoolMissing(p) => {
            return report(
                Report::no(POOL_NOT_FOUND, format!("SandboxWarmPool {p:?} not found")),
                Some(Duration::from_secs(30)),
            )
        }
        Backing::TemplateMissing(t) => {
            return report(
                Report::no(TEMPLATE_NOT_FOUND, format!("SandboxTemplate {t:?} not found")),
                Some(Duration::from_secs(30)),
            )
        }
        Backing::Invalid(why) => {
            return report(Report::no(INVALID_TEMPLATE, why.clone()), Some(Duration::from_secs(60)))
        }
        Backing::Glovebox(s) => s,
    };
    if claim.is_terminal() {
        return Step::Ignore;
    }
    if let Err(why) = merge_env(settings, &claim.env) {
        return report(Report::no(ENV_REJECTED, why), None);
    }
    if !claim.finalized {
        return Step::AddFinalizer;
    }
    match &claim.binding {
        Some(b) => decide_bound(b, view),
        None => decide_unbound(claim, settings, view),
    }
}

fn decide_deletion(claim: &ClaimView, view: &ClusterView) -> Step {
    if !claim.finalized {
        return Step::Ignore;
    }
    let target = match &claim.binding {
        Some(b) => Some((b.node.clone(), b.sandbox.clone())),
        None => view.sandbox_of_claim(&claim.uid),
    };
    match target {
        None => Step::RemoveFinalizer,
        Some((node, sandbox)) => match view.standing(&node) {
            NodeStanding::Up => Step::Destroy { node, sandbox },
            // A node restarting comes back within the grace period: the claim waits for it.
            NodeStanding::Suspect => Step::Wait(Duration::from_secs(2)),
            // Its sandbox is gone with the node, or is swept as an orphan if the node returns.
            NodeStanding::Lost { .. } | NodeStanding::Unknown => Step::RemoveFinalizer,
        },
    }
}

fn decide_bound(b: &Binding, view: &ClusterView) -> Step {
    match view.standing(&b.node) {
        NodeStanding::Up => {
            let since = b.bound_at.unwrap_or(SystemTime::UNIX_EPOCH);
            if view.listed_without(&b.node, &b.sandbox, since) {
                return Step::Inspect { node: b.node.clone(), sandbox: b.sandbox.clone() };
            }
            report(Report::yes(ready_message(b)), Some(RESYNC))
        }
        // The claim keeps what it shows while its node may be restarting.
        NodeStanding::Suspect => Step::Wait(Duration::from_secs(2)),
        NodeStanding::Lost { why } => report(
            Report::no(
                NODE_LOST,
                format!(
                    "Glovebox node {} stopped answering ({why}): sandbox {} and its state are gone; \
                     delete this claim and make a new one",
                    b.node, b.sandbox
                ),
            ),
            None,
        ),
        NodeStanding::Unknown => report(
            Report::no(
                NODE_LOST,
                format!(
                    "Glovebox node {} is no longer in the cluster: sandbox {} and its state are gone; \
                     delete this claim and make a new one",
                    b.node, b.sandbox
                ),
            ),
            None,
        ),
    }
}

fn ready_message(b: &Binding) -> String {
    format!("Glovebox sandbox {} on node {}", b.sandbox, b.node)
}

fn decide_unbound(claim: &ClaimView, s: &Settings, view: &ClusterView) -> Step {
    if let Some((node, sandbox)) = view.sandbox_of_claim(&claim.uid) {
        return Step::Adopt { node, sandbox };
    }
    match pick(&view.candidates(), spread_key(&claim.uid)) {
        None => report(Report::no(NO_NODE, view.why_none()), Some(Duration::from_secs(5))),
        Some(node) => Step::Create { node: node.to_string(), request: Box::new(request(claim, s)) },
    }
}

/// The create request for `claim` (its env already checked by [`decide`]).
pub fn request(claim: &ClaimView, s: &Settings) -> CreateSandbox {
    let mut req = CreateSandbox {
        template: s.template.clone(),
        timeout_s: s.timeout_s,
        resources: s.resources.clone(),
        env: merge_env(s, &claim.env).unwrap_or_else(|_| s.env.clone()),
        network: s.network.clone(),
        ..CreateSandbox::default()
    };
    let m = &mut req.metadata;
    m.insert(META_MANAGED_BY.into(), MANAGED_BY.into());
    m.insert(META_CLAIM_UID.into(), claim.uid.clone());
    m.insert(META_CLAIM.into(), format!("{}/{}", claim.namespace, claim.name));
    m.insert(META_SANDBOX_NAME.into(), claim.sandbox_name());
    m.insert(META_NAMESPACE.into(), claim.namespace.clone());
    req
}

/// What a create's answer means for the claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// Bind the sandbox to the claim.
    Bound { sandbox: String },
    /// The node did not answer or cannot take sandboxes now: mark it suspect and place the
    /// claim elsewhere.
    NodeDown { why: String },
    /// Record this and end the pass.
    Report { report: Report, requeue: Option<Duration> },
}

pub fn after_create(node: &str, answer: &Result<Sandbox, DaemonError>) -> Created {
    let e = match answer {
        Ok(sb) => return Created::Bound { sandbox: sb.id.clone() },
        Err(e) => e,
    };
    let fail = |reason, message: String, secs| Created::Report {
        report: Report::no(reason, format!("node {node}: {message}")),
        requeue: Some(Duration::from_secs(secs)),
    };
    match e {
        DaemonError::Unreachable { detail, .. } => Created::NodeDown { why: detail.clone() },
        DaemonError::BadAnswer { detail, .. } => Created::NodeDown { why: format!("not a Glovebox answer: {detail}") },
        DaemonError::Refused { status, code, message, .. } => match (code, *status) {
            (Some(ErrorCode::QuotaExceeded), _) => fail(QUOTA, message.clone(), 15),
            (Some(ErrorCode::TemplateNotFound), _) => fail(TEMPLATE_NOT_FOUND, message.clone(), 30),
            (Some(ErrorCode::InvalidRequest), _) => fail(INVALID_TEMPLATE, message.clone(), 60),
            (Some(ErrorCode::Unauthorized | ErrorCode::Forbidden), _) => {
                fail(CREATE_FAILED, format!("refused the controller's API key: {message}"), 60)
            }
            (Some(ErrorCode::Unavailable), _) | (None, 502..=504) => {
                Created::NodeDown { why: format!("{status}: {message}") }
            }
            _ => fail(CREATE_FAILED, format!("{status}: {message}"), 10),
        },
    }
}

/// What a look at a sandbox a listing lacked means for the claim.
pub fn after_inspect(b: &Binding, answer: &Result<Inspection, DaemonError>) -> Step {
    let ended = |what: String| {
        report(Report::no(SANDBOX_ENDED, format!("Glovebox sandbox {} on node {} {what}", b.sandbox, b.node)), None)
    };
    match answer {
        Ok(Inspection::Live) => report(Report::yes(ready_message(b)), Some(RESYNC)),
        Ok(Inspection::Ended(Some(r))) => ended(format!("ended: {}", describe(*r))),
        Ok(Inspection::Ended(None)) => ended("ended".to_string()),
        Ok(Inspection::Unknown) => ended("is unknown to the node (its data dir was reset?)".to_string()),
        Err(_) => Step::Wait(Duration::from_secs(2)),
    }
}

/// Whether a claim still holds sandbox `id` on `node` (the orphan sweep destroys the ones no
/// claim holds). `claim`: the claim whose uid the sandbox carries, if it exists.
pub fn holds(claim: Option<&ClaimView>, node: &str, id: &str) -> bool {
    let Some(c) = claim else { return false };
    if c.deleting {
        // Its own deletion destroys it (or releases it once its node is lost).
        return true;
    }
    if c.is_terminal() {
        return false;
    }
    match &c.binding {
        // Made, and the claim not yet updated: the next pass adopts it.
        None => true,
        Some(b) => b.node == node && b.sandbox == id,
    }
}

fn describe(r: EndReason) -> &'static str {
    match r {
        EndReason::Timeout => "timeout (its lifetime ran out)",
        EndReason::Killed => "killed (deleted through the Glovebox API)",
        EndReason::Oom => "oom (out of memory)",
        EndReason::Error => "error (its agent died)",
        EndReason::DaemonRestart => "daemon_restart (lost across a restart of the node's daemon)",
        EndReason::Idle => "idle (nothing ran for its idle timeout)",
    }
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
