//! The HTTP router driven in-process (`tower::ServiceExt::oneshot`, no socket) over a
//! manager on the fake backend: what a client sees of create, exec, the clocks and destroy.
//! No root.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::http::AppState;
use crate::manager::testing::{fixture, Fixture};

const KEY: &str = "test-key";

fn app(f: &Fixture) -> axum::Router {
    crate::server::app(AppState { manager: f.m.clone(), api_key: Arc::new(KEY.to_string()) })
}

/// One request; the status and the JSON body (`Null` when there is none).
async fn call(f: &Fixture, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(body.map(|b| Body::from(b.to_string())).unwrap_or_else(Body::empty))
        .expect("request");
    let resp = app(f).oneshot(req).await.expect("response");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn create(f: &Fixture, body: Value) -> String {
    let (status, v) = call(f, Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["id"].as_str().expect("id").to_string()
}

#[tokio::test]
async fn create_exec_destroy_then_410() {
    let f = fixture();
    let id = create(&f, json!({})).await;
    let (status, v) = call(&f, Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!((status, v["state"].as_str()), (StatusCode::OK, Some("running")));
    let (status, v) =
        call(&f, Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": ["echo", "hi"]}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!((v["exit_code"].as_i64(), v["stdout"].as_str()), (Some(0), Some("hi\n")));
    let (status, _) = call(&f, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for (method, path) in
        [(Method::GET, format!("/v1/sandboxes/{id}")), (Method::POST, format!("/v1/sandboxes/{id}/exec"))]
    {
        let body = (method == Method::POST).then(|| json!({"cmd": ["echo", "hi"]}));
        let (status, v) = call(&f, method, &path, body).await;
        assert_eq!(status, StatusCode::GONE, "{path}: {v}");
        assert_eq!(v["error"]["code"].as_str(), Some("sandbox_gone"));
        assert_eq!(v["error"]["reason"].as_str(), Some("killed"));
    }
}

#[tokio::test]
async fn command_timeout_is_reported_and_the_sandbox_stays() {
    let f = fixture();
    let id = create(&f, json!({})).await;
    let exec = json!({"cmd": ["sleep", "10"], "timeout_ms": 50});
    let (status, v) = call(&f, Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(exec)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["timed_out"].as_bool(), Some(true));
    let (status, _) = call(&f, Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn idle_expiry_answers_410_idle() {
    let f = fixture();
    let id = create(&f, json!({"idle_timeout_s": 1})).await;
    // Watched from the side: any request on the sandbox would count as activity.
    let t = Instant::now();
    while f.m.live_count() > 0 && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, v) = call(&f, Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::GONE, "{v}");
    assert_eq!(v["error"]["reason"].as_str(), Some("idle"));
}

#[tokio::test]
async fn bad_create_is_400_and_unknown_is_404() {
    let f = fixture();
    let (status, v) = call(&f, Method::POST, "/v1/sandboxes", Some(json!({"timeout_s": 0}))).await;
    assert_eq!((status, v["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_request")));
    let (status, v) = call(&f, Method::GET, "/v1/sandboxes/nope", None).await;
    assert_eq!((status, v["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("sandbox_not_found")));
    assert_eq!(f.m.live_count(), 0);
}

/// Watching a sandbox (what a dashboard polls) is not activity: it still idles out; a
/// request that reaches its processes is.
#[tokio::test]
async fn watching_is_not_activity_but_using_is() {
    let f = fixture();
    let watched = create(&f, json!({"idle_timeout_s": 1})).await;
    let used = create(&f, json!({"idle_timeout_s": 1})).await;
    let t = Instant::now();
    let mut ended = None;
    while t.elapsed() < Duration::from_secs(6) && ended.is_none() {
        for route in ["", "/metrics", "/events", "/usage"] {
            let (status, v) = call(&f, Method::GET, &format!("/v1/sandboxes/{watched}{route}"), None).await;
            if status == StatusCode::GONE {
                ended = Some((t.elapsed(), v));
                break;
            }
        }
        let (status, v) =
            call(&f, Method::POST, &format!("/v1/sandboxes/{used}/exec"), Some(json!({"cmd": ["true"]}))).await;
        assert_eq!(status, StatusCode::OK, "a sandbox in use idled out: {v}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let Some((after, v)) = ended else { panic!("a sandbox only watched for 6 s did not idle out (1 s idle timeout)") };
    assert_eq!(v["error"]["reason"].as_str(), Some("idle"), "after {after:?}: {v}");
    assert!(after < Duration::from_secs(4), "idled out only after {after:?} of watching");
}

#[tokio::test]
async fn pause_resume_and_auto_resume() {
    let f = fixture();
    let id = create(&f, json!({})).await;
    for _ in 0..2 {
        let (status, v) = call(&f, Method::POST, &format!("/v1/sandboxes/{id}/pause"), None).await;
        assert_eq!((status, v["state"].as_str()), (StatusCode::OK, Some("paused")), "{v}");
    }
    let (_, v) = call(&f, Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(v["state"].as_str(), Some("paused"), "a view does not resume");
    let (status, _) = call(&f, Method::GET, &format!("/v1/sandboxes/{id}/metrics"), None).await;
    assert_eq!(status, StatusCode::OK, "metrics answer while paused");
    let (_, v) = call(&f, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(v["sandboxes"][0]["state"].as_str(), Some("paused"));
    // A request that reaches its processes resumes it first (the fake's frozen agent answers
    // nothing, so the command runs only if it was resumed).
    let (status, v) =
        call(&f, Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": ["echo", "hi"]}))).await;
    assert_eq!((status, v["stdout"].as_str()), (StatusCode::OK, Some("hi\n")), "{v}");
    let (_, v) = call(&f, Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(v["state"].as_str(), Some("running"));
    call(&f, Method::POST, &format!("/v1/sandboxes/{id}/pause"), None).await;
    for _ in 0..2 {
        let (status, v) = call(&f, Method::POST, &format!("/v1/sandboxes/{id}/resume"), None).await;
        assert_eq!((status, v["state"].as_str()), (StatusCode::OK, Some("running")), "{v}");
    }
    let (status, v) = call(&f, Method::POST, "/v1/sandboxes/nope/pause", None).await;
    assert_eq!((status, v["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("sandbox_not_found")));
}

#[tokio::test]
async fn hibernate_is_501_hibernate_unavailable() {
    let f = fixture();
    let (status, v) = call(&f, Method::POST, "/v1/sandboxes", Some(json!({"on_idle": "hibernate"}))).await;
    assert_eq!((status, v["error"]["code"].as_str()), (StatusCode::NOT_IMPLEMENTED, Some("hibernate_unavailable")));
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("not available on this host: ")), "{v}");
}

#[tokio::test]
async fn patch_changes_labels_and_idle_timeout_and_refuses_bad_input() {
    let f = fixture();
    let id = create(&f, json!({"metadata": {"a": "1"}})).await;
    let path = format!("/v1/sandboxes/{id}");
    let (status, v) = call(&f, Method::PATCH, &path, Some(json!({"metadata": {"b": "2"}, "idle_timeout_s": 60}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!((&v["metadata"], &v["idle_timeout_s"]), (&json!({"b": "2"}), &json!(60)));
    let (_, v) = call(&f, Method::GET, "/v1/sandboxes?metadata=b=2", None).await;
    assert_eq!(v["sandboxes"][0]["id"].as_str(), Some(id.as_str()), "{v}");
    let (status, v) = call(&f, Method::PATCH, &path, Some(json!({"idle_timeout_s": 0}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!((&v["metadata"], v.get("idle_timeout_s")), (&json!({"b": "2"}), None), "0 turns it off");
    for bad in [
        json!({"idle_timeout_s": u64::MAX}),
        json!({"idle_timeout_s": -1}),
        json!({"labels": {}}),
        json!({"metadata": {"k": 1}}),
    ] {
        let (status, v) = call(&f, Method::PATCH, &path, Some(bad.clone())).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{bad}: {v}"
        );
    }
    let (_, v) = call(&f, Method::GET, &path, None).await;
    assert_eq!((&v["metadata"], v.get("idle_timeout_s")), (&json!({"b": "2"}), None), "bad input changed nothing");
    let (status, v) = call(&f, Method::PATCH, "/v1/sandboxes/nope", Some(json!({}))).await;
    assert_eq!((status, v["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("sandbox_not_found")));
}

#[tokio::test]
async fn snapshot_routes_answer_with_stable_codes() {
    let f = fixture();
    let id = create(&f, json!({})).await;
    let code = |v: &Value| v["error"]["code"].as_str().map(str::to_string);
    // The fake backend shows no writable layer: a clear 422, not a 500.
    let (status, v) =
        call(&f, Method::POST, &format!("/v1/sandboxes/{id}/snapshots"), Some(json!({"name": "s"}))).await;
    assert_eq!((status, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, Some("snapshot_failed".into())), "{v}");
    let (status, v) =
        call(&f, Method::POST, &format!("/v1/sandboxes/{id}/snapshots"), Some(json!({"name": "-bad"}))).await;
    assert_eq!((status, code(&v)), (StatusCode::BAD_REQUEST, Some("invalid_request".into())), "{v}");
    let (status, v) = call(&f, Method::POST, "/v1/sandboxes/nope/snapshots", Some(json!({"name": "s"}))).await;
    assert_eq!((status, code(&v)), (StatusCode::NOT_FOUND, Some("sandbox_not_found".into())), "{v}");
    for body in [json!({"count": 0}), json!({"count": 21}), json!({"count": 1, "x": 1})] {
        let (status, v) = call(&f, Method::POST, &format!("/v1/sandboxes/{id}/fork"), Some(body.clone())).await;
        assert_eq!((status, code(&v)), (StatusCode::BAD_REQUEST, Some("invalid_request".into())), "{body}: {v}");
    }
    // An empty body is a fork of one (which the fake backend cannot snapshot).
    let (status, v) = call(&f, Method::POST, &format!("/v1/sandboxes/{id}/fork"), None).await;
    assert_eq!((status, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, Some("snapshot_failed".into())), "{v}");
    let (status, v) = call(&f, Method::GET, "/v1/snapshots", None).await;
    assert_eq!((status, &v["snapshots"]), (StatusCode::OK, &json!([])), "{v}");
    for (m, p) in [(Method::GET, "/v1/snapshots/nope"), (Method::DELETE, "/v1/snapshots/nope")] {
        let (status, v) = call(&f, m, p, None).await;
        assert_eq!((status, code(&v)), (StatusCode::NOT_FOUND, Some("snapshot_not_found".into())), "{v}");
    }
    let (status, v) = call(&f, Method::POST, "/v1/sandboxes", Some(json!({"snapshot": "nope"}))).await;
    assert_eq!((status, code(&v)), (StatusCode::NOT_FOUND, Some("snapshot_not_found".into())), "{v}");
}

#[tokio::test]
async fn e2b_snapshot_routes_answer_in_e2b_shapes() {
    let f = fixture();
    let id = create(&f, json!({})).await;
    let e2b_404 = |what: &str| json!({"code": 404, "message": format!("snapshot '{what}' not found")});
    // The fake backend shows no writable layer: E2B's error shape, 422.
    let (status, v) = call(&f, Method::POST, &format!("/sandboxes/{id}/snapshots"), Some(json!({}))).await;
    assert_eq!((status, v["code"].as_u64()), (StatusCode::UNPROCESSABLE_ENTITY, Some(422)), "{v}");
    for name in ["-bad", "Bad", "a/b", "snapshots/../x"] {
        let (status, v) =
            call(&f, Method::POST, &format!("/sandboxes/{id}/snapshots"), Some(json!({"name": name}))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {v}");
    }
    let (status, _) = call(&f, Method::POST, "/sandboxes/nope/snapshots", Some(json!({}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, v) = call(&f, Method::GET, "/snapshots?sandboxID=nope&name=x&limit=5", None).await;
    assert_eq!((status, v), (StatusCode::OK, json!([])));
    let (status, _) = call(&f, Method::GET, "/snapshots?limit=0", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A create from an unknown snapshot is E2B's 404; an id with no valid name is 400.
    let (status, v) = call(&f, Method::POST, "/sandboxes", Some(json!({"templateID": "snapshots/nope"}))).await;
    assert_eq!((status, v), (StatusCode::NOT_FOUND, e2b_404("snapshots/nope")));
    let (status, _) = call(&f, Method::POST, "/sandboxes", Some(json!({"templateID": "snapshots/../nope"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Delete: an unknown snapshot 404 (the SDK's `False`), a template's id is not deleted.
    let (status, v) = call(&f, Method::DELETE, "/templates/snapshots%2Fnope", None).await;
    assert_eq!((status, v), (StatusCode::NOT_FOUND, e2b_404("snapshots/nope")));
    for (path, want) in [
        ("/templates/snapshots%2F..%2Fx", StatusCode::BAD_REQUEST),
        ("/templates/base", StatusCode::BAD_REQUEST),
        ("/templates/nosuchtemplate", StatusCode::NOT_FOUND),
    ] {
        let (status, v) = call(&f, Method::DELETE, path, None).await;
        assert_eq!(status, want, "{path}: {v}");
    }
}

#[tokio::test]
async fn the_dashboard_is_served_without_a_key_under_a_strict_policy() {
    let f = fixture();
    for (path, ct) in [
        ("/ui", "text/html"),
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
        ("/ui/icon.svg", "image/svg+xml"),
    ] {
        let req = Request::builder().uri(path).header("host", "127.0.0.1:7171").body(Body::empty()).expect("request");
        let resp = app(&f).oneshot(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let h = resp.headers();
        let header = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        assert!(header("content-type").starts_with(ct), "{path}: {}", header("content-type"));
        let csp = header("content-security-policy");
        assert!(csp.starts_with("default-src 'self'; script-src 'self';"), "{path}: {csp}");
        assert!(csp.contains("connect-src 'self' ws://127.0.0.1:7171 wss://127.0.0.1:7171;"), "{path}: {csp}");
        assert_eq!(header("x-content-type-options"), "nosniff");
    }
}

#[tokio::test]
async fn a_websocket_subprotocol_carries_the_key_to_the_api() {
    use base64::Engine;
    let f = fixture();
    let get = |protocols: String| {
        let req = Request::builder()
            .uri("/v1/sandboxes")
            .header("sec-websocket-protocol", protocols)
            .body(Body::empty())
            .expect("request");
        app(&f).oneshot(req)
    };
    let enc = |k: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(k);
    let ok = get(format!("glovebox, glovebox.bearer.{}", enc(KEY))).await.expect("response");
    assert_eq!(ok.status(), StatusCode::OK);
    let wrong = get(format!("glovebox, glovebox.bearer.{}", enc("not-the-key"))).await.expect("response");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let bare = get(format!("glovebox, {KEY}")).await.expect("response");
    assert_eq!(bare.status(), StatusCode::UNAUTHORIZED, "a key is only read from its own subprotocol");
}
