//! Records of finished commands: exit status, timing and the first [`KEPT`] bytes of each
//! stream, kept in the store for the retention period — so `GET …/commands/{cid}` answers
//! after the agent forgot the command, after the sandbox ended, and after a daemon restart.
//!
//! Foreground commands are recorded when they end; background ones by a watcher attached to
//! each (started with the command, and again for the running ones of an adopted sandbox);
//! whatever is left when a sandbox ends is fetched from its agent before the kill
//! ([`flush`]), bounded in time. Language kernels are not commands and are not recorded.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use glovebox_proto::agent::{self as ap, Event, ExitStatus, Reply, Request};
use glovebox_proto::api::{Encoding, ExecResult};
use glovebox_proto::frame::Kind;

use crate::manager::{Manager, Sb};
use crate::store::CommandRecord;

/// Bytes kept per stream of a recorded command.
pub const KEPT: usize = 64 << 10;
/// How long a sandbox's end waits for its commands' records.
const FLUSH_BOUND: Duration = Duration::from_secs(3);

fn is_kernel(cmd: &ap::Command) -> bool {
    match cmd {
        ap::Command::Argv(v) => v.iter().any(|a| a.starts_with(crate::code::KERNEL_DIR)),
        ap::Command::Shell(s) => s.contains(crate::code::KERNEL_DIR),
    }
}

/// Stores one finished command (output cut to [`KEPT`] per stream).
pub fn record(m: &Manager, sandbox_id: &str, cmd: &ap::Command, exit: &ExitStatus, out: [&[u8]; 2]) {
    if is_kernel(cmd) {
        return;
    }
    let ended = SystemTime::now();
    let r = CommandRecord {
        sandbox_id: sandbox_id.to_string(),
        cmd_id: exit.id,
        cmd: serde_json::to_value(cmd).unwrap_or_default(),
        exit: exit.clone(),
        stdout: out[0][..out[0].len().min(KEPT)].to_vec(),
        stderr: out[1][..out[1].len().min(KEPT)].to_vec(),
        started_at: ended.checked_sub(Duration::from_millis(exit.duration_ms)),
        ended_at: ended,
    };
    if let Err(e) = m.store.put_command(&r) {
        tracing::error!(sandbox = %sandbox_id, "store command {}: {e}", exit.id);
    }
}

/// A stored command as the API shows it (`stdout_truncated` also when the record kept less
/// than the command wrote).
pub fn stored_result(m: &Manager, sandbox_id: &str, cmd_id: u64, enc: Encoding) -> Option<ExecResult> {
    let r = m.store.command(sandbox_id, cmd_id).ok().flatten()?;
    let e = r.exit;
    Some(ExecResult {
        id: e.id,
        exit_code: e.exit_code,
        signal: e.signal,
        timed_out: e.timed_out,
        oom_killed: e.oom_killed,
        stdout_truncated: e.stdout_truncated || (r.stdout.len() as u64) < e.stdout_bytes,
        stderr_truncated: e.stderr_truncated || (r.stderr.len() as u64) < e.stderr_bytes,
        stdout: crate::ops::encode(&r.stdout, enc),
        stderr: crate::ops::encode(&r.stderr, enc),
        encoding: enc,
        stdout_bytes: e.stdout_bytes,
        stderr_bytes: e.stderr_bytes,
        duration_ms: e.duration_ms,
    })
}

/// Reads an `Attach` exchange: output (first [`KEPT`] bytes per stream) until the exit, or
/// until `quiet` passes without a frame (then `None` for the exit: the command still runs).
async fn attach(sb: &Sb, id: u64, quiet: Option<Duration>) -> Option<(Option<ExitStatus>, [Vec<u8>; 2])> {
    let (mut r, mut w) = sb.connect().await.ok()?;
    w.json(&Request::Attach { id }).await.ok()?;
    let mut out = [Vec::new(), Vec::new()];
    loop {
        let next = match quiet {
            Some(q) => match tokio::time::timeout(q, r.next()).await {
                Ok(n) => n,
                Err(_) => return Some((None, out)),
            },
            None => r.next().await,
        };
        match next.ok()? {
            Some((k @ (Kind::Stdout | Kind::Stderr), b)) => {
                let o = &mut out[if k == Kind::Stdout { 0 } else { 1 }];
                let room = KEPT.saturating_sub(o.len());
                o.extend_from_slice(&b[..b.len().min(room)]);
            }
            Some((Kind::Json, b)) => {
                return match serde_json::from_slice::<Event>(&b) {
                    Ok(Event::Exited(e)) => Some((Some(e), out)),
                    _ => None,
                }
            }
            _ => return None,
        }
    }
}

/// Records background command `id` when it ends (a task; it gives up silently if the
/// sandbox goes first — [`flush`] covers that). The sandbox counts as busy meanwhile.
pub fn watch_background(m: Arc<Manager>, sb: Arc<Sb>, id: u64, cmd: ap::Command) {
    if is_kernel(&cmd) {
        return;
    }
    tokio::spawn(async move {
        // A running command is activity until it ends (the idle clock starts from there).
        let _busy = sb.activity.guard();
        if let Some((Some(exit), out)) = attach(&sb, id, None).await {
            record(&m, &sb.id, &cmd, &exit, [&out[0], &out[1]]);
        }
    });
}

/// Watches every running background command of an adopted sandbox.
pub async fn watch_running(m: &Arc<Manager>, sb: &Arc<Sb>) {
    if let Ok(Reply::Commands { commands }) = m.agent_call(sb, &Request::List).await {
        for c in commands {
            if c.running {
                watch_background(m.clone(), sb.clone(), c.id, c.cmd);
            }
        }
    }
}

/// Before a sandbox is killed: records every command its agent still has that the store
/// lacks — finished ones as they ended, running ones with their output so far and the
/// SIGKILL the teardown is about to send. Bounded by `FLUSH_BOUND` altogether.
pub async fn flush(m: &Manager, sb: &Sb) {
    let go = async {
        let Ok(Reply::Commands { commands }) = m.agent_call(sb, &Request::List).await else { return };
        let known = m.store.command_ids(&sb.id).unwrap_or_default();
        for c in commands {
            if known.contains(&c.id) || is_kernel(&c.cmd) {
                continue;
            }
            let quiet = if c.running { Some(Duration::from_millis(200)) } else { None };
            let Some((exit, out)) = attach(sb, c.id, quiet).await else { continue };
            let exit = exit.unwrap_or(ExitStatus {
                id: c.id,
                exit_code: 128 + libc::SIGKILL,
                signal: Some(libc::SIGKILL),
                stdout_bytes: out[0].len() as u64,
                stderr_bytes: out[1].len() as u64,
                ..Default::default()
            });
            record(m, &sb.id, &c.cmd, &exit, [&out[0], &out[1]]);
        }
    };
    if tokio::time::timeout(FLUSH_BOUND, go).await.is_err() {
        tracing::warn!(sandbox = %sb.id, "command records: gave up after {FLUSH_BOUND:?}");
    }
}

/// Drops records past the retention period, now and then every ten minutes.
pub fn spawn_pruner(m: std::sync::Weak<Manager>, retention: Duration) {
    tokio::spawn(async move {
        loop {
            let Some(mm) = m.upgrade() else { return };
            if let Some(before) = SystemTime::now().checked_sub(retention) {
                match mm.store.prune(before) {
                    Ok(n) if n > 0 => tracing::info!("store: pruned {n} records older than {retention:?}"),
                    Ok(_) => {}
                    Err(e) => tracing::error!("store prune: {e}"),
                }
            }
            drop(mm);
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
    });
}
