//! Request parsing for the native API: `Json`, `Path` and `Query` extractors whose
//! rejections use the API's error shape, and the small response helpers every handler uses.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::ErrorCode;

use super::error::ApiError;

/// `Json` with rejections turned into our error shape (400 + what was wrong). The body must
/// be a JSON object: serde would otherwise read a struct from an array of its fields, so
/// `[]` would pass for `{}`.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<Object<T>>::from_request(req, state).await {
            Ok(axum::Json(Object(v))) => Ok(Json(v)),
            Err(r) => Err(json_rejection(r)),
        }
    }
}

/// A `T` read only from a JSON object.
struct Object<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData)).map(Object)
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    let status = match &r {
        JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        JsonRejection::BytesRejection(_) => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError::with_status(status, ErrorCode::InvalidRequest, r.body_text())
}

/// `Path` with rejections in our error shape.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(r) => Err(ApiError::new(ErrorCode::InvalidRequest, r.body_text())),
        }
    }
}

/// `Query` with rejections in our error shape.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(r) => Err(ApiError::new(ErrorCode::InvalidRequest, r.body_text())),
        }
    }
}

/// A JSON answer.
pub fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response {
    (status, axum::Json(v)).into_response()
}

/// Whether the client asked for an NDJSON stream.
pub fn wants_ndjson(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("application/x-ndjson"))
}

/// An NDJSON answer streaming `body`.
pub fn ndjson(body: axum::body::Body) -> Result<Response, ApiError> {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(body)
        .map_err(|e| crate::error::Error::Internal(e.to_string()).into())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::post;
    use axum::Router;
    use glovebox_proto::api::CreateSandbox;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    /// What a route taking `Json<CreateSandbox>` answers to `body`: the status and the code.
    async fn answer(body: &str, content_type: Option<&str>) -> (StatusCode, serde_json::Value) {
        let app = Router::new().route("/", post(|Json(_): Json<CreateSandbox>| async { StatusCode::CREATED }));
        let mut req = Request::post("/");
        if let Some(t) = content_type {
            req = req.header(header::CONTENT_TYPE, t);
        }
        let resp = app.oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    #[tokio::test]
    async fn bodies_must_be_json_objects() {
        assert_eq!(answer("{}", Some("application/json")).await.0, StatusCode::CREATED);
        for body in ["[]", "[300]", "null", "5", "\"x\"", "{", "{\"bogus\":1}"] {
            let (st, v) = answer(body, Some("application/json")).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
            assert_eq!(v["error"]["code"], "invalid_request", "{body}: {v}");
        }
        let (st, v) = answer("[]", Some("application/json")).await;
        assert!(v["error"]["message"].as_str().unwrap().contains("a JSON object"), "{st}: {v}");
        let (st, v) = answer("{}", None).await;
        assert_eq!((st, v["error"]["code"].as_str()), (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("invalid_request")));
    }
}
