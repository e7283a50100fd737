//! The daemon's persistent state: one SQLite file, `<data_dir>/glovebox.db`, in WAL mode.
//!
//! Invariants:
//! - The schema is the ordered list [`MIGRATIONS`]; entry `i` takes the schema from version
//!   `i` to `i + 1` and runs once, inside a transaction, recorded in `schema_version`. Entries
//!   are never edited once landed: a change is a new entry appended at the end.
//! - Every write is a single statement or a transaction, so a daemon killed at any instant
//!   leaves the file consistent (the sandbox it was creating may be missing, never half there).
//! - Several processes may open the same file (a daemon and embedded runs sharing a data
//!   dir): SQLite's own locking serialises them; `busy_timeout` bounds the wait.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use glovebox_proto::api::{EndReason, Limits, NetworkPolicy};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

/// Schema migrations, oldest first. Append only.
pub const MIGRATIONS: &[&str] = &[
    // 1: sandboxes, their lifecycle events, and records of finished commands.
    "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        template TEXT NOT NULL,
        config TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        deadline INTEGER NOT NULL,
        slot INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        pid_start INTEGER NOT NULL,
        state TEXT NOT NULL,
        end_reason TEXT,
        ended_at INTEGER
    );
    CREATE INDEX sandboxes_state ON sandboxes(state);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        time INTEGER NOT NULL,
        sandbox_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        reason TEXT,
        detail TEXT
    );
    CREATE INDEX events_sandbox ON events(sandbox_id, seq);
    CREATE TABLE commands (
        sandbox_id TEXT NOT NULL,
        cmd_id INTEGER NOT NULL,
        cmd TEXT NOT NULL,
        exit TEXT NOT NULL,
        stdout BLOB NOT NULL,
        stderr BLOB NOT NULL,
        started_at INTEGER,
        ended_at INTEGER NOT NULL,
        PRIMARY KEY (sandbox_id, cmd_id)
    );
    CREATE INDEX commands_ended ON commands(ended_at);",
    // 2: tenants' API keys (SHA-256 digests only), quotas, and metered usage of sandboxes.
    "CREATE TABLE api_keys (
        digest TEXT PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        info TEXT NOT NULL
    );
    CREATE TABLE quotas (
        tenant TEXT PRIMARY KEY,
        quota TEXT NOT NULL
    );
    CREATE TABLE usage (
        sandbox_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        ended_at INTEGER NOT NULL,
        report TEXT NOT NULL
    );
    CREATE INDEX usage_tenant ON usage(tenant);",
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("open {path}: {source}")]
    Open { path: String, source: rusqlite::Error },
    #[error("migration {version}: {source}")]
    Migrate { version: usize, source: rusqlite::Error },
    #[error("database {0} has schema version {1}, newer than this glovebox knows ({2})")]
    TooNew(String, usize, usize),
    #[error("{what}: {source}")]
    Query { what: &'static str, source: rusqlite::Error },
    #[error("{what}: bad stored value: {message}")]
    Corrupt { what: &'static str, message: String },
}

pub type Result<T> = std::result::Result<T, StoreError>;

fn q(what: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Query { what, source }
}

/// Milliseconds since the epoch (the store's one time format).
pub fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

pub fn from_ms(v: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(v.max(0) as u64)
}

/// What a sandbox was created with (stored as one JSON column, so adding a setting needs no
/// migration).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SandboxConfig {
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub network: NetworkPolicy,
    #[serde(default)]
    pub idle_timeout_s: Option<u64>,
    #[serde(default)]
    pub preload: Option<String>,
    /// The owning tenant (`default` when absent).
    #[serde(default)]
    pub tenant: Option<String>,
    /// The sandbox cgroup's CPU counter when it was handed out (usage metering: what is
    /// above it is the sandbox's, across daemon restarts).
    #[serde(default)]
    pub cpu_base_usec: Option<u64>,
    /// What its idle clock does (`kill` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_idle: Option<glovebox_proto::api::OnIdle>,
    /// Set while it is paused: the lifetime it had left, in milliseconds (its clock is
    /// stopped; a restart adopts it paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_left_ms: Option<u64>,
    /// The volumes it mounts (counted again when a restart adopts it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<glovebox_proto::api::VolumeMount>,
    /// `false` when requests do not resume it while paused (`true` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<bool>,
    /// Where it started from, when a snapshot or a fork (its layers, kept by GC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Which kernel its processes run on (`process` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<glovebox_proto::api::Isolation>,
}

/// A sandbox started from a snapshot (a fork's children too): the snapshot, the layers it
/// runs on (top-most first, the snapshot's own layer first) and its lineage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Origin {
    pub snapshot: String,
    pub layers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// Parent first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ancestors: Vec<String>,
}

