//! The router hop of docs/scale-out.md (issue 28): agent-sandbox's sandbox-router forwards an
//! SDK's request to `{name}.{namespace}.svc.cluster.local:8888` without the caller's key
//! (and, in its Python version, without `X-Sandbox-*`); the daemon's router-facing listener
//! (`glovebox serve --router-listen`) picks the sandbox by that Host name.
//!
//! A real daemon with the listener, sandboxes created with the request the claims controller
//! sends (`glovebox_k8s::reconcile::request`), and the unmodified `k8s-agent-sandbox` SDK
//! driving them through a stand-in router (`tests/sandboxd/router_hop.py`, both routers'
//! header handling). Then, straight at the listener: what it must not serve (the admin API,
//! the other front-ends, a sandbox's exposed port by preview host or path, gRPC), that
//! `X-Sandbox-ID` does not steer it, and the answers for names it does not know.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{poll, run_checks, sandboxd_sdk_python, Daemon};
use glovebox_k8s::reconcile::{request, Backing, ClaimView};
use glovebox_k8s::settings::Settings;
use reqwest::Method;
use serde_json::{json, Value};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sandboxd")
}

/// What the controller sends a node for claim `namespace/name`, with `CLAIM` in the
/// sandbox's environment to tell the sandboxes apart.
fn controller_create(namespace: &str, name: &str) -> Value {
    let claim = ClaimView {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{namespace}-{name}"),
        deleting: false,
        finalized: true,
        backing: Backing::NotGlovebox,
        env: Vec::new(),
        binding: None,
        ready: None,
    };
    let mut s = Settings::default();
    s.env.insert("CLAIM".into(), format!("{namespace}/{name}"));
    let req = request(&claim, &s);
    assert_eq!(req.metadata["agents.x-k8s.io/sandbox-name"], name);
    serde_json::to_value(req).expect("create request")
}

/// A request straight at the router-facing listener, sent to `host`.
fn at_listener(d: &Daemon, method: Method, host: &str, path: &str) -> reqwest::blocking::RequestBuilder {
    let http = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build().unwrap();
    http.request(method, format!("{}{path}", d.router_url.as_deref().expect("router listener"))).header("host", host)
}

