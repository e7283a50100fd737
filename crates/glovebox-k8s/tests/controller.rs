//! The Kubernetes side of the controller against recorded API-server exchanges: kube-rs'
//! client over a `tower-test` mock service, where a script plays the API server (each
//! request checked — method, path, the body's meaningful fields — and answered with the JSON
//! an API server returns), and a fake Glovebox daemon answering as the real one does. One
//! reconcile pass per test: create, ready, node lost, claim deleted, quota refused, and the
//! cases around them. No API server runs on these machines; docs/scale-out.md says what is
//! checked on a real cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use glovebox_k8s::cluster::{LiveSandbox, NodeTarget, Observation};
use glovebox_k8s::controller::{error_policy, reconcile, Config, Ctx};
use glovebox_k8s::crd::SandboxClaim;
use glovebox_k8s::daemon::{refused, DaemonApi, DaemonError, Inspection};
use glovebox_k8s::load::NodeLoad;
use glovebox_proto::api::{CreateSandbox, Sandbox};
use http::{Request, Response};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::Client;
use serde_json::{json, Value};
use tower_test::mock;

// ---------------------------------------------------------------------------------------
// A fake Glovebox daemon per node
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Fake {
    /// What a create on a node answers (by URL); a created sandbox otherwise.
    create_answer: Mutex<BTreeMap<String, Result<Sandbox, DaemonError>>>,
    calls: Mutex<Vec<String>>,
}

impl Fake {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

fn sandbox(id: &str, uid: &str) -> Sandbox {
    serde_json::from_value(json!({
        "id": id, "template": "base", "state": "running",
        "created_at": "2026-12-02T07:31:00Z", "expires_at": "2026-12-02T07:36:00Z",
        "limits": {"cpus": 1.0, "memory_mb": 512, "disk_mb": 1024, "pids": 256},
        "metadata": {"glovebox.dev/claim-uid": uid, "glovebox.dev/managed-by": "glovebox-controller"},
        "network": {"mode": "deny-all"}
    }))
    .unwrap()
}

#[derive(Clone, Default)]
struct FakeDaemons(Arc<Fake>);

impl DaemonApi for FakeDaemons {
    async fn create(&self, url: &str, req: &CreateSandbox) -> Result<Sandbox, DaemonError> {
        let uid = req.metadata.get("glovebox.dev/claim-uid").cloned().unwrap_or_default();
        self.0.calls.lock().unwrap().push(format!("create {url} {uid}"));
        let scripted = self.0.create_answer.lock().unwrap().get(url).cloned();
        scripted.unwrap_or_else(|| Ok(sandbox("k3v9x", &uid)))
    }
    async fn destroy(&self, url: &str, id: &str) -> Result<(), DaemonError> {
        self.0.calls.lock().unwrap().push(format!("destroy {url} {id}"));
        Ok(())
    }
    async fn inspect(&self, url: &str, id: &str) -> Result<Inspection, DaemonError> {
        self.0.calls.lock().unwrap().push(format!("inspect {url} {id}"));
        Ok(Inspection::Live)
    }
    async fn observe(&self, url: &str) -> Result<Observation, DaemonError> {
        Err(DaemonError::Unreachable { url: url.into(), detail: "not used here".into() })
    }
}

// ---------------------------------------------------------------------------------------
// The API server's side
// ---------------------------------------------------------------------------------------

type Handle = mock::Handle<Request<Body>, Response<Body>>;

struct ApiServer(Handle);

impl ApiServer {
    /// Takes the next request, checks its method and path (query included), answers
    /// `status` with `body`, and returns the request's JSON body (Null when empty).
    async fn expect(&mut self, method: &str, path: &str, status: u16, body: Value) -> Value {
        let (req, send) = self.0.next_request().await.expect("the client sent no request");
        assert_eq!(req.method().as_str(), method, "{} {}", req.method(), req.uri());
        let uri = req.uri().to_string();
        assert_eq!(uri, path, "request path");
        let bytes = req.into_body().collect_bytes().await.expect("request body");
        let got = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("json body") };
        let resp = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap();
        send.send_response(resp);
        got
    }
}

/// A kube client whose API server is the returned script handle.
fn mock_client() -> (Client, ApiServer) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), ApiServer(handle))
}

const CLAIMS: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/team-a/sandboxclaims";
const POOL: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/team-a/sandboxwarmpools/python";
const TEMPLATE: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/team-a/sandboxtemplates/python";