/// Lifecycle state as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Starting,
    Running,
    /// Ended on request or by a clock (`killed`, `timeout`, `idle`).
    Stopped,
    /// Ended by a failure (`error`, `oom`, `daemon_restart`).
    Killed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Stopped => "stopped",
            State::Killed => "killed",
        }
    }
    fn parse(s: &str) -> Option<State> {
        Some(match s {
            "starting" => State::Starting,
            "running" => State::Running,
            "stopped" => State::Stopped,
            "killed" => State::Killed,
            _ => return None,
        })
    }
    /// The state a sandbox ends in for `reason`.
    pub fn ended(reason: EndReason) -> State {
        match reason {
            EndReason::Killed | EndReason::Timeout | EndReason::Idle => State::Stopped,
            EndReason::Oom | EndReason::Error | EndReason::DaemonRestart => State::Killed,
        }
    }
}

/// One sandbox as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRecord {
    pub id: String,
    pub template: String,
    pub config: SandboxConfig,
    pub created_at: SystemTime,
    pub deadline: SystemTime,
    /// uid slot index.
    pub slot: u32,
    /// PID 1 (the agent) on the host, and its start time (clock ticks after boot, field 22
    /// of `/proc/PID/stat`): together they name the process even after pid reuse.
    pub pid: i32,
    pub pid_start: u64,
    pub state: State,
    pub end_reason: Option<EndReason>,
    pub ended_at: Option<SystemTime>,
}

/// One lifecycle event as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub seq: i64,
    pub time: SystemTime,
    pub sandbox_id: String,
    pub kind: String,
    pub reason: Option<String>,
    pub detail: Option<String>,
}

/// A finished command as stored (output capped by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct CommandRecord {
    pub sandbox_id: String,
    pub cmd_id: u64,
    /// The command as JSON (argv array or shell string).
    pub cmd: serde_json::Value,
    pub exit: glovebox_proto::agent::ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub started_at: Option<SystemTime>,
    pub ended_at: SystemTime,
}

/// Starts the thread that checkpoints `path`'s write-ahead log every `CHECKPOINT_EVERY`, on a
/// connection of its own, until the returned sender is dropped.
///
/// SQLite's automatic checkpoint runs inside the commit that fills the log past 1,000 pages and
/// syncs the database file there: one create or destroy in a few hundred then took 20–30 ms
/// instead of a fraction of one. A passive checkpoint on another connection never blocks the
/// writer; past `CHECKPOINT_RESTART_FRAMES` one restart checkpoint (which waits for the writer)
/// makes the log start over, so it stays bounded under writes without a pause.
///
/// A log whose every frame is copied starts over at the next write, which first writes a new
/// log header and syncs it (SQLite's guard against reordered writes after a restart): 0.3–5 ms
/// of `fsync` that the first create or destroy after each quiet second paid on its request's
/// path. So after a checkpoint that copied everything, this thread makes the log start over
/// itself with a write that changes nothing (`start_log_over`), and the request's write
/// appends to it. Only when something new was committed since its last pass (`data_version`),
/// so an idle daemon syncs nothing. A one-shot process (which lives a few tens of milliseconds)
/// leaves the restart to the writer, as SQLite does.
///
/// `one_shot`: the first checkpoint on the thread, at once, instead of before returning (see
/// [`Store::open_one_shot`]), and no restarts of the log.
fn start_checkpointer(path: &Path, one_shot: bool) -> std::io::Result<std::sync::mpsc::Sender<()>> {
    let conn = Connection::open(path).map_err(std::io::Error::other)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(std::io::Error::other)?;
    // A first checkpoint now opens the connection's log file: the daemon's set of open files
    // is complete once the store is open (the load test checks it does not change). Else it
    // is the thread's first pass, at once.
    if !one_shot {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())).map_err(std::io::Error::other)?;
    }
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new().name("store-checkpoint".into()).spawn(move || {
        let mut wait = if one_shot { Duration::ZERO } else { CHECKPOINT_EVERY };
        // `PRAGMA data_version` at the last pass: it changes when another connection commits.
        let mut seen = None;
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(wait) {
            wait = CHECKPOINT_EVERY;
            let version = conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0)).ok();
            if version.is_some() && version == seen {
                continue;
            }
            seen = version;
            // (busy, frames in the log, frames copied into the file)
            let ran = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            });
            match ran {
                // The log restarts from its beginning at the first write after a checkpoint
                // that copied all of it; under writes without a pause, every passive one is
                // overtaken and the log (and its index, mapped in every connection) only
                // grows. Past the bound, one checkpoint waits for the writer to let it finish:
                // most frames are copied already, so the wait is short and rare.
                Ok((_, frames, _)) if frames > CHECKPOINT_RESTART_FRAMES => {
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(())) {
                        tracing::warn!("store: checkpoint (restart): {e}");
                    } else if !one_shot {
                        start_log_over(&conn, version);
                    }
                }
                Ok((0, frames, copied)) if !one_shot && frames > 0 && copied == frames => {
                    start_log_over(&conn, version)
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("store: checkpoint: {e}"),
            }
        }
    })?;
    Ok(stop)
}

