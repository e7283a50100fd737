//! Records of finished commands: exit status, timing and the first [`KEPT`] bytes of each
//! stream, kept in the store for the retention period — so `GET …/commands/{cid}` answers
//! after the agent forgot the command, after the sandbox ended, and after a daemon restart.
//!
//! Foreground commands are recorded when they end; background ones by a watcher attached to
//! each (started with the command, and again for the running ones of an adopted sandbox);
//! whatever is left when a sandbox ends is fetched from its agent before the kill
//! ([`flush`]), bounded in time. Language kernels are not commands and are not recorded.
//!
//! The inserts happen on a thread of their own ([`Writer`]), batched, [`LINGER`] after the
//! record (so after the result is on its way, not beside it on a two-core host): an insert
//! and its WAL commit cost about 0.1 ms of CPU, a twentieth of an exec round trip. Every read
//! of the records first waits for the writer to catch up ([`Writer::settle`], which ends the
//! wait at once), so a record is never missing to a reader that asks after the command's
//! result came back. A daemon killed within those two milliseconds loses the record; the
//! agent still has the command, and a re-adopted sandbox serves it from there.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use glovebox_proto::agent::{self as ap, ExitStatus};
use glovebox_proto::api::{Encoding, ExecResult};

use crate::agent::Output;

use crate::manager::{Manager, Sb};
use crate::store::{CommandRecord, Store};

/// Records written in one transaction at most.
const BATCH: usize = 256;
/// How long the writer waits after a record before inserting it (see [`Writer::start`]).
const LINGER: Duration = Duration::from_millis(2);
/// The longest a reader waits for the writer to catch up.
const SETTLE_BOUND: Duration = Duration::from_secs(2);

enum Msg {
    Put(Box<CommandRecord>),
    Settled(tokio::sync::oneshot::Sender<()>),
}

/// The command-record writer: a thread that inserts what [`record`] hands it, in batches.
pub struct Writer {
    tx: Option<std::sync::mpsc::Sender<Msg>>,
    store: Arc<Store>,
}

impl Writer {
    pub fn start(store: Arc<Store>) -> Writer {
        let (tx, rx) = std::sync::mpsc::channel::<Msg>();
        let s = store.clone();
        let spawned = std::thread::Builder::new().name("glovebox-records".into()).spawn(move || {
            // Ends when the manager (the only sender) is dropped.
            while let Ok(first) = rx.recv() {
                let (mut batch, mut settled) = (Vec::new(), Vec::new());
                // A record arrives just before its command's result is written to the client:
                // the insert waits a moment (or until a reader asks) so that it runs after the
                // reply rather than beside it, and takes whatever else came meanwhile along.
                let linger_until = std::time::Instant::now() + LINGER;
                let mut next = Some(first);
                while let Some(m) = next.take() {
                    match m {
                        Msg::Put(r) => batch.push(*r),
                        Msg::Settled(t) => settled.push(t),
                    }
                    if batch.len() < BATCH {
                        let wait = linger_until.saturating_duration_since(std::time::Instant::now());
                        next = if settled.is_empty() && !wait.is_zero() {
                            rx.recv_timeout(wait).ok()
                        } else {
                            rx.try_recv().ok()
                        };
                    }
                }
                if !batch.is_empty() {
                    if let Err(e) = s.put_commands(&batch) {
                        tracing::error!("store {} command records: {e}", batch.len());
                    }
                }
                for t in settled {
                    let _ = t.send(());
                }
            }
        });
        let tx = match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::error!("command record writer: {e}; writing records inline");
                None
            }
        };
        Writer { tx, store }
    }

    fn put(&self, r: CommandRecord) {
        let r = match &self.tx {
            Some(tx) => match tx.send(Msg::Put(Box::new(r))) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(Msg::Put(r))) => *r,
                Err(_) => return,
            },
            None => r,
        };
        if let Err(e) = self.store.put_commands(std::slice::from_ref(&r)) {
            tracing::error!(sandbox = %r.sandbox_id, "store command {}: {e}", r.cmd_id);
        }
    }

    /// Waits (bounded) until every record handed over before this call is in the store.
    pub async fn settle(&self) {
        let Some(tx) = &self.tx else { return };
        let (t, r) = tokio::sync::oneshot::channel();
        if tx.send(Msg::Settled(t)).is_ok() {
            let _ = tokio::time::timeout(SETTLE_BOUND, r).await;
        }
    }
}

/// Bytes kept per stream of a recorded command.
pub const KEPT: usize = 64 << 10;
/// How long a sandbox's end waits for its commands' records.
const FLUSH_BOUND: Duration = Duration::from_secs(3);

fn is_kernel(cmd: &ap::Command) -> bool {
    match cmd {
        ap::Command::Argv(v) => v.iter().any(|a| a.starts_with(crate::kernels::KERNEL_DIR)),
        ap::Command::Shell(s) => s.contains(crate::kernels::KERNEL_DIR),
    }
}

