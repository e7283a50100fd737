//! The Glovebox daemon's HTTP API as the controller uses it: create, look at and destroy a
//! sandbox, and look at a node (its `/metrics` and its list of the controller's sandboxes).
//! [`DaemonApi`] is the seam: [`HttpDaemons`] speaks HTTP to real daemons; tests put a fake
//! in its place.

use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use glovebox_proto::api::{CreateSandbox, EndReason, ErrorBody, ErrorCode, Sandbox, SandboxList, SandboxState};
use k8s_openapi::jiff::Timestamp;
use thiserror::Error;

use crate::cluster::{LiveSandbox, Observation};
use crate::crd::{MANAGED_BY, META_CLAIM_UID, META_MANAGED_BY};

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum DaemonError {
    /// No answer: connection refused or reset, timed out, or the node is not reachable.
    #[error("{url}: no answer: {detail}")]
    Unreachable { url: String, detail: String },
    /// The daemon answered with an error.
    #[error("{url}: {status} {}: {message}", code.map_or("-", |c| c.as_str()))]
    Refused { url: String, status: u16, code: Option<ErrorCode>, message: String, reason: Option<EndReason> },
    /// The daemon answered something that is not its API's.
    #[error("{url}: unexpected answer: {detail}")]
    BadAnswer { url: String, detail: String },
}

/// A sandbox as a later look finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspection {
    Live,
    /// Ended, with the daemon's reason when it has one.
    Ended(Option<EndReason>),
    /// The daemon does not know it (never made, or forgotten).
    Unknown,
}

/// What the controller asks of one node's daemon (`url`: its base URL).
pub trait DaemonApi: Send + Sync + 'static {
    fn create(&self, url: &str, req: &CreateSandbox) -> impl Future<Output = Result<Sandbox, DaemonError>> + Send;
    /// Destroys `id`; one already gone counts as destroyed.
    fn destroy(&self, url: &str, id: &str) -> impl Future<Output = Result<(), DaemonError>> + Send;
    fn inspect(&self, url: &str, id: &str) -> impl Future<Output = Result<Inspection, DaemonError>> + Send;
    /// The node's load and the controller's sandboxes on it.
    fn observe(&self, url: &str) -> impl Future<Output = Result<Observation, DaemonError>> + Send;
}

/// The sandbox as the cluster view keeps it.
pub fn live_sandbox(sb: &Sandbox) -> LiveSandbox {
    LiveSandbox {
        id: sb.id.clone(),
        claim_uid: sb.metadata.get(META_CLAIM_UID).cloned(),
        created_at: Timestamp::from_str(&sb.created_at).ok().map(SystemTime::from),
    }
}

/// Real daemons over HTTP, with the API key every node shares.
#[derive(Clone)]
pub struct HttpDaemons {
    http: reqwest::Client,
    key: String,
}

impl HttpDaemons {
    /// `timeout` bounds every call (a create from an empty warm pool boots a sandbox, which
    /// takes milliseconds on `base` and a few seconds for a code interpreter).
    pub fn new(key: String, timeout: Duration) -> Result<HttpDaemons, DaemonError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(3))
            .build()
            .map_err(|e| DaemonError::BadAnswer { url: String::new(), detail: format!("http client: {e}") })?;
        Ok(HttpDaemons { http, key })
    }

    async fn send(&self, url: &str, rb: reqwest::RequestBuilder) -> Result<reqwest::Response, DaemonError> {
        rb.bearer_auth(&self.key)
            .send()
            .await
            .map_err(|e| DaemonError::Unreachable { url: url.to_string(), detail: cause(&e) })
    }

    /// The body of a success, or the daemon's error.
    async fn body(url: &str, r: reqwest::Response) -> Result<Vec<u8>, DaemonError> {
        let status = r.status().as_u16();
        let bytes =
            r.bytes().await.map_err(|e| DaemonError::Unreachable { url: url.to_string(), detail: cause(&e) })?;
        if (200..300).contains(&status) {
            return Ok(bytes.to_vec());
        }
        Err(refused(url, status, &bytes))
    }
}

/// The daemon's error body read into [`DaemonError::Refused`] (a body that is not one still
/// gives the status and a bounded excerpt).
pub fn refused(url: &str, status: u16, body: &[u8]) -> DaemonError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => DaemonError::Refused {
            url: url.to_string(),
            status,
            code: Some(e.error.code),
            message: e.error.message,
            reason: e.error.reason,
        },
        Err(_) => DaemonError::Refused {
            url: url.to_string(),
            status,
            code: None,
            message: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
            reason: None,
        },
    }
}

