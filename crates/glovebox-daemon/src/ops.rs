//! The daemon's operations on a sandbox's agent: commands and files, validated, metered and
//! recorded, over the typed [`AgentClient`]. Output is bounded here again by the caller's cap
//! (the agent is untrusted), and every failure becomes the daemon's error: the sandbox's end
//! when the connection broke because the sandbox ended.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use glovebox_proto::agent::{self as ap, ExecSpec, FileInfo};
use glovebox_proto::api::{CommandList, CommandSummary, Encoding, ExecRequest, ExecResult, ExecStreamLine, Started};

use crate::agent::{AgentError, DirWatch, NewFile, Op, Output, Running};
use crate::error::{Error, Result};
use crate::manager::{Manager, Sb};

/// Most output kept per stream when re-reading a command (the API's own cap).
const MAX_KEPT: u64 = 64 << 20;

/// Maps a failed `op` request to `sb`'s agent to the daemon's error: a broken connection
/// reports the sandbox's end when it ended meanwhile.
pub fn failed<'a>(m: &'a Manager, sb: &'a Sb, op: Op) -> impl Fn(AgentError) -> Error + 'a {
    move |e| e.into_error(op, |e| m.agent_error(&sb.id, e))
}

/// Starts a foreground command and feeds it its stdin.
async fn start(m: &Manager, sb: &Sb, spec: &ExecSpec, stdin: Option<Vec<u8>>) -> Result<Running> {
    // Counted before the agent hears of it, so a teardown meanwhile asks the agent.
    sb.commands.started();
    let mut run = sb.agent().exec(spec).await.map_err(failed(m, sb, Op::Exec))?;
    if let Some(data) = stdin {
        run.stdin.send(&data, true).await.map_err(failed(m, sb, Op::Command(run.id)))?;
    }
    Ok(run)
}

fn result(e: ap::ExitStatus, out: [Vec<u8>; 2], enc: Encoding, oom: bool) -> ExecResult {
    ExecResult {
        id: e.id,
        exit_code: e.exit_code,
        signal: e.signal,
        timed_out: e.timed_out,
        oom_killed: e.oom_killed || oom,
        stdout: crate::util::encode(&out[0], enc),
        stderr: crate::util::encode(&out[1], enc),
        encoding: enc,
        stdout_truncated: e.stdout_truncated,
        stderr_truncated: e.stderr_truncated,
        stdout_bytes: e.stdout_bytes,
        stderr_bytes: e.stderr_bytes,
        duration_ms: e.duration_ms,
    }
}