/// A warm pool as the API server returns it.
fn pool() -> Value {
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
        "metadata": {"name": "python", "namespace": "team-a", "uid": "9d1e-pool", "resourceVersion": "4410",
                     "generation": 1, "creationTimestamp": "2026-12-02T07:00:00Z"},
        "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "python"}, "updateStrategy": {"type": "OnReplenish"}},
        "status": {"replicas": 0, "readyReplicas": 0}
    })
}

fn template(runtime_class: Option<&str>) -> Value {
    let mut spec = json!({"containers": [{"name": "main", "image": "registry.example/python-runtime:1",
        "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}}]});
    if let Some(rc) = runtime_class {
        spec["runtimeClassName"] = rc.into();
    }
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
        "metadata": {"name": "python", "namespace": "team-a", "uid": "77aa-tpl", "resourceVersion": "4402",
                     "generation": 1, "creationTimestamp": "2026-12-02T07:00:00Z",
                     "annotations": {"glovebox.dev/template": "base"}},
        "spec": {"podTemplate": {"metadata": {}, "spec": spec},
                 "networkPolicyManagement": "Unmanaged", "envVarsInjectionPolicy": "Disallowed",
                 "volumeClaimTemplatesPolicy": "Disallowed"}
    })
}

fn not_found(what: &str, name: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("{what}.extensions.agents.x-k8s.io \"{name}\" not found"),
           "reason": "NotFound", "details": {"name": name, "group": "extensions.agents.x-k8s.io", "kind": what},
           "code": 404})
}

/// A claim as the watch delivers it; `extra` is merged into its metadata and status.
fn claim(meta: Value, status: Value) -> Value {
    let mut m = json!({"name": "sandbox-claim-1a2b3c4d", "namespace": "team-a", "uid": "5f0c-uid",
                       "resourceVersion": "5120", "generation": 1, "creationTimestamp": "2026-12-02T07:31:00Z",
                       "labels": {"agents.x-k8s.io/created-by": "python-sdk"}});
    for (k, v) in meta.as_object().cloned().unwrap_or_default() {
        m[k] = v;
    }
    let mut c = json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
                       "metadata": m, "spec": {"warmPoolRef": {"name": "python"}}});
    if !status.is_null() {
        c["status"] = status;
    }
    c
}

fn bound_meta(node: &str) -> Value {
    json!({"finalizers": ["glovebox.dev/sandbox"],
           "annotations": {"glovebox.dev/node": node, "glovebox.dev/sandbox-id": "k3v9x",
                           "glovebox.dev/bound-at": "2026-12-02T07:31:00Z",
                           "agents.x-k8s.io/sandbox-name": "sandbox-claim-1a2b3c4d"}})
}

fn ready_status(message: &str) -> Value {
    json!({"conditions": [{"type": "Ready", "status": "True", "reason": "SandboxReady", "message": message,
                           "observedGeneration": 1, "lastTransitionTime": "2026-12-02T07:31:01Z"}],
           "sandbox": {"name": "sandbox-claim-1a2b3c4d"}})
}

// ---------------------------------------------------------------------------------------
// The controller's side
// ---------------------------------------------------------------------------------------

fn config() -> Config {
    Config {
        namespace: None,
        daemon_namespace: "glovebox-system".into(),
        daemon_selector: "app.kubernetes.io/name=glovebox".into(),
        daemon_port: 7171,
        router_ports: vec![("http".into(), 8888)],
        refresh: Duration::from_secs(5),
        grace: Duration::from_secs(30),
        orphan_age: Duration::from_secs(60),
    }
}

fn node(name: &str, ip: &str) -> NodeTarget {
    NodeTarget { name: name.into(), url: format!("http://{ip}:7171"), address: ip.into(), schedulable: true }
}

/// Nodes n1 (10.244.1.7, 3 running) and n2 (10.244.2.3, 1 running), both up; n2 lists
/// `on_n2`; the listing was taken now (after any bound-at above).
fn setup(on_n2: &[(&str, &str)]) -> (Arc<Ctx<FakeDaemons>>, ApiServer, FakeDaemons) {
    let (client, api) = mock_client();
    let fake = FakeDaemons::default();
    let ctx = Ctx::new(client, fake.clone(), config());
    {
        let mut v = ctx.nodes.view();
        let t = Instant::now();
        v.set_targets(vec![node("n1", "10.244.1.7"), node("n2", "10.244.2.3")], t);
        let live = |l: &[(&str, &str)]| {
            l.iter()
                .map(|(id, uid)| LiveSandbox { id: id.to_string(), claim_uid: Some(uid.to_string()), created_at: None })
                .collect()
        };
        v.observed(
            "n1",
            Observation { load: NodeLoad { running: 3, warm: 0 }, live: Vec::new() },
            t,
            SystemTime::now(),
        );
        v.observed(
            "n2",
            Observation { load: NodeLoad { running: 1, warm: 2 }, live: live(on_n2) },
            t,
            SystemTime::now(),
        );
    }
    (Arc::new(ctx), api, fake)
}

