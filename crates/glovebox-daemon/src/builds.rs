//! Building a template: each filesystem step (`RUN`, `COPY`, `WORKDIR`) runs in a Glovebox
//! sandbox started from the layers built so far, with network `allow-all` and its writable
//! upper on a host directory; when the step's command succeeds the sandbox is destroyed and
//! its upper becomes the next layer (ids shifted back from the sandbox's host uid range to
//! 0-based ones: lowers are id-mapped at mount time). `ENV`, `USER`, `CMD` only change the
//! template's config. A layer's id hashes its parent, the step and what it copied, so an
//! unchanged prefix of steps is found in the store and nothing runs.
//!
//! Invariants: the template is saved only after its last step; a failed build leaves its
//! finished layers as cache (GC removes them once unreferenced) and no template; the upper
//! tree is written by untrusted code, so it is walked without following any symlink.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use glovebox_proto::agent::ExecSpec;
use glovebox_proto::api::{self, BuildLine, BuildTemplate, CreateSandbox, EndReason, NetworkMode, NetworkPolicy};
use tokio::sync::mpsc;

use crate::agent::{AgentError, Output, Running};
use crate::manager::{Manager, Sb};
use crate::templates::spec::{self, Cmd, Instr};
use crate::templates::store::{hash_parts, hex, TemplateMeta};
use crate::templates::Template;

pub use crate::templates::BUILD_SANDBOX;
/// One step's time budget.
const STEP_TIMEOUT_MS: u64 = 30 * 60 * 1000;
/// Lines of output kept for the failure report.
const TAIL_LINES: usize = 20;
/// Largest build context accepted (decoded tar).
pub const MAX_CONTEXT: usize = 12 << 20;

/// A build failure as the log reports it.
#[derive(Debug)]
pub struct Failure {
    pub step: Option<usize>,
    pub line: Option<usize>,
    pub exit_code: Option<i32>,
    pub message: String,
    pub output_tail: String,
    /// Bad input (a 4xx before anything ran) rather than a failed step.
    pub invalid: bool,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            step: None,
            line: None,
            exit_code: None,
            message: message.into(),
            output_tail: String::new(),
            invalid: true,
        }
    }
    fn at(step: usize, line: usize, message: impl Into<String>) -> Failure {
        Failure {
            step: Some(step),
            line: Some(line),
            exit_code: None,
            message: message.into(),
            output_tail: String::new(),
            invalid: false,
        }
    }
    pub fn into_line(self) -> BuildLine {
        BuildLine::Error {
            step: self.step,
            line: self.line,
            exit_code: self.exit_code,
            message: self.message,
            output_tail: self.output_tail,
        }
    }
}

/// What a build checks before anything runs (so the API can answer 400 instead of a stream).
pub struct Checked {
    req: BuildTemplate,
    spec: spec::Spec,
    context: Option<Vec<u8>>,
}

pub fn check(req: BuildTemplate) -> Result<Checked, Failure> {
    use base64::Engine;
    if !crate::templates::store::valid_name(&req.name) {
        return Err(Failure::invalid(format!(
            "bad template name {:?} (1-63 of a-z 0-9 . _ -, starting with a letter or digit)",
            req.name
        )));
    }
    if req.name == "base" {
        return Err(Failure::invalid("`base` is the built-in host template; choose another name"));
    }
    let spec = spec::parse(&req.dockerfile, &req.build_args).map_err(|e| Failure {
        line: (e.line > 0).then_some(e.line),
        ..Failure::invalid(format!("Dockerfile: {e}"))
    })?;
    let context = match &req.context_tar_base64 {
        Some(b) => {
            let v = base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| Failure::invalid(format!("context_tar_base64: {e}")))?;
            if v.len() > MAX_CONTEXT {
                return Err(Failure::invalid(format!("build context larger than {} MiB", MAX_CONTEXT >> 20)));
            }
            Some(v)
        }
        None => None,
    };
    Ok(Checked { req, spec, context })
}

struct Log {
    tx: mpsc::Sender<BuildLine>,
}

