//! envd's `process.Process` service over the agent's commands.
//!
//! A process is an agent command started in the background (so it outlives the request),
//! followed with `Attach`; E2B's pid is the command's pid inside the sandbox and is mapped
//! back to the command through the agent's list. The client's deadline
//! (`Connect-Timeout-Ms`, the SDKs' `timeout=`) becomes the command's own timeout, so a
//! command that outlives it is killed with everything it spawned, a little before the
//! client gives up, and the stream ends with `deadline_exceeded`.
//!
//! A process started with `pty` runs on a pseudo-terminal (an agent terminal command): its
//! output is one `pty` byte stream read through the agent's session (which a `Connect` takes
//! over), its input is written to the terminal, and `Update` resizes it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use base64::Engine;
use futures_util::StreamExt;
use glovebox_proto::agent::{Command, ExitStatus};
use glovebox_proto::api::{Encoding, ExecRequest, PtyRequest, TimeBudget};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, Code, RpcError};
use super::{sandbox_path, At, E2b, ENVD_PORT};
use crate::agent::{Op, Output};
use crate::conn::ResetOnClose;
use crate::error::Error;
use crate::manager::{Manager, Sb};
use crate::ops;

/// Output kept (and so streamable) per stream of one process: the first half live, the last
/// half (a marker of the bytes dropped between included) when the process ends.
const OUTPUT_CAP: u64 = 16 << 20;

#[derive(Deserialize, Default)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Pty>,
    stdin: Option<bool>,
}