/// Runs one reconcile of `claim` beside the API server's `script`, both bounded.
async fn pass<F>(ctx: &Arc<Ctx<FakeDaemons>>, claim: Value, script: F) -> Result<Action, String>
where
    F: std::future::Future<Output = ()>,
{
    let claim: SandboxClaim = serde_json::from_value(claim).unwrap();
    let claim = Arc::new(claim);
    let run = async {
        let (r, ()) = tokio::join!(reconcile(claim.clone(), ctx.clone()), script);
        r.map_err(|e| {
            let _ = error_policy(claim.clone(), &e, ctx.clone());
            e.to_string()
        })
    };
    tokio::time::timeout(Duration::from_secs(10), run).await.expect("the pass or the script hung")
}

#[tokio::test]
async fn create_places_on_the_least_loaded_node_and_publishes_the_sandbox() {
    let (ctx, mut api, fake) = setup(&[]);
    let fresh = claim(json!({}), Value::Null);
    let script = async {
        api.expect("GET", POOL, 200, pool()).await;
        api.expect("GET", TEMPLATE, 200, template(Some("glovebox"))).await;
        let fin = api
            .expect(
                "PATCH",
                &format!("{CLAIMS}/sandbox-claim-1a2b3c4d?"),
                200,
                claim(
                    json!({"resourceVersion": "5121",
                "finalizers": ["glovebox.dev/sandbox"]}),
                    Value::Null,
                ),
            )
            .await;
        assert_eq!(fin, json!({"metadata": {"finalizers": ["glovebox.dev/sandbox"], "resourceVersion": "5120"}}));
        let svc = api
            .expect(
                "PATCH",
                "/api/v1/namespaces/team-a/services/sandbox-claim-1a2b3c4d?&force=true&fieldManager=glovebox-controller",
                200,
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sandbox-claim-1a2b3c4d"}}),
            )
            .await;
        assert_eq!(svc["spec"]["clusterIP"], "None");
        assert_eq!(svc["metadata"]["ownerReferences"][0]["uid"], "5f0c-uid");
        let slice = api
            .expect(
                "PATCH",
                "/apis/discovery.k8s.io/v1/namespaces/team-a/endpointslices/sandbox-claim-1a2b3c4d-glovebox?&force=true&fieldManager=glovebox-controller",
                200,
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                       "metadata": {"name": "sandbox-claim-1a2b3c4d-glovebox"}, "addressType": "IPv4", "endpoints": []}),
            )
            .await;
        assert_eq!(slice["endpoints"][0]["addresses"], json!(["10.244.2.3"]), "the node it was placed on");
        let ann = api
            .expect("PATCH", &format!("{CLAIMS}/sandbox-claim-1a2b3c4d?"), 200, claim(bound_meta("n2"), Value::Null))
            .await;
        let a = &ann["metadata"]["annotations"];
        assert_eq!(
            (a["glovebox.dev/node"].as_str(), a["glovebox.dev/sandbox-id"].as_str()),
            (Some("n2"), Some("k3v9x"))
        );
        assert_eq!(a["agents.x-k8s.io/sandbox-name"], "sandbox-claim-1a2b3c4d");
        let st = api
            .expect(
                "PATCH",
                &format!("{CLAIMS}/sandbox-claim-1a2b3c4d/status?"),
                200,
                claim(bound_meta("n2"), ready_status("x")),
            )
            .await;
        let c = &st["status"]["conditions"][0];
        assert_eq!(
            (c["type"].as_str(), c["status"].as_str(), c["reason"].as_str()),
            (Some("Ready"), Some("True"), Some("SandboxReady"))
        );
        assert_eq!(c["message"], "Glovebox sandbox k3v9x on node n2");
        assert_eq!(st["status"]["sandbox"], json!({"name": "sandbox-claim-1a2b3c4d"}), "no pod IPs");
    };
    let action = pass(&ctx, fresh, script).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
    assert_eq!(fake.0.calls(), ["create http://10.244.2.3:7171 5f0c-uid"]);
}

