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