/// envd's `PTY` message.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Pty {
    size: PtySize,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PtySize {
    cols: u32,
    rows: u32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UpdateRequest {
    process: Selector,
    pty: Option<Pty>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WithProcess {
    process: Selector,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SendInput {
    process: Selector,
    input: Input,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SendSignal {
    process: Selector,
    signal: Value,
}

pub async fn rpc(
    State(st): State<E2b>,
    At(sb): At<ENVD_PORT>,
    Path(method): Path<String>,
    reset: Option<Extension<ResetOnClose>>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    let m = st.app.manager.clone();
    let reset = reset.map(|Extension(r)| r);
    match method.as_str() {
        "Start" => match connect::stream_request::<StartRequest>(&h, &body) {
            Ok(req) => start(m, sb, &h, req, reset).await,
            Err(e) => connect::stream_error(e),
        },
        "Connect" => match connect::stream_request::<WithProcess>(&h, &body) {
            Ok(req) => follow(m, sb, req.process, reset).await,
            Err(e) => connect::stream_error(e),
        },
        "List" => connect::unary_response(list(&m, &sb).await),
        "SendInput" => connect::unary_response(match connect::unary_request::<SendInput>(&h, &body) {
            Ok(req) => send_input(&m, &sb, req).await,
            Err(e) => Err(e),
        }),
        "SendSignal" => connect::unary_response(match connect::unary_request::<SendSignal>(&h, &body) {
            Ok(req) => send_signal(&m, &sb, req).await,
            Err(e) => Err(e),
        }),
        "CloseStdin" => connect::unary_response(match connect::unary_request::<WithProcess>(&h, &body) {
            Ok(req) => close_stdin(&m, &sb, req.process).await,
            Err(e) => Err(e),
        }),
        "StreamInput" => connect::stream_error(unsupported("streaming stdin")),
        "Update" => connect::unary_response(match connect::unary_request::<UpdateRequest>(&h, &body) {
            Ok(req) => update(&m, &sb, req).await,
            Err(e) => Err(e),
        }),
        _ => connect::unary_response::<Value>(Err(RpcError::new(Code::Unimplemented, format!("no method {method}")))),
    }
}

fn unsupported(what: &str) -> RpcError {
    RpcError::new(Code::Unimplemented, format!("{what} is not supported by Glovebox"))
}

/// The command's own budget for a client deadline of `t` ms: a little shorter, so the
/// command is gone by the time the client reports the timeout; `0` (E2B's "no limit") is
/// the budget's own `0`.
fn command_timeout(t: u64) -> TimeBudget {
    if t == 0 {
        return TimeBudget::UNBOUNDED;
    }
    let margin = (t / 10).min(500);
    // Clamped to the ceiling, so `from_ms` cannot refuse it.
    TimeBudget::from_ms(t.saturating_sub(margin).clamp(1, TimeBudget::MAX_MS)).unwrap_or(TimeBudget::UNBOUNDED)
}

async fn start(
    m: Arc<Manager>,
    sb: Arc<Sb>,
    h: &HeaderMap,
    req: StartRequest,
    reset: Option<ResetOnClose>,
) -> Response {
    let p = req.process;
    if p.cmd.is_empty() {
        return connect::stream_error(RpcError::new(Code::InvalidArgument, "process.cmd must not be empty"));
    }
    let mut argv = vec![p.cmd];
    argv.extend(p.args);
    if let Some(pty) = req.pty {
        let pty_req = PtyRequest {
            cmd: Some(Command::Argv(argv)),
            cols: pty.size.cols,
            rows: pty.size.rows,
            cwd: p.cwd.as_deref().map(sandbox_path),
            env: p.envs,
        };
        let timeout = connect::timeout_ms(h).map_or(TimeBudget::UNBOUNDED, command_timeout);
        return match ops::pty_start(&m, &sb, pty_req, timeout).await {
            Ok(started) => pty_events(m, sb, started.id, started.pid, reset).await,
            Err(e) => connect::stream_error(e.into()),
        };
    }
    let exec = ExecRequest {
        cmd: Command::Argv(argv),
        cwd: p.cwd.as_deref().map(sandbox_path),
        env: p.envs,
        stdin: None,
        stdin_base64: None,
        // No deadline: the sandbox's lifetime alone bounds the process (E2B's `timeout=0`).
        timeout_ms: Some(connect::timeout_ms(h).map_or(TimeBudget::UNBOUNDED, command_timeout)),
        max_output_bytes: Some(OUTPUT_CAP),
        output_tail_bytes: None,
        encoding: Encoding::Utf8,
        background: true,
    };
    let started = match ops::exec_background(&m, &sb, exec).await {
        Ok(s) => s,
        Err(e) => return connect::stream_error(e.into()),
    };
    if !req.stdin.unwrap_or(false) {
        // Without `stdin` the process reads end-of-file, as under envd. It may have ended
        // already, which is fine.
        let _ = ops::send_stdin(&m, &sb, started.id, &[], true).await;
    }
    events(m, sb, started.id, started.pid, reset).await
}

/// `Connect`: follows a running process (its kept output first).
async fn follow(m: Arc<Manager>, sb: Arc<Sb>, sel: Selector, reset: Option<ResetOnClose>) -> Response {
    match command_of(&m, &sb, &sel).await {
        Ok(c) if c.pty => pty_events(m, sb, c.id, c.pid, reset).await,
        Ok(c) => events(m, sb, c.id, c.pid, reset).await,
        Err(e) => connect::stream_error(e),
    }
}

/// The event stream of terminal command `id` from now on (the terminal is taken over from
/// any earlier stream): start, `pty` output, end.
async fn pty_events(m: Arc<Manager>, sb: Arc<Sb>, id: u64, pid: i32, reset: Option<ResetOnClose>) -> Response {
    let session = match ops::pty_attach(&m, &sb, id).await {
        Ok(s) => s,
        Err(e) => return connect::stream_error(e.into()),
    };
    let (mut output, input) = session.split();
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(32);
    tokio::spawn(async move {
        // Held for the stream's life: the agent ends a session whose input side closes.
        let _input = input;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        if tx.send(Ok(connect::envelope(&json!({ "event": { "start": { "pid": pid } } })))).await.is_err() {
            return;
        }
        loop {
            let item = match output.next().await.map_err(ops::failed(&m, &sb, Op::Output(id))) {
                Ok(None) => ops::pty_session_ended(&m, &sb, id).await.map(|()| None),
                other => other,
            };
            let msg = match item {
                Ok(Some(Output::Stdout(b) | Output::Stderr(b))) => {
                    connect::envelope(&json!({ "event": { "data": { "pty": b64(&b) } } }))
                }
                Ok(Some(Output::Exited(e))) if e.timed_out => {
                    let _ = tx
                        .send(Ok(connect::end_stream(Some(&RpcError::new(
                            Code::DeadlineExceeded,
                            "the terminal ran past its timeout and was killed",
                        )))))
                        .await;
                    return;
                }
                Ok(Some(Output::Exited(e))) => {
                    let _ = tx.send(Ok(connect::envelope(&json!({ "event": { "end": end_event(&e) } })))).await;
                    let _ = tx.send(Ok(connect::end_stream(None))).await;
                    return;
                }
                // Another stream took the terminal over: this one ends, as envd ends a
                // replaced subscriber's stream.
                Ok(None) => {
                    let _ = tx.send(Ok(connect::end_stream(None))).await;
                    return;
                }
                Err(e @ (Error::Gone { .. } | Error::SandboxNotFound(_))) => {
                    if let Some(r) = &reset {
                        r.arm();
                    }
                    let _ = tx.send(Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, e.to_string()))).await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Ok(connect::end_stream(Some(&e.into())))).await;
                    return;
                }
            };
            if tx.send(Ok(msg)).await.is_err() {
                // The client went away (disconnect): the terminal goes on.
                return;
            }
        }
    });
    let body = tokio_stream::wrappers::ReceiverStream::new(rx);
    connect::stream_response(Body::from_stream(body))
}

/// The event stream of command `id`: start, output, end.
async fn events(m: Arc<Manager>, sb: Arc<Sb>, id: u64, pid: i32, reset: Option<ResetOnClose>) -> Response {
    let out = match ops::attach(m, sb, id).await {
        Ok(o) => o,
        Err(e) => return connect::stream_error(e.into()),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(32);
    tokio::spawn(async move {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        if tx.send(Ok(connect::envelope(&json!({ "event": { "start": { "pid": pid } } })))).await.is_err() {
            return;
        }
        let mut out = std::pin::pin!(out);
        while let Some(item) = out.next().await {
            let msg = match item {
                Ok(Output::Stdout(b)) => connect::envelope(&json!({ "event": { "data": { "stdout": b64(&b) } } })),
                Ok(Output::Stderr(b)) => connect::envelope(&json!({ "event": { "data": { "stderr": b64(&b) } } })),
                Ok(Output::Exited(e)) if e.timed_out => connect::end_stream(Some(&RpcError::new(
                    Code::DeadlineExceeded,
                    "the command ran past its timeout and was killed",
                ))),
                Ok(Output::Exited(e)) => {
                    let _ = tx.send(Ok(connect::envelope(&json!({ "event": { "end": end_event(&e) } })))).await;
                    connect::end_stream(None)
                }
                // The sandbox ended under the command (killed, timed out, OOM): the
                // connection is reset, as E2B's proxy resets the stream, with no end
                // envelope. The SDKs then ask `/health`, get 502 for the gone sandbox, and
                // report that it ended (an orderly close would read as a protocol error).
                Err(e @ (Error::Gone { .. } | Error::SandboxNotFound(_))) => {
                    if let Some(r) = &reset {
                        r.arm();
                    }
                    let _ = tx.send(Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, e.to_string()))).await;
                    return;
                }
                Err(e) => connect::end_stream(Some(&e.into())),
            };
            if tx.send(Ok(msg)).await.is_err() {
                // The client went away; the process goes on (as under envd).
                return;
            }
        }
    });
    let body = tokio_stream::wrappers::ReceiverStream::new(rx);
    connect::stream_response(Body::from_stream(body))
}