#[tokio::test]
async fn a_ready_claim_is_left_as_it_is() {
    let (ctx, mut api, fake) = setup(&[("k3v9x", "5f0c-uid")]);
    let ready = claim(bound_meta("n2"), ready_status("Glovebox sandbox k3v9x on node n2"));
    let script = async {
        api.expect("GET", POOL, 200, pool()).await;
        api.expect("GET", TEMPLATE, 200, template(Some("glovebox"))).await;
    };
    let action = pass(&ctx, ready, script).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
    assert!(fake.0.calls().is_empty(), "no daemon call: {:?}", fake.0.calls());
}

#[tokio::test]
async fn a_bound_claim_without_its_status_gets_ready() {
    // The controller stopped between the annotations and the status.
    let (ctx, mut api, _fake) = setup(&[("k3v9x", "5f0c-uid")]);
    let script = async {
        api.expect("GET", POOL, 200, pool()).await;
        api.expect("GET", TEMPLATE, 200, template(Some("glovebox"))).await;
        let st = api
            .expect(
                "PATCH",
                &format!("{CLAIMS}/sandbox-claim-1a2b3c4d/status?"),
                200,
                claim(bound_meta("n2"), ready_status("x")),
            )
            .await;
        assert_eq!(st["status"]["conditions"][0]["status"], "True");
    };
    pass(&ctx, claim(bound_meta("n2"), Value::Null), script).await.unwrap();
}

#[tokio::test]
async fn node_lost_is_written_to_the_claim_and_ends_it() {
    let (ctx, mut api, fake) = setup(&[]);
    {
        let mut v = ctx.nodes.view();
        let t = Instant::now();
        v.failed("n1", "connect: connection refused", t - Duration::from_secs(31));
        v.tick(t);
    }
    let script = async {
        api.expect("GET", POOL, 200, pool()).await;
        api.expect("GET", TEMPLATE, 200, template(Some("glovebox"))).await;
        let st = api
            .expect(
                "PATCH",
                &format!("{CLAIMS}/sandbox-claim-1a2b3c4d/status?"),
                200,
                claim(bound_meta("n1"), Value::Null),
            )
            .await;
        let c = &st["status"]["conditions"][0];
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("NodeLost")));
        assert_eq!(
            c["message"],
            "Glovebox node n1 stopped answering (connect: connection refused): sandbox k3v9x and its state are gone; \
             delete this claim and make a new one"
        );
    };
    let ready = claim(bound_meta("n1"), ready_status("Glovebox sandbox k3v9x on node n1"));
    let action = pass(&ctx, ready, script).await.unwrap();
    assert_eq!(action, Action::await_change(), "terminal: nothing to look at again");
    assert!(fake.0.calls().is_empty());
}

#[tokio::test]
async fn a_deleted_claims_sandbox_is_destroyed_and_the_claim_released() {
    let (ctx, mut api, fake) = setup(&[("k3v9x", "5f0c-uid")]);
    let mut meta = bound_meta("n2");
    meta["deletionTimestamp"] = "2026-12-02T07:40:00Z".into();
    meta["finalizers"] = json!(["other.example/keep", "glovebox.dev/sandbox"]);
    let script = async {
        // No pool or template read: what the claim records is enough.
        let fin =
            api.expect("PATCH", &format!("{CLAIMS}/sandbox-claim-1a2b3c4d?"), 200, claim(json!({}), Value::Null)).await;
        assert_eq!(fin, json!({"metadata": {"finalizers": ["other.example/keep"], "resourceVersion": "5120"}}));
    };
    let action = pass(&ctx, claim(meta, ready_status("x")), script).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(fake.0.calls(), ["destroy http://10.244.2.3:7171 k3v9x"]);
}

#[tokio::test]
async fn a_deleted_claim_on_a_lost_node_is_released_without_waiting_for_it() {
    let (ctx, mut api, fake) = setup(&[]);
    {
        let mut v = ctx.nodes.view();
        v.failed("n1", "timed out", Instant::now() - Duration::from_secs(40));
        v.tick(Instant::now());
    }
    let mut meta = bound_meta("n1");
    meta["deletionTimestamp"] = "2026-12-02T07:40:00Z".into();
    let script = async {
        api.expect("PATCH", &format!("{CLAIMS}/sandbox-claim-1a2b3c4d?"), 200, claim(json!({}), Value::Null)).await;
    };
    pass(&ctx, claim(meta, Value::Null), script).await.unwrap();
    assert!(fake.0.calls().is_empty(), "the lost node is not called: {:?}", fake.0.calls());
}

