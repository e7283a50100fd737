//! An in-memory backend for unit tests: no namespaces, no cgroups, no root. Each sandbox is
//! a task serving a small scripted agent on a unix socket in a temporary directory, so the
//! manager's real agent calls run against it: `echo` prints its arguments, `sleep` runs
//! into the command's time budget (reported as the agent reports a timeout), anything
//! else exits 0. A frozen sandbox's agent answers nothing (its connections are dropped).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream as StdStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use glovebox_jail::cgroup::Stats;
use glovebox_proto::agent::{Command, Event, ExecSpec, ExitStatus, Reply, Request};
use glovebox_proto::api::Limits;
use glovebox_proto::frame::Kind;
use glovebox_proto::io::{split, Reader, Writer};

use super::{Backend, Instance, Orphan, Recorded, Spec};
use crate::error::{Error, Result};
use crate::util::lock;

/// The fake tier; sandboxes live under `dir`.
pub(crate) struct Fake {
    dir: PathBuf,
    next: AtomicU32,
    /// Every sandbox booted, for tests to reach into (e.g. to kill an agent).
    pub booted: Mutex<Vec<Arc<Agent>>>,
    /// The limits of every boot, in order (a disk-backed one is `!jail::in_memory`).
    pub boot_limits: Mutex<Vec<Limits>>,
}

impl Fake {
    pub(crate) fn new(dir: &Path) -> Fake {
        Fake {
            dir: dir.to_path_buf(),
            next: AtomicU32::new(1),
            booted: Mutex::default(),
            boot_limits: Mutex::default(),
        }
    }

    /// The booted sandbox `id`'s agent.
    pub(crate) fn agent(&self, id: &str) -> Option<Arc<Agent>> {
        lock(&self.booted).iter().find(|a| a.id == id).cloned()
    }
}

/// A fake sandbox's agent: alive until killed.
pub(crate) struct Agent {
    id: String,
    alive: AtomicBool,
    /// Set while the sandbox is frozen: the agent answers nothing.
    frozen: Arc<AtomicBool>,
    /// Our end of a socket pair whose other end turns readable when this end is dropped:
    /// the exit signal the manager's death watch waits on.
    life: Mutex<Option<StdStream>>,
    watch: StdStream,
    server: tokio::task::JoinHandle<()>,
    /// Run at each reading of its usage (tests: what a caller sees at that moment).
    on_stats: OnStats,
}

type OnStats = Mutex<Option<Box<dyn Fn() + Send + Sync>>>;

impl Agent {
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }

    /// Runs `f` at each reading of its usage from now on (a destroy's final one included).
    pub(crate) fn on_stats(&self, f: impl Fn() + Send + Sync + 'static) {
        *lock(&self.on_stats) = Some(Box::new(f));
    }

    /// Ends the agent as a crash would: its socket stops answering, its exit is seen.
    pub(crate) fn die(&self) {
        self.doom();
        lock(&self.life).take();
    }

    /// Ends the agent as killing a gVisor sentry does: its socket stops answering and it is
    /// no longer alive at once, but its exit is seen only later ([`Agent::die`]).
    pub(crate) fn doom(&self) {
        self.alive.store(false, Ordering::Release);
        self.server.abort();
    }
}

struct FakeInstance {
    agent: Arc<Agent>,
    slot: u32,
    dir: PathBuf,
    socket: PathBuf,
}

impl Backend for Fake {
    fn boot(&self, spec: &Spec) -> Result<Box<dyn Instance>> {
        lock(&self.boot_limits).push(spec.limits.clone());
        let n = self.next.fetch_add(1, Ordering::AcqRel);
        let id = format!("fake{n:04}");
        let dir = self.dir.join(&id);
        std::fs::create_dir_all(&dir).map_err(|e| Error::Internal(format!("fake dir: {e}")))?;
        let socket = dir.join("agent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| Error::Start(format!("fake agent socket: {e}")))?;
        let rt = tokio::runtime::Handle::try_current().map_err(|e| Error::Start(format!("fake agent: {e}")))?;
        let listener = {
            let _g = rt.enter();
            tokio::net::UnixListener::from_std(listener).map_err(|e| Error::Start(format!("fake agent: {e}")))?
        };
        let (life, watch) = StdStream::pair().map_err(|e| Error::Start(format!("fake agent: {e}")))?;
        let frozen = Arc::new(AtomicBool::new(false));
        let server = rt.spawn(serve(listener, frozen.clone()));
        let agent = Arc::new(Agent {
            id,
            alive: AtomicBool::new(true),
            frozen,
            life: Mutex::new(Some(life)),
            watch,
            server,
            on_stats: Mutex::new(None),
        });
        lock(&self.booted).push(agent.clone());
        Ok(Box::new(FakeInstance { agent, slot: n, dir, socket }))
    }

    fn reopen(&self, rec: &Recorded<'_>) -> std::result::Result<Box<dyn Instance>, String> {
        Err(format!("the fake backend adopts nothing ({})", rec.id))
    }

    fn orphans(&self) -> Vec<Orphan> {
        Vec::new()
    }

    fn clean(&self, _: &Orphan) {}

    fn sweep(&self) {}

    fn reap_stale_bases(&self) {}

    fn start(&self) {}

    fn close(&self) {}

    fn release_own_state(&self) {}
}

impl Instance for FakeInstance {
    fn id(&self) -> &str {
        &self.agent.id
    }