fn send(rb: reqwest::blocking::RequestBuilder) -> (u16, Value) {
    let r = rb.send().expect("request to the router-facing listener");
    let st = r.status().as_u16();
    let text = r.text().unwrap_or_default();
    (st, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

const DEMO: &str = "demo.team-a.svc.cluster.local:8888";

#[test]
fn the_sdk_reaches_claims_sandboxes_through_the_router_hop() {
    require_root!();
    let py = sandboxd_sdk_python();
    let d = Daemon::start_with_router();
    let a = d.create(controller_create("team-a", "demo"));
    let b = d.create(controller_create("team-b", "demo"));
    // A tenant labels its own sandbox as a claim: the listener must not route to it.
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "mallory", "name": "router-test" }));
    assert_eq!(st, 201, "{k}");
    let tenant_key = k["key"].as_str().expect("tenant key").to_string();
    let mut squat = controller_create("team-a", "squatter");
    squat["metadata"]["glovebox.dev/managed-by"] = json!("glovebox-controller");
    let (st, v) = d.send(d.req_noauth(Method::POST, "/v1/sandboxes").bearer_auth(&tenant_key).json(&squat));
    assert_eq!(st, 201, "{v}");
    let squatter = v["id"].as_str().expect("id").to_string();
    d.register(&squatter);

    // The SDK through the stand-in routers.
    let listener = d.router_url.as_deref().unwrap().trim_start_matches("http://").to_string();
    let mut cmd = Command::new(&py);
    cmd.arg("-u").arg(scripts().join("router_hop.py")).env("GLOVEBOX_ROUTER_LISTENER", &listener);
    let (stdout, oks) = run_checks(&d, &mut cmd, "router hop: ");
    assert!(oks >= 18, "router_hop.py ran {oks} checks:\n{stdout}");

    // What the SDK wrote is in claim team-a/demo's sandbox, as its API shows.
    // (The last write was the Go router's: 256 × 17 bytes and its label.)
    assert_eq!(d.sh_ok(&a, "wc -c < work/from-sdk.bin").trim(), (256 * 17 + "go router".len()).to_string());
    assert_eq!(d.sh_ok(&b, "test -e work/from-sdk.bin || echo absent").trim(), "absent");

    // Host decides; X-Sandbox-ID (which the Go router forwards) does not steer.
    let (st, v) = send(
        at_listener(&d, Method::POST, DEMO, "/execute")
            .header("x-sandbox-id", &b)
            .header("x-sandbox-namespace", "team-b")
            .json(&json!({ "command": "echo $CLAIM" })),
    );
    assert_eq!((st, v["stdout"].as_str()), (200, Some("team-a/demo\n")), "{v}");

    // Names it does not know: 404 in the front-end's shape; never a 5xx.
    for host in ["demo.team-c.svc.cluster.local:8888", "10.244.1.7:8888", "[fd00::7]:8888", "demo", "x.y.example.test"]
    {
        let (st, v) = send(at_listener(&d, Method::POST, host, "/execute").json(&json!({ "command": "true" })));
        assert_eq!((st, v["code"].as_str()), (404, Some("NOT_FOUND")), "{host}: {v}");
    }
    // Two live sandboxes carrying one claim: refused, not guessed.
    let dup1 = d.create(controller_create("team-a", "twice"));
    let dup2 = d.create(controller_create("team-a", "twice"));
    let (st, v) = send(at_listener(&d, Method::GET, "twice.team-a.svc.cluster.local", "/v1/health"));
    assert_eq!((st, v["code"].as_str()), (409, Some("FAILED_PRECONDITION")), "{v}");

    // Nothing but sandboxd's and the python-runtime's routes, even with the admin key.
    let before = d.get("/v1/sandboxes").1["sandboxes"].as_array().map(Vec::len);
    assert_eq!(before, Some(5), "a, b, squatter, dup1, dup2 and no other");
    for (method, path) in [
        (Method::GET, "/v1/sandboxes".to_string()),
        (Method::POST, "/v1/sandboxes".to_string()),
        (Method::GET, format!("/v1/sandboxes/{a}")),
        (Method::DELETE, format!("/v1/sandboxes/{b}")),
        (Method::POST, "/v1/keys".to_string()),
        (Method::GET, "/metrics".to_string()),
        (Method::GET, "/healthz".to_string()),
        (Method::GET, "/ui".to_string()),
        (Method::POST, "/sandboxes".to_string()),
        (Method::GET, format!("/v1/sandboxes/{a}/ports/8000/")),
    ] {
        let (st, v) = send(at_listener(&d, method.clone(), DEMO, &path).bearer_auth(&d.key).json(&json!({})));
        assert_eq!((st, v["code"].as_str()), (404, Some("NOT_FOUND")), "{method} {path}: {v}");
    }
    assert_eq!(
        d.get("/v1/sandboxes").1["sandboxes"].as_array().map(Vec::len),
        before,
        "nothing was created or deleted"
    );
    let (st, v) = d.get(&format!("/v1/sandboxes/{b}"));
    assert_eq!(st, 200, "{v}");

    // A public port of sandbox a: served by preview host on the API listener, not here.
    let (st, v) = d.post(
        &format!("/v1/sandboxes/{a}/exec"),
        &json!({ "cmd": ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"], "background": true, "timeout_ms": 0 }),
    );
    assert_eq!(st, 202, "{v}");
    let (st, v) = d.post(&format!("/v1/sandboxes/{a}/ports/8000"), &json!({ "public": true }));
    assert_eq!(st, 200, "{v}");
    let preview = format!("8000-{a}.localhost");
    let served = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        let (st, _) = d.send(d.req_noauth(Method::GET, "/").header("host", &preview));
        (st == 200).then_some(())
    });
    assert!(served.is_some(), "the preview host serves on the API listener");
    let (st, v) = send(at_listener(&d, Method::GET, &preview, "/"));
    assert_eq!((st, v["code"].as_str()), (404, Some("NOT_FOUND")), "preview host on the router listener: {v}");

    // gRPC (HTTP/2) is not served here: the preface gets no 5xx and reaches nothing.
    let addr = d.router_url.as_deref().unwrap().trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let head = String::from_utf8_lossy(&got[..got.len().min(40)]).to_string();
    assert!(!head.starts_with("HTTP/1.1 5") && !head.starts_with("HTTP/2"), "h2 preface answered {head:?}");
    eprintln!("h2 preface on the router listener: {head:?}");

    for id in [&a, &b, &squatter, &dup1, &dup2] {
        let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
        assert!(st == 204 || st == 200, "delete {id}: {st} {v}");
    }
    // A claim whose sandbox ended: 404.
    let (st, v) = send(at_listener(&d, Method::GET, DEMO, "/v1/health"));
    assert_eq!((st, v["code"].as_str()), (404, Some("NOT_FOUND")), "{v}");
    d.shutdown_and_check_leaks();
}