impl Log {
    async fn send(&self, l: BuildLine) {
        // A client that went away does not stop the build.
        let _ = self.tx.send(l).await;
    }
}

/// Removes the build's scratch directory however the build ends.
struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// What a filesystem step runs: its command, as whom, its stdin, and a digest of what it
/// copies (part of the layer id).
#[derive(Default)]
struct Work {
    argv: Vec<String>,
    user: Option<String>,
    stdin: Option<Vec<u8>>,
    digest: String,
}

/// The state that flows from step to step.
struct State {
    host_usr: bool,
    /// Layer ids, top-most first.
    layers: Vec<String>,
    env: BTreeMap<String, String>,
    workdir: Option<String>,
    user: Option<String>,
    start_cmd: Option<Vec<String>>,
}

/// Runs a checked build to the end, sending progress to `tx`. Returns the saved template.
pub async fn run(m: Arc<Manager>, c: Checked, tx: mpsc::Sender<BuildLine>) -> Result<TemplateMeta, Failure> {
    let name = c.req.name.clone();
    if !m.templates.begin(&name) {
        return Err(Failure::invalid(format!("template {name:?} is already being built")));
    }
    let r = run_inner(&m, c, Log { tx }).await;
    m.templates.end(&name);
    r
}

/// Makes sure the template a create asks for can be started: a shipped template that is not
/// built yet has its build started in the background (once; again after a failure), and the
/// create is told how far it got (503 `unavailable`: "building template NAME, N% (step k/n)").
/// Other names, and daemons with automatic builds off, are left to the create.
pub fn ensure_shipped(m: &Arc<Manager>, name: &str) -> crate::error::Result<()> {
    use crate::templates::AutoBuild;
    let Some(shipped) = crate::templates::shipped(name) else { return Ok(()) };
    if !m.cfg.auto_build || m.template(name).is_ok() {
        return Ok(());
    }
    let state = match m.templates.claim_auto_build(name) {
        Err(running) => running,
        Ok(last) => {
            let req = BuildTemplate {
                name: name.to_string(),
                dockerfile: shipped.dockerfile.to_string(),
                ..Default::default()
            };
            let checked = check(req).map_err(|f| {
                m.templates.set_auto_build(name, None);
                crate::error::Error::Internal(format!("shipped spec of {name}: {}", f.message))
            })?;
            let running = AutoBuild::Running { step: 0, total: 0 };
            tracing::info!(template = name, "building the shipped template (a sandbox asked for it)");
            let (tx, mut rx) = mpsc::channel::<BuildLine>(64);
            let (m2, n2) = (m.clone(), name.to_string());
            tokio::spawn(async move {
                let follow = {
                    let (m, n) = (m2.clone(), n2.clone());
                    async move {
                        while let Some(line) = rx.recv().await {
                            match line {
                                BuildLine::Step { step, total, cached, .. } => {
                                    if !cached {
                                        tracing::info!(template = %n, "automatic build: step {step}/{total}");
                                    }
                                    m.templates.set_auto_build(&n, Some(AutoBuild::Running { step, total }));
                                }
                                BuildLine::Base { message } => {
                                    tracing::info!(template = %n, "automatic build: {message}")
                                }
                                _ => {}
                            }
                        }
                    }
                };
                let (r, ()) = tokio::join!(run(m2.clone(), checked, tx), follow);
                match r {
                    Ok(_) => {
                        tracing::info!(template = %n2, "automatic build done");
                        m2.templates.set_auto_build(&n2, None);
                        m2.refill_pool();
                    }
                    Err(f) => {
                        let at = f.step.map(|s| format!("step {s}: ")).unwrap_or_default();
                        tracing::warn!(template = %n2, "automatic build failed: {at}{}\n{}", f.message, f.output_tail);
                        m2.templates.set_auto_build(&n2, Some(AutoBuild::Failed(format!("{at}{}", f.message))));
                    }
                }
            });
            match last {
                Some(failed @ AutoBuild::Failed(_)) => {
                    return Err(crate::error::Error::Unavailable(format!(
                        "{}; building it again, retry in a few seconds",
                        failed.message(name)
                    )))
                }
                _ => running,
            }
        }
    };
    Err(crate::error::Error::Unavailable(state.message(name)))
}

