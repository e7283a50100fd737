//! The Vercel routes driven in-process over a manager on the fake backend (no root): who may
//! call, and that bad or unsupported requests get Vercel's error shape with a 4xx before
//! anything is made. (The fake agent has no file operations, so sandboxes made through this
//! front-end are tested end to end, in crates/glovebox/tests/vercel.rs.)

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::http::AppState;
use crate::manager::testing::{fixture, Fixture};

const KEY: &str = "test-key";

async fn call(f: &Fixture, method: Method, path: &str, key: Option<&str>, body: &str) -> (StatusCode, Value) {
    let app = crate::server::app(AppState { manager: f.m.clone(), api_key: Arc::new(KEY.to_string()) });
    let mut req = Request::builder().method(method).uri(path).header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let resp = app.oneshot(req.body(Body::from(body.to_string())).expect("request")).await.expect("response");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn the_key_is_checked_first() {
    let f = fixture();
    for key in [None, Some("wrong")] {
        let (status, v) = call(&f, Method::POST, "/vercel/v2/sandboxes", key, "{}").await;
        assert_eq!((status, code(&v)), (StatusCode::FORBIDDEN, "forbidden"), "{v}");
        let (status, _) = call(&f, Method::GET, "/vercel/v2/sandboxes/sessions/x/cmd/1/logs", key, "").await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    assert!(f.m.list_for(&crate::tenants::Caller::admin()).is_empty(), "nothing was made");
}

#[tokio::test]
async fn bad_and_unsupported_requests_are_4xx_in_vercels_shape() {
    let f = fixture();
    let k = Some(KEY);
    for (body, want) in [
        ("{not json", "bad_request"),
        (r#"{"runtime": "ruby3.3"}"#, "bad_request"),
        (r#"{"runtime": "node22", "image": "base"}"#, "bad_request"),
        (r#"{"timeout": 0}"#, "bad_request"),
        (r#"{"networkPolicy": {"mode": "sometimes"}}"#, "bad_request"),
        (r#"{"networkPolicy": {"allow": ["not a domain!"]}}"#, "bad_request"),
        (r#"{"persistent": true}"#, "not_supported"),
        (r#"{"ports": [0]}"#, "bad_request"),
        (r#"{"ports": [65536]}"#, "bad_request"),
        (r#"{"ports": "3000"}"#, "bad_request"),
        (r#"{"ports": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}"#, "bad_request"),
        (r#"{"source": {"type": "git", "url": "https://x.test/r.git"}}"#, "not_supported"),
        (r#"{"name": "mine"}"#, "not_supported"),
        (r#"{"mounts": {"/data": {"drive": "d"}}}"#, "not_supported"),
        (r#"{"networkPolicy": {"allow": {"a.test": [{"forwardURL": "https://b.test"}]}}}"#, "not_supported"),
    ] {
        let (status, v) = call(&f, Method::POST, "/vercel/v2/sandboxes", k, body).await;
        assert_eq!((status, code(&v)), (StatusCode::BAD_REQUEST, want), "{body}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap_or_default().is_empty(), "{v}");
    }
    for (method, path, want) in [
        (Method::GET, "/vercel/v2/sandboxes/snapshots", (StatusCode::BAD_REQUEST, "not_supported")),
        (Method::GET, "/vercel/v2/sandboxes/snapshots/snp_1", (StatusCode::BAD_REQUEST, "not_supported")),
        (Method::GET, "/vercel/v2/sandboxes/drives", (StatusCode::BAD_REQUEST, "not_supported")),
        (Method::POST, "/vercel/v2/sandboxes/x/fork", (StatusCode::BAD_REQUEST, "not_supported")),
        (Method::POST, "/vercel/v2/sandboxes/sessions/x/snapshot", (StatusCode::BAD_REQUEST, "not_supported")),
        (Method::POST, "/vercel/v2/sandboxes/sessions/x/interactive", (StatusCode::BAD_REQUEST, "not_supported")),
        (Method::GET, "/vercel/v9/nothing", (StatusCode::NOT_FOUND, "not_found")),
        (Method::GET, "/vercel/v2/sandboxes/nope", (StatusCode::NOT_FOUND, "sandbox_not_found")),
        (Method::POST, "/vercel/v2/sandboxes/sessions/nope/cmd", (StatusCode::NOT_FOUND, "sandbox_not_found")),
        (Method::POST, "/vercel/v2/sandboxes/sessions/nope/fs/write", (StatusCode::NOT_FOUND, "sandbox_not_found")),
    ] {
        let (status, v) = call(&f, method, path, k, "{}").await;
        assert_eq!((status, code(&v)), want, "{path}: {v}");
    }
}

#[tokio::test]
async fn listings_are_empty_pages() {
    let f = fixture();
    let (status, v) = call(&f, Method::GET, "/vercel/v2/sandboxes", Some(KEY), "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v, json!({ "pagination": { "count": 0, "next": null }, "sandboxes": [] }));
}
