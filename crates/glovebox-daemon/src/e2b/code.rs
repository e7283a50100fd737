//! The code-interpreter server the `e2b-code-interpreter` SDKs call (port 49999): `/execute`
//! streams a cell's events as NDJSON in E2B's shapes; `/contexts` manages contexts. Both
//! run on Glovebox's own kernels (`crate::code`).

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::Router;
use futures_util::StreamExt;
use glovebox_proto::api::{CodeResult, CodeStreamLine, Language, RunCode, TimeBudget};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{sandbox_path, At, E2b, RestError, JUPYTER_PORT};
use crate::error::Error;
use crate::kernels::Kernel;

pub fn routes() -> Router<E2b> {
    Router::new()
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}", delete(remove_context))
        .route("/contexts/{id}/restart", post(restart_context))
}

fn json_body<T: for<'de> Deserialize<'de> + Default>(b: &Bytes) -> Result<T, RestError> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(b).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, format!("invalid body: {e}")))
}

fn language(l: Option<&str>) -> Result<Option<Language>, RestError> {
    match l.map(str::to_ascii_lowercase) {
        None => Ok(None),
        Some(l) => serde_json::from_value(Value::String(l.clone()))
            .map(Some)
            .map_err(|_| RestError::new(StatusCode::BAD_REQUEST, format!("language {l:?} is not supported"))),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Execute {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

/// Nanoseconds since the epoch (E2B's output timestamps).
fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// A MIME bundle as E2B's `Result`: well-known types by short name, the rest in `extra`.
/// A text that is a quoted string (a `str` result's repr) loses its quotes, as E2B shows it.
fn result(r: CodeResult) -> Value {
    let mut out = Map::new();
    let mut extra = Map::new();
    for (mime, v) in r.data {
        let key = match mime.as_str() {
            "text/plain" => {
                out.insert("text".into(), v.as_str().map_or(v.clone(), |t| json!(unquote(t))));
                continue;
            }
            "e2b/data" => "data",
            "e2b/chart" => "chart",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            _ => {
                extra.insert(mime, v);
                continue;
            }
        };
        out.insert(key.to_string(), v);
    }
    out.insert("type".into(), json!("result"));
    out.insert("is_main_result".into(), json!(r.is_main_result));
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    Value::Object(out)
}

/// `'abc'` or `"abc"` → `abc`; any other text as it is.
fn unquote(t: &str) -> &str {
    let quoted = |q: char| t.len() >= 2 && t.starts_with(q) && t.ends_with(q);
    if quoted('\'') || quoted('"') {
        &t[1..t.len() - 1]
    } else {
        t
    }
}

/// One Glovebox stream line as E2B's.
fn line(l: CodeStreamLine) -> Value {
    match l {
        CodeStreamLine::Stdout { text } => json!({ "type": "stdout", "text": text, "timestamp": now_ns() }),
        CodeStreamLine::Stderr { text } => json!({ "type": "stderr", "text": text, "timestamp": now_ns() }),
        CodeStreamLine::Result(r) => result(r),
        CodeStreamLine::Error(e) => {
            json!({ "type": "error", "name": e.name, "value": e.value, "traceback": e.traceback })
        }
        CodeStreamLine::End { execution_count, .. } => {
            json!({ "type": "number_of_executions", "execution_count": execution_count })
        }
    }
}

async fn execute(State(st): State<E2b>, At(sb): At<JUPYTER_PORT>, b: Bytes) -> Result<Response, RestError> {
    let req: Execute = json_body(&b)?;
    let req = RunCode {
        code: req.code,
        language: language(req.language.as_deref())?,
        context_id: req.context_id,
        // The SDKs keep their own (client-side) execution timeout; the sandbox's lifetime
        // bounds a cell here.
        timeout_ms: Some(TimeBudget::UNBOUNDED),
        env: req.env_vars.unwrap_or_default(),
    };
    let (m, id) = (st.app.manager.clone(), sb.id.clone());
    let stream = crate::code::run_code_stream(st.app.manager.clone(), sb, req).map_err(not_found_is_404)?;
    let body = stream.map(move |chunk| {
        let b = chunk?;
        // Each chunk is one NDJSON line of ours; re-shape it.
        let Ok(l) = serde_json::from_slice::<CodeStreamLine>(&b) else { return Ok(Bytes::new()) };
        // A cell cut short by the sandbox's end breaks the response off, as E2B's does (the
        // SDK then finds the sandbox gone and says it was killed).
        let last = matches!(l, CodeStreamLine::End { .. } | CodeStreamLine::Error(_));
        if last && m.get(&id).is_err() {
            return Err(std::io::Error::other("the sandbox ended during the cell"));
        }
        let mut v = serde_json::to_vec(&line(l)).unwrap_or_default();
        v.push(b'\n');
        Ok(Bytes::from(v))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(body)).into_response())
}

fn not_found_is_404(e: Error) -> RestError {
    match e {
        Error::NotFound { what: "context", name } => {
            RestError::new(StatusCode::NOT_FOUND, format!("context {name:?} not found"))
        }
        e => e.into(),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

fn context_view(k: &Kernel) -> Value {
    let c = k.view();
    json!({ "id": c.id, "language": c.language.as_str(), "cwd": c.cwd })
}

async fn create_context(State(st): State<E2b>, At(sb): At<JUPYTER_PORT>, b: Bytes) -> Result<Response, RestError> {
    let req: NewContext = json_body(&b)?;
    let lang = language(req.language.as_deref())?.unwrap_or_default();
    let k = crate::code::create_context(&st.app.manager, &sb, lang, req.cwd.as_deref().map(sandbox_path)).await?;
    Ok(axum::Json(context_view(&k)).into_response())
}

async fn list_contexts(At(sb): At<JUPYTER_PORT>) -> Response {
    // E2B's code interpreter starts with a python and a javascript context; ours are made on
    // first use, so listing makes them (their kernels start with their first cell).
    for lang in [Language::Python, Language::Javascript] {
        sb.kernels.default_for(lang, sb.preload.as_deref());
    }
    let v: Vec<Value> = sb
        .kernels
        .list()
        .into_iter()
        .map(|c| json!({ "id": c.id, "language": c.language.as_str(), "cwd": c.cwd }))
        .collect();
    axum::Json(v).into_response()
}

async fn remove_context(At(sb): At<JUPYTER_PORT>, Path(id): Path<String>) -> Result<Response, RestError> {
    let k = sb.kernels.remove(&id).ok_or_else(|| not_found_is_404(Error::NotFound { what: "context", name: id }))?;
    k.shutdown(&sb.target()).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn restart_context(At(sb): At<JUPYTER_PORT>, Path(id): Path<String>) -> Result<Response, RestError> {
    let k = sb.kernels.get(&id).ok_or_else(|| not_found_is_404(Error::NotFound { what: "context", name: id }))?;
    k.restart(&sb.target()).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_use_e2b_names() {
        let mut data = BTreeMap::new();
        data.insert("text/plain".to_string(), json!("<Figure>"));
        data.insert("image/png".to_string(), json!("iVBOR"));
        data.insert("application/x-custom".to_string(), json!(1));
        let v = result(CodeResult { is_main_result: false, data });
        assert_eq!(v["type"], "result");
        assert_eq!(v["png"], "iVBOR");
        assert_eq!(v["text"], "<Figure>");
        assert_eq!(v["extra"]["application/x-custom"], 1);
        let mut data = BTreeMap::new();
        data.insert("text/plain".to_string(), json!("'supertest'"));
        data.insert("e2b/data".to_string(), json!({"a": [1, 2]}));
        data.insert("e2b/chart".to_string(), json!({"type": "line"}));
        let v = result(CodeResult { is_main_result: true, data });
        assert_eq!(v["text"], "supertest");
        assert_eq!(v["data"]["a"][1], 2);
        assert_eq!(v["chart"]["type"], "line");
        assert!(v.get("extra").is_none());
        assert_eq!(unquote("\"x\""), "x");
        assert_eq!(unquote("'"), "'");
        assert_eq!(unquote("[1, 'a']"), "[1, 'a']");
        let e = line(CodeStreamLine::End { execution_count: 3, context_restarted: false });
        assert_eq!(e["execution_count"], 3);
    }

    #[test]
    fn languages() {
        assert_eq!(language(Some("Python")).unwrap(), Some(Language::Python));
        assert_eq!(language(Some("js")).unwrap(), Some(Language::Javascript));
        assert_eq!(language(Some("javascript")).unwrap(), Some(Language::Javascript));
        assert_eq!(language(Some("ts")).unwrap(), Some(Language::Typescript));
        assert_eq!(language(Some("TypeScript")).unwrap(), Some(Language::Typescript));
        assert_eq!(language(Some("r")).unwrap(), Some(Language::R));
        assert_eq!(language(Some("R")).unwrap(), Some(Language::R));
        assert_eq!(language(Some("java")).unwrap(), Some(Language::Java));
        assert_eq!(language(Some("bash")).unwrap(), Some(Language::Bash));
        assert!(language(Some("cobol")).is_err());
    }
}