/// A write that changes nothing (the header's user version, which this store does not use,
/// set to what it is; a row rewritten as it was writes no page): the first write after a
/// complete checkpoint makes the log start over, header and `fsync` included. Skipped when
/// another connection committed since `checked` (the `data_version` the checkpoint started
/// at): the log is not all copied then, and that writer may be writing again.
fn start_log_over(conn: &Connection, checked: Option<i64>) {
    let now = conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0)).ok();
    if now.is_none() || now != checked {
        return;
    }
    let write = || -> rusqlite::Result<()> {
        let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        conn.execute_batch(&format!("PRAGMA user_version = {v}"))
    };
    if let Err(e) = write() {
        tracing::warn!("store: starting the log over: {e}");
    }
}

pub struct Store {
    conn: Mutex<Connection>,
    /// Dropping it ends the checkpointer thread (see `start_checkpointer`).
    _checkpointer: Option<std::sync::mpsc::Sender<()>>,
}

/// How often the checkpointer copies the write-ahead log into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// Log frames (pages) past which the checkpointer makes the log start over (see
/// `start_checkpointer`): 4,000 pages, 16 MiB.
const CHECKPOINT_RESTART_FRAMES: i64 = 4000;

impl Store {
    /// Opens (creating if needed) `<data_dir>/glovebox.db` and brings its schema up to date.
    pub fn open(data_dir: &Path) -> Result<Store> {
        Store::open_with(data_dir, false)
    }

    fn open_with(data_dir: &Path, one_shot: bool) -> Result<Store> {
        let path = data_dir.join("glovebox.db");
        let conn =
            Connection::open(&path).map_err(|source| StoreError::Open { path: path.display().to_string(), source })?;
        let mut store = Store::init(conn, &path.display().to_string())?;
        match start_checkpointer(&path, one_shot) {
            Ok(stop) => {
                // The checkpointer does it now; a commit on a request's path never does.
                store.with(|c| c.pragma_update(None, "wal_autocheckpoint", 0)).map_err(q("wal_autocheckpoint"))?;
                store._checkpointer = Some(stop);
            }
            Err(e) => tracing::warn!("store: no checkpointer thread ({e}); commits checkpoint the log themselves"),
        }
        Ok(store)
    }

    /// [`Store::open`] for a process that writes a few records and ends (an embedded run):
    /// the checkpointer's first pass, which folds the log an earlier process left into the
    /// file (three `fsync`s), runs on its own thread instead of before the store is returned.
    pub fn open_one_shot(data_dir: &Path) -> Result<Store> {
        Store::open_with(data_dir, true)
    }

    /// A private in-memory store (tests).
    pub fn open_in_memory() -> Result<Store> {
        let conn =
            Connection::open_in_memory().map_err(|source| StoreError::Open { path: ":memory:".into(), source })?;
        Store::init(conn, ":memory:")
    }

    fn init(mut conn: Connection, path: &str) -> Result<Store> {
        let open = |source| StoreError::Open { path: path.to_string(), source };
        conn.busy_timeout(Duration::from_secs(5)).map_err(open)?;
        // WAL: readers never block the writer and a crash mid-write loses at most the last
        // transaction; NORMAL sync is durable across a process kill (not a power cut), which
        // is what restart recovery needs, at a fraction of FULL's fsync cost.
        conn.pragma_update(None, "journal_mode", "WAL").map_err(open)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(open)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(open)?;
        // A small page cache (512 KiB): the daemon's memory must not grow with the file; the
        // OS page cache keeps hot pages anyway.
        conn.pragma_update(None, "cache_size", -512).map_err(open)?;
        // Every statement on a request's path is prepared once (`prepare_cached`).
        conn.set_prepared_statement_cache_capacity(64);
        // The log is cut back to this size when it restarts after a full checkpoint.
        conn.pragma_update(None, "journal_size_limit", 8 << 20).map_err(open)?;
        migrate(&mut conn, path)?;
        Ok(Store { conn: Mutex::new(conn), _checkpointer: None })
    }

