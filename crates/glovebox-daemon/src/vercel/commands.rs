//! Commands: run (waited on, as an NDJSON stream, or detached), get (optionally waiting for
//! the exit), logs (NDJSON) and kill — agent commands started in the background and followed
//! with `ops::attach`.
//!
//! A waited-on command belongs to its request: when the client goes away before the command
//! ends (the SDK's `signal` aborted the call), the command and everything it started are
//! killed, so an aborted `runCommand` leaves nothing running.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use glovebox_proto::agent::{Command, ExitStatus};
use glovebox_proto::api::{Encoding, ExecRequest, TimeBudget};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{body, now_ms, sandbox, sandbox_path, ApiError, CmdMeta, Vercel};
use crate::agent::Output;
use crate::error::Error;
use crate::manager::{Manager, Sb};
use crate::ops;

/// Output kept per stream of one command (and so readable by `logs()` after it ended).
const OUTPUT_CAP: u64 = 16 << 20;
const NDJSON: &str = "application/x-ndjson";

#[derive(Deserialize, Default)]
#[serde(default)]
struct Run {
    command: String,
    args: Vec<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    sudo: bool,
    wait: bool,
    logs: Option<bool>,
    /// The command's own budget, ms (the SDK's `timeoutMs`).
    timeout: Option<u64>,
}

fn command_json(sb: &str, id: u64, meta: &CmdMeta, exit: Option<&ExitStatus>) -> Value {
    let mut v = json!({
        "id": id.to_string(),
        "name": meta.name,
        "args": meta.args,
        "cwd": meta.cwd,
        "sessionId": sb,
        "exitCode": exit.map(|e| e.exit_code),
        "startedAt": meta.started_at,
    });
    if let Some(e) = exit {
        v["durationMs"] = json!(e.duration_ms);
    }
    v
}

fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}

fn ndjson(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>));
    ([(header::CONTENT_TYPE, NDJSON)], body).into_response()
}

/// Splits output into text without breaking a UTF-8 sequence across two log lines.
#[derive(Default)]
struct Utf8Carry(Vec<u8>);

impl Utf8Carry {
    fn push(&mut self, b: &[u8]) -> String {
        self.0.extend_from_slice(b);
        let keep = match std::str::from_utf8(&self.0) {
            Ok(_) => 0,
            // An incomplete sequence at the end waits for the next chunk.
            Err(e) if e.error_len().is_none() => self.0.len() - e.valid_up_to(),
            Err(_) => 0,
        };
        let rest = self.0.split_off(self.0.len() - keep);
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0 = rest;
        text
    }
}

fn log_line(stream: &str, data: &str) -> Bytes {
    line(&json!({ "stream": stream, "data": data }))
}

fn error_line(e: &Error) -> Bytes {
    let code = match e {
        Error::Gone { .. } | Error::SandboxNotFound(_) => "sandbox_stopped",
        _ => "internal_error",
    };
    line(&json!({ "stream": "error", "data": { "code": code, "message": e.to_string() } }))
}

fn command_id(cid: &str) -> Result<u64, ApiError> {
    cid.parse()
        .map_err(|_| ApiError::new(axum::http::StatusCode::NOT_FOUND, "command_not_found", format!("no command {cid}")))
}

/// What is known of command `id`: what this front-end remembered, else what the agent says.
async fn meta_of(st: &Vercel, m: &Manager, sb: &Sb, id: u64) -> Result<CmdMeta, ApiError> {
    if let Some(meta) = st.meta(&sb.id, id) {
        return Ok(meta);
    }
    let list = ops::list_commands(m, sb).await?;
    let c = list.commands.iter().find(|c| c.id == id).ok_or_else(|| {
        ApiError::new(axum::http::StatusCode::NOT_FOUND, "command_not_found", format!("no command {id}"))
    })?;
    let (name, args) = match &c.cmd {
        Command::Argv(v) => (v.first().cloned().unwrap_or_default(), v.get(1..).unwrap_or_default().to_vec()),
        Command::Shell(s) => ("/bin/sh".to_string(), vec!["-c".to_string(), s.clone()]),
    };
    Ok(CmdMeta { name, args, cwd: super::CWD.to_string(), started_at: 0 })
}

