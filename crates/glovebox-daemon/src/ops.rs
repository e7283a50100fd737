//! Requests that go to a sandbox's agent: commands and files. The agent is untrusted (it
//! shares its box with hostile code): every frame it sends is bounded here again — output
//! beyond the cap is dropped even if the agent sends it, and a reply of the wrong shape is an
//! `agent_error`, never a crash.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use glovebox_proto::agent::{self as ap, Event, ExecSpec, FileInfo, Reply, Request};
use glovebox_proto::api::{CommandList, CommandSummary, Encoding, ExecRequest, ExecResult, ExecStreamLine, Started};
use glovebox_proto::frame::{Kind, CHUNK};
use glovebox_proto::io::{Reader, Writer};

use crate::error::{Error, Result};
use crate::manager::{reply_error, Manager, Sb};

/// How long past a command's own timeout the daemon waits for the agent's verdict.
const AGENT_SLACK: Duration = Duration::from_secs(10);
/// How long the daemon waits for any single reply of an agent (a hung or hostile agent must
/// not hang API requests).
pub const AGENT_REPLY: Duration = Duration::from_secs(15);
/// Most output kept per stream when re-reading a command (the API's own cap).
const MAX_KEPT: u64 = 64 << 20;

fn spec(sb: &Sb, req: &ExecRequest) -> Result<(ExecSpec, Option<Vec<u8>>)> {
    let stdin = match (&req.stdin, &req.stdin_base64) {
        (Some(_), Some(_)) => return Err(Error::Invalid("give either stdin or stdin_base64, not both".into())),
        (Some(s), None) => Some(s.as_bytes().to_vec()),
        (None, Some(b)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| Error::Invalid(format!("stdin_base64: {e}")))?,
        ),
        (None, None) => None,
    };
    let max = req.max_output_bytes.unwrap_or(ap::DEFAULT_MAX_OUTPUT);
    if max > 64 << 20 {
        return Err(Error::Invalid("max_output_bytes must be at most 67108864 (64 MiB)".into()));
    }
    // Its ceiling was checked when the request was read.
    let budget = req.timeout_ms.unwrap_or_default();
    match &req.cmd {
        ap::Command::Argv(v) if v.is_empty() => return Err(Error::Invalid("cmd must not be empty".into())),
        ap::Command::Shell(s) if s.trim().is_empty() => return Err(Error::Invalid("cmd must not be empty".into())),
        _ => {}
    }
    let mut env = sb.base_env();
    env.extend(req.env.clone());
    let (workdir, uid, gid) = crate::templates::exec_defaults(sb);
    Ok((
        ExecSpec {
            cmd: req.cmd.clone(),
            cwd: req.cwd.clone().or(workdir),
            env,
            // Background commands keep stdin open for `…/stdin` requests.
            stdin: stdin.is_some() || req.background,
            timeout_ms: budget.limit().map(|_| budget.as_ms()),
            max_output_bytes: max,
            uid,
            gid,
            background: req.background,
            raw: false,
        },
        stdin,
    ))
}

async fn send_stdin_frames(w: &mut Writer, id: u64, data: &[u8], close: bool) -> Result<()> {
    w.data(Kind::Stdin, data).await?;
    if close {
        w.json(&Request::CloseStdin { id }).await?;
    } else {
        w.json(&Request::EndStdin).await?;
    }
    Ok(w.flush().await?)
}

/// Starts a command; returns the connection positioned after `Started`.
async fn start(m: &Manager, sb: &Sb, req: &ExecRequest) -> Result<(Reader, Writer, ExecSpec, Started)> {
    let (spec, stdin) = spec(sb, req)?;
    // Counted before the agent hears of it, so a teardown meanwhile asks the agent.
    sb.commands.started();
    let (mut r, mut w) = sb.connect().await.map_err(|e| m.agent_error(&sb.id, e))?;
    w.json(&Request::Exec(spec.clone())).await?;
    let first: serde_json::Value = tokio::time::timeout(AGENT_REPLY, r.json())
        .await
        .map_err(|_| m.agent_error(&sb.id, "the agent did not start the command in time"))?
        .map_err(|e| m.agent_error(&sb.id, e))?;
    let started = match serde_json::from_value::<Event>(first.clone()) {
        Ok(Event::Started { id, pid }) => Started { id, pid },
        _ => {
            return Err(match serde_json::from_value::<Reply>(first) {
                Ok(Reply::Error { code, message }) => match code {
                    ap::ErrorCode::InvalidArgument | ap::ErrorCode::SpawnFailed => Error::Invalid(message),
                    _ => Error::Agent(message),
                },
                _ => Error::Agent("unexpected reply to exec".into()),
            })
        }
    };
    if let Some(data) = stdin {
        if spec.background {
            // The agent ends a background exchange after `Started`: feed stdin separately.
            drop((r, w));
            send_stdin(m, sb, started.id, &data, true).await?;
            let (r, w) = sb.connect().await.map_err(|e| m.agent_error(&sb.id, e))?;
            return Ok((r, w, spec, started));
        }
        send_stdin_frames(&mut w, started.id, &data, true).await?;
    }
    Ok((r, w, spec, started))
}

