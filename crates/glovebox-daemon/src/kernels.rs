//! Long-lived language kernels (contexts) inside a sandbox, and the kernel files every
//! sandbox carries. The cells' operations on a sandbox (`code`) sit above this room; a
//! kernel reaches its sandbox only through a [`Host`].
//!
//! A kernel is a `raw` (session-mode) command run by the agent: the daemon holds one
//! full-duplex session to it, writes one JSON request line per cell to its stdin and reads
//! JSON event lines from its stdout (protocol in `kernels/python_kernel.py`). Kernel output
//! is untrusted: lines are bounded, unknown events are skipped. The first cell of a kernel
//! also carries `env`, the sandbox's environment, which every kernel keeps for good; a
//! cell's own variables travel as `scoped_env` and hold for that cell only.
//!
//! Invariants: cells of one context run one at a time (the session lock); a cell that
//! outlives its timeout is interrupted with SIGINT and, if it does not end within a grace
//! period, the kernel is killed and the context restarted empty — the caller is told so
//! (`context_restarted`); the sandbox is never wedged by a cell.

use std::sync::Arc;
use std::time::Duration;

use glovebox_proto::agent::ExecSpec;
use glovebox_proto::api::{CodeError, CodeResult, CodeStreamLine, Context, Language};

use crate::agent::{AgentClient, Output, Session};
use crate::error::{Error, Result};

/// What a kernel needs of its sandbox to start: the agent socket (a warm sandbox in the pool
/// has no `Sb` yet), and a python kernel forked into it from its template's zygote, if its
/// backend made one (`Config::code_zygote`).
pub struct Target<'a> {
    pub id: &'a str,
    pub socket: &'a std::path::Path,
    pub forked: Option<&'a std::sync::Mutex<Option<Forked>>>,
}

/// A python kernel forked into a sandbox from its template's zygote (see
/// `glovebox_jail::kzygote`): already inside the sandbox and as confined as a command, ready
/// to serve cells on the pipes the daemon holds the other ends of. Not the agent's command:
/// the daemon signals it through its pidfd (host root), and the agent, PID 1, reaps it.
pub struct Forked {
    pub pidfd: std::os::fd::OwnedFd,
    pub stdin: std::os::fd::OwnedFd,
    pub stdout: std::os::fd::OwnedFd,
    pub stderr: std::os::fd::OwnedFd,
    /// Its cgroup of its own, below the sandbox's (every process it starts is in it).
    pub cgroup: Option<KernelCgroup>,
}

/// A forked kernel's cgroup on the host, and how to kill everything in it.
pub struct KernelCgroup {
    pub dir: std::path::PathBuf,
    pub kill: glovebox_jail::cgroup::KillMethod,
}

impl KernelCgroup {
    /// Kills every process in it, then removes it (blocking; errors logged: what is left
    /// goes with the sandbox's cgroups).
    pub fn kill_and_remove(&self) {
        if let Err(e) = glovebox_jail::cgroup::kill_tree(&self.dir, self.kill) {
            tracing::warn!(cgroup = %self.dir.display(), "kill the forked kernel's cgroup: {e}");
        }
        if let Err(e) = glovebox_jail::cgroup::remove_tree(&self.dir) {
            tracing::warn!(cgroup = %self.dir.display(), "remove the forked kernel's cgroup: {e}");
        }
    }
}

/// The daemon's side of a running kernel.
enum Io {
    /// A raw command of the agent's (its id, its session).
    Agent(u64, Session),
    Forked {
        pidfd: std::os::fd::OwnedFd,
        stdin: tokio::net::unix::pipe::Sender,
        stdout: tokio::net::unix::pipe::Receiver,
        cgroup: Option<KernelCgroup>,
    },
}

impl Io {
    async fn write(&mut self, data: &[u8]) -> std::result::Result<(), String> {
        match self {
            Io::Agent(_, s) => s.write(data).await.map_err(|e| e.to_string()),
            Io::Forked { stdin, .. } => {
                use tokio::io::AsyncWriteExt;
                stdin.write_all(data).await.map_err(|e| format!("write to the kernel: {e}"))
            }
        }
    }

    async fn read(&mut self) -> std::result::Result<Option<Output>, String> {
        match self {
            Io::Agent(_, s) => s.read().await.map_err(|e| e.to_string()),
            Io::Forked { stdout, .. } => {
                use tokio::io::AsyncReadExt;
                let mut b = vec![0u8; 64 << 10];
                match stdout.read(&mut b).await {
                    Ok(0) => Ok(None),
                    Ok(n) => {
                        b.truncate(n);
                        Ok(Some(Output::Stdout(b)))
                    }
                    Err(e) => Err(format!("read from the kernel: {e}")),
                }
            }
        }
    }