/// envd's end event: a signal death is exit code -1 with Go's wording of the signal.
fn end_event(e: &ExitStatus) -> Value {
    match e.signal {
        Some(sig) => {
            let name = match sig {
                libc::SIGKILL => "killed".to_string(),
                libc::SIGTERM => "terminated".to_string(),
                libc::SIGINT => "interrupt".to_string(),
                n => format!("signal {n}"),
            };
            json!({ "exitCode": -1, "exited": false, "status": format!("signal: {name}") })
        }
        None => json!({ "exitCode": e.exit_code, "exited": true, "status": format!("exit status {}", e.exit_code) }),
    }
}

/// Whether an agent command is a code-interpreter kernel (not a user's process).
fn is_kernel(cmd: &Command) -> bool {
    match cmd {
        Command::Argv(v) => v.iter().any(|a| a.starts_with(crate::kernels::KERNEL_DIR)),
        Command::Shell(_) => false,
    }
}

async fn list(m: &Manager, sb: &Sb) -> Result<Value, RpcError> {
    let cmds = sb.agent().list().await.map_err(ops::failed(m, sb, Op::File))?;
    let processes: Vec<Value> = cmds
        .iter()
        .filter(|c| c.running && !is_kernel(&c.cmd))
        .map(|c| {
            let (cmd, args) = match &c.cmd {
                Command::Argv(v) => (v.first().cloned().unwrap_or_default(), v.get(1..).unwrap_or_default().to_vec()),
                Command::Shell(s) => ("/bin/sh".to_string(), vec!["-c".to_string(), s.clone()]),
            };
            json!({ "pid": c.pid, "config": { "cmd": cmd, "args": args, "envs": {}, "cwd": c.cwd } })
        })
        .collect();
    Ok(json!({ "processes": processes }))
}