/// Collects a command's output until it exits.
struct Collector {
    out: [Vec<u8>; 2],
    cap: u64,
}

impl Collector {
    fn push(&mut self, kind: Kind, b: &[u8]) {
        let i = if kind == Kind::Stdout { 0 } else { 1 };
        let room = (self.cap as usize).saturating_sub(self.out[i].len());
        self.out[i].extend_from_slice(&b[..b.len().min(room)]);
    }
}

pub fn encode(b: &[u8], enc: Encoding) -> String {
    match enc {
        Encoding::Utf8 => String::from_utf8_lossy(b).into_owned(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(b),
    }
}

fn result(e: ap::ExitStatus, out: [Vec<u8>; 2], enc: Encoding, oom: bool) -> ExecResult {
    ExecResult {
        id: e.id,
        exit_code: e.exit_code,
        signal: e.signal,
        timed_out: e.timed_out,
        oom_killed: e.oom_killed || oom,
        stdout: encode(&out[0], enc),
        stderr: encode(&out[1], enc),
        encoding: enc,
        stdout_truncated: e.stdout_truncated,
        stderr_truncated: e.stderr_truncated,
        stdout_bytes: e.stdout_bytes,
        stderr_bytes: e.stderr_bytes,
        duration_ms: e.duration_ms,
    }
}

async fn collect(
    m: &Manager,
    sb: &Sb,
    r: &mut Reader,
    cap: u64,
    wait: Option<Duration>,
) -> Result<(ap::ExitStatus, [Vec<u8>; 2])> {
    let mut c = Collector { out: [Vec::new(), Vec::new()], cap };
    let fut = async {
        loop {
            match r.next().await.map_err(|e| m.agent_error(&sb.id, e))? {
                None => return Err(m.agent_error(&sb.id, "connection closed before the command ended")),
                Some((k @ (Kind::Stdout | Kind::Stderr), b)) => c.push(k, &b),
                Some((Kind::Json, b)) => match serde_json::from_slice::<Event>(&b) {
                    Ok(Event::Exited(e)) => return Ok(e),
                    _ => match serde_json::from_slice::<Reply>(&b) {
                        Ok(Reply::Error { code: ap::ErrorCode::NotFound, message }) => {
                            return Err(Error::NotFound { what: "command", name: message })
                        }
                        _ => return Err(Error::Agent("unexpected message in output stream".into())),
                    },
                },
                Some(_) => return Err(Error::Agent("unexpected frame in output stream".into())),
            }
        }
    };
    let exit = match wait {
        Some(d) => tokio::time::timeout(d, fut)
            .await
            .map_err(|_| Error::Agent("the agent did not report the command's end in time".into()))??,
        None => fut.await?,
    };
    Ok((exit, c.out))
}

fn deadline(spec: &ExecSpec) -> Option<Duration> {
    spec.timeout_ms.map(|t| Duration::from_millis(t) + AGENT_SLACK)
}

pub async fn exec(m: &Manager, sb: &Sb, req: ExecRequest) -> Result<ExecResult> {
    let t = std::time::Instant::now();
    let oom_before = sb.oom_kills();
    let (mut r, _w, spec, _) = start(m, sb, &req).await?;
    let (exit, out) = collect(m, sb, &mut r, spec.max_output_bytes, deadline(&spec)).await?;
    crate::records::record(m, sb, &spec.cmd, &exit, [&out[0], &out[1]]);
    let oom = sb.oom_kills() > oom_before;
    let res = result(exit, out, req.encoding, oom);
    count_command(m, &res, t.elapsed());
    Ok(res)
}

fn count_command(m: &Manager, r: &ExecResult, took: Duration) {
    use crate::metrics::Metrics;
    Metrics::inc(&m.metrics.commands);
    if r.timed_out {
        Metrics::inc(&m.metrics.command_timeouts);
    }
    if r.oom_killed {
        Metrics::inc(&m.metrics.command_ooms);
    }
    m.metrics.exec_latency.observe(took);
}

pub async fn exec_background(m: &Manager, sb: &Sb, req: ExecRequest) -> Result<Started> {
    let (_r, _w, _spec, started) = start(m, sb, &req).await?;
    Ok(started)
}

/// The NDJSON stream of a command: `started`, output chunks, then `exited` (or `error`).
pub async fn exec_stream(
    m: std::sync::Arc<Manager>,
    sb: std::sync::Arc<Sb>,
    req: ExecRequest,
) -> Result<impl Stream<Item = std::result::Result<Bytes, std::io::Error>>> {
    let t0 = std::time::Instant::now();
    let oom_before = sb.oom_kills();
    let (mut r, w, spec, started) = start(&m, &sb, &req).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let line = |l: &ExecStreamLine| {
        let mut v = serde_json::to_vec(l).unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    };
    let _ = tx.send(line(&ExecStreamLine::Started { id: started.id, pid: started.pid })).await;
    let enc = req.encoding;
    tokio::spawn(async move {
        let _w = w; // keep our end open until the command ends
        let mut sent = [0u64; 2];
        let mut kept: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        let cap = spec.max_output_bytes;
        let end = async {
            loop {
                match r.next().await.map_err(|e| m.agent_error(&sb.id, e))? {
                    None => return Err(m.agent_error(&sb.id, "connection closed before the command ended")),
                    Some((k @ (Kind::Stdout | Kind::Stderr), b)) => {
                        let i = if k == Kind::Stdout { 0 } else { 1 };
                        let room = cap.saturating_sub(sent[i]) as usize;
                        let b = &b[..b.len().min(room)];
                        if b.is_empty() {
                            continue;
                        }
                        sent[i] += b.len() as u64;
                        let room = crate::records::KEPT.saturating_sub(kept[i].len());
                        kept[i].extend_from_slice(&b[..b.len().min(room)]);
                        let data = encode(b, enc);
                        let l = if i == 0 { ExecStreamLine::Stdout { data } } else { ExecStreamLine::Stderr { data } };
                        if tx.send(line(&l)).await.is_err() {
                            // The client went away; the command goes on until it ends.
                            return Err(Error::Internal("client gone".into()));
                        }
                    }
                    Some((Kind::Json, b)) => match serde_json::from_slice::<Event>(&b) {
                        Ok(Event::Exited(e)) => return Ok(e),
                        _ => return Err(Error::Agent("unexpected message in output stream".into())),
                    },
                    Some(_) => return Err(Error::Agent("unexpected frame in output stream".into())),
                }
            }
        };
        let r = match deadline(&spec) {
            Some(d) => tokio::time::timeout(d, end)
                .await
                .unwrap_or_else(|_| Err(Error::Agent("the agent did not report the command's end in time".into()))),
            None => end.await,
        };
        let last = match r {
            Ok(e) => {
                crate::records::record(&m, &sb, &spec.cmd, &e, [&kept[0], &kept[1]]);
                let oom = sb.oom_kills() > oom_before;
                let res = result(e, [Vec::new(), Vec::new()], enc, oom);
                count_command(&m, &res, t0.elapsed());
                ExecStreamLine::Exited(res)
            }
            Err(e) => ExecStreamLine::Error { error: e.into_detail() },
        };
        let _ = tx.send(line(&last)).await;
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok))
}

pub async fn command_result(m: &Manager, sb: &Sb, id: u64, wait: bool, enc: Encoding) -> Result<ExecResult> {
    if !wait {
        let list = list_commands(m, sb).await?;
        match list.commands.iter().find(|c| c.id == id) {
            None => return Err(Error::NotFound { what: "command", name: id.to_string() }),
            Some(c) if c.running => return Err(Error::Conflict(format!("command {id} is still running"))),
            Some(_) => {}
        }
    }
    let (mut r, mut w) = sb.connect().await.map_err(|e| m.agent_error(&sb.id, e))?;
    w.json(&Request::Attach { id }).await?;
    let (exit, out) = collect(m, sb, &mut r, MAX_KEPT, None).await.map_err(|e| match e {
        Error::NotFound { .. } => Error::NotFound { what: "command", name: id.to_string() },
        e => e,
    })?;
    Ok(result(exit, out, enc, false))
}

pub async fn list_commands(m: &Manager, sb: &Sb) -> Result<CommandList> {
    match m.agent_call(sb, &Request::List).await? {
        Reply::Commands { commands } => Ok(CommandList {
            commands: commands
                .into_iter()
                .map(|c| CommandSummary {
                    id: c.id,
                    pid: c.pid,
                    cmd: c.cmd,
                    running: c.running,
                    exit_code: c.exit.map(|e| e.exit_code),
                })
                .collect(),
        }),
        other => Err(unexpected(other)),
    }
}

fn unexpected(r: Reply) -> Error {
    match r {
        Reply::Error { code, message } => reply_error(code, message),
        _ => Error::Agent("unexpected reply".into()),
    }
}

fn command_error(id: u64, r: Reply) -> Error {
    match r {
        Reply::Error { code: ap::ErrorCode::NotFound, .. } => Error::NotFound { what: "command", name: id.to_string() },
        Reply::Error { code: ap::ErrorCode::InvalidArgument, message } => Error::Invalid(message),
        other => unexpected(other),
    }
}

pub async fn signal(m: &Manager, sb: &Sb, id: u64, signal: i32) -> Result<()> {
    if !(1..=64).contains(&signal) {
        return Err(Error::Invalid(format!("signal must be between 1 and 64, got {signal}")));
    }
    match m.agent_call(sb, &Request::Signal { id, signal }).await? {
        Reply::Ok => Ok(()),
        other => Err(command_error(id, other)),
    }
}

pub async fn send_stdin(m: &Manager, sb: &Sb, id: u64, data: &[u8], close: bool) -> Result<()> {
    let (mut r, mut w) = sb.connect().await.map_err(|e| m.agent_error(&sb.id, e))?;
    w.json(&Request::Stdin { id }).await?;
    // On a write error the agent has already answered (e.g. no such command): read that.
    let sent = send_stdin_frames(&mut w, id, data, close).await;
    let reply = match tokio::time::timeout(AGENT_REPLY, r.json::<Reply>()).await {
        Ok(r) => r,
        Err(_) => return Err(m.agent_error(&sb.id, "the agent did not answer in time")),
    };
    if let (Err(e), Err(_)) = (&sent, &reply) {
        return Err(m.agent_error(&sb.id, e));
    }
    match reply.map_err(|e| m.agent_error(&sb.id, e))? {
        Reply::Ok => Ok(()),
        other => Err(command_error(id, other)),
    }
}

/// A file request with a single reply.
pub async fn file_call(m: &Manager, sb: &Sb, req: &Request) -> Result<Reply> {
    match m.agent_call(sb, req).await? {
        Reply::Error { code, message } => Err(reply_error(code, message)),
        r => Ok(r),
    }
}

pub async fn download(
    m: std::sync::Arc<Manager>,
    sb: std::sync::Arc<Sb>,
    path: String,
) -> Result<(FileInfo, impl Stream<Item = std::result::Result<Bytes, std::io::Error>>)> {
    let (mut r, mut w) = sb.connect().await.map_err(|e| m.agent_error(&sb.id, e))?;
    w.json(&Request::ReadFile { path }).await?;
    let info = match r.json::<Reply>().await.map_err(|e| m.agent_error(&sb.id, e))? {
        Reply::FileInfo(i) => i,
        other => return Err(unexpected(other)),
    };
    let size = info.size;
    let stream = futures_util::stream::unfold((r, w, 0u64, false), move |(mut r, w, got, done)| async move {
        if done {
            return None;
        }
        match r.next().await {
            Ok(Some((Kind::Data, b))) => {
                let got = got + b.len() as u64;
                if got > size {
                    // The file grew while being read: stop at the announced length.
                    let keep = b.len() - (got - size) as usize;
                    return Some((Ok(Bytes::copy_from_slice(&b[..keep])), (r, w, size, true)));
                }
                Some((Ok(Bytes::from(b)), (r, w, got, false)))
            }
            Ok(Some((Kind::Json, b))) => match serde_json::from_slice::<Reply>(&b) {
                Ok(Reply::Ok) if got == size => None,
                _ => Some((Err(std::io::Error::other("file changed or failed while downloading")), (r, w, got, true))),
            },
            _ => Some((Err(std::io::Error::other("download interrupted")), (r, w, got, true))),
        }
    });
    Ok((info, stream))
}

pub async fn upload<S, E>(m: &Manager, sb: &Sb, path: String, mode: Option<u32>, body: S) -> Result<FileInfo>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let oom_before = sb.oom_kills();
    // The disk is RAM-backed: an upload that breaks while the sandbox hits its memory limit
    // ran out of space, whatever broke first.
    let out_of_memory = |e: Error| {
        if sb.oom_kills() > oom_before && matches!(e, Error::Agent(_)) {
            reply_error(
                ap::ErrorCode::NoSpace,
                "the sandbox ran out of memory during the upload (its disk is RAM-backed)".into(),
            )
        } else {
            e
        }
    };
    let (mut r, mut w) = sb.connect().await.map_err(|e| m.agent_error(&sb.id, e))?;
    w.json(&Request::WriteFile { path, mode, parents: true }).await?;
    let mut body = body;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Error::Invalid(format!("upload body: {e}")))?;
        for piece in chunk.chunks(CHUNK) {
            if let Err(e) = w.data(Kind::Data, piece).await {
                // The agent stopped reading: it has an error reply waiting (e.g. disk full).
                return match r.json::<Reply>().await {
                    Ok(Reply::Error { code, message }) => Err(reply_error(code, message)),
                    _ => Err(out_of_memory(m.agent_error(&sb.id, e))),
                };
            }
        }
    }
    w.json(&Request::EndData).await.map_err(|e| out_of_memory(e.into()))?;
    w.flush().await.map_err(|e| out_of_memory(e.into()))?;
    match r.json::<Reply>().await.map_err(|e| out_of_memory(m.agent_error(&sb.id, e)))? {
        Reply::FileInfo(i) => Ok(i),
        other => Err(unexpected(other)),
    }
}