async fn run_inner(m: &Arc<Manager>, c: Checked, log: Log) -> Result<TemplateMeta, Failure> {
    let t0 = Instant::now();
    // Resource defaults must be ones a sandbox can be created with.
    m.limits_for(&c.req.resources).map_err(|e| Failure::invalid(format!("template resources: {e}")))?;
    let _shared = m.templates.gc_lock.read().await;
    let store = m.templates.store.clone();
    let scratch = Scratch(store.scratch().map_err(|e| Failure::invalid(format!("scratch dir: {e}")))?);
    let ctx = scratch.0.join("context");
    fs::create_dir(&ctx).map_err(|e| Failure::invalid(format!("context dir: {e}")))?;
    if let Some(tar) = &c.context {
        unpack_context(tar, &ctx).map_err(|e| Failure::invalid(format!("build context: {e}")))?;
    }
    let spec = &c.spec;
    let mut st = base(m, &spec.from, &ctx, &scratch.0, &log).await?;
    let total = spec.steps.len();
    for (i, step) in spec.steps.iter().enumerate() {
        let n = i + 1;
        let show = show_instr(&step.instr);
        let work: Option<Work> = match &step.instr {
            Instr::Env(kvs) => {
                st.env.extend(kvs.iter().cloned());
                None
            }
            Instr::User(u) => {
                st.user = Some(u.clone());
                None
            }
            Instr::Cmd(cmd) => {
                st.start_cmd = Some(argv(cmd));
                None
            }
            Instr::Workdir(d) => {
                let abs = join_abs(st.workdir.as_deref(), d);
                st.workdir = Some(abs.clone());
                Some(Work { argv: vec!["mkdir".into(), "-p".into(), "--".into(), abs], ..Work::default() })
            }
            Instr::Run(cmd) => Some(Work { argv: argv(cmd), user: st.user.clone(), ..Work::default() }),
            Instr::Copy { srcs, dest, chown, chmod } => {
                if chown.is_some() {
                    return Err(Failure::at(
                        n,
                        step.line,
                        "COPY --chown is not supported yet (files are owned by root)",
                    ));
                }
                let dest = join_abs(st.workdir.as_deref(), dest);
                let (tar, digest) = copy_tar(&ctx, srcs, &dest, *chmod).map_err(|e| Failure::at(n, step.line, e))?;
                let argv = ["tar", "-x", "-p", "--no-same-owner", "-f", "-", "-C", "/"].map(String::from).to_vec();
                Some(Work { argv, stdin: Some(tar), digest, ..Work::default() })
            }
        };
        let Some(Work { argv, user, stdin, digest }) = work else {
            log.send(BuildLine::Step { step: n, total, line: step.line, instruction: show, cached: false }).await;
            continue;
        };
        let parent = st.layers.first().cloned().unwrap_or_else(|| format!("root:{}", st.host_usr));
        let env = run_env(&st, &step.args);
        let key = hash_parts(&[
            parent.as_bytes(),
            step.key_text().as_bytes(),
            digest.as_bytes(),
            format!("{env:?}").as_bytes(),
            format!("{:?} {:?}", st.workdir, user).as_bytes(),
        ]);
        let cached = !c.req.no_cache && store.has_layer(&key);
        log.send(BuildLine::Step { step: n, total, line: step.line, instruction: show.clone(), cached }).await;
        if cached {
            st.layers.insert(0, key);
            continue;
        }
        let cwd = match &step.instr {
            Instr::Run(_) => st.workdir.clone(),
            _ => None,
        };
        let upper = scratch.0.join(format!("step-{n}"));
        fs::create_dir(&upper).map_err(|e| Failure::at(n, step.line, format!("step dir: {e}")))?;
        // Only RUN reaches the network.
        let network = matches!(step.instr, Instr::Run(_));
        let tree = run_step(m, &c.req, &st, &upper, argv, env, cwd, user, stdin, network, n, &log).await.map_err(
            |mut f| {
                f.step = Some(n);
                f.line = Some(step.line);
                f
            },
        )?;
        store
            .commit_layer(&key, &tree, st.layers.first().map(String::as_str), &show)
            .map_err(|e| Failure::at(n, step.line, format!("save layer: {e}")))?;
        let _ = fs::remove_dir_all(&upper);
        st.layers.insert(0, key);
    }
    // A named USER is resolved inside the finished image (its own /etc/passwd).
    let (uid, gid) = match &st.user {
        None => (None, None),
        Some(u) => match numeric_user(u) {
            Some((uid, gid)) => (Some(uid), Some(gid)),
            None => {
                let (uid, gid) = resolve_user_in_image(m, &c.req, &st, &scratch.0, u).await.map_err(|mut f| {
                    f.step = Some(total);
                    f
                })?;
                (Some(uid), Some(gid))
            }
        },
    };
    let preload = (c.req.name == "code-interpreter").then(|| "numpy,pandas,matplotlib,matplotlib.pyplot".to_string());
    let size = st.layers.iter().map(|l| store.layer_size(l)).sum();
    let meta = TemplateMeta {
        name: c.req.name.clone(),
        base: spec.from.clone(),
        host_usr: st.host_usr,
        layers: st.layers.clone(),
        env: st.env.clone(),
        workdir: st.workdir.clone(),
        user: st.user.clone(),
        uid,
        gid,
        resources: c.req.resources.clone(),
        start_cmd: st.start_cmd.clone(),
        isolation: c.req.isolation,
        preload,
        created_at: crate::util::rfc3339(std::time::SystemTime::now()),
        size_bytes: size,
    };
    store.save(&meta).map_err(|e| Failure::invalid(format!("save template: {e}")))?;
    log.send(BuildLine::Done { template: m.template_info(&meta), seconds: t0.elapsed().as_secs_f64() }).await;
    Ok(meta)
}