#[tokio::test]
async fn a_quota_refusal_is_reported_and_retried() {
    let (ctx, mut api, fake) = setup(&[]);
    let body = br#"{"error":{"code":"quota_exceeded","message":"tenant default: at most 50 running sandboxes"}}"#;
    fake.0
        .create_answer
        .lock()
        .unwrap()
        .insert("http://10.244.2.3:7171".into(), Err(refused("http://10.244.2.3:7171", 429, body)));
    let script = async {
        api.expect("GET", POOL, 200, pool()).await;
        api.expect("GET", TEMPLATE, 200, template(Some("glovebox"))).await;
        let st = api
            .expect("PATCH", &format!("{CLAIMS}/sandbox-claim-1a2b3c4d/status?"), 200, claim(json!({}), Value::Null))
            .await;
        let c = &st["status"]["conditions"][0];
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("QuotaExceeded")));
        assert_eq!(c["message"], "node n2: tenant default: at most 50 running sandboxes");
        assert!(st["status"].get("sandbox").is_none(), "no sandbox name before there is one");
    };
    let fin = claim(json!({"finalizers": ["glovebox.dev/sandbox"]}), Value::Null);
    let action = pass(&ctx, fin, script).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
    assert_eq!(fake.0.calls(), ["create http://10.244.2.3:7171 5f0c-uid"], "no Service for a refused create");
}

#[tokio::test]
async fn a_node_that_does_not_answer_is_skipped_for_the_next() {
    let (ctx, mut api, fake) = setup(&[]);
    let down = DaemonError::Unreachable { url: "http://10.244.2.3:7171".into(), detail: "connection refused".into() };
    fake.0.create_answer.lock().unwrap().insert("http://10.244.2.3:7171".into(), Err(down));
    let script = async {
        api.expect("GET", POOL, 200, pool()).await;
        api.expect("GET", TEMPLATE, 200, template(Some("glovebox"))).await;
        for _ in 0..2 {
            let (req, send) = api.0.next_request().await.expect("service and slice");
            assert_eq!(req.method(), "PATCH");
            send.send_response(Response::builder().status(200).body(Body::from(b"{}".to_vec())).unwrap());
        }
        let ann = api
            .expect("PATCH", &format!("{CLAIMS}/sandbox-claim-1a2b3c4d?"), 200, claim(bound_meta("n1"), Value::Null))
            .await;
        assert_eq!(ann["metadata"]["annotations"]["glovebox.dev/node"], "n1");
        api.expect(
            "PATCH",
            &format!("{CLAIMS}/sandbox-claim-1a2b3c4d/status?"),
            200,
            claim(bound_meta("n1"), Value::Null),
        )
        .await;
    };
    let fin = claim(json!({"finalizers": ["glovebox.dev/sandbox"]}), Value::Null);
    pass(&ctx, fin, script).await.unwrap();
    assert_eq!(fake.0.calls(), ["create http://10.244.2.3:7171 5f0c-uid", "create http://10.244.1.7:7171 5f0c-uid"]);
    assert_eq!(ctx.nodes.view().candidates().len(), 1, "n2 is suspect now");
}

#[tokio::test]
async fn other_runtimes_claims_are_not_touched() {
    let (ctx, mut api, fake) = setup(&[]);
    let script = async {
        api.expect("GET", POOL, 200, pool()).await;
        api.expect("GET", TEMPLATE, 200, template(Some("gvisor"))).await;
    };
    let action = pass(&ctx, claim(json!({}), Value::Null), script).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(fake.0.calls().is_empty());
}

#[tokio::test]
async fn a_missing_warm_pool_is_reported_with_agent_sandboxs_reason() {
    let (ctx, mut api, _fake) = setup(&[]);
    let script = async {
        api.expect("GET", POOL, 404, not_found("sandboxwarmpools", "python")).await;
        let st = api
            .expect("PATCH", &format!("{CLAIMS}/sandbox-claim-1a2b3c4d/status?"), 200, claim(json!({}), Value::Null))
            .await;
        assert_eq!(st["status"]["conditions"][0]["reason"], "WarmPoolNotFound");
    };
    let action = pass(&ctx, claim(json!({}), Value::Null), script).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
}