    fn pid(&self) -> i32 {
        // No process: a pid no process has on Linux.
        0
    }

    fn slot(&self) -> u32 {
        self.slot
    }

    fn linked_ahead(&self) -> bool {
        false
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn agent_socket(&self) -> &Path {
        &self.socket
    }

    fn alive(&self) -> bool {
        self.agent.is_alive()
    }

    fn exit_fd(&self) -> Option<OwnedFd> {
        self.agent.watch.try_clone().ok().map(OwnedFd::from)
    }

    fn stats(&self) -> Option<Stats> {
        if let Some(f) = &*lock(&self.agent.on_stats) {
            f();
        }
        Some(Stats {
            memory_current_bytes: 1 << 20,
            memory_peak_bytes: None,
            cpu_usage_usec: 1000,
            pids_current: 1,
            oom_kills: 0,
        })
    }

    fn cpu_usage_usec(&self) -> Option<u64> {
        Some(1000)
    }

    fn oom_kills(&self) -> u64 {
        0
    }

    fn set_limits(&self, _: &Limits) -> Result<()> {
        Ok(())
    }

    fn set_background(&self, _: bool) -> Result<()> {
        Ok(())
    }

    fn freeze(&self) -> Result<()> {
        self.agent.frozen.store(true, Ordering::Release);
        Ok(())
    }

    fn writable_layer(&self) -> Option<super::WritableLayer> {
        None
    }

    fn thaw(&self) -> Result<()> {
        self.agent.frozen.store(false, Ordering::Release);
        Ok(())
    }

    fn kill(&self) -> bool {
        self.agent.die();
        true
    }

    fn release(&self, _gone: bool) -> std::result::Result<(), String> {
        std::fs::remove_dir_all(&self.dir).map_err(|e| format!("fake dir: {e}"))
    }
}

/// Serves the scripted agent until aborted; drops every connection while `frozen`.
async fn serve(listener: tokio::net::UnixListener, frozen: Arc<AtomicBool>) {
    let mut next_cmd = 0u64;
    while let Ok((s, _)) = listener.accept().await {
        if frozen.load(Ordering::Acquire) {
            continue;
        }
        next_cmd += 1;
        let (r, w) = split(s);
        tokio::spawn(answer(r, w, next_cmd));
    }
}

/// Answers one connection's request.
async fn answer(mut r: Reader, mut w: Writer, cmd_id: u64) -> std::result::Result<(), glovebox_proto::io::ConnError> {
    match r.json::<Request>().await? {
        Request::Ping => w.json(&Reply::Pong { version: glovebox_proto::agent::VERSION }).await,
        Request::List => w.json(&Reply::Commands { commands: Vec::new() }).await,
        Request::Exec(spec) => exec(&mut w, cmd_id, &spec).await,
        _ => w.json(&Reply::Ok).await,
    }
}

async fn exec(w: &mut Writer, id: u64, spec: &ExecSpec) -> std::result::Result<(), glovebox_proto::io::ConnError> {
    w.json(&Event::Started { id, pid: 2 }).await?;
    let argv = match &spec.cmd {
        Command::Argv(v) => v.clone(),
        Command::Shell(s) => s.split_whitespace().map(str::to_string).collect(),
    };
    let mut exit = ExitStatus { id, ..ExitStatus::default() };
    match argv.first().map(String::as_str) {
        Some("echo") => {
            let out = format!("{}\n", argv[1..].join(" "));
            w.data(Kind::Stdout, out.as_bytes()).await?;
            exit.stdout_bytes = out.len() as u64;
        }
        Some("sleep") => {
            let Some(ms) = spec.timeout_ms else { return std::future::pending().await };
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            exit = ExitStatus { exit_code: 137, signal: Some(9), timed_out: true, duration_ms: ms, ..exit };
        }
        _ => {}
    }
    w.json(&Event::Exited(exit)).await
}