/// Commands of one sandbox started through the API, and how many of them are on record:
/// when the two agree, a teardown has nothing to fetch from the agent (one round trip less).
#[derive(Default)]
pub struct Counts {
    started: std::sync::atomic::AtomicU64,
    recorded: std::sync::atomic::AtomicU64,
}

impl Counts {
    /// For an adopted sandbox: what ran before the restart is unknown, so they never agree.
    pub fn unknown() -> Counts {
        Counts { started: std::sync::atomic::AtomicU64::new(u64::MAX / 2), ..Default::default() }
    }

    pub fn started(&self) {
        self.started.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    fn all_recorded(&self) -> bool {
        use std::sync::atomic::Ordering::Acquire;
        self.recorded.load(Acquire) >= self.started.load(Acquire)
    }
}

/// Stores one finished command (output cut to [`KEPT`] per stream).
pub fn record(m: &Manager, sb: &Sb, cmd: &ap::Command, exit: &ExitStatus, out: [&[u8]; 2]) {
    if is_kernel(cmd) {
        return;
    }
    sb.commands.recorded.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    let sandbox_id = sb.id.as_str();
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
    m.records.put(r);
}

/// A stored command as the API shows it (`stdout_truncated` also when the record kept less
/// than the command wrote).
pub async fn stored_result(m: &Manager, sandbox_id: &str, cmd_id: u64, enc: Encoding) -> Option<ExecResult> {
    m.records.settle().await;
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
        stdout: crate::util::encode(&r.stdout, enc),
        stderr: crate::util::encode(&r.stderr, enc),
        encoding: enc,
        stdout_bytes: e.stdout_bytes,
        stderr_bytes: e.stderr_bytes,
        duration_ms: e.duration_ms,
    })
}

/// Reads an `Attach` exchange: output (first [`KEPT`] bytes per stream) until the exit, or
/// until `quiet` passes without a frame (then `None` for the exit: the command still runs).
async fn attach(sb: &Sb, id: u64, quiet: Option<Duration>) -> Option<(Option<ExitStatus>, [Vec<u8>; 2])> {
    let mut stream = sb.agent().attach(id).await.ok()?;
    let mut out = [Vec::new(), Vec::new()];
    loop {
        let next = match quiet {
            Some(q) => match tokio::time::timeout(q, stream.next()).await {
                Ok(n) => n,
                Err(_) => return Some((None, out)),
            },
            None => stream.next().await,
        };
        let (o, b) = match next.ok()? {
            Output::Stdout(b) => (&mut out[0], b),
            Output::Stderr(b) => (&mut out[1], b),
            Output::Exited(e) => return Some((Some(e), out)),
        };
        let room = KEPT.saturating_sub(o.len());
        o.extend_from_slice(&b[..b.len().min(room)]);
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
            record(&m, &sb, &cmd, &exit, [&out[0], &out[1]]);
        }
    });
}

/// Watches every running background command of an adopted sandbox.
pub async fn watch_running(m: &Arc<Manager>, sb: &Arc<Sb>) {
    if let Ok(commands) = sb.agent().list().await {
        for c in commands {
            if c.running {
                watch_background(m.clone(), sb.clone(), c.id, c.cmd);
            }
        }
    }
}

/// The command records' observer of sandboxes: [`flush`] before each kill.
pub struct Flush;

impl crate::manager::Observer for Flush {
    fn before_kill<'a>(&'a self, m: &'a Manager, sb: &'a Arc<Sb>) -> Option<crate::manager::LastWords<'a>> {
        Some(Box::pin(flush(m, sb)))
    }
}

/// Before a sandbox is killed: records every command its agent still has that the store
/// lacks — finished ones as they ended, running ones with their output so far and the
/// SIGKILL the teardown is about to send. Bounded by `FLUSH_BOUND` altogether.
pub async fn flush(m: &Manager, sb: &Sb) {
    // Every command started through the API already ended on record: nothing to fetch.
    if sb.commands.all_recorded() {
        return;
    }
    let go = async {
        let Ok(commands) = sb.agent().list().await else { return };
        m.records.settle().await;
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
            record(m, sb, &c.cmd, &exit, [&out[0], &out[1]]);
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

#[cfg(test)]
mod tests {
    use super::Counts;
    use std::sync::atomic::Ordering;

    #[test]
    fn counts_agree_only_when_every_started_command_is_recorded() {
        let c = Counts::default();
        assert!(c.all_recorded(), "nothing started");
        c.started();
        c.started();
        assert!(!c.all_recorded());
        c.recorded.fetch_add(1, Ordering::AcqRel);
        assert!(!c.all_recorded(), "one of two on record");
        c.recorded.fetch_add(1, Ordering::AcqRel);
        assert!(c.all_recorded());
        let adopted = Counts::unknown();
        adopted.recorded.fetch_add(1000, Ordering::AcqRel);
        assert!(!adopted.all_recorded(), "an adopted sandbox's history is unknown");
    }
}