fn show_instr(i: &Instr) -> String {
    match i {
        Instr::Run(Cmd::Shell(s)) => format!("RUN {s}"),
        Instr::Run(Cmd::Exec(v)) => format!("RUN {v:?}"),
        Instr::Cmd(c) => format!("CMD {:?}", argv(c)),
        Instr::Copy { srcs, dest, .. } => format!("COPY {} {dest}", srcs.join(" ")),
        Instr::Env(kvs) => {
            format!("ENV {}", kvs.iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join(" "))
        }
        Instr::Workdir(d) => format!("WORKDIR {d}"),
        Instr::User(u) => format!("USER {u}"),
    }
}

fn argv(c: &Cmd) -> Vec<String> {
    match c {
        Cmd::Exec(v) => v.clone(),
        Cmd::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
    }
}

/// `d` made absolute against the working directory (default `/`), `.`/`..` folded.
fn join_abs(workdir: Option<&str>, d: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let base = if d.starts_with('/') { "" } else { workdir.unwrap_or("/") };
    for c in base.split('/').chain(d.split('/')) {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let trailing = d.ends_with('/') && !parts.is_empty();
    format!("/{}{}", parts.join("/"), if trailing { "/" } else { "" })
}

/// The environment of a step's command: the template's ENV over the build arguments.
fn run_env(st: &State, args: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env = args.clone();
    env.extend(st.env.clone());
    env
}

fn numeric_user(u: &str) -> Option<(u32, u32)> {
    let (a, b) = u.split_once(':').unwrap_or((u, u));
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The base's state: `host` (no layers, host /usr), a Debian root or an OCI image.
async fn base(m: &Arc<Manager>, from: &str, ctx: &Path, scratch: &Path, log: &Log) -> Result<State, Failure> {
    let mut st =
        State { host_usr: true, layers: Vec::new(), env: BTreeMap::new(), workdir: None, user: None, start_cmd: None };
    if from == "host" || from == "glovebox:host" {
        return Ok(st);
    }
    // Another built template: its layers and config, as a parent image.
    if crate::templates::store::valid_name(from) {
        if let Some(t) = m.templates.store.load(from) {
            log.send(BuildLine::Base { message: format!("from template {from} ({} layers)", t.layers.len()) }).await;
            st.host_usr = t.host_usr;
            st.layers = t.layers;
            st.env = t.env;
            st.workdir = t.workdir;
            st.user = t.user;
            st.start_cmd = t.start_cmd;
            return Ok(st);
        }
    }
    let fail = |e: String| Failure { step: Some(0), line: None, ..Failure::at(0, 0, format!("FROM {from}: {e}")) };
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let logger = move |s: String| {
        let _ = tx.send(s);
    };
    let store = m.templates.store.clone();
    let work = async {
        if let Some(r) = crate::templates::debian::parse_ref(from) {
            let (suite, slim) = r.map_err(fail)?;
            let layers =
                crate::templates::debian::ensure_layers(&store, &suite, slim, scratch, &logger).await.map_err(fail)?;
            return Ok::<_, Failure>(crate::templates::oci::Image { layers, ..Default::default() });
        }
        if let Some(path) = from.strip_prefix("oci-archive:") {
            let p = crate::templates::context_path(ctx, path)
                .ok_or_else(|| fail("the archive must be inside the build context".into()))?;
            let store2 = store.clone();
            return tokio::task::spawn_blocking(move || crate::templates::oci::from_archive(&store2, &p))
                .await
                .map_err(|e| fail(format!("task: {e}")))?
                .map_err(fail);
        }
        crate::templates::oci::pull(&store, from, &logger).await.map_err(fail)
    };
    tokio::pin!(work);
    let img = loop {
        tokio::select! {
            r = &mut work => break r?,
            Some(msg) = rx.recv() => log.send(BuildLine::Base { message: msg }).await,
        }
    };
    while let Ok(msg) = rx.try_recv() {
        log.send(BuildLine::Base { message: msg }).await;
    }
    st.host_usr = false;
    st.layers = img.layers;
    st.env = img.env;
    st.workdir = img.workdir;
    st.user = img.user;
    st.start_cmd = img.cmd;
    Ok(st)
}

/// A build sandbox: generous limits, network only for `RUN` (`allow-all`, so package
/// managers reach their registries).
fn build_request(req: &BuildTemplate, network: bool) -> CreateSandbox {
    let d = glovebox_proto::api::Limits::default();
    CreateSandbox {
        template: Some(BUILD_SANDBOX.into()),
        timeout_s: Some(2 * 3600),
        resources: api::Resources {
            cpus: Some(req.resources.cpus.unwrap_or(d.cpus).clamp(2.0, api::MAX_CPUS)),
            memory_mb: Some(req.resources.memory_mb.unwrap_or(0).max(2048)),
            disk_mb: None,
            pids: Some(d.pids.max(1024)),
        },
        env: BTreeMap::new(),
        metadata: BTreeMap::new(),
        idle_timeout_s: None,
        on_idle: None,
        volumes: Vec::new(),
        auto_resume: None,
        network: NetworkPolicy {
            mode: if network { NetworkMode::AllowAll } else { NetworkMode::DenyAll },
            allow: Vec::new(),
            deny: Vec::new(),
        },
        snapshot: None,
        // Build steps run in the jail (their writes are read back from a host directory);
        // the template's `isolation` is for the sandboxes created from it.
        isolation: Some(api::Isolation::Process),
    }
}

fn step_template(m: &Manager, st: &State) -> Template {
    Template {
        name: "build".into(),
        layers: st.layers.iter().map(|l| m.templates.store.layer_fs(l)).collect(),
        preload: None,
        host_usr: st.host_usr,
        defaults: None,
    }
}

/// Runs one step's command in a build sandbox; returns the normalized tree of its writes.
#[allow(clippy::too_many_arguments)]
async fn run_step(
    m: &Arc<Manager>,
    req: &BuildTemplate,
    st: &State,
    upper: &Path,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    user: Option<String>,
    stdin: Option<Vec<u8>>,
    network: bool,
    n: usize,
    log: &Log,
) -> Result<PathBuf, Failure> {
    let sb = m
        .create_for_build(build_request(req, network), step_template(m, st), upper.to_path_buf())
        .await
        .map_err(|e| Failure::at(n, 0, format!("start the build sandbox: {e}")))?;
    let r = async {
        let (uid, gid) = match user.as_deref() {
            None => (None, None),
            Some(u) => match numeric_user(u) {
                Some((a, b)) => (Some(a), Some(b)),
                None => {
                    let (a, b) = resolve_user(m, &sb, u).await?;
                    (Some(a), Some(b))
                }
            },
        };
        let spec = ExecSpec {
            cwd,
            env,
            uid,
            gid,
            stdin: stdin.is_some(),
            timeout_ms: Some(STEP_TIMEOUT_MS),
            ..ExecSpec::argv(argv)
        };
        exec(m, &sb, spec, stdin, Some((n, log))).await
    }
    .await;
    m.destroy(&sb.id, EndReason::Killed).await;
    let (code, tail) = r?;
    if code != 0 {
        return Err(Failure {
            exit_code: Some(code),
            output_tail: tail,
            ..Failure::at(n, 0, format!("step {n} failed with exit code {code}"))
        });
    }
    let up = upper.join("upper");
    tokio::task::spawn_blocking(move || commit_tree(&up))
        .await
        .map_err(|e| Failure::at(n, 0, format!("task: {e}")))?
        .map_err(|e| Failure::at(n, 0, format!("capture the step's files: {e}")))
}

/// `id -u NAME` / `id -g NAME` inside the sandbox.
async fn resolve_user(m: &Arc<Manager>, sb: &Sb, u: &str) -> Result<(u32, u32), Failure> {
    let mut ids = [0u32; 2];
    for (i, flag) in ["-u", "-g"].iter().enumerate() {
        let spec = ExecSpec { timeout_ms: Some(30_000), ..ExecSpec::argv(["id", flag, u]) };
        let (code, out) = exec(m, sb, spec, None, None).await?;
        ids[i] = match (code, out.trim().parse::<u32>()) {
            (0, Ok(v)) => v,
            _ => return Err(Failure::at(0, 0, format!("USER {u}: no such user in the image ({})", out.trim()))),
        };
    }
    Ok((ids[0], ids[1]))
}

async fn resolve_user_in_image(
    m: &Arc<Manager>,
    req: &BuildTemplate,
    st: &State,
    scratch: &Path,
    u: &str,
) -> Result<(u32, u32), Failure> {
    let upper = scratch.join("resolve-user");
    let _ = fs::create_dir(&upper);
    let sb = m
        .create_for_build(build_request(req, false), step_template(m, st), upper)
        .await
        .map_err(|e| Failure::at(0, 0, format!("start a sandbox to resolve USER: {e}")))?;
    let r = resolve_user(m, &sb, u).await;
    m.destroy(&sb.id, EndReason::Killed).await;
    r
}

/// Runs a command to its end; streams its output to the log (as step `n`) and returns the
/// exit code and the output's tail.
async fn exec(
    m: &Manager,
    sb: &Sb,
    spec: ExecSpec,
    stdin: Option<Vec<u8>>,
    log: Option<(usize, &Log)>,
) -> Result<(i32, String), Failure> {
    let agent = |e: String| Failure::at(0, 0, format!("build sandbox: {e}"));
    let broken = |e: AgentError| match e {
        AgentError::Refused { message, .. } => agent(message),
        AgentError::Closed(_) => agent("the sandbox ended before the command".into()),
        e => agent(m.agent_error(&sb.id, e).to_string()),
    };
    let Running { mut output, stdin: mut writer, .. } = sb.agent().exec(&spec).await.map_err(broken)?;
    let feeder = stdin.map(|data| {
        tokio::spawn(async move {
            let _ = writer.send(&data, true).await;
            writer
        })
    });
    let mut tail: Vec<u8> = Vec::new();
    let code = loop {
        match output.next().await.map_err(broken)? {
            Output::Stdout(b) | Output::Stderr(b) => {
                tail.extend_from_slice(&b);
                if tail.len() > 64 << 10 {
                    tail.drain(..tail.len() - (32 << 10));
                }
                if let Some((n, log)) = log {
                    log.send(BuildLine::Output { step: n, data: String::from_utf8_lossy(&b).into_owned() }).await;
                }
            }
            Output::Exited(e) => break e.exit_code,
        }
    };
    if let Some(f) = feeder {
        let _ = f.await;
    }
    let text = String::from_utf8_lossy(&tail).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
    Ok((code, tail))
}

/// Turns a build sandbox's upper (`upper/{root,usr}`) into a layer tree: ids shifted from
/// the sandbox's host range (its base is the owner of `upper/root`, set by the jailer) to
/// 0-based, `/usr` writes merged under `usr/`. Whiteouts (0/0 character devices) and opaque
/// directories (an xattr) keep their meaning when the tree becomes a lower layer.
fn commit_tree(upper: &Path) -> std::io::Result<PathBuf> {
    let root = upper.join("root");
    let base = fs::symlink_metadata(&root)?.uid();
    if base == 0 {
        return Err(std::io::Error::other("upper is owned by host root; refusing to shift ids"));
    }
    shift_ids(&root, base)?;
    let usr = upper.join("usr");
    shift_ids(&usr, base)?;
    if fs::read_dir(&usr)?.next().is_some() {
        merge_into(&usr, &root.join("usr"))?;
    }
    // The layer's root directory itself is root's, like every `/`.
    std::os::unix::fs::lchown(&root, Some(0), Some(0))?;
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755))?;
    Ok(root)
}