    /// Runs `f` on the connection (for modules that keep their own tables in this file).
    pub fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        // Poisoning only follows a panic while holding the lock; SQLite itself stays
        // consistent (an open transaction is rolled back when dropped).
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c)
    }

    /// Runs `f`'s statements in one transaction: the writes of one lifecycle step (a
    /// sandbox's record and its `created` event; its usage, end state and `ended` event)
    /// land together or not at all, and commit once — a commit (the log write and its
    /// locks) costs more here than the statements it carries. Nothing is written if `f` fails.
    pub fn transaction<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        self.with(|c| {
            let tx = c.transaction()?;
            let v = f(&tx)?;
            tx.commit()?;
            Ok(v)
        })
    }

    pub fn schema_version(&self) -> Result<usize> {
        self.with(|c| version(c)).map_err(q("schema version"))
    }

    // --- sandboxes ----------------------------------------------------------------------

    /// Inserts or replaces a sandbox's record.
    pub fn put_sandbox(&self, r: &SandboxRecord) -> Result<()> {
        self.with(|c| put_sandbox_on(c, r)).map_err(q("put sandbox"))
    }

    pub fn set_state(&self, id: &str, state: State) -> Result<()> {
        self.with(|c| {
            c.prepare_cached("UPDATE sandboxes SET state = ?2 WHERE id = ?1")?.execute(params![id, state.as_str()])
        })
        .map_err(q("set state"))?;
        Ok(())
    }

    pub fn set_deadline(&self, id: &str, deadline: SystemTime) -> Result<()> {
        self.with(|c| {
            c.prepare_cached("UPDATE sandboxes SET deadline = ?2 WHERE id = ?1")?.execute(params![id, ms(deadline)])
        })
        .map_err(q("set deadline"))?;
        Ok(())
    }

    pub fn set_config(&self, id: &str, config: &SandboxConfig) -> Result<()> {
        let config = serde_json::to_string(config)
            .map_err(|e| StoreError::Corrupt { what: "sandbox config", message: e.to_string() })?;
        self.with(|c| c.prepare_cached("UPDATE sandboxes SET config = ?2 WHERE id = ?1")?.execute(params![id, config]))
            .map_err(q("set config"))?;
        Ok(())
    }

    /// Marks a sandbox ended for `reason` (see [`end_sandbox_on`]).
    pub fn end_sandbox(&self, id: &str, reason: EndReason, at: SystemTime) -> Result<()> {
        self.with(|c| end_sandbox_on(c, id, reason, at)).map_err(q("end sandbox"))
    }

    pub fn sandbox(&self, id: &str) -> Result<Option<SandboxRecord>> {
        let row = self
            .with(|c| {
                c.query_row(&format!("SELECT {SB_COLS} FROM sandboxes WHERE id = ?1"), [id], raw_sandbox).optional()
            })
            .map_err(q("get sandbox"))?;
        row.map(RawSandbox::decode).transpose()
    }

    /// Why sandbox `id` ended, if it did and is remembered.
    pub fn end_reason(&self, id: &str) -> Result<Option<EndReason>> {
        let r: Option<Option<String>> = self
            .with(|c| c.query_row("SELECT end_reason FROM sandboxes WHERE id = ?1", [id], |r| r.get(0)).optional())
            .map_err(q("end reason"))?;
        Ok(r.flatten().and_then(|s| EndReason::parse(&s)))
    }

    /// Sandboxes not ended (starting or running), oldest first.
    pub fn live_sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        let rows = self
            .with(|c| {
                let mut st = c.prepare(&format!(
                    "SELECT {SB_COLS} FROM sandboxes WHERE end_reason IS NULL ORDER BY created_at, id"
                ))?;
                let v = st.query_map([], raw_sandbox)?.collect::<rusqlite::Result<Vec<_>>>();
                v
            })
            .map_err(q("live sandboxes"))?;
        rows.into_iter().map(RawSandbox::decode).collect()
    }

    // --- events -------------------------------------------------------------------------

    /// Appends an event; returns it with its sequence number.
    pub fn add_event(
        &self,
        sandbox_id: &str,
        kind: &str,
        reason: Option<&str>,
        detail: Option<&str>,
    ) -> Result<EventRecord> {
        self.with(|c| add_event_on(c, sandbox_id, kind, reason, detail)).map_err(q("add event"))
    }

    /// Events after sequence number `after`, oldest first, at most `limit`; of one sandbox
    /// or of all.
    pub fn events(&self, sandbox_id: Option<&str>, after: i64, limit: usize) -> Result<Vec<EventRecord>> {
        self.with(|c| {
            let map = |r: &rusqlite::Row<'_>| {
                Ok(EventRecord {
                    seq: r.get(0)?,
                    time: from_ms(r.get(1)?),
                    sandbox_id: r.get(2)?,
                    kind: r.get(3)?,
                    reason: r.get(4)?,
                    detail: r.get(5)?,
                })
            };
            let cols = "seq, time, sandbox_id, kind, reason, detail";
            let v = match sandbox_id {
                Some(id) => c
                    .prepare(&format!(
                        "SELECT {cols} FROM events WHERE sandbox_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
                    ))?
                    .query_map(params![id, after, limit as i64], map)?
                    .collect::<rusqlite::Result<Vec<_>>>(),
                None => c
                    .prepare(&format!("SELECT {cols} FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2"))?
                    .query_map(params![after, limit as i64], map)?
                    .collect::<rusqlite::Result<Vec<_>>>(),
            };
            v
        })
        .map_err(q("events"))
    }

    // --- commands -----------------------------------------------------------------------

    /// Records a finished command (the first record of a command id wins: the agent's
    /// completion and a teardown fetch may both try).
    pub fn put_command(&self, r: &CommandRecord) -> Result<()> {
        self.put_commands(std::slice::from_ref(r))
    }

    /// Records finished commands in one transaction (see [`Store::put_command`]).
    pub fn put_commands(&self, rs: &[CommandRecord]) -> Result<()> {
        let exits = rs
            .iter()
            .map(|r| serde_json::to_string(&r.exit))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| StoreError::Corrupt { what: "command exit", message: e.to_string() })?;
        self.with(|c| {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached(
                    "INSERT OR IGNORE INTO commands
                     (sandbox_id, cmd_id, cmd, exit, stdout, stderr, started_at, ended_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?;
                for (r, exit) in rs.iter().zip(&exits) {
                    st.execute(params![
                        r.sandbox_id,
                        r.cmd_id as i64,
                        r.cmd.to_string(),
                        exit,
                        r.stdout,
                        r.stderr,
                        r.started_at.map(ms),
                        ms(r.ended_at),
                    ])?;
                }
            }
            tx.commit()
        })
        .map_err(q("put command"))?;
        Ok(())
    }

    pub fn command(&self, sandbox_id: &str, cmd_id: u64) -> Result<Option<CommandRecord>> {
        type Raw = (String, String, Vec<u8>, Vec<u8>, Option<i64>, i64);
        let raw: Option<Raw> = self
            .with(|c| {
                c.query_row(
                    "SELECT cmd, exit, stdout, stderr, started_at, ended_at FROM commands
                     WHERE sandbox_id = ?1 AND cmd_id = ?2",
                    params![sandbox_id, cmd_id as i64],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
                )
                .optional()
            })
            .map_err(q("get command"))?;
        let Some((cmd, exit, stdout, stderr, started_at, ended_at)) = raw else { return Ok(None) };
        let bad = |e: serde_json::Error| StoreError::Corrupt { what: "command", message: e.to_string() };
        Ok(Some(CommandRecord {
            sandbox_id: sandbox_id.to_string(),
            cmd_id,
            cmd: serde_json::from_str(&cmd).map_err(bad)?,
            exit: serde_json::from_str(&exit).map_err(bad)?,
            stdout,
            stderr,
            started_at: started_at.map(from_ms),
            ended_at: from_ms(ended_at),
        }))
    }

    /// Ids of the commands recorded for a sandbox, ascending.
    pub fn command_ids(&self, sandbox_id: &str) -> Result<Vec<u64>> {
        self.with(|c| {
            let mut st = c.prepare("SELECT cmd_id FROM commands WHERE sandbox_id = ?1 ORDER BY cmd_id")?;
            let v = st.query_map([sandbox_id], |r| r.get::<_, i64>(0).map(|v| v as u64))?.collect();
            v
        })
        .map_err(q("command ids"))
    }

    /// Drops command records that ended before `before`, events older than `before`, and
    /// ended sandboxes' records older than `before`. Returns how many rows went.
    pub fn prune(&self, before: SystemTime) -> Result<usize> {
        let t = ms(before);
        self.with(|c| {
            let tx = c.transaction()?;
            let mut n = tx.execute("DELETE FROM commands WHERE ended_at < ?1", [t])?;
            n += tx.execute("DELETE FROM events WHERE time < ?1", [t])?;
            n += tx.execute("DELETE FROM sandboxes WHERE ended_at IS NOT NULL AND ended_at < ?1", [t])?;
            tx.commit()?;
            Ok(n)
        })
        .map_err(q("prune"))
    }
}