#[tokio::test]
async fn a_conflicting_write_fails_the_pass_before_anything_is_made() {
    let (ctx, mut api, fake) = setup(&[]);
    let script = async {
        api.expect("GET", POOL, 200, pool()).await;
        api.expect("GET", TEMPLATE, 200, template(Some("glovebox"))).await;
        api.expect(
            "PATCH",
            &format!("{CLAIMS}/sandbox-claim-1a2b3c4d?"),
            409,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "Operation cannot be fulfilled on sandboxclaims.extensions.agents.x-k8s.io \"sandbox-claim-1a2b3c4d\": the object has been modified; please apply your changes to the latest version and try again",
                   "reason": "Conflict", "code": 409}),
        )
        .await;
    };
    let err = pass(&ctx, claim(json!({}), Value::Null), script).await.unwrap_err();
    assert!(err.contains("the object has been modified"), "{err}");
    assert!(fake.0.calls().is_empty(), "no sandbox without the finalizer");
}

// ---------------------------------------------------------------------------------------
// Leader election: the Lease
// ---------------------------------------------------------------------------------------

mod leader {
    use super::*;
    use glovebox_k8s::controller::leader::{run_elected, Leader, LeaseConfig, Role};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use tokio::time::Instant as TokioInstant;

    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/glovebox-system/leases/glovebox-controller";
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/glovebox-system/leases";

