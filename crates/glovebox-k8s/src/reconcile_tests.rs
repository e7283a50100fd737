use std::time::Instant;

use super::*;
use crate::cluster::{LiveSandbox, NodeTarget, Observation};
use crate::load::NodeLoad;

fn target(name: &str) -> NodeTarget {
    NodeTarget { name: name.into(), url: format!("http://{name}:7171"), address: "10.0.0.1".into(), schedulable: true }
}

/// A node: name, running sandboxes, live sandboxes as (id, claim uid).
type NodeSpec<'a> = (&'a str, u64, &'a [(&'a str, &'a str)]);

/// The nodes, all up.
fn view(nodes: &[NodeSpec]) -> ClusterView {
    let t = Instant::now();
    let mut v = ClusterView::new(Duration::from_secs(30));
    v.set_targets(nodes.iter().map(|(n, _, _)| target(n)).collect(), t);
    for (n, running, live) in nodes {
        let live = live
            .iter()
            .map(|(id, uid)| LiveSandbox { id: id.to_string(), claim_uid: Some(uid.to_string()), created_at: None })
            .collect();
        v.observed(n, Observation { load: NodeLoad { running: *running, warm: 0 }, live }, t, SystemTime::now());
    }
    v
}

fn claim() -> ClaimView {
    ClaimView {
        namespace: "team-a".into(),
        name: "sandbox-claim-1a2b3c4d".into(),
        uid: "5f0c-uid".into(),
        deleting: false,
        finalized: true,
        backing: Backing::Glovebox(Settings::default()),
        env: Vec::new(),
        binding: None,
        ready: None,
    }
}

fn bound(node: &str, sandbox: &str) -> ClaimView {
    ClaimView {
        binding: Some(Binding { node: node.into(), sandbox: sandbox.into(), bound_at: Some(SystemTime::UNIX_EPOCH) }),
        ..claim()
    }
}

fn reason(step: &Step) -> (&'static str, bool, Option<Duration>) {
    match step {
        Step::Report { report, requeue } => (report.reason, report.ready, *requeue),
        other => panic!("not a report: {other:?}"),
    }
}

#[test]
fn other_runtimes_claims_are_left_alone() {
    let c = ClaimView { backing: Backing::NotGlovebox, ..claim() };
    assert_eq!(decide(&c, &view(&[("a", 0, &[])])), Step::Ignore);
    let deleting = ClaimView { deleting: true, finalized: false, ..c };
    assert_eq!(decide(&deleting, &view(&[])), Step::Ignore);
}

#[test]
fn create_goes_to_the_least_loaded_node_with_the_claims_metadata() {
    let fresh = ClaimView { finalized: false, ..claim() };
    let v = view(&[("a", 4, &[]), ("b", 1, &[]), ("c", 3, &[])]);
    assert_eq!(decide(&fresh, &v), Step::AddFinalizer, "the finalizer comes before anything is made");
    let Step::Create { node, request } = decide(&claim(), &v) else { panic!("no create") };
    assert_eq!(node, "b");
    let m = &request.metadata;
    assert_eq!(m["glovebox.dev/managed-by"], "glovebox-controller");
    assert_eq!(m["glovebox.dev/claim-uid"], "5f0c-uid");
    assert_eq!(m["glovebox.dev/claim"], "team-a/sandbox-claim-1a2b3c4d");
    assert_eq!(m["agents.x-k8s.io/sandbox-name"], "sandbox-claim-1a2b3c4d");
    assert_eq!(m["agents.x-k8s.io/namespace"], "team-a");
}

#[test]
fn the_template_settings_and_allowed_claim_env_make_the_request() {
    let mut s = Settings { template: Some("code-interpreter".into()), timeout_s: Some(600), ..Settings::default() };
    s.resources.memory_mb = Some(1024);
    s.env.insert("LANG".into(), "C.UTF-8".into());
    s.env_policy = crate::settings::EnvPolicy::Allowed;
    let c = ClaimView { backing: Backing::Glovebox(s), env: vec![("TASK".into(), "7".into())], ..claim() };
    let Step::Create { request, .. } = decide(&c, &view(&[("a", 0, &[])])) else { panic!() };
    assert_eq!(request.template.as_deref(), Some("code-interpreter"));
    assert_eq!(request.timeout_s, Some(600));
    assert_eq!(request.resources.memory_mb, Some(1024));
    assert_eq!(request.env.len(), 2);
}