const SB_COLS: &str = "id, template, config, created_at, deadline, slot, pid, pid_start, state, end_reason, ended_at";

struct RawSandbox {
    id: String,
    template: String,
    config: String,
    created_at: i64,
    deadline: i64,
    slot: i64,
    pid: i64,
    pid_start: i64,
    state: String,
    end_reason: Option<String>,
    ended_at: Option<i64>,
}

fn raw_sandbox(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawSandbox> {
    Ok(RawSandbox {
        id: r.get(0)?,
        template: r.get(1)?,
        config: r.get(2)?,
        created_at: r.get(3)?,
        deadline: r.get(4)?,
        slot: r.get(5)?,
        pid: r.get(6)?,
        pid_start: r.get(7)?,
        state: r.get(8)?,
        end_reason: r.get(9)?,
        ended_at: r.get(10)?,
    })
}

impl RawSandbox {
    fn decode(self) -> Result<SandboxRecord> {
        let bad = |m: String| StoreError::Corrupt { what: "sandbox", message: m };
        Ok(SandboxRecord {
            config: serde_json::from_str(&self.config).map_err(|e| bad(format!("{}: config: {e}", self.id)))?,
            state: State::parse(&self.state).ok_or_else(|| bad(format!("{}: state {:?}", self.id, self.state)))?,
            end_reason: self.end_reason.as_deref().and_then(EndReason::parse),
            id: self.id,
            template: self.template,
            created_at: from_ms(self.created_at),
            deadline: from_ms(self.deadline),
            slot: self.slot as u32,
            pid: self.pid as i32,
            pid_start: self.pid_start as u64,
            ended_at: self.ended_at.map(from_ms),
        })
    }
}

fn version(c: &Connection) -> rusqlite::Result<usize> {
    c.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |r| r.get::<_, i64>(0)).map(|v| v as usize)
}