    /// Signals the kernel (the agent's command through the agent; a forked one directly).
    async fn signal(&self, t: &Target<'_>, sig: i32) {
        match self {
            Io::Agent(id, _) => {
                let _ = t.agent().signal(*id, sig).await;
            }
            Io::Forked { pidfd, .. } => {
                let sig = rustix::process::Signal::from_named_raw(sig);
                if let Some(sig) = sig {
                    let _ = rustix::process::pidfd_send_signal(pidfd, sig);
                }
            }
        }
    }
}

impl Forked {
    fn into_io(self) -> std::io::Result<Io> {
        let stdin = tokio::net::unix::pipe::Sender::from_owned_fd(self.stdin)?;
        let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(self.stdout)?;
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(self.stderr)?;
        // Its stderr (a crash report, if any) is not protocol: drained so it never blocks,
        // logged for the operator.
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut stderr = stderr;
            let mut b = vec![0u8; 16 << 10];
            while let Ok(n) = stderr.read(&mut b).await {
                if n == 0 {
                    break;
                }
                tracing::debug!("forked python kernel: {}", String::from_utf8_lossy(&b[..n]));
            }
        });
        Ok(Io::Forked { pidfd: self.pidfd, stdin, stdout, cgroup: self.cgroup })
    }
}

impl Target<'_> {
    fn agent(&self) -> AgentClient {
        AgentClient::new(self.socket)
    }
}

/// What a kernel needs of the sandbox it runs in, beyond its agent.
pub trait Host: Sync {
    /// The sandbox's agent.
    fn target(&self) -> Target<'_>;
    /// The variables every context starts with (the sandbox's own environment).
    fn base_env(&self) -> std::collections::BTreeMap<String, String>;
    /// What to report for a broken agent connection (the sandbox's end, when it ended).
    fn broken(&self, e: String) -> Error;
    /// Whether the sandbox's memory limit has killed a process (why a kernel died).
    fn oom_killed(&self) -> bool;
}

/// A context's working directory unless it asks for another.
pub const DEFAULT_CWD: &str = "/home/user";
/// Where the kernels live inside every sandbox (written into the base skeleton).
pub const KERNEL_DIR: &str = "/opt/glovebox/kernels";
/// Longest event line accepted from a kernel (a large PNG is a few MiB of base64).
const MAX_LINE: usize = 64 << 20;
/// How long a kernel may take to start (imports of preloaded modules included).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// After SIGINT, how long a cell may take to end before its kernel is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// Output text kept per stream and cell; beyond it the cell's output is dropped (and said so).
const MAX_CELL_TEXT: usize = 4 << 20;
/// Rich results kept per cell, and their total size.
const MAX_CELL_RESULTS: usize = 100;
const MAX_CELL_RESULT_BYTES: usize = 64 << 20;

/// The kernel programs, embedded so every sandbox gets the daemon's own version.
pub const KERNEL_FILES: &[(&str, &str)] = &[
    ("python_kernel.py", include_str!("../kernels/python_kernel.py")),
    ("node_kernel.js", include_str!("../kernels/node_kernel.js")),
    ("bash_kernel.sh", include_str!("../kernels/bash_kernel.sh")),
    ("r_kernel.R", include_str!("../kernels/r_kernel.R")),
    ("java_kernel.java", include_str!("../kernels/java_kernel.java")),
];

fn argv(lang: Language) -> Vec<String> {
    let file = |f: &str| format!("{KERNEL_DIR}/{f}");
    let v: Vec<String> = match lang {
        Language::Python => vec!["python3".into(), file("python_kernel.py")],
        Language::Javascript => vec!["node".into(), file("node_kernel.js")],
        Language::Typescript => vec!["node".into(), file("node_kernel.js"), "--typescript".into()],
        Language::Bash => vec!["bash".into(), file("bash_kernel.sh")],
        Language::R => vec!["Rscript".into(), "--no-save".into(), "--no-restore".into(), file("r_kernel.R")],
        // The source launcher compiles the kernel in memory; C1 only and the serial
        // collector start a small JVM fastest.
        Language::Java => vec![
            "java".into(),
            "-XX:TieredStopAtLevel=1".into(),
            "-XX:+UseSerialGC".into(),
            "-Xss4m".into(),
            file("java_kernel.java"),
        ],
    };
    v
}