/// What went wrong reaching a daemon, short: the innermost cause ("Connection refused (os
/// error 111)"), after "connect:" or as "timed out" when that is what it was.
fn cause(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".to_string();
    }
    let mut inner: &dyn std::error::Error = e;
    while let Some(s) = inner.source() {
        inner = s;
    }
    if e.is_connect() {
        format!("connect: {inner}")
    } else {
        inner.to_string()
    }
}

fn decode<T: serde::de::DeserializeOwned>(url: &str, bytes: &[u8]) -> Result<T, DaemonError> {
    serde_json::from_slice(bytes).map_err(|e| DaemonError::BadAnswer { url: url.to_string(), detail: e.to_string() })
}

impl DaemonApi for HttpDaemons {
    async fn create(&self, url: &str, req: &CreateSandbox) -> Result<Sandbox, DaemonError> {
        let r = self.send(url, self.http.post(format!("{url}/v1/sandboxes")).json(req)).await?;
        let body = Self::body(url, r).await?;
        decode(url, &body)
    }

    async fn destroy(&self, url: &str, id: &str) -> Result<(), DaemonError> {
        let r = self.send(url, self.http.delete(format!("{url}/v1/sandboxes/{id}"))).await?;
        match Self::body(url, r).await {
            Ok(_) => Ok(()),
            Err(DaemonError::Refused { status: 404 | 410, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn inspect(&self, url: &str, id: &str) -> Result<Inspection, DaemonError> {
        let r = self.send(url, self.http.get(format!("{url}/v1/sandboxes/{id}"))).await?;
        match Self::body(url, r).await {
            Ok(body) => {
                let sb: Sandbox = decode(url, &body)?;
                Ok(match sb.state {
                    SandboxState::Stopped | SandboxState::Killed => Inspection::Ended(sb.end_reason),
                    _ => Inspection::Live,
                })
            }
            Err(DaemonError::Refused { status: 410, reason, .. }) => Ok(Inspection::Ended(reason)),
            Err(DaemonError::Refused { status: 404, .. }) => Ok(Inspection::Unknown),
            Err(e) => Err(e),
        }
    }

    async fn observe(&self, url: &str) -> Result<Observation, DaemonError> {
        let metrics = self.send(url, self.http.get(format!("{url}/metrics"))).await?;
        let text = Self::body(url, metrics).await?;
        let load = crate::load::parse(&String::from_utf8_lossy(&text))
            .map_err(|e| DaemonError::BadAnswer { url: url.to_string(), detail: e.to_string() })?;
        let filter = format!("{META_MANAGED_BY}={MANAGED_BY}");
        let list = self.send(url, self.http.get(format!("{url}/v1/sandboxes")).query(&[("metadata", filter)])).await?;
        let body = Self::body(url, list).await?;
        let list: SandboxList = decode(url, &body)?;
        Ok(Observation { load, live: list.sandboxes.iter().map(live_sandbox).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_daemons_error_body() {
        // As the daemon answers a create over a tenant's quota.
        let body = br#"{"error":{"code":"quota_exceeded","message":"tenant default: at most 50 running sandboxes"}}"#;
        let e = refused("http://n1:7171", 429, body);
        assert_eq!(
            e,
            DaemonError::Refused {
                url: "http://n1:7171".into(),
                status: 429,
                code: Some(ErrorCode::QuotaExceeded),
                message: "tenant default: at most 50 running sandboxes".into(),
                reason: None,
            }
        );
        assert_eq!(e.to_string(), "http://n1:7171: 429 quota_exceeded: tenant default: at most 50 running sandboxes");
        let gone = refused("u", 410, br#"{"error":{"code":"sandbox_gone","message":"ended","reason":"timeout"}}"#);
        assert!(matches!(gone, DaemonError::Refused { reason: Some(EndReason::Timeout), .. }));
        let proxy = refused("u", 502, b"<html>bad gateway</html>");
        assert!(matches!(proxy, DaemonError::Refused { status: 502, code: None, .. }));
    }

    #[test]
    fn a_listed_sandbox_keeps_its_claim_and_age() {
        let sb: Sandbox = serde_json::from_value(serde_json::json!({
            "id": "k3v9x", "template": "base", "state": "running",
            "created_at": "2026-12-02T07:31:00Z", "expires_at": "2026-12-02T07:36:00Z",
            "limits": {"cpus": 1.0, "memory_mb": 512, "disk_mb": 1024, "pids": 256},
            "metadata": {"glovebox.dev/claim-uid": "u-1", "glovebox.dev/managed-by": "glovebox-controller"},
            "network": {"mode": "deny-all"}
        }))
        .unwrap();
        let live = live_sandbox(&sb);
        assert_eq!(live.claim_uid.as_deref(), Some("u-1"));
        let t = live.created_at.unwrap();
        assert_eq!(t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), 1_796_196_660);
    }
}