#[test]
fn claim_env_the_template_forbids_is_refused_for_good() {
    let c = ClaimView { env: vec![("X".into(), "1".into())], ..claim() };
    let step = decide(&c, &view(&[("a", 0, &[])]));
    assert_eq!(reason(&step), (ENV_REJECTED, false, None));
}

#[test]
fn with_no_node_up_the_claim_says_why_and_waits() {
    let t = Instant::now();
    let mut v = view(&[("a", 0, &[])]);
    v.failed("a", "connection refused", t);
    let step = decide(&claim(), &v);
    assert_eq!(reason(&step), (NO_NODE, false, Some(Duration::from_secs(5))));
    let Step::Report { report, .. } = step else { unreachable!() };
    assert_eq!(report.message, "no Glovebox node takes sandboxes (a: not answering (connection refused))");
}

#[test]
fn missing_pool_or_template_is_reported_with_agent_sandboxs_reasons() {
    let c = ClaimView { backing: Backing::PoolMissing("python".into()), ..claim() };
    assert_eq!(reason(&decide(&c, &view(&[]))).0, POOL_NOT_FOUND);
    let c = ClaimView { backing: Backing::TemplateMissing("py".into()), ..claim() };
    assert_eq!(reason(&decide(&c, &view(&[]))).0, TEMPLATE_NOT_FOUND);
}

#[test]
fn a_sandbox_made_before_a_restart_is_adopted_not_made_twice() {
    let v = view(&[("a", 1, &[]), ("b", 1, &[("s9", "5f0c-uid")])]);
    assert_eq!(decide(&claim(), &v), Step::Adopt { node: "b".into(), sandbox: "s9".into() });
}

#[test]
fn ready_when_its_sandbox_is_listed_on_an_up_node() {
    let v = view(&[("a", 1, &[("s1", "5f0c-uid")])]);
    let step = decide(&bound("a", "s1"), &v);
    assert_eq!(reason(&step), (READY, true, Some(RESYNC)));
    let Step::Report { report, .. } = &step else { unreachable!() };
    assert_eq!(report.message, "Glovebox sandbox s1 on node a");
    let recorded = ClaimView {
        ready: Some(ReadyState { ready: true, reason: READY.into(), message: report.message.clone() }),
        ..bound("a", "s1")
    };
    assert!(report.recorded_in(&recorded), "no second write of the same condition");
}

#[test]
fn a_sandbox_missing_from_a_later_listing_is_looked_at_then_reported_ended() {
    let v = view(&[("a", 0, &[])]);
    let c = bound("a", "s1");
    assert_eq!(decide(&c, &v), Step::Inspect { node: "a".into(), sandbox: "s1".into() });
    // A listing older than the binding proves nothing.
    let fresh = ClaimView {
        binding: Some(Binding { node: "a".into(), sandbox: "s1".into(), bound_at: Some(SystemTime::now()) }),
        ..claim()
    };
    assert_eq!(reason(&decide(&fresh, &v)).0, READY);
    let b = c.binding.clone().unwrap();
    let ended = after_inspect(&b, &Ok(Inspection::Ended(Some(EndReason::Timeout))));
    assert_eq!(reason(&ended), (SANDBOX_ENDED, false, None));
    let Step::Report { report, .. } = ended else { unreachable!() };
    assert_eq!(report.message, "Glovebox sandbox s1 on node a ended: timeout (its lifetime ran out)");
    assert_eq!(reason(&after_inspect(&b, &Ok(Inspection::Live))).0, READY);
    let down = Err(DaemonError::Unreachable { url: "u".into(), detail: "refused".into() });
    assert!(matches!(after_inspect(&b, &down), Step::Wait(_)));
}

#[test]
fn node_lost_ends_the_claim_with_a_reason_and_nothing_more() {
    let t = Instant::now();
    let mut v = view(&[("a", 1, &[("s1", "5f0c-uid")]), ("b", 0, &[])]);
    v.failed("a", "connection refused", t);
    assert!(matches!(decide(&bound("a", "s1"), &v), Step::Wait(_)), "suspect: wait, claim unchanged");
    v.tick(t + Duration::from_secs(30));
    let step = decide(&bound("a", "s1"), &v);
    assert_eq!(reason(&step), (NODE_LOST, false, None));
    let Step::Report { report, .. } = step else { unreachable!() };
    assert_eq!(
        report.message,
        "Glovebox node a stopped answering (connection refused): sandbox s1 and its state are gone; \
         delete this claim and make a new one"
    );
    let lost = ClaimView {
        ready: Some(ReadyState { ready: false, reason: NODE_LOST.into(), message: report.message }),
        ..bound("a", "s1")
    };
    assert_eq!(decide(&lost, &v), Step::Ignore, "terminal: not placed again behind the user's back");
    assert!(!holds(Some(&lost), "a", "s1"), "if a returns, the sandbox is an orphan");
    let gone = decide(&bound("zz", "s1"), &v);
    assert_eq!(reason(&gone).0, NODE_LOST, "a node removed from the cluster");
}