pub async fn exec(m: &Manager, sb: &Sb, req: ExecRequest) -> Result<ExecResult> {
    let t = std::time::Instant::now();
    let oom_before = sb.oom_kills();
    let (spec, stdin) = sb.exec_spec(&req)?;
    let mut run = start(m, sb, &spec, stdin).await?;
    let (exit, out) = run.output.collect(spec.max_output_bytes).await.map_err(failed(m, sb, Op::Output(run.id)))?;
    crate::manager::records::record(m, sb, &spec.cmd, &exit, [&out[0], &out[1]]);
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
    let (spec, stdin) = sb.exec_spec(&req)?;
    sb.commands.started();
    let run = sb.agent().exec(&spec).await.map_err(failed(m, sb, Op::Exec))?;
    let started = Started { id: run.id, pid: run.pid };
    // The agent ends a background exchange after `Started`: stdin goes separately.
    drop(run);
    if let Some(data) = stdin {
        send_stdin(m, sb, started.id, &data, true).await?;
    }
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
    let (spec, stdin) = sb.exec_spec(&req)?;
    let run = start(&m, &sb, &spec, stdin).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let line = |l: &ExecStreamLine| {
        let mut v = serde_json::to_vec(l).unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    };
    let _ = tx.send(line(&ExecStreamLine::Started { id: run.id, pid: run.pid })).await;
    let enc = req.encoding;
    tokio::spawn(async move {
        // Our end stays open until the command ends.
        let Running { id, mut output, stdin: _stdin, .. } = run;
        let mut sent = [0u64; 2];
        let mut kept: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        let cap = spec.max_output_bytes;
        let end = async {
            loop {
                let (i, b) = match output.next().await.map_err(failed(&m, &sb, Op::Output(id)))? {
                    Output::Exited(e) => return Ok(e),
                    Output::Stdout(b) => (0, b),
                    Output::Stderr(b) => (1, b),
                };
                let room = cap.saturating_sub(sent[i]) as usize;
                let b = &b[..b.len().min(room)];
                if b.is_empty() {
                    continue;
                }
                sent[i] += b.len() as u64;
                let room = crate::manager::records::KEPT.saturating_sub(kept[i].len());
                kept[i].extend_from_slice(&b[..b.len().min(room)]);
                let data = crate::util::encode(b, enc);
                let l = if i == 0 { ExecStreamLine::Stdout { data } } else { ExecStreamLine::Stderr { data } };
                if tx.send(line(&l)).await.is_err() {
                    // The client went away; the command goes on until it ends.
                    return Err(Error::Internal("client gone".into()));
                }
            }
        };
        let last = match end.await {
            Ok(e) => {
                crate::manager::records::record(&m, &sb, &spec.cmd, &e, [&kept[0], &kept[1]]);
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
    let fail = failed(m, sb, Op::Output(id));
    let (exit, out) = sb.agent().attach(id).await.map_err(&fail)?.collect(MAX_KEPT).await.map_err(&fail)?;
    Ok(result(exit, out, enc, false))
}

pub async fn list_commands(m: &Manager, sb: &Sb) -> Result<CommandList> {
    let commands = sb.agent().list().await.map_err(failed(m, sb, Op::File))?;
    Ok(CommandList {
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
    })
}

pub async fn signal(m: &Manager, sb: &Sb, id: u64, signal: i32) -> Result<()> {
    if !(1..=64).contains(&signal) {
        return Err(Error::Invalid(format!("signal must be between 1 and 64, got {signal}")));
    }
    sb.agent().signal(id, signal).await.map_err(failed(m, sb, Op::Command(id)))
}

pub async fn send_stdin(m: &Manager, sb: &Sb, id: u64, data: &[u8], close: bool) -> Result<()> {
    sb.agent().stdin(id, data, close).await.map_err(failed(m, sb, Op::Command(id)))
}

pub async fn stat(m: &Manager, sb: &Sb, path: String) -> Result<FileInfo> {
    sb.agent().stat(path).await.map_err(failed(m, sb, Op::File))
}

pub async fn list_dir(m: &Manager, sb: &Sb, path: String, depth: u32) -> Result<Vec<FileInfo>> {
    sb.agent().list_dir(path, depth).await.map_err(failed(m, sb, Op::File))
}

/// Makes a directory and its missing parents (the new ones owned by `owner`, default root).
pub async fn make_dir(m: &Manager, sb: &Sb, path: String, owner: Option<ap::Owner>) -> Result<FileInfo> {
    sb.agent().make_dir(path, true, owner).await.map_err(failed(m, sb, Op::File))
}

pub async fn remove(m: &Manager, sb: &Sb, path: String, recursive: bool) -> Result<()> {
    sb.agent().remove(path, recursive).await.map_err(failed(m, sb, Op::File))
}

/// Starts watching a directory inside the sandbox.
pub async fn watch_dir(m: &Manager, sb: &Sb, path: String, recursive: bool) -> Result<DirWatch> {
    sb.agent().watch_dir(path, recursive).await.map_err(failed(m, sb, Op::File))
}

/// A watch's changes since the last call, and whether some were dropped.
pub async fn watch_events(m: &Manager, sb: &Sb, watch: &mut DirWatch) -> Result<(Vec<ap::FsEvent>, bool)> {
    watch.events().await.map_err(failed(m, sb, Op::File))
}

pub async fn rename(m: &Manager, sb: &Sb, from: String, to: String) -> Result<FileInfo> {
    sb.agent().rename(from, to).await.map_err(failed(m, sb, Op::File))
}

pub async fn download(
    m: std::sync::Arc<Manager>,
    sb: std::sync::Arc<Sb>,
    path: String,
) -> Result<(FileInfo, impl Stream<Item = std::result::Result<Bytes, std::io::Error>>)> {
    let (info, reader) = sb.agent().read_file(path).await.map_err(failed(&m, &sb, Op::File))?;
    let stream = futures_util::stream::unfold(reader, |mut r| async move {
        match r.next().await {
            Ok(Some(b)) => Some((Ok(Bytes::from(b)), r)),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), r)),
        }
    });
    Ok((info, stream))
}

pub async fn upload<S, E>(m: &Manager, sb: &Sb, path: String, new: NewFile, body: S) -> Result<FileInfo>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let oom_before = sb.oom_kills();
    // The disk is RAM-backed: an upload that breaks while the sandbox hits its memory limit
    // ran out of space, whatever broke first.
    let fail = |e: AgentError| {
        let e = e.into_error(Op::File, |e| m.agent_error(&sb.id, e));
        if sb.oom_kills() > oom_before && matches!(e, Error::Agent(_)) {
            Error::File {
                code: ap::ErrorCode::NoSpace,
                message: "the sandbox ran out of memory during the upload (its disk is RAM-backed)".into(),
            }
        } else {
            e
        }
    };
    let mut up = sb.agent().write_file(path, new).await.map_err(failed(m, sb, Op::File))?;
    let mut body = body;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| Error::Invalid(format!("upload body: {e}")))?;
        up.send(&chunk).await.map_err(fail)?;
    }
    up.finish().await.map_err(fail)
}

/// Follows a command: what was kept of its output from the start, then live output, then
/// its exit. The stream ends after `Exited` or the first error.
pub async fn attach(
    m: std::sync::Arc<Manager>,
    sb: std::sync::Arc<Sb>,
    id: u64,
) -> Result<impl Stream<Item = Result<Output>>> {
    let output = sb.agent().attach(id).await.map_err(failed(&m, &sb, Op::Output(id)))?;
    Ok(futures_util::stream::unfold(Some((output, m, sb)), move |st| async move {
        let (mut output, m, sb) = st?;
        let item = output.next().await.map_err(failed(&m, &sb, Op::Output(id)));
        let go_on = matches!(item, Ok(Output::Stdout(_) | Output::Stderr(_)));
        Some((item, go_on.then_some((output, m, sb))))
    }))
}