fn shift_ids(p: &Path, base: u32) -> std::io::Result<()> {
    let range = crate::slots::RANGE;
    let md = fs::symlink_metadata(p)?;
    let shift = |id: u32| if id >= base && id < base + range { Some(id - base) } else { None };
    let (u, g) = (shift(md.uid()), shift(md.gid()));
    if u.is_some() || g.is_some() {
        std::os::unix::fs::lchown(p, u, g)?;
        // chown clears setuid/setgid bits; put the mode back.
        if !md.file_type().is_symlink() {
            fs::set_permissions(p, fs::Permissions::from_mode(md.mode() & 0o7777))?;
        }
    }
    if md.is_dir() {
        for e in fs::read_dir(p)? {
            shift_ids(&e?.path(), base)?;
        }
    }
    Ok(())
}

/// Moves `src`'s entries into `dst` (created if missing), merging directories.
fn merge_into(src: &Path, dst: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(dst) {
        Err(_) => return fs::rename(src, dst),
        Ok(md) if !md.is_dir() => {
            fs::remove_file(dst)?;
            return fs::rename(src, dst);
        }
        Ok(_) => {}
    }
    for e in fs::read_dir(src)? {
        let e = e?;
        let from = e.path();
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() && fs::symlink_metadata(&to).is_ok_and(|m| m.is_dir()) {
            merge_into(&from, &to)?;
        } else {
            if let Ok(m) = fs::symlink_metadata(&to) {
                if m.is_dir() {
                    fs::remove_dir_all(&to)?;
                } else {
                    fs::remove_file(&to)?;
                }
            }
            fs::rename(&from, &to)?;
        }
    }
    Ok(())
}