pub async fn run(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let m = st.app.manager.clone();
    let req: Run = body(&b)?;
    if req.command.is_empty() {
        return Err(ApiError::bad("command must not be empty"));
    }
    // Every command runs as the sandbox's root, so `sudo` changes nothing.
    let _ = req.sudo;
    let cwd = match &req.cwd {
        Some(c) => sandbox_path(c, None)?,
        None => super::CWD.to_string(),
    };
    let timeout = match req.timeout {
        None | Some(0) => TimeBudget::UNBOUNDED,
        Some(t) => TimeBudget::from_ms(t).map_err(|e| ApiError::bad(format!("timeout: {e}")))?,
    };
    let mut argv = vec![req.command.clone()];
    argv.extend(req.args.iter().cloned());
    let exec = ExecRequest {
        cmd: Command::Argv(argv),
        cwd: Some(cwd.clone()),
        env: req.env,
        stdin: None,
        stdin_base64: None,
        timeout_ms: Some(timeout),
        max_output_bytes: Some(OUTPUT_CAP),
        output_tail_bytes: None,
        encoding: Encoding::Utf8,
        background: true,
    };
    let started = ops::exec_background(&m, &sb, exec).await?;
    // Commands read end-of-file on stdin (there is no way to feed one). It may have ended
    // already, which is fine.
    let _ = ops::send_stdin(&m, &sb, started.id, &[], true).await;
    let meta = CmdMeta { name: req.command, args: req.args, cwd, started_at: now_ms() };
    st.remember(&sb.id, started.id, meta.clone());
    let first = command_json(&sb.id, started.id, &meta, None);
    if !req.wait {
        return Ok(axum::Json(json!({ "command": first })).into_response());
    }
    let logs = req.logs.unwrap_or(false);
    let out = match ops::attach(m.clone(), sb.clone(), started.id).await {
        Ok(out) => out,
        Err(e) => {
            // Nobody could follow it: it must not run on unseen.
            kill_tree(&m, &sb, started.id).await;
            return Err(e.into());
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(32);
    let cid = started.id;
    tokio::spawn(async move {
        let _ = tx.send(line(&json!({ "command": first }))).await;
        let mut out = std::pin::pin!(out);
        let mut text = [Utf8Carry::default(), Utf8Carry::default()];
        loop {
            let item = tokio::select! {
                item = out.next() => item,
                // The client went away (the SDK's call was aborted): the command dies with it.
                _ = tx.closed() => {
                    kill_tree(&m, &sb, cid).await;
                    return;
                }
            };
            let msg = match item {
                Some(Ok(Output::Stdout(b))) if logs => log_line("stdout", &text[0].push(&b)),
                Some(Ok(Output::Stderr(b))) if logs => log_line("stderr", &text[1].push(&b)),
                Some(Ok(Output::Stdout(_) | Output::Stderr(_))) => continue,
                Some(Ok(Output::Exited(e))) => line(&json!({ "command": command_json(&sb.id, cid, &meta, Some(&e)) })),
                Some(Err(e)) => error_line(&e),
                None => return,
            };
            if tx.send(msg).await.is_err() {
                kill_tree(&m, &sb, cid).await;
                return;
            }
        }
    });
    Ok(ndjson(rx))
}

async fn kill_tree(m: &Manager, sb: &Sb, id: u64) {
    if let Err(e) = ops::signal(m, sb, id, libc::SIGKILL).await {
        tracing::debug!("vercel: kill command {id} of {}: {e}", sb.id);
    }
}

/// Waits for command `id` to end (its output is read and dropped).
async fn wait_exit(m: Arc<Manager>, sb: Arc<Sb>, id: u64) -> Result<ExitStatus, Error> {
    let out = ops::attach(m, sb, id).await?;
    let mut out = std::pin::pin!(out);
    while let Some(item) = out.next().await {
        if let Output::Exited(e) = item? {
            return Ok(e);
        }
    }
    Err(Error::Internal(format!("command {id}: output ended without an exit")))
}

pub async fn get_one(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path((id, cid)): Path<(String, String)>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let m = st.app.manager.clone();
    let cid = command_id(&cid)?;
    let meta = meta_of(&st, &m, &sb, cid).await?;
    let exit = if q.get("wait").is_some_and(|w| w == "true") {
        Some(wait_exit(m, sb.clone(), cid).await?)
    } else {
        let list = ops::list_commands(&m, &sb).await?;
        match list.commands.iter().find(|c| c.id == cid) {
            Some(c) if !c.running => Some(wait_exit(m, sb.clone(), cid).await?),
            _ => None,
        }
    };
    Ok(axum::Json(json!({ "command": command_json(&sb.id, cid, &meta, exit.as_ref()) })).into_response())
}

/// The command's output from its start, live until it ends: one NDJSON line per chunk.
pub async fn logs(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path((id, cid)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let cid = command_id(&cid)?;
    let out = ops::attach(st.app.manager.clone(), sb, cid).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(32);
    tokio::spawn(async move {
        let mut out = std::pin::pin!(out);
        let mut text = [Utf8Carry::default(), Utf8Carry::default()];
        loop {
            let item = tokio::select! {
                item = out.next() => item,
                // The client went away: stop following (the command goes on).
                _ = tx.closed() => return,
            };
            let Some(item) = item else { return };
            let msg = match item {
                Ok(Output::Stdout(b)) => log_line("stdout", &text[0].push(&b)),
                Ok(Output::Stderr(b)) => log_line("stderr", &text[1].push(&b)),
                Ok(Output::Exited(_)) => return,
                Err(e) => error_line(&e),
            };
            if tx.send(msg).await.is_err() {
                return;
            }
        }
    });
    Ok(ndjson(rx))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Kill {
    signal: Option<i32>,
}

pub async fn kill(
    State(st): State<Vercel>,
    h: HeaderMap,
    Path((id, cid)): Path<(String, String)>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let sb = sandbox(&st, &h, &id)?;
    let m = st.app.manager.clone();
    let cid = command_id(&cid)?;
    let k: Kill = body(&b)?;
    let meta = meta_of(&st, &m, &sb, cid).await?;
    ops::signal(&m, &sb, cid, k.signal.unwrap_or(libc::SIGTERM)).await?;
    Ok(axum::Json(json!({ "command": command_json(&sb.id, cid, &meta, None) })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_not_split_across_lines() {
        let mut c = Utf8Carry::default();
        let euro = "€".as_bytes();
        assert_eq!(c.push(&[b'a', euro[0]]), "a");
        assert_eq!(c.push(&euro[1..]), "€");
        assert_eq!(c.push(&[0xff, b'b']), "\u{fffd}b");
    }

    #[test]
    fn commands_look_like_vercels() {
        let meta =
            CmdMeta { name: "node".into(), args: vec!["a.mjs".into()], cwd: "/vercel/sandbox".into(), started_at: 5 };
        let v = command_json("sb1", 3, &meta, None);
        assert_eq!((v["id"].clone(), v["exitCode"].clone()), (json!("3"), Value::Null));
        let e = ExitStatus { exit_code: 2, duration_ms: 7, ..Default::default() };
        let v = command_json("sb1", 3, &meta, Some(&e));
        assert_eq!((v["exitCode"].clone(), v["durationMs"].clone()), (json!(2), json!(7)));
    }
}