    /// A Lease as the API server returns it.
    fn lease(holder: Option<&str>, renew: &str, rv: &str, duration_s: i64, transitions: i64) -> Value {
        let mut spec = json!({"leaseDurationSeconds": duration_s, "acquireTime": "2026-12-07T04:00:00.000000Z",
                              "renewTime": renew, "leaseTransitions": transitions});
        if let Some(h) = holder {
            spec["holderIdentity"] = h.into();
        }
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "glovebox-controller", "namespace": "glovebox-system", "uid": "3c1f-lease",
                            "resourceVersion": rv, "creationTimestamp": "2026-12-07T04:00:00Z"},
               "spec": spec})
    }

    /// The Lease as pod-a's write left it (15 s).
    fn ours(rv: &str, transitions: i64) -> Value {
        lease(Some("pod-a"), "2026-12-07T04:20:00.000000Z", rv, 15, transitions)
    }

    fn lease_not_found() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "leases.coordination.k8s.io \"glovebox-controller\" not found", "reason": "NotFound",
               "details": {"name": "glovebox-controller", "group": "coordination.k8s.io", "kind": "leases"}, "code": 404})
    }

    fn conflict() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "Operation cannot be fulfilled on leases.coordination.k8s.io \"glovebox-controller\": the object has been modified; please apply your changes to the latest version and try again",
               "reason": "Conflict", "code": 409})
    }

    fn mine() -> (Leader, ApiServer) {
        let (client, api) = mock_client();
        (Leader::new(client, LeaseConfig::new("glovebox-system", "glovebox-controller", "pod-a")), api)
    }

    async fn step<F: std::future::Future<Output = ()>>(l: &mut Leader, at: TokioInstant, script: F) -> Role {
        let run = async { tokio::join!(l.step(at), script).0 };
        tokio::time::timeout(Duration::from_secs(10), run).await.expect("hung").expect("step")
    }

    #[tokio::test]
    async fn the_first_replica_creates_the_lease_and_leads() {
        let (mut l, mut api) = mine();
        let script = async {
            api.expect("GET", LEASE, 404, lease_not_found()).await;
            let made = api.expect("POST", &format!("{LEASES}?"), 201, ours("801", 0)).await;
            let s = &made["spec"];
            assert_eq!((s["holderIdentity"].as_str(), s["leaseDurationSeconds"].as_i64()), (Some("pod-a"), Some(15)));
            assert_eq!(s["leaseTransitions"], 0);
            assert!(s["acquireTime"].as_str().is_some_and(|t| t.ends_with('Z')), "{made}");
            assert_eq!(s["acquireTime"], s["renewTime"]);
        };
        assert_eq!(step(&mut l, TokioInstant::now(), script).await, Role::Leader);
    }

    #[tokio::test]
    async fn the_leader_renews_against_the_records_version() {
        let (mut l, mut api) = mine();
        let script = async {
            let old = "2026-12-07T04:10:00.000000Z";
            api.expect("GET", LEASE, 200, lease(Some("pod-a"), old, "900", 15, 2)).await;
            let put = api.expect("PUT", &format!("{LEASE}?"), 200, ours("901", 2)).await;
            assert_eq!(put["metadata"]["resourceVersion"], "900", "optimistic concurrency");
            assert_eq!(put["spec"]["holderIdentity"], "pod-a");
            assert_ne!(put["spec"]["renewTime"], old, "a new renewTime");
            assert_eq!(put["spec"]["acquireTime"], "2026-12-07T04:00:00.000000Z", "kept");
            assert_eq!(put["spec"]["leaseTransitions"], 2, "no transition");
        };
        assert_eq!(step(&mut l, TokioInstant::now(), script).await, Role::Leader);
    }

    #[tokio::test]
    async fn a_follower_takes_over_only_after_the_record_stayed_the_same_for_its_duration() {
        let (mut l, mut api) = mine();
        let t = TokioInstant::now();
        let held = || lease(Some("pod-b"), "2026-12-07T04:10:00.000000Z", "950", 15, 3);
        for at in [0, 10, 14] {
            let script = async {
                api.expect("GET", LEASE, 200, held()).await;
            };
            let role = step(&mut l, t + Duration::from_secs(at), script).await;
            assert_eq!(role, Role::Follower(Some("pod-b".into())), "at {at} s: no write");
        }
        let script = async {
            api.expect("GET", LEASE, 200, held()).await;
            let put = api.expect("PUT", &format!("{LEASE}?"), 200, ours("951", 4)).await;
            assert_eq!(put["metadata"]["resourceVersion"], "950");
            let s = &put["spec"];
            assert_eq!((s["holderIdentity"].as_str(), s["leaseTransitions"].as_i64()), (Some("pod-a"), Some(4)));
            assert_ne!(s["acquireTime"], "2026-12-07T04:00:00.000000Z", "acquired now");
        };
        assert_eq!(step(&mut l, t + Duration::from_secs(15), script).await, Role::Leader);
    }

    #[tokio::test]
    async fn a_holder_that_renews_is_not_taken_and_a_lost_race_leaves_a_follower() {
        let (mut l, mut api) = mine();
        let t = TokioInstant::now();
        // Renewed between two looks 16 s apart: seen anew, not expired.
        for (at, renew, rv) in [(0, "2026-12-07T04:10:00.000000Z", "960"), (16, "2026-12-07T04:10:12.000000Z", "961")] {
            let script = async {
                api.expect("GET", LEASE, 200, lease(Some("pod-b"), renew, rv, 15, 3)).await;
            };
            assert_eq!(step(&mut l, t + Duration::from_secs(at), script).await, Role::Follower(Some("pod-b".into())));
        }
        // Then silent for 15 s: taken — but another replica's write lands first.
        let script = async {
            api.expect("GET", LEASE, 200, lease(Some("pod-b"), "2026-12-07T04:10:12.000000Z", "961", 15, 3)).await;
            api.expect("PUT", &format!("{LEASE}?"), 409, conflict()).await;
        };
        assert_eq!(step(&mut l, t + Duration::from_secs(31), script).await, Role::Follower(None));
    }

    /// The API server for `run_elected`: pod-b holds a 1-second Lease, never renewing it;
    /// pod-a's takeover is accepted, then `renewals` renewals, then pod-c holds it (or, with
    /// `down`, every request fails). Returns when pod-a took over (through `took`) and the
    /// requests it answered.
    async fn scripted_cluster(
        mut api: ApiServer,
        renewals: usize,
        down: bool,
        took: Arc<Mutex<Option<TokioInstant>>>,
    ) -> Vec<String> {
        let mut record = lease(Some("pod-b"), "2026-12-07T04:10:00.000000Z", "970", 1, 5);
        let mut log = Vec::new();
        let mut renewed = 0;
        while let Some((req, send)) = api.0.next_request().await {
            let method = req.method().to_string();
            log.push(method.clone());
            let body = req.into_body().collect_bytes().await.expect("body");
            let after = renewed >= renewals && took.lock().unwrap().is_some();
            let (status, answer) = match method.as_str() {
                _ if after && down => (
                    500,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500}),
                ),
                "GET" if renewed >= renewals && took.lock().unwrap().is_some() => {
                    (200, lease(Some("pod-c"), "2026-12-07T05:00:00.000000Z", "999", 1, 7))
                }
                "GET" => (200, record.clone()),
                "PUT" => {
                    let put: Value = serde_json::from_slice(&body).expect("json");
                    assert_eq!(put["spec"]["holderIdentity"], "pod-a");
                    assert_eq!(put["metadata"]["resourceVersion"], record["metadata"]["resourceVersion"]);
                    if took.lock().unwrap().is_none() {
                        assert_eq!(put["spec"]["leaseTransitions"], 6, "{put}");
                        *took.lock().unwrap() = Some(TokioInstant::now());
                    } else {
                        renewed += 1;
                    }
                    let mut next = put.clone();
                    let rv: u64 = record["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
                    next["metadata"]["resourceVersion"] = (rv + 1).to_string().into();
                    record = next.clone();
                    (200, next)
                }
                other => panic!("unexpected {other}"),
            };
            let resp = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap();
            send.send_response(resp);
        }
        log
    }

    #[tokio::test]
    async fn only_the_leader_reconciles_and_it_stops_when_the_lease_is_taken() {
        let (passes, log) = elected(false, "lost the leader lease: the lease is held by pod-c").await;
        assert!(passes > 0);
        assert_eq!(log.iter().filter(|m| *m == "PUT").count(), 4, "one takeover and three renewals: {log:?}");
    }

    #[tokio::test]
    async fn a_leader_that_cannot_renew_within_the_deadline_stops() {
        let (_, log) = elected(true, "lost the leader lease: not renewed for 600ms: kubernetes api: ").await;
        // Retried every 100 ms until the 600 ms deadline since the last renewal.
        let failed = log.iter().rev().take_while(|m| *m == "GET").count();
        assert!((3..=7).contains(&failed), "{failed} failed looks: {log:?}");
    }

    /// `run_elected` against `scripted_cluster` (three renewals, then the Lease taken or the
    /// API server down); checks what any loss of the Lease must do, and returns the passes
    /// the "controller" made and the requests seen.
    async fn elected(down: bool, want: &str) -> (u64, Vec<String>) {
        let (client, api) = mock_client();
        let mut cfg = LeaseConfig::new("glovebox-system", "glovebox-controller", "pod-a");
        cfg.duration = Duration::from_secs(1);
        cfg.renew_deadline = Duration::from_millis(600);
        cfg.retry = Duration::from_millis(100);
        let took = Arc::new(Mutex::new(None));
        let cluster = tokio::spawn(scripted_cluster(api, 3, down, took.clone()));

        // The "controller": counts its passes; records when it started and that it was dropped.
        let started: Arc<Mutex<Option<TokioInstant>>> = Arc::default();
        let passes = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicBool::new(false));
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let work = {
            let (started, passes, dropped) = (started.clone(), passes.clone(), dropped.clone());
            move || async move {
                let _guard = Dropped(dropped);
                *started.lock().unwrap() = Some(TokioInstant::now());
                loop {
                    passes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let t0 = TokioInstant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), run_elected(client, cfg, work)).await.expect("hung");
        let err = r.expect_err("it stops leading").to_string();
        assert!(err.starts_with(want), "{err}");
        let took = took.lock().unwrap().expect("pod-a took the lease over");
        let started = started.lock().unwrap().expect("the controller ran");
        assert!(started >= took, "reconciling began only after the takeover was written");
        assert!(took - t0 >= Duration::from_secs(1), "pod-b's lease was left to expire first: {:?}", took - t0);
        assert!(dropped.load(Ordering::SeqCst), "the controller is dropped when the lease is lost");
        let n = passes.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(passes.load(Ordering::SeqCst), n, "nothing of it runs on");
        let log = cluster.await.expect("cluster");
        assert!(log.iter().all(|m| m == "GET" || m == "PUT"), "{log:?}");
        (n, log)
    }

    #[tokio::test]
    async fn a_leader_that_stops_releases_the_lease() {
        let (client, mut api) = mock_client();
        let cfg = LeaseConfig::new("glovebox-system", "glovebox-controller", "pod-a");
        let script = async {
            api.expect("GET", LEASE, 404, lease_not_found()).await;
            api.expect("POST", &format!("{LEASES}?"), 201, ours("801", 0)).await;
            api.expect("GET", LEASE, 200, ours("801", 0)).await;
            let put = api
                .expect("PUT", &format!("{LEASE}?"), 200, lease(None, "2026-12-07T04:20:00.000000Z", "802", 15, 0))
                .await;
            assert_eq!(put["metadata"]["resourceVersion"], "801");
            assert!(put["spec"].get("holderIdentity").is_none(), "released: {put}");
        };
        let run = async { tokio::join!(run_elected(client, cfg, || async { Ok(()) }), script).0 };
        tokio::time::timeout(Duration::from_secs(10), run).await.expect("hung").expect("ran and stopped");
    }
}