/// Unpacks the build context (a tar) into `dst`; entries that would land outside are
/// refused by the tar reader; owners are not restored.
fn unpack_context(tar: &[u8], dst: &Path) -> std::io::Result<()> {
    let mut a = tar::Archive::new(tar);
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(false);
    a.set_unpack_xattrs(false);
    a.set_overwrite(true);
    for e in a.entries()? {
        let mut e = e?;
        match e.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Directory | tar::EntryType::Symlink => {
                e.unpack_in(dst)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The tar a `COPY` extracts at `/` in the build sandbox (paths relative to `/`, files
/// owned by root, modes as in the context or `--chmod`), and a digest of it. Deterministic:
/// fixed mtimes and sorted entries, so the same files give the same layer id.
fn copy_tar(ctx: &Path, srcs: &[String], dest: &str, chmod: Option<u32>) -> Result<(Vec<u8>, String), String> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    let to_dir = dest.ends_with('/') || srcs.len() > 1;
    for s in srcs {
        let p = crate::templates::context_path(ctx, s)
            .ok_or_else(|| format!("COPY source {s:?} is outside the build context"))?;
        let md = fs::symlink_metadata(&p).map_err(|_| format!("COPY source {s:?} not found in the build context"))?;
        let target = if md.is_dir() {
            dest.trim_end_matches('/').to_string()
        } else if to_dir {
            let fname = Path::new(s).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            format!("{}/{fname}", dest.trim_end_matches('/'))
        } else {
            dest.to_string()
        };
        add_tree(&mut b, &p, target.trim_start_matches('/'), chmod, md.is_dir())?;
    }
    let data = b.into_inner().map_err(|e| format!("COPY: {e}"))?;
    let digest = hex(&<sha2::Sha256 as sha2::Digest>::digest(&data));
    Ok((data, digest))
}

fn add_tree(
    b: &mut tar::Builder<Vec<u8>>,
    p: &Path,
    name: &str,
    chmod: Option<u32>,
    contents_only: bool,
) -> Result<(), String> {
    let md = fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let mut h = tar::Header::new_gnu();
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1);
    let mode = chmod.unwrap_or(md.mode() & 0o7777);
    let err = |e: std::io::Error| format!("COPY {}: {e}", p.display());
    if md.file_type().is_symlink() {
        let t = fs::read_link(p).map_err(err)?;
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        b.append_link(&mut h, name, &t).map_err(err)?;
    } else if md.is_dir() {
        if !contents_only && !name.is_empty() {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(mode);
            h.set_size(0);
            b.append_data(&mut h, format!("{name}/"), std::io::empty()).map_err(err)?;
        }
        let mut names: Vec<_> = fs::read_dir(p).map_err(err)?.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for f in names {
            let child = if name.is_empty() {
                f.to_string_lossy().into_owned()
            } else {
                format!("{name}/{}", f.to_string_lossy())
            };
            add_tree(b, &p.join(&f), &child, chmod, false)?;
        }
    } else if md.is_file() {
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(md.len());
        let f = fs::File::open(p).map_err(err)?;
        b.append_data(&mut h, name, f).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abs_paths() {
        assert_eq!(join_abs(None, "app"), "/app");
        assert_eq!(join_abs(Some("/a/b"), "../c"), "/a/c");
        assert_eq!(join_abs(Some("/a"), "/x/./y/"), "/x/y/");
        assert_eq!(join_abs(None, "../../.."), "/");
    }

    #[test]
    fn copy_tar_is_deterministic_and_keeps_modes() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("dir")).unwrap();
        fs::write(d.path().join("dir/run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(d.path().join("dir/run.sh"), fs::Permissions::from_mode(0o751)).unwrap();
        fs::write(d.path().join("f"), "x").unwrap();
        let (a, da) = copy_tar(d.path(), &["dir".into(), "f".into()], "/app/", None).unwrap();
        let (_, db) = copy_tar(d.path(), &["dir".into(), "f".into()], "/app/", None).unwrap();
        assert_eq!(da, db);
        let mut names = Vec::new();
        for e in tar::Archive::new(&a[..]).entries().unwrap() {
            let e = e.unwrap();
            names.push((e.path().unwrap().display().to_string(), e.header().mode().unwrap()));
        }
        assert!(names.contains(&("app/run.sh".into(), 0o751)), "{names:?}");
        assert!(names.iter().any(|(n, _)| n == "app/f"), "{names:?}");
        fs::write(d.path().join("f"), "y").unwrap();
        assert_ne!(copy_tar(d.path(), &["f".into()], "/app/", None).unwrap().1, da);
        assert!(copy_tar(d.path(), &["missing".into()], "/x", None).is_err());
    }

    #[test]
    fn numeric_users() {
        assert_eq!(numeric_user("1000"), Some((1000, 1000)));
        assert_eq!(numeric_user("1:2"), Some((1, 2)));
        assert_eq!(numeric_user("user"), None);
    }
}
