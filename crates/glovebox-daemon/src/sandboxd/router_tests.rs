//! The HTTP side driven in-process (`tower::ServiceExt::oneshot`, no socket) over a manager
//! on the fake backend: which requests are this front-end's, and how it refuses. No root.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::http::AppState;
use crate::manager::testing::{fixture, Fixture};

const KEY: &str = "test-key";

async fn call(
    f: &Fixture,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(body.map(|b| Body::from(b.to_string())).unwrap_or_else(Body::empty)).expect("request");
    let app = crate::server::app(AppState { manager: f.m.clone(), api_key: Arc::new(KEY.to_string()) });
    let resp = app.oneshot(req).await.expect("response");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn sandbox(f: &Fixture) -> String {
    let auth = format!("Bearer {KEY}");
    let (st, v) = call(f, Method::POST, "/v1/sandboxes", &[("authorization", &auth)], Some(json!({}))).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    v["id"].as_str().expect("id").to_string()
}

#[tokio::test]
async fn the_sandbox_header_routes_here_and_only_it() {
    let f = fixture();
    let id = sandbox(&f).await;
    let auth = format!("Bearer {KEY}");
    let h = [("x-sandbox-id", id.as_str()), ("authorization", auth.as_str())];
    let (st, v) = call(&f, Method::POST, "/execute", &h, Some(json!({"command": "true"}))).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!((v["exit_code"].as_i64(), v["timed_out"].as_bool()), (Some(0), Some(false)), "{v}");
    let (st, v) = call(&f, Method::GET, "/v1/health", &h, None).await;
    assert_eq!((st, v["status"].as_str()), (StatusCode::OK, Some("ok")), "{v}");
    // Without the header the same path is the native API's (which has no such route).
    let (st, v) = call(&f, Method::GET, "/v1/health", &[("authorization", &auth)], None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert_ne!(v["code"], "NOT_FOUND", "not this front-end's answer: {v}");
    // The X-API-Key header carries the key too (what passes agent-sandbox's router).
    let h2 = [("x-sandbox-id", id.as_str()), ("x-api-key", KEY)];
    assert_eq!(call(&f, Method::GET, "/v1/health", &h2, None).await.0, StatusCode::OK);
}

/// Headers, path, the status and the `code` expected.
type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, StatusCode, &'a str);

#[tokio::test]
async fn refusals_name_the_problem() {
    let f = fixture();
    let id = sandbox(&f).await;
    let auth = format!("Bearer {KEY}");
    let cases: [Case; 6] = [
        (&[("x-sandbox-id", &id)], "/v1/health", StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        (
            &[("x-sandbox-id", &id), ("authorization", "Bearer nope")],
            "/v1/health",
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
        ),
        (&[("x-sandbox-id", "sb-nope"), ("authorization", &auth)], "/v1/health", StatusCode::NOT_FOUND, "NOT_FOUND"),
        (&[("x-sandbox-id", ""), ("authorization", &auth)], "/v1/health", StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        (
            &[("x-sandbox-id", &id), ("authorization", &auth), ("x-sandbox-port", "3000")],
            "/v1/health",
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (&[("x-sandbox-id", &id), ("authorization", &auth)], "/v2/frobnicate", StatusCode::NOT_FOUND, "NOT_FOUND"),
    ];
    for (h, path, status, code) in cases {
        let (st, v) = call(&f, Method::GET, path, h, None).await;
        assert_eq!((st, v["code"].as_str()), (status, Some(code)), "{h:?} {path}: {v}");
        assert!(!v["message"].as_str().unwrap_or("").is_empty(), "{v}");
    }
    let h = [("x-sandbox-id", id.as_str()), ("authorization", auth.as_str())];
    let (_, v) = call(&f, Method::GET, "/v2/frobnicate", &h, None).await;
    assert!(v["message"].as_str().unwrap_or("").contains("docs/sandboxd.md"), "{v}");
    let (st, v) = call(&f, Method::GET, "/v1/files/..%2F..%2Fetc", &h, None).await;
    assert_eq!((st, v["code"].as_str()), (StatusCode::FORBIDDEN, Some("PERMISSION_DENIED")), "{v}");
    let (st, v) = call(&f, Method::POST, "/execute", &h, Some(json!({"command": " "}))).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
}