/// A piece of a command's output, or its end (see [`attach`]).
pub enum Output {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exited(ap::ExitStatus),
}

/// Follows a command: what was kept of its output from the start, then live output, then
/// its exit. The stream ends after `Exited` or the first error.
pub async fn attach(
    m: std::sync::Arc<Manager>,
    sb: std::sync::Arc<Sb>,
    id: u64,
) -> Result<impl Stream<Item = Result<Output>>> {
    let (r, mut w) = sb.connect().await.map_err(|e| m.agent_error(&sb.id, e))?;
    w.json(&Request::Attach { id }).await?;
    w.flush().await?;
    Ok(futures_util::stream::unfold(Some((r, w, m, sb)), move |st| async move {
        let (mut r, w, m, sb) = st?;
        let item = match r.next().await {
            Err(e) => Err(m.agent_error(&sb.id, e)),
            Ok(None) => Err(m.agent_error(&sb.id, "connection closed before the command ended")),
            Ok(Some((Kind::Stdout, b))) => Ok(Output::Stdout(b)),
            Ok(Some((Kind::Stderr, b))) => Ok(Output::Stderr(b)),
            Ok(Some((Kind::Json, b))) => match serde_json::from_slice::<Event>(&b) {
                Ok(Event::Exited(e)) => Ok(Output::Exited(e)),
                _ => match serde_json::from_slice::<Reply>(&b) {
                    Ok(Reply::Error { code: ap::ErrorCode::NotFound, .. }) => {
                        Err(Error::NotFound { what: "command", name: id.to_string() })
                    }
                    _ => Err(Error::Agent("unexpected message in output stream".into())),
                },
            },
            Ok(Some(_)) => Err(Error::Agent("unexpected frame in output stream".into())),
        };
        let go_on = matches!(item, Ok(Output::Stdout(_) | Output::Stderr(_)));
        Some((item, go_on.then_some((r, w, m, sb))))
    }))
}
