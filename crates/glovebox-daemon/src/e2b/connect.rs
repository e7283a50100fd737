//! The Connect protocol, JSON codec (what the SDKs use: `useBinaryFormat: false`).
//!
//! Unary: `POST /<service>/<Method>`, `Content-Type: application/json`, the message as the
//! body; errors are an HTTP status with `{"code": "<snake_case>", "message": …}`.
//! Server streaming: `Content-Type: application/connect+json`; request and response
//! messages are envelopes (1 flag byte, 4-byte big-endian length, the JSON); the last
//! response envelope has flag 0x02 and holds `{}` or `{"error": {…}}`. Errors of a stream
//! go there too, with HTTP 200.

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Error;

/// Flag of the end-of-stream envelope.
const END_STREAM: u8 = 0x02;
/// Flag of a compressed envelope (refused: the SDKs send none).
const COMPRESSED: u8 = 0x01;
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";

/// Connect error codes (the subset Glovebox answers with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
        }
    }

    /// The HTTP status of a unary error (the Connect spec's table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

#[derive(Debug)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }

    fn body(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (self.code.http_status(), axum::Json(self.body())).into_response()
    }
}

impl From<Error> for RpcError {
    fn from(e: Error) -> RpcError {
        use glovebox_proto::agent::ErrorCode as C;
        let code = match &e {
            Error::Invalid(_) => Code::InvalidArgument,
            Error::SandboxNotFound(_) | Error::Gone { .. } => Code::Unavailable,
            Error::NotFound { .. } | Error::TemplateNotBuilt { .. } => Code::NotFound,
            Error::Conflict(_) | Error::Paused(_) | Error::PausedMeanwhile(_) | Error::VolumeInUse(_) => {
                Code::FailedPrecondition
            }
            Error::Unavailable(_) | Error::Quota(_) => Code::ResourceExhausted,
            Error::HibernateUnavailable(_) => Code::Unimplemented,
            Error::SnapshotFailed(_) => Code::FailedPrecondition,
            Error::File { code, .. } => match code {
                C::NotFound => Code::NotFound,
                C::AlreadyExists => Code::AlreadyExists,
                C::PermissionDenied => Code::PermissionDenied,
                C::NotADirectory | C::IsADirectory | C::InvalidArgument | C::SpawnFailed => Code::InvalidArgument,
                C::NotEmpty => Code::FailedPrecondition,
                C::NoSpace => Code::ResourceExhausted,
                C::Protocol | C::Io => Code::Internal,
            },
            Error::Start(_) | Error::Agent(_) | Error::Internal(_) => {
                tracing::warn!("e2b rpc: {e}");
                return RpcError::new(Code::Internal, "internal error (see the daemon log)");
            }
        };
        let message = match &e {
            // The SDKs recognise a gone sandbox by this phrase.
            Error::SandboxNotFound(id) | Error::Gone { id, .. } => format!("The sandbox {id} was not found"),
            _ => e.to_string(),
        };
        RpcError::new(code, message)
    }
}

/// The body of a unary request.
pub fn unary_request<T: DeserializeOwned>(h: &HeaderMap, body: &[u8]) -> Result<T, RpcError> {
    let ct = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !ct.starts_with("application/json") {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!("content type {ct:?} is not served (only the JSON codec is)"),
        ));
    }
    let body = if body.is_empty() { b"{}".as_slice() } else { body };
    serde_json::from_slice(body).map_err(|e| RpcError::new(Code::InvalidArgument, format!("bad request message: {e}")))
}

pub fn unary_response<T: Serialize>(r: Result<T, RpcError>) -> Response {
    match r {
        Ok(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The one message of a server-streaming request.
pub fn stream_request<T: DeserializeOwned>(h: &HeaderMap, body: &[u8]) -> Result<T, RpcError> {
    let ct = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !ct.starts_with(STREAM_CONTENT_TYPE) {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!("content type {ct:?} is not served (only the JSON codec is)"),
        ));
    }
    if body.len() < 5 {
        return Err(RpcError::new(Code::InvalidArgument, "truncated envelope"));
    }
    let (flags, len) = (body[0], u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize);
    if flags & COMPRESSED != 0 {
        return Err(RpcError::new(Code::Unimplemented, "compressed messages are not served"));
    }
    let msg = body.get(5..5 + len).ok_or_else(|| RpcError::new(Code::InvalidArgument, "truncated envelope"))?;
    serde_json::from_slice(msg).map_err(|e| RpcError::new(Code::InvalidArgument, format!("bad request message: {e}")))
}

/// One response envelope.
pub fn envelope<T: Serialize>(msg: &T) -> Bytes {
    frame(0, &serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()))
}

/// The end-of-stream envelope, with the stream's error if it failed.
pub fn end_stream(err: Option<&RpcError>) -> Bytes {
    let body = match err {
        Some(e) => serde_json::json!({ "error": e.body() }),
        None => serde_json::json!({}),
    };
    frame(END_STREAM, &serde_json::to_vec(&body).unwrap_or_default())
}

fn frame(flags: u8, json: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(5 + json.len());
    v.push(flags);
    v.extend_from_slice(&(json.len() as u32).to_be_bytes());
    v.extend_from_slice(json);
    Bytes::from(v)
}

/// A streaming response that failed before its first message.
pub fn stream_error(e: RpcError) -> Response {
    stream_response(axum::body::Body::from(end_stream(Some(&e))))
}

pub fn stream_response(body: axum::body::Body) -> Response {
    ([(header::CONTENT_TYPE, STREAM_CONTENT_TYPE)], body).into_response()
}

/// The client's deadline (`Connect-Timeout-Ms`), if it set one.
pub fn timeout_ms(h: &HeaderMap) -> Option<u64> {
    h.get("connect-timeout-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip() {
        let e = envelope(&serde_json::json!({"a": 1}));
        assert_eq!(e[0], 0);
        assert_eq!(u32::from_be_bytes([e[1], e[2], e[3], e[4]]) as usize, e.len() - 5);
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, STREAM_CONTENT_TYPE.parse().unwrap());
        let v: serde_json::Value = stream_request(&h, &e).unwrap();
        assert_eq!(v["a"], 1);
        let end = end_stream(Some(&RpcError::new(Code::NotFound, "x")));
        assert_eq!(end[0], END_STREAM);
        let body: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(body["error"]["code"], "not_found");
    }

    #[test]
    fn bad_envelopes_are_refused() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, STREAM_CONTENT_TYPE.parse().unwrap());
        assert!(stream_request::<serde_json::Value>(&h, &[0, 0, 0, 0, 9, b'{']).is_err());
        assert!(stream_request::<serde_json::Value>(&h, &[1, 0, 0, 0, 2, b'{', b'}']).is_err());
        h.insert(header::CONTENT_TYPE, "application/proto".parse().unwrap());
        assert_eq!(unary_request::<serde_json::Value>(&h, b"{}").unwrap_err().code, Code::Unimplemented);
    }
}
