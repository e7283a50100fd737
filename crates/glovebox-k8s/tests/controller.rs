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
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
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
    (Arc::new(ctx), ApiServer(handle), fake)
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