/// One context of one sandbox.
pub struct Kernel {
    pub id: String,
    pub language: Language,
    pub cwd: String,
    /// Modules the python kernel imports before it reports ready.
    preload: Option<String>,
    st: tokio::sync::Mutex<KState>,
}

#[derive(Default)]
struct KState {
    /// The running kernel.
    session: Option<Io>,
    /// Whether the sandbox's environment was applied (with the first cell).
    env_applied: bool,
    /// Bytes of a partial line.
    buf: Vec<u8>,
    next: u64,
    /// The id of a cell sent whose `end` has not been read: its caller went away mid-cell
    /// (a dropped connection). Whoever takes the lock next settles it first, so a new cell
    /// never queues behind an abandoned one, whichever of the two arrives first.
    pending: Option<String>,
}

/// The contexts of a sandbox, in the order they were made.
#[derive(Default)]
pub struct Kernels {
    list: std::sync::Mutex<Vec<Arc<Kernel>>>,
}

impl Kernels {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Kernel>>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: &str) -> Option<Arc<Kernel>> {
        self.lock().iter().find(|k| k.id == id).cloned()
    }

    /// The default contexts first, then the others; each group oldest first.
    pub fn list(&self) -> Vec<Context> {
        let mut v: Vec<Context> = self.lock().iter().map(|k| k.view()).collect();
        v.sort_by_key(|c| c.id != c.language.as_str());
        v
    }

    /// The default context of `lang` (id = the language's name), made if missing (its
    /// kernel starts with its first cell).
    pub fn default_for(&self, lang: Language, preload: Option<&str>) -> Arc<Kernel> {
        let mut list = self.lock();
        if let Some(k) = list.iter().find(|k| k.id == lang.as_str()) {
            return k.clone();
        }
        let k = Arc::new(Kernel::new(lang.as_str().to_string(), lang, None, preload));
        list.push(k.clone());
        k
    }

    pub fn insert(&self, k: Arc<Kernel>) {
        let mut list = self.lock();
        list.retain(|old| old.id != k.id);
        list.push(k);
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Kernel>> {
        let mut list = self.lock();
        let i = list.iter().position(|k| k.id == id)?;
        Some(list.remove(i))
    }
}

/// Outcome of one cell, delivered event by event to `on`.
pub struct CellEnd {
    pub execution_count: u64,
    pub context_restarted: bool,
}

impl Kernel {
    pub fn new(id: String, language: Language, cwd: Option<String>, preload: Option<&str>) -> Kernel {
        Kernel {
            id,
            language,
            cwd: cwd.unwrap_or_else(|| DEFAULT_CWD.to_string()),
            preload: if language == Language::Python { preload.map(str::to_string) } else { None },
            st: tokio::sync::Mutex::new(KState::default()),
        }
    }

    pub fn view(&self) -> Context {
        Context { id: self.id.clone(), language: self.language, cwd: self.cwd.clone() }
    }

    /// Starts the kernel if it is not running.
    pub async fn ensure(&self, t: &Target<'_>) -> Result<()> {
        let mut st = self.st.lock().await;
        self.start_locked(t, &mut st).await
    }

    async fn start_locked(&self, t: &Target<'_>, st: &mut KState) -> Result<()> {
        if st.session.is_some() {
            return Ok(());
        }
        st.env_applied = false;
        // A python kernel forked into the sandbox from its template's zygote, once.
        // (It was made with the default working directory, and only python's.)
        let forked = match (self.language, t.forked) {
            (Language::Python, Some(slot)) if self.cwd == DEFAULT_CWD => {
                slot.lock().unwrap_or_else(|p| p.into_inner()).take()
            }
            _ => None,
        };
        if let Some(f) = forked {
            let started = match f.into_io() {
                Ok(io) => {
                    st.session = Some(io);
                    st.buf.clear();
                    self.wait_ready(t, st).await
                }
                Err(e) => Err(Error::Internal(e.to_string())),
            };
            match started {
                Ok(()) => {
                    tracing::info!(sandbox = %t.id, "python kernel from the zygote ready");
                    return Ok(());
                }
                // Killed by `wait_ready`; the agent starts one as without a zygote.
                Err(e) => tracing::warn!(sandbox = %t.id, "forked python kernel: {e}; starting one"),
            }
        }
        let mut env = std::collections::BTreeMap::new();
        env.insert("MPLBACKEND".into(), "Agg".into());
        env.insert("PYTHONUNBUFFERED".into(), "1".into());
        if let Some(p) = &self.preload {
            env.insert("GLOVEBOX_PRELOAD".into(), p.clone());
        }
        let mut spec = ExecSpec::argv(argv(self.language));
        spec.cwd = Some(self.cwd.clone());
        spec.env = env;
        spec.raw = true;
        let agent = t.agent();
        let start_failed = |e| Error::Agent(format!("start {} kernel: {e}", self.language.as_str()));
        // A raw command's `Exec` exchange ends at `Started`; its output flows to the session.
        let id = agent.exec(&spec).await.map_err(start_failed)?.id;
        let session = agent.session(id).await.map_err(|e| Error::Agent(e.to_string()))?;
        st.session = Some(Io::Agent(id, session));
        st.buf.clear();
        self.wait_ready(t, st).await
    }