#[test]
fn deleting_a_claim_destroys_its_sandbox_then_releases_it() {
    let t = Instant::now();
    let mut v = view(&[("a", 1, &[("s1", "5f0c-uid")])]);
    let del = ClaimView { deleting: true, ..bound("a", "s1") };
    assert_eq!(decide(&del, &v), Step::Destroy { node: "a".into(), sandbox: "s1".into() });
    let done = ClaimView { binding: None, ..del.clone() };
    v.removed("a", "s1", t);
    assert_eq!(decide(&done, &v), Step::RemoveFinalizer);
    v.failed("a", "timed out", t);
    assert!(matches!(decide(&del, &v), Step::Wait(_)), "a restarting node is waited for");
    v.tick(t + Duration::from_secs(31));
    assert_eq!(decide(&del, &v), Step::RemoveFinalizer, "a lost node does not hold the deletion");
}

#[test]
fn deleting_an_unbound_claim_finds_a_sandbox_made_for_it() {
    let v = view(&[("a", 1, &[("s7", "5f0c-uid")])]);
    let del = ClaimView { deleting: true, ..claim() };
    assert_eq!(decide(&del, &v), Step::Destroy { node: "a".into(), sandbox: "s7".into() });
}

fn refused(status: u16, code: Option<ErrorCode>, message: &str) -> Result<Sandbox, DaemonError> {
    Err(DaemonError::Refused { url: "http://a:7171".into(), status, code, message: message.into(), reason: None })
}

#[test]
fn create_answers_are_classified() {
    let quota = after_create("a", &refused(429, Some(ErrorCode::QuotaExceeded), "at most 50 running sandboxes"));
    assert_eq!(
        quota,
        Created::Report {
            report: Report::no(QUOTA, "node a: at most 50 running sandboxes".into()),
            requeue: Some(Duration::from_secs(15)),
        }
    );
    let down =
        after_create("a", &Err(DaemonError::Unreachable { url: "u".into(), detail: "connection refused".into() }));
    assert_eq!(down, Created::NodeDown { why: "connection refused".into() });
    let stopping = after_create("a", &refused(503, Some(ErrorCode::Unavailable), "shutting down"));
    assert!(matches!(stopping, Created::NodeDown { .. }), "a daemon shutting down: place elsewhere");
    let gateway = after_create("a", &refused(502, None, "bad gateway"));
    assert!(matches!(gateway, Created::NodeDown { .. }));
    let tpl = after_create("a", &refused(404, Some(ErrorCode::TemplateNotFound), "no template x"));
    assert!(matches!(tpl, Created::Report { report: Report { reason: TEMPLATE_NOT_FOUND, .. }, .. }));
    let boom = after_create("a", &refused(500, Some(ErrorCode::StartFailed), "clone3: EAGAIN"));
    assert!(matches!(boom, Created::Report { report: Report { reason: CREATE_FAILED, .. }, .. }));
}

#[test]
fn sandbox_names_are_dns_labels() {
    assert_eq!(claim().sandbox_name(), "sandbox-claim-1a2b3c4d");
    let dotted = ClaimView { name: "my.claim".into(), uid: "0A1b-2c3d-4E5f".into(), ..claim() };
    assert_eq!(dotted.sandbox_name(), "gb-0a1b2c3d4e5f");
    let digit = ClaimView { name: "1st".into(), ..claim() };
    assert!(digit.sandbox_name().starts_with("gb-"));
}

#[test]
fn the_sweep_keeps_what_claims_hold() {
    assert!(!holds(None, "a", "s1"), "no claim: orphan");
    assert!(holds(Some(&claim()), "a", "s1"), "unbound claim: about to adopt it");
    assert!(holds(Some(&bound("a", "s1")), "a", "s1"));
    assert!(!holds(Some(&bound("a", "s1")), "b", "s2"), "the claim holds another one");
    assert!(holds(Some(&ClaimView { deleting: true, ..bound("b", "s2") }), "a", "s1"));
}