/// Inserts or replaces a sandbox's record (see [`Store::put_sandbox`], [`Store::transaction`]).
pub fn put_sandbox_on(c: &Connection, r: &SandboxRecord) -> rusqlite::Result<()> {
    let config = serde_json::to_string(&r.config).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    c.prepare_cached(
        "INSERT OR REPLACE INTO sandboxes
         (id, template, config, created_at, deadline, slot, pid, pid_start, state, end_reason, ended_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        r.id,
        r.template,
        config,
        ms(r.created_at),
        ms(r.deadline),
        r.slot,
        r.pid,
        r.pid_start as i64,
        r.state.as_str(),
        r.end_reason.map(EndReason::as_str),
        r.ended_at.map(ms),
    ])?;
    Ok(())
}

/// Marks a sandbox ended for `reason` (creating a bare record if it had none, so an orphan
/// found at start is remembered too). The first end wins.
pub fn end_sandbox_on(c: &Connection, id: &str, reason: EndReason, at: SystemTime) -> rusqlite::Result<()> {
    let state = State::ended(reason).as_str();
    let n = c
        .prepare_cached(
            "UPDATE sandboxes SET state = ?2, end_reason = ?3, ended_at = ?4
             WHERE id = ?1 AND end_reason IS NULL",
        )?
        .execute(params![id, state, reason.as_str(), ms(at)])?;
    if n == 0 {
        c.prepare_cached(
            "INSERT OR IGNORE INTO sandboxes
             (id, template, config, created_at, deadline, slot, pid, pid_start, state, end_reason, ended_at)
             VALUES (?1, '', '{}', ?4, ?4, 0, 0, 0, ?2, ?3, ?4)",
        )?
        .execute(params![id, state, reason.as_str(), ms(at)])?;
    }
    Ok(())
}

/// Appends an event; returns it with its sequence number.
pub fn add_event_on(
    c: &Connection,
    sandbox_id: &str,
    kind: &str,
    reason: Option<&str>,
    detail: Option<&str>,
) -> rusqlite::Result<EventRecord> {
    let time = SystemTime::now();
    c.prepare_cached("INSERT INTO events (time, sandbox_id, kind, reason, detail) VALUES (?1, ?2, ?3, ?4, ?5)")?
        .execute(params![ms(time), sandbox_id, kind, reason, detail])?;
    Ok(EventRecord {
        seq: c.last_insert_rowid(),
        time: from_ms(ms(time)),
        sandbox_id: sandbox_id.to_string(),
        kind: kind.to_string(),
        reason: reason.map(str::to_string),
        detail: detail.map(str::to_string),
    })
}