    /// Waits for the kernel's `ready` (killing it if it does not come).
    async fn wait_ready(&self, t: &Target<'_>, st: &mut KState) -> Result<()> {
        let ready = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                match next_line(st).await? {
                    Some(v) if v.get("type").and_then(|t| t.as_str()) == Some("ready") => return Ok(()),
                    Some(_) => continue,
                    None => {
                        return Err(Error::Invalid(format!(
                            "the {} kernel exited while starting (is {} installed in this sandbox?)",
                            self.language.as_str(),
                            argv(self.language)[0]
                        )))
                    }
                }
            }
        })
        .await;
        match ready {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.kill_locked(t, st).await;
                Err(e)
            }
            Err(_) => {
                self.kill_locked(t, st).await;
                Err(Error::Agent(format!(
                    "the {} kernel did not start within {START_TIMEOUT:?}",
                    self.language.as_str()
                )))
            }
        }
    }

    async fn kill_locked(&self, t: &Target<'_>, st: &mut KState) {
        let io = st.session.take();
        st.pending = None;
        st.buf.clear();
        if let Some(io) = io {
            io.signal(t, libc::SIGKILL).await;
            match io {
                Io::Agent(id, _) => {
                    let _ = t.agent().release(id).await;
                }
                // What the kernel started dies with it, as the agent's command cgroup does for
                // a kernel it started.
                Io::Forked { cgroup: Some(cg), .. } => {
                    let _ = tokio::task::spawn_blocking(move || cg.kill_and_remove()).await;
                }
                Io::Forked { cgroup: None, .. } => {}
            }
        }
    }

    /// Kills the kernel and starts a fresh one.
    pub async fn restart(&self, t: &Target<'_>) -> Result<()> {
        let mut st = self.st.lock().await;
        self.kill_locked(t, &mut st).await;
        self.start_locked(t, &mut st).await
    }

    /// Stops the cell whose caller has gone, if it still runs: see [`Kernel::settle_locked`].
    pub async fn interrupt(&self, t: &Target<'_>) {
        let mut st = self.st.lock().await;
        self.settle_locked(t, &mut st).await;
    }

    /// Ends an abandoned cell (one sent whose `end` was never read): SIGINT (the kernel
    /// turns it into KeyboardInterrupt), then its remaining events are read up to its `end`;
    /// a cell that does not end within the grace period gets its kernel killed (the context
    /// starts over with the next cell). Nothing to do when no cell is pending, so an idle
    /// kernel is never sent a stray SIGINT.
    async fn settle_locked(&self, t: &Target<'_>, st: &mut KState) {
        let Some(req_id) = st.pending.take() else { return };
        let Some(io) = st.session.as_ref() else { return };
        io.signal(t, libc::SIGINT).await;
        let ended = tokio::time::timeout(INTERRUPT_GRACE, async {
            loop {
                match next_line(st).await {
                    Ok(Some(ev)) => {
                        let is = |k: &str, v: &str| ev.get(k).and_then(|x| x.as_str()) == Some(v);
                        if is("type", "end") && is("id", &req_id) {
                            return true;
                        }
                    }
                    Ok(None) | Err(_) => return false,
                }
            }
        })
        .await;
        if ended != Ok(true) {
            self.kill_locked(t, st).await;
        }
    }

    /// The error of a cell whose kernel died.
    fn died(&self, host: &impl Host) -> CodeError {
        let reason = if host.oom_killed() { "out of memory" } else { "exited" };
        CodeError {
            name: "KernelDied".into(),
            value: format!("the {} kernel {reason} during the cell; its state is lost", self.language.as_str()),
            traceback: String::new(),
        }
    }

    pub async fn shutdown(&self, t: &Target<'_>) {
        let mut st = self.st.lock().await;
        self.kill_locked(t, &mut st).await;
    }

    /// Runs one cell, calling `on` for every stdout/stderr/result/error as it happens.
    pub async fn run(
        &self,
        host: &impl Host,
        code: &str,
        env: &std::collections::BTreeMap<String, String>,
        timeout: Duration,
        mut on: impl FnMut(CodeStreamLine),
    ) -> Result<CellEnd> {
        let t = host.target();
        let t = &t;
        let mut st = self.st.lock().await;
        // A cell abandoned by its caller ends before this one is sent.
        self.settle_locked(t, &mut st).await;
        self.start_locked(t, &mut st).await.map_err(|e| match e {
            Error::Agent(msg) => host.broken(msg),
            e => e,
        })?;
        st.next += 1;
        let req_id = format!("c{}", st.next);
        let mut req = serde_json::json!({ "id": req_id, "code": code });
        // The sandbox's environment is set once and kept; the run's own variables hold for
        // this cell only (the kernel restores what they replaced).
        if !st.env_applied {
            let base = host.base_env();
            if !base.is_empty() {
                req["env"] = serde_json::to_value(&base).unwrap_or_default();
            }
            st.env_applied = true;
        }
        if !env.is_empty() {
            req["scoped_env"] = serde_json::to_value(env).unwrap_or_default();
        }
        let mut line = serde_json::to_vec(&req).map_err(|e| Error::Internal(e.to_string()))?;
        line.push(b'\n');
        // Pending from here: a caller that goes away leaves this cell to be settled.
        st.pending = Some(req_id.clone());
        if let Some(session) = st.session.as_mut() {
            if let Err(e) = session.write(&line).await {
                // The kernel is gone (killed while idle): unless the sandbox went with it, say
                // so and start a fresh one with the next cell.
                self.kill_locked(t, &mut st).await;
                return match host.broken(e) {
                    Error::Agent(_) => {
                        on(CodeStreamLine::Error(self.died(host)));
                        Ok(CellEnd { execution_count: 0, context_restarted: true })
                    }
                    gone => Err(gone),
                };
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut interrupted = false;
        // Bounds on what one cell may hand the daemon (the kernel is untrusted).
        let mut text = [0usize; 2];
        let mut results = (0usize, 0usize);
        let mut on = move |line: CodeStreamLine| {
            let i = match &line {
                CodeStreamLine::Stdout { .. } => 0,
                CodeStreamLine::Stderr { .. } => 1,
                CodeStreamLine::Result(r) => {
                    let size: usize = r.data.values().map(|v| v.as_str().map_or(64, str::len)).sum();
                    results = (results.0 + 1, results.1 + size);
                    if results.0 > MAX_CELL_RESULTS || results.1 > MAX_CELL_RESULT_BYTES {
                        if results.0 == MAX_CELL_RESULTS + 1 || results.1 - size <= MAX_CELL_RESULT_BYTES {
                            on(CodeStreamLine::Stderr {
                                text: "[glovebox: further results of this cell dropped]\n".into(),
                            });
                        }
                        return;
                    }
                    return on(line);
                }
                _ => return on(line),
            };
            let n = match &line {
                CodeStreamLine::Stdout { text } | CodeStreamLine::Stderr { text } => text.len(),
                _ => 0,
            };
            let before = text[i];
            text[i] += n;
            if text[i] <= MAX_CELL_TEXT {
                on(line);
            } else if before <= MAX_CELL_TEXT {
                let note = format!("\n[glovebox: output truncated after {} MiB]\n", MAX_CELL_TEXT >> 20);
                on(if i == 0 { CodeStreamLine::Stdout { text: note } } else { CodeStreamLine::Stderr { text: note } });
            }
        };
        loop {
            let limit = if interrupted { deadline + INTERRUPT_GRACE } else { deadline };
            let next = tokio::time::timeout_at(limit, next_line(&mut st)).await;
            match next {
                Err(_) if !interrupted => {
                    interrupted = true;
                    if let Some(io) = st.session.as_ref() {
                        io.signal(t, libc::SIGINT).await;
                    }
                }
                Err(_) => {
                    // The cell ignored the interrupt: kill the kernel, start over next time.
                    self.kill_locked(t, &mut st).await;
                    on(CodeStreamLine::Error(timeout_error(timeout)));
                    return Ok(CellEnd { execution_count: 0, context_restarted: true });
                }
                Ok(Err(e)) => {
                    self.kill_locked(t, &mut st).await;
                    return Err(host.broken(e.to_string()));
                }
                Ok(Ok(None)) => {
                    // The kernel died mid-cell (e.g. out of memory, or `os._exit`).
                    self.kill_locked(t, &mut st).await;
                    on(CodeStreamLine::Error(self.died(host)));
                    return Ok(CellEnd { execution_count: 0, context_restarted: true });
                }
                Ok(Ok(Some(ev))) => {
                    if ev.get("id").and_then(|v| v.as_str()) != Some(req_id.as_str()) {
                        continue;
                    }
                    let text = |k: &str| ev.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                    match ev.get("type").and_then(|t| t.as_str()) {
                        Some("stdout") => on(CodeStreamLine::Stdout { text: text("text") }),
                        Some("stderr") => on(CodeStreamLine::Stderr { text: text("text") }),
                        Some("result") => {
                            let data = ev
                                .get("data")
                                .and_then(|d| d.as_object())
                                .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                                .unwrap_or_default();
                            let is_main_result = ev.get("is_main_result").and_then(|v| v.as_bool()).unwrap_or(false);
                            on(CodeStreamLine::Result(CodeResult { is_main_result, data }));
                        }
                        Some("error") => {
                            let mut e =
                                CodeError { name: text("name"), value: text("value"), traceback: text("traceback") };
                            if interrupted && e.name == "KeyboardInterrupt" {
                                e = CodeError { traceback: e.traceback, ..timeout_error(timeout) };
                            }
                            on(CodeStreamLine::Error(e));
                        }
                        Some("end") => {
                            st.pending = None;
                            let n = ev.get("execution_count").and_then(|v| v.as_u64()).unwrap_or(0);
                            return Ok(CellEnd { execution_count: n, context_restarted: false });
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

fn timeout_error(t: Duration) -> CodeError {
    CodeError {
        name: "TimeoutError".into(),
        value: format!("execution timed out after {} ms", t.as_millis()),
        traceback: String::new(),
    }
}

/// The next JSON event line of the kernel; `None` when the kernel exited.
async fn next_line(st: &mut KState) -> Result<Option<serde_json::Value>> {
    loop {
        if let Some(nl) = st.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = st.buf.drain(..=nl).collect();
            match serde_json::from_slice::<serde_json::Value>(&line) {
                Ok(v) if v.is_object() => return Ok(Some(v)),
                // Not protocol (a kernel bug, or stray bytes): skip it.
                _ => continue,
            }
        }
        if st.buf.len() > MAX_LINE {
            return Err(Error::Agent("kernel sent an over-long line".into()));
        }
        let Some(session) = st.session.as_mut() else { return Ok(None) };
        match session.read().await {
            Ok(Some(Output::Stdout(b))) => st.buf.extend_from_slice(&b),
            // The kernel's own stderr (its crash report, if any) is not protocol.
            Ok(Some(_)) => {}
            Ok(None) => return Ok(None),
            Err(e) => return Err(Error::Agent(e)),
        }
    }
}

/// Starts the default python context of a sandbox and waits until it is ready (warm
/// kernels: the pool does this before handing a sandbox out).
pub async fn prewarm(kernels: &Kernels, t: &Target<'_>, preload: Option<&str>) -> Result<()> {
    kernels.default_for(Language::Python, preload).ensure(t).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_listed_first_then_contexts_in_the_order_made() {
        let ks = Kernels::default();
        for id in ["ctx-zz", "ctx-aa"] {
            ks.insert(Arc::new(Kernel::new(id.into(), Language::R, None, None)));
        }
        ks.default_for(Language::Javascript, None);
        ks.default_for(Language::Python, Some("numpy"));
        let ids: Vec<String> = ks.list().into_iter().map(|c| c.id).collect();
        assert_eq!(ids, ["javascript", "python", "ctx-zz", "ctx-aa"]);
    }

    #[test]
    fn every_language_has_a_kernel_program() {
        for lang in
            [Language::Python, Language::Javascript, Language::Typescript, Language::Bash, Language::R, Language::Java]
        {
            let argv = argv(lang);
            let file = argv.iter().find(|a| a.starts_with(KERNEL_DIR)).expect("a kernel file");
            let name = file.trim_start_matches(KERNEL_DIR).trim_start_matches('/');
            assert!(KERNEL_FILES.iter().any(|(n, _)| *n == name), "{name} is not embedded");
        }
    }
}