/// A running command a selector names.
struct Named {
    id: u64,
    pid: i32,
    pty: bool,
}

/// The running command a selector names.
async fn command_of(m: &Manager, sb: &Sb, sel: &Selector) -> Result<Named, RpcError> {
    let Some(pid) = sel.pid else {
        return Err(match &sel.tag {
            Some(_) => RpcError::new(Code::NotFound, "process tags are not supported by Glovebox"),
            None => RpcError::new(Code::InvalidArgument, "process selector needs a pid"),
        });
    };
    let list = sb.agent().list().await.map_err(ops::failed(m, sb, Op::File))?;
    list.iter()
        .find(|c| c.running && c.pid >= 0 && c.pid as u32 == pid)
        .map(|c| Named { id: c.id, pid: c.pid, pty: c.pty })
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("process with pid {pid} not found")))
}

async fn send_input(m: &Manager, sb: &Sb, req: SendInput) -> Result<Value, RpcError> {
    let (field, data) = match (req.input.stdin, req.input.pty) {
        (Some(_), Some(_)) => return Err(RpcError::new(Code::InvalidArgument, "input is stdin or pty, not both")),
        (_, Some(p)) => ("pty", p),
        (s, None) => ("stdin", s.unwrap_or_default()),
    };
    let data = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("input.{field}: {e}")))?;
    let c = command_of(m, sb, &req.process).await?;
    if (field == "pty") != c.pty {
        let want = if c.pty { "input.pty" } else { "input.stdin" };
        return Err(RpcError::new(Code::InvalidArgument, format!("process {} takes {want}", c.pid)));
    }
    ops::send_stdin(m, sb, c.id, &data, false).await?;
    Ok(json!({}))
}

/// `Update`: a terminal's new size (the only update envd has).
async fn update(m: &Manager, sb: &Sb, req: UpdateRequest) -> Result<Value, RpcError> {
    let Some(pty) = req.pty else { return Ok(json!({})) };
    let c = command_of(m, sb, &req.process).await?;
    ops::pty_resize(m, sb, c.id, pty.size.cols, pty.size.rows).await?;
    Ok(json!({}))
}

/// E2B's `Signal` enum, by name or number.
fn signal_number(v: &Value) -> Result<i32, RpcError> {
    match v {
        Value::String(s) if s == "SIGNAL_SIGKILL" => Ok(libc::SIGKILL),
        Value::String(s) if s == "SIGNAL_SIGTERM" => Ok(libc::SIGTERM),
        Value::Number(n) if n.as_i64() == Some(9) => Ok(libc::SIGKILL),
        Value::Number(n) if n.as_i64() == Some(15) => Ok(libc::SIGTERM),
        other => Err(RpcError::new(Code::InvalidArgument, format!("unsupported signal {other}"))),
    }
}

async fn send_signal(m: &Manager, sb: &Sb, req: SendSignal) -> Result<Value, RpcError> {
    let sig = signal_number(&req.signal)?;
    let c = command_of(m, sb, &req.process).await?;
    ops::signal(m, sb, c.id, sig).await?;
    Ok(json!({}))
}

async fn close_stdin(m: &Manager, sb: &Sb, sel: Selector) -> Result<Value, RpcError> {
    let c = command_of(m, sb, &sel).await?;
    ops::send_stdin(m, sb, c.id, &[], true).await?;
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_timeouts_end_before_the_client_deadline() {
        assert_eq!(command_timeout(60_000).as_ms(), 59_500);
        assert_eq!(command_timeout(2_000).as_ms(), 1_800);
        assert_eq!(command_timeout(1).as_ms(), 1);
        assert_eq!(command_timeout(u64::MAX).as_ms(), TimeBudget::MAX_MS);
        assert_eq!(command_timeout(0), TimeBudget::UNBOUNDED, "E2B's 0 is no limit, not 1 ms");
    }

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(signal_number(&json!("SIGNAL_SIGKILL")).unwrap(), 9);
        assert_eq!(signal_number(&json!(15)).unwrap(), 15);
        assert!(signal_number(&json!("SIGNAL_UNSPECIFIED")).is_err());
    }

    #[test]
    fn end_events_look_like_envd() {
        let e = ExitStatus { exit_code: 3, ..Default::default() };
        assert_eq!(end_event(&e)["exitCode"], 3);
        let k = ExitStatus { exit_code: 137, signal: Some(9), ..Default::default() };
        assert_eq!(end_event(&k)["exitCode"], -1);
        assert_eq!(end_event(&k)["status"], "signal: killed");
    }
}