/// A terminal size from a request: both sides `1..=1000`.
pub fn pty_size(cols: u32, rows: u32) -> Result<ap::PtySize> {
    let size = match (u16::try_from(cols), u16::try_from(rows)) {
        (Ok(cols), Ok(rows)) => Some(ap::PtySize { cols, rows }),
        _ => None,
    };
    size.filter(ap::PtySize::is_valid).ok_or_else(|| {
        Error::Invalid(format!("cols and rows must be between 1 and {}, got {cols}x{rows}", ap::PtySize::MAX))
    })
}

/// Starts a command on a pseudo-terminal in the background: a login shell unless the
/// request names a command. Its output waits for a session (nothing is kept).
pub async fn pty_start(
    m: &Manager,
    sb: &Sb,
    req: glovebox_proto::api::PtyRequest,
    timeout: glovebox_proto::api::TimeBudget,
) -> Result<Started> {
    let size = pty_size(req.cols, req.rows)?;
    let cmd = match req.cmd {
        Some(c) => c,
        None => {
            let bash = sb.agent().stat("/bin/bash".into()).await.is_ok_and(|i| i.mode & 0o111 != 0);
            ap::Command::Argv(vec![if bash { "/bin/bash" } else { "/bin/sh" }.into(), "-l".into()])
        }
    };
    let exec = ExecRequest {
        cmd,
        cwd: req.cwd,
        env: req.env,
        stdin: None,
        stdin_base64: None,
        timeout_ms: Some(timeout),
        max_output_bytes: None,
        output_tail_bytes: None,
        encoding: Encoding::Utf8,
        background: true,
    };
    start_raw(m, sb, &exec, Some(size)).await
}

/// Starts a command in session mode (`raw`: its output waits for the one session attached,
/// nothing is kept), on a pseudo-terminal of `pty`'s size when given.
async fn start_raw(m: &Manager, sb: &Sb, exec: &ExecRequest, pty: Option<ap::PtySize>) -> Result<Started> {
    let (mut spec, _) = sb.exec_spec(exec)?;
    spec.raw = true;
    spec.stdin = true;
    spec.pty = pty;
    sb.commands.started();
    let run = sb.agent().exec(&spec).await.map_err(failed(m, sb, Op::Exec))?;
    Ok(Started { id: run.id, pid: run.pid })
}

/// Starts a command in session mode (on a pseudo-terminal of `pty`'s size when given) and
/// attaches to it: its output, from its first byte, goes to the returned session alone.
/// Stdin goes by [`send_stdin`].
pub async fn start_session(
    m: &Manager,
    sb: &Sb,
    exec: &ExecRequest,
    pty: Option<ap::PtySize>,
) -> Result<(Started, crate::agent::Session)> {
    let started = start_raw(m, sb, exec, pty).await?;
    match sb.agent().session(started.id).await {
        Ok(s) => Ok((started, s)),
        Err(e) => {
            // Nobody could ever read it: it must not run on unseen.
            let _ = sb.agent().signal(started.id, 9).await;
            Err(failed(m, sb, Op::Command(started.id))(e))
        }
    }
}

/// Resizes terminal command `id`.
pub async fn pty_resize(m: &Manager, sb: &Sb, id: u64, cols: u32, rows: u32) -> Result<()> {
    let size = pty_size(cols, rows)?;
    sb.agent().resize(id, size.cols, size.rows).await.map_err(failed(m, sb, Op::Command(id)))
}

/// Checks that command `id` exists and runs on a terminal, then attaches to it (taking it
/// over from any session attached before).
pub async fn pty_attach(m: &Manager, sb: &Sb, id: u64) -> Result<crate::agent::Session> {
    let cmds = sb.agent().list().await.map_err(failed(m, sb, Op::File))?;
    match cmds.iter().find(|c| c.id == id) {
        None => return Err(Error::NotFound { what: "command", name: id.to_string() }),
        Some(c) if !c.pty => return Err(Error::Invalid(format!("command {id} does not run on a terminal"))),
        Some(_) => {}
    }
    sb.agent().session(id).await.map_err(failed(m, sb, Op::Command(id)))
}

/// Why a terminal session ended without the program's exit: `Ok` when another attachment
/// took the terminal over, else the error (the sandbox ended, its agent is unreachable).
pub async fn pty_session_ended(m: &Manager, sb: &Sb, id: u64) -> Result<()> {
    let cmds = sb.agent().list().await.map_err(failed(m, sb, Op::Output(id)))?;
    match cmds.iter().find(|c| c.id == id) {
        Some(_) => Ok(()),
        None => Err(Error::NotFound { what: "command", name: id.to_string() }),
    }
}