/// Applies the migrations the file has not seen yet, each in its own transaction.
fn migrate(conn: &mut Connection, path: &str) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )
    .map_err(|source| StoreError::Migrate { version: 0, source })?;
    loop {
        // Re-read inside the write transaction: another process may be migrating too.
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|source| StoreError::Migrate { version: 0, source })?;
        let have = version(&tx).map_err(|source| StoreError::Migrate { version: 0, source })?;
        if have > MIGRATIONS.len() {
            return Err(StoreError::TooNew(path.to_string(), have, MIGRATIONS.len()));
        }
        if have == MIGRATIONS.len() {
            return Ok(());
        }
        let v = have + 1;
        let err = |source| StoreError::Migrate { version: v, source };
        tx.execute_batch(MIGRATIONS[have]).map_err(err)?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            params![v as i64, ms(SystemTime::now())],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        tracing::info!(version = v, "store: schema migrated");
    }
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, clock ticks after boot),
/// or `None` if it does not exist.
pub fn proc_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything, spaces and
    // parentheses included: fields after it start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state); field 22 is the 20th from there.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            template: "base".into(),
            config: SandboxConfig {
                limits: Limits::default(),
                metadata: [("k".to_string(), "v".to_string())].into(),
                env: [("A".to_string(), "1".to_string())].into(),
                network: NetworkPolicy::default(),
                idle_timeout_s: Some(30),
                preload: None,
                tenant: Some("acme".into()),
                cpu_base_usec: Some(1234),
                ..SandboxConfig::default()
            },
            created_at: from_ms(1_000),
            deadline: from_ms(301_000),
            slot: 7,
            pid: 1234,
            pid_start: 98765,
            state: State::Running,
            end_reason: None,
            ended_at: None,
        }
    }

    #[test]
    fn commits_never_checkpoint_and_the_checkpointer_thread_does() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path()).unwrap();
        let auto: i64 = s.with(|c| c.query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))).unwrap();
        assert_eq!(auto, 0, "a commit on a request's path must not checkpoint");
        let db = t.path().join("glovebox.db");
        let before = std::fs::metadata(&db).unwrap().len();
        let detail = "x".repeat(4000);
        for i in 0..400 {
            s.add_event(&format!("sb{i}"), "created", None, Some(&detail)).unwrap();
        }
        // 1.6 MB of events, in the log until the checkpointer copies them into the file.
        let deadline = std::time::Instant::now() + 4 * CHECKPOINT_EVERY;
        let grown = loop {
            let len = std::fs::metadata(&db).unwrap().len();
            if len > before + 1_000_000 || std::time::Instant::now() > deadline {
                break len;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(grown > before + 1_000_000, "database file {before} -> {grown} bytes: never checkpointed");
        assert_eq!(s.events(None, 0, 1000).unwrap().len(), 400);
    }

    /// The write-ahead log header's salts: new ones at every start over of the log.
    fn log_restarts(wal: &Path) -> Vec<u8> {
        std::fs::read(wal).unwrap_or_default().get(16..24).map(<[u8]>::to_vec).unwrap_or_default()
    }

    /// Waits (bounded) for the log to start over after `from`.
    fn restarted_after(wal: &Path, from: &[u8]) -> bool {
        let deadline = std::time::Instant::now() + 4 * CHECKPOINT_EVERY;
        while std::time::Instant::now() < deadline {
            if log_restarts(wal) != from {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn the_checkpointer_starts_the_log_over_so_a_request_write_never_syncs_it() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path()).unwrap();
        let wal = t.path().join("glovebox.db-wal");
        s.add_event("a", "created", None, None).unwrap();
        let after_write = log_restarts(&wal);
        // Checkpointed, then started over by the checkpointer: no write of ours meanwhile.
        assert!(restarted_after(&wal, &after_write), "the checkpointer never started the log over");
        // A write now appends to that log: it neither restarts it nor syncs its header.
        let before = log_restarts(&wal);
        s.add_event("a", "destroyed", None, None).unwrap();
        assert_eq!(log_restarts(&wal), before, "the request's write started the log over itself");
        assert_eq!(s.events(None, 0, 10).unwrap().len(), 2);
        // That write is checkpointed and the log started over once more; then, with nothing
        // new committed, the checkpointer leaves it alone (an idle daemon syncs nothing).
        assert!(restarted_after(&wal, &before), "the second write was never checkpointed");
        let idle = log_restarts(&wal);
        std::thread::sleep(CHECKPOINT_EVERY * 5 / 2);
        assert_eq!(log_restarts(&wal), idle, "the log started over with nothing written");
    }

    #[test]
    fn a_one_shot_store_leaves_the_restart_to_the_writer() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open_one_shot(t.path()).unwrap();
        let wal = t.path().join("glovebox.db-wal");
        s.add_event("a", "created", None, None).unwrap();
        let after_write = log_restarts(&wal);
        std::thread::sleep(CHECKPOINT_EVERY * 5 / 2);
        assert_eq!(log_restarts(&wal), after_write, "a one-shot store's checkpointer wrote to the log");
        s.add_event("a", "destroyed", None, None).unwrap();
        assert_ne!(log_restarts(&wal), after_write, "the checkpointed log was not started over by the writer");
    }

    #[test]
    fn under_writes_without_a_pause_the_log_still_starts_over() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path()).unwrap();
        let wal = t.path().join("glovebox.db-wal");
        let detail = "x".repeat(2000);
        let (mut max, mut restarted) = (0u64, false);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut i = 0u64;
        // Every passive checkpoint is overtaken by these writes; only the restart past
        // CHECKPOINT_RESTART_FRAMES lets the log start over (cut back to journal_size_limit).
        while !restarted && std::time::Instant::now() < deadline {
            s.add_event(&format!("sb{i}"), "created", None, Some(&detail)).unwrap();
            i += 1;
            // Paced (up to a thousand commits a second, as a busy daemon's): the log stays
            // within tens of MiB.
            std::thread::sleep(Duration::from_millis(1));
            if i.is_multiple_of(20) {
                let len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
                max = max.max(len);
                restarted = len + (4 << 20) < max;
            }
        }
        assert!(restarted, "the log grew to {max} bytes over {i} writes and never started over");
    }

    #[test]
    fn migrations_run_once_and_survive_reopening() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path()).unwrap();
        assert_eq!(s.schema_version().unwrap(), MIGRATIONS.len());
        s.put_sandbox(&record("a")).unwrap();
        drop(s);
        let s = Store::open(t.path()).unwrap();
        assert_eq!(s.schema_version().unwrap(), MIGRATIONS.len());
        assert_eq!(s.sandbox("a").unwrap().unwrap(), record("a"));
        let mode: String = s.with(|c| c.query_row("PRAGMA journal_mode", [], |r| r.get(0))).unwrap();
        assert_eq!(mode.to_lowercase(), "wal");
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path()).unwrap();
        s.with(|c| {
            c.prepare_cached("INSERT INTO schema_version VALUES (?1, 0)")?.execute([MIGRATIONS.len() as i64 + 1])
        })
        .unwrap();
        drop(s);
        assert!(matches!(Store::open(t.path()), Err(StoreError::TooNew(..))));
    }

    #[test]
    fn a_transaction_lands_whole_or_not_at_all() {
        let s = Store::open_in_memory().unwrap();
        let e = s
            .transaction(|c| {
                put_sandbox_on(c, &record("a"))?;
                add_event_on(c, "a", "created", None, None)
            })
            .unwrap();
        assert_eq!(s.sandbox("a").unwrap().unwrap(), record("a"));
        assert_eq!(s.events(Some("a"), 0, 10).unwrap().iter().map(|r| r.seq).collect::<Vec<_>>(), [e.seq]);
        // A step failing after others wrote rolls every one of them back.
        let r = s.transaction(|c| {
            end_sandbox_on(c, "a", EndReason::Idle, from_ms(2_000))?;
            add_event_on(c, "a", "ended", Some("idle"), None)?;
            c.execute("INSERT INTO no_such_table VALUES (1)", []).map(drop)
        });
        assert!(r.is_err());
        assert_eq!(s.end_reason("a").unwrap(), None);
        assert_eq!(s.events(Some("a"), 0, 10).unwrap().len(), 1);
        // The connection is usable after the rollback.
        s.end_sandbox("a", EndReason::Idle, from_ms(2_000)).unwrap();
        assert_eq!(s.end_reason("a").unwrap(), Some(EndReason::Idle));
    }

    #[test]
    fn sandboxes_end_once_and_orphans_are_remembered() {
        let s = Store::open_in_memory().unwrap();
        s.put_sandbox(&record("a")).unwrap();
        s.put_sandbox(&record("b")).unwrap();
        assert_eq!(s.live_sandboxes().unwrap().len(), 2);
        s.set_deadline("a", from_ms(500_000)).unwrap();
        assert_eq!(s.sandbox("a").unwrap().unwrap().deadline, from_ms(500_000));
        s.end_sandbox("a", EndReason::Idle, from_ms(2_000)).unwrap();
        // A second end (e.g. the death watch racing a delete) does not overwrite the first.
        s.end_sandbox("a", EndReason::Error, from_ms(3_000)).unwrap();
        let a = s.sandbox("a").unwrap().unwrap();
        assert_eq!((a.state, a.end_reason, a.ended_at), (State::Stopped, Some(EndReason::Idle), Some(from_ms(2_000))));
        assert_eq!(s.end_reason("a").unwrap(), Some(EndReason::Idle));
        assert_eq!(s.end_reason("b").unwrap(), None);
        assert_eq!(s.live_sandboxes().unwrap().iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b"]);
        // A sandbox the store never saw (found orphaned at start) is remembered as ended.
        s.end_sandbox("zz", EndReason::DaemonRestart, from_ms(4_000)).unwrap();
        assert_eq!(s.end_reason("zz").unwrap(), Some(EndReason::DaemonRestart));
        assert_eq!(s.sandbox("zz").unwrap().unwrap().state, State::Killed);
        assert_eq!(s.end_reason("nope").unwrap(), None);
    }

    #[test]
    fn events_page_by_sequence() {
        let s = Store::open_in_memory().unwrap();
        for i in 0..5 {
            s.add_event(if i % 2 == 0 { "a" } else { "b" }, "created", None, None).unwrap();
        }
        s.add_event("a", "killed", Some("timeout"), Some("lifetime over")).unwrap();
        let all = s.events(None, 0, 100).unwrap();
        assert_eq!(all.len(), 6);
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
        let a = s.events(Some("a"), 0, 100).unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(a[3].reason.as_deref(), Some("timeout"));
        let page = s.events(None, all[1].seq, 2).unwrap();
        assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [all[2].seq, all[3].seq]);
    }

    #[test]
    fn commands_are_kept_once_and_pruned_after_retention() {
        let s = Store::open_in_memory().unwrap();
        let rec = CommandRecord {
            sandbox_id: "a".into(),
            cmd_id: 3,
            cmd: serde_json::json!(["echo", "hi"]),
            exit: glovebox_proto::agent::ExitStatus { id: 3, exit_code: 0, stdout_bytes: 3, ..Default::default() },
            stdout: b"hi\n".to_vec(),
            stderr: vec![0, 255],
            started_at: Some(from_ms(10_000)),
            ended_at: from_ms(11_000),
        };
        s.put_command(&rec).unwrap();
        s.put_command(&CommandRecord { stdout: b"other".to_vec(), ..rec.clone() }).unwrap();
        assert_eq!(s.command("a", 3).unwrap().unwrap(), rec);
        assert_eq!(s.command_ids("a").unwrap(), [3]);
        assert!(s.command("a", 4).unwrap().is_none());
        s.add_event("a", "created", None, None).unwrap();
        let mut old = record("old");
        old.end_reason = Some(EndReason::Killed);
        old.ended_at = Some(from_ms(5_000));
        old.state = State::Stopped;
        s.put_sandbox(&old).unwrap();
        s.put_sandbox(&record("live")).unwrap();
        assert_eq!(s.prune(from_ms(11_000)).unwrap(), 1); // only the old sandbox record
        assert!(s.command("a", 3).unwrap().is_some());
        s.prune(SystemTime::now() + Duration::from_secs(1)).unwrap();
        assert!(s.command("a", 3).unwrap().is_none());
        assert!(s.events(None, 0, 10).unwrap().is_empty());
        // Live sandboxes are never pruned.
        assert!(s.sandbox("live").unwrap().is_some());
    }

    #[test]
    fn start_time_names_a_process() {
        let me = std::process::id() as i32;
        let t = proc_start_time(me).expect("own start time");
        assert_eq!(proc_start_time(me), Some(t));
        assert!(proc_start_time(i32::MAX).is_none());
    }
}
