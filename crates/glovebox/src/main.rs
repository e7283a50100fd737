//! `glovebox`: the daemon (`serve`), one-shot sandboxed commands (`run`), and thin clients
//! of the API (`sandbox …`, `files …`).
//!
//! Exit codes (stable): the command's own code for `run` and `sandbox exec`; 124 when the
//! command's time budget ran out; 125 when Glovebox itself failed (message on stderr).

mod admin;
mod client;
mod doctor;
mod embedded;
mod mcp;
mod run;
mod serve_config;
mod shell;
mod snapshot;
mod template;
mod units;
mod volume;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::builder::BoolishValueParser;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use glovebox_proto::api::{self, CreateSandbox, Encoding, ExecRequest, Resources, SandboxList};
use reqwest::Method;

use crate::client::Client;

pub const EXIT_TIMEOUT: i32 = 124;
pub const EXIT_ERROR: i32 = 125;

#[derive(Parser)]
#[command(name = "glovebox", version, about = "Run untrusted code in disposable, isolated sandboxes")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon (HTTP API).
    Serve(ServeArgs),
    /// Run one command in a fresh sandbox, then destroy it. Uses the daemon at
    /// $GLOVEBOX_URL if set, otherwise runs embedded (no daemon needed; root required).
    Run(run::RunArgs),
    /// Manage sandboxes through the daemon.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Files in a sandbox, through the daemon.
    #[command(subcommand)]
    Files(FilesCmd),
    /// Serve the Model Context Protocol on stdio: tools that run code in one sandbox kept
    /// for the session. Uses the daemon at $GLOVEBOX_URL if set, otherwise runs embedded.
    Mcp(mcp::McpArgs),
    /// API keys of tenants (admin key).
    #[command(subcommand)]
    Keys(admin::KeysCmd),
    /// Tenant quotas (admin key to set).
    #[command(subcommand)]
    Quota(admin::QuotaCmd),
    /// Metered usage per tenant (CPU-seconds, memory GiB-seconds, wall time, egress).
    Usage {
        /// A tenant (admin key); default: the key's own tenant, or all for the admin.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Build and manage templates (root filesystems sandboxes start from).
    #[command(subcommand)]
    Template(template::TemplateCmd),
    /// Disk-backed volumes with a size cap that outlive sandboxes and daemon restarts.
    #[command(subcommand)]
    Volume(volume::VolumeCmd),
    /// Snapshots of sandboxes' files (take one with `glovebox sandbox snapshot ID NAME`).
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCmd),
    /// Check this host: kernel, namespaces, cgroups, mounts, seccomp, Landlock, nf_tables,
    /// templates and disk, then boot one sandbox. Prints each result with its fix.
    Doctor(doctor::DoctorArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions { shell: clap_complete::Shell },
    /// Write man pages (glovebox.1 and one per subcommand) into a directory.
    Man {
        /// Where to write them.
        dir: PathBuf,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Config file (TOML); flags and environment variables override it. Default:
    /// /etc/glovebox/config.toml when it exists.
    #[arg(long, env = "GLOVEBOX_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7171", env = "GLOVEBOX_LISTEN")]
    listen: String,
    /// Also listen here for agent-sandbox's router (Kubernetes): sandboxd and python-runtime
    /// routes only, the sandbox picked by the Host name `{claim}.{namespace}.svc…`, no API key
    /// asked (admit only the router to it; docs/scale-out.md). Off by default.
    #[arg(long, env = "GLOVEBOX_ROUTER_LISTEN", value_name = "ADDR")]
    router_listen: Option<String>,
    /// Data directory (state, sandboxes' private dirs, the API key).
    #[arg(long, default_value = "/var/lib/glovebox", env = "GLOVEBOX_DATA_DIR")]
    data_dir: PathBuf,
    /// API key to require (default: the one in <data-dir>/api-key, created on first start).
    #[arg(long, env = "GLOVEBOX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Sandboxes kept booted ahead of requests (default limits only; 0 disables).
    #[arg(long, default_value_t = 2, env = "GLOVEBOX_WARM_POOL")]
    warm_pool: usize,
    /// Network namespaces kept linked ahead for sandboxes whose policy is not deny-all
    /// (0 disables: each such create makes its own link).
    #[arg(long, default_value_t = 2, env = "GLOVEBOX_LINK_POOL")]
    link_pool: usize,
    /// Destroy every sandbox on SIGTERM/SIGINT (default: leave them running for the next
    /// start to re-adopt).
    #[arg(long, env = "GLOVEBOX_DESTROY_ON_EXIT", value_parser = BoolishValueParser::new())]
    destroy_on_exit: bool,
    /// Give code-interpreter sandboxes their python kernel forked from a zygote of their
    /// tenant and template (shares the imported libraries' memory; experimental, off by
    /// default; docs/benchmarks.md).
    #[arg(long, env = "GLOVEBOX_CODE_ZYGOTE", value_parser = BoolishValueParser::new())]
    code_zygote: bool,
    /// Turn the host's cgroup2 mount's `favordynmods` on at start (kept after the daemon
    /// stops): a create or first command after a quiet spell then no longer waits an RCU grace
    /// period to move a process into a cgroup, at a small cost to every fork and exit on the
    /// host (docs/install.md).
    #[arg(long, env = "GLOVEBOX_CGROUP_FAVOR_DYNMODS", value_parser = BoolishValueParser::new())]
    cgroup_favor_dynmods: bool,
    /// How long records of finished commands and ended sandboxes are kept, in seconds.
    #[arg(long, default_value_t = 86_400, env = "GLOVEBOX_RETENTION_S")]
    retention_s: u64,
    /// The base domain of exposed ports' preview hosts: port P of sandbox ID is served at
    /// `http://P-ID.<domain>:<listen port>/` (`*.localhost` needs no DNS in browsers).
    #[arg(long, default_value = "localhost", env = "GLOVEBOX_PREVIEW_DOMAIN")]
    preview_domain: String,
    /// The isolation of sandboxes whose create request and template name none: process
    /// (the jail) or gvisor (needs runsc; the daemon refuses to start without it).
    #[arg(long, default_value = "process", env = "GLOVEBOX_DEFAULT_ISOLATION", value_parser = str::parse::<api::Isolation>)]
    default_isolation: api::Isolation,
    /// Default sandbox limits (config file only).
    #[arg(skip)]
    limits: api::Limits,
}

impl ServeArgs {
    /// Fills every setting whose flag and env var were not given from the config file.
    fn apply_config(&mut self, m: &ArgMatches) -> Result<()> {
        let Some(path) = serve_config::locate(self.config.as_deref()) else { return Ok(()) };
        let f = serve_config::load(&path)?;
        let may = |id: &str| serve_config::file_may_set(m, id);
        if let Some(v) = f.listen.filter(|_| may("listen")) {
            self.listen = v;
        }
        if let Some(v) = f.router_listen.filter(|_| may("router_listen")) {
            self.router_listen = Some(v);
        }
        if let Some(v) = f.data_dir.filter(|_| may("data_dir")) {
            self.data_dir = v;
        }
        if let Some(v) = f.api_key.filter(|_| may("api_key")) {
            self.api_key = Some(v);
        }
        if let Some(v) = f.warm_pool.filter(|_| may("warm_pool")) {
            self.warm_pool = v;
        }
        if let Some(v) = f.link_pool.filter(|_| may("link_pool")) {
            self.link_pool = v;
        }
        if let Some(v) = f.destroy_on_exit.filter(|_| may("destroy_on_exit")) {
            self.destroy_on_exit = v;
        }
        if let Some(v) = f.code_zygote.filter(|_| may("code_zygote")) {
            self.code_zygote = v;
        }
        if let Some(v) = f.cgroup_favor_dynmods.filter(|_| may("cgroup_favor_dynmods")) {
            self.cgroup_favor_dynmods = v;
        }
        if let Some(v) = f.retention_s.filter(|_| may("retention_s")) {
            self.retention_s = v;
        }
        if let Some(v) = f.preview_domain.filter(|_| may("preview_domain")) {
            self.preview_domain = v;
        }
        if let Some(v) = f.default_isolation.filter(|_| may("default_isolation")) {
            self.default_isolation = v;
        }
        self.limits = f.limits.over(self.limits.clone());
        Ok(())
    }
}

#[derive(Args, Clone, Default)]
pub struct LimitArgs {
    /// Memory limit, e.g. 512M or 2G.
    #[arg(long)]
    pub memory: Option<String>,
    /// CPU quota in cores, e.g. 0.5.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Process limit.
    #[arg(long)]
    pub pids: Option<u64>,
    /// Disk cap for everything the sandbox writes, e.g. 1G.
    #[arg(long)]
    pub disk: Option<String>,
}

impl LimitArgs {
    pub fn resources(&self) -> Result<Resources> {
        Ok(Resources {
            cpus: self.cpus,
            memory_mb: self.memory.as_deref().map(units::size_mb).transpose()?,
            disk_mb: self.disk.as_deref().map(units::size_mb).transpose()?,
            pids: self.pids,
        })
    }
}

#[derive(Args, Clone, Default)]
pub struct NetArgs {
    /// Network mode: deny-all (default; loopback only), allow-list, allow-all.
    #[arg(long)]
    pub network: Option<String>,
    /// Allow a CIDR or IP, optionally with ports (`198.51.100.0/24:443`); implies allow-list.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// Deny a CIDR or IP (wins over allows).
    #[arg(long = "deny", value_name = "CIDR")]
    pub deny: Vec<String>,
}

impl NetArgs {
    pub fn policy(&self) -> Result<api::NetworkPolicy> {
        let mode = match self.network.as_deref() {
            None if !self.allow.is_empty() => api::NetworkMode::AllowList,
            None => api::NetworkMode::DenyAll,
            Some(m) => serde_json::from_value(serde_json::Value::String(m.to_string()))
                .map_err(|_| anyhow::anyhow!("--network must be deny-all, allow-list or allow-all"))?,
        };
        Ok(api::NetworkPolicy {
            mode,
            allow: self.allow.iter().map(|a| api::AllowRule::from(a.as_str())).collect(),
            deny: self.deny.clone(),
        })
    }
}

// Parsed once per process: a large `Create` costs nothing, and boxing its fields would only
// obscure the clap definitions.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum SandboxCmd {
    /// Create a sandbox and print its id.
    Create {
        /// Template to start from (`base`, `code-interpreter`, …).
        #[arg(long)]
        template: Option<String>,
        /// Lifetime, e.g. 300s, 10m.
        #[arg(long)]
        timeout: Option<String>,
        /// Stop after this long without activity, e.g. 5m (default: never).
        #[arg(long)]
        idle_timeout: Option<String>,
        /// What the idle timeout does: kill (default) or pause.
        #[arg(long, value_name = "kill|pause")]
        on_idle: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        net: NetArgs,
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        #[arg(long = "metadata", value_name = "K=V")]
        metadata: Vec<String>,
        /// Mount a volume: NAME:/path, or NAME:/path:ro for read-only (repeatable).
        #[arg(long = "volume", value_name = "NAME:/PATH[:ro]")]
        volumes: Vec<String>,
        /// Start from a snapshot of yours (its files are there at once; its template is used).
        #[arg(long)]
        snapshot: Option<String>,
        /// Which kernel its processes run on: process (the jail) or gvisor (default: the
        /// template's, else process).
        #[arg(long)]
        isolation: Option<String>,
    },
    /// Replace a sandbox's network policy (live; connections it no longer allows are reset).
    Network {
        id: String,
        #[command(flatten)]
        net: NetArgs,
    },
    /// List live sandboxes.
    Ls,
    /// Run a command in a sandbox and exit with its code.
    Exec {
        id: String,
        /// Time budget, e.g. 2s, 500ms (default 60s; 0 = only the sandbox lifetime bounds it).
        #[arg(long)]
        timeout: Option<String>,
        #[arg(long)]
        cwd: Option<String>,
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        #[arg(trailing_var_arg = true, required = true)]
        cmd: Vec<String>,
    },
    /// Open an interactive terminal in a sandbox: a login shell, or CMD (exits with its code).
    /// Ctrl-C and friends go to the program in the sandbox.
    Shell {
        id: String,
        /// Attach to a terminal command already running (its id) instead of starting one.
        #[arg(long, value_name = "CID", conflicts_with = "cmd")]
        attach: Option<u64>,
        #[arg(trailing_var_arg = true)]
        cmd: Vec<String>,
    },
    /// Run code in one of the sandbox's code contexts (state persists between calls).
    Code {
        id: String,
        /// python, javascript or bash.
        #[arg(long, default_value = "python")]
        language: String,
        /// A context id from `POST /v1/sandboxes/{id}/contexts` (default: the language's).
        #[arg(long)]
        context: Option<String>,
        /// Time budget, e.g. 10s (default 60s; 0 = only the sandbox lifetime bounds it).
        #[arg(long)]
        timeout: Option<String>,
        /// The code (`-` reads stdin).
        code: String,
    },
    /// Destroy a sandbox.
    Kill { id: String },
    /// Pause a sandbox: its processes frozen, its lifetime clock stopped (any request on it
    /// resumes it).
    Pause { id: String },
    /// Resume a paused sandbox.
    Resume { id: String },
    /// Snapshot a sandbox's files as NAME (frozen for the copy; processes are not kept).
    Snapshot { id: String, name: String },
    /// Fork a sandbox: new sandboxes starting from its current files, network policy, limits,
    /// environment and labels (running processes are not copied). Prints the children's ids.
    Fork {
        id: String,
        /// How many children (1-20).
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Expose PORT of a sandbox (a server listening inside it) and print its preview URL
    /// (with the port's token; `--public` needs none).
    Expose {
        id: String,
        port: u16,
        /// Reachable without the API key or the token.
        #[arg(long)]
        public: bool,
    },
}

#[derive(Subcommand)]
enum FilesCmd {
    /// Upload LOCAL to PATH in the sandbox.
    Put { id: String, local: PathBuf, path: String },
    /// Download PATH from the sandbox (to LOCAL, or stdout).
    Get { id: String, path: String, local: Option<PathBuf> },
    /// List a directory in the sandbox.
    Ls {
        id: String,
        #[arg(default_value = "/home/user")]
        path: String,
    },
}

fn main() {
    glovebox_daemon::limit_malloc_arenas();
    glovebox_daemon::raise_fd_limit();
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Cmd::Serve(a), Some(m)) = (&mut cli.cmd, matches.subcommand_matches("serve")) {
        if let Err(e) = a.apply_config(m) {
            eprintln!("glovebox: {e:#}");
            std::process::exit(EXIT_ERROR);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("GLOVEBOX_LOG").unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(if matches!(cli.cmd, Cmd::Serve(_)) { "info" } else { "warn" })
        }))
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a log file or the journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("glovebox: runtime: {e}");
            std::process::exit(EXIT_ERROR);
        }
    };
    let code = rt.block_on(async move {
        match dispatch(cli.cmd).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("glovebox: {e:#}");
                EXIT_ERROR
            }
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    std::process::exit(code);
}

async fn dispatch(cmd: Cmd) -> Result<i32> {
    match cmd {
        Cmd::Serve(a) => serve(a).await.map(|_| 0),
        Cmd::Run(a) => run::run(a).await,
        Cmd::Sandbox(c) => sandbox(c).await,
        Cmd::Files(c) => files(c).await,
        Cmd::Mcp(a) => mcp::run(a).await,
        Cmd::Keys(c) => admin::keys(c).await,
        Cmd::Quota(c) => admin::quota(c).await,
        Cmd::Usage { tenant } => admin::usage(tenant).await,
        Cmd::Template(c) => template::run(c).await,
        Cmd::Volume(c) => volume::run(c).await,
        Cmd::Snapshot(c) => snapshot::run(c).await,
        Cmd::Doctor(a) => doctor::run(a).await,
        Cmd::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "glovebox", &mut out);
            match std::io::stdout().write_all(&out) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("write completions"),
                _ => Ok(0),
            }
        }
        Cmd::Man { dir } => man_pages(&dir).map(|_| 0),
    }
}

/// `glovebox.1` and `glovebox-<sub>[-<subsub>].1` for every subcommand, from the CLI
/// definition itself.
fn man_pages(dir: &std::path::Path) -> Result<()> {
    fn write(cmd: &clap::Command, name: &str, dir: &std::path::Path) -> Result<()> {
        let cmd = cmd.clone().name(name.to_string());
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.clone()).render(&mut out).with_context(|| format!("render {name}"))?;
        std::fs::write(&path, out).with_context(|| format!("write {}", path.display()))?;
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            write(sub, &format!("{name}-{}", sub.get_name()), dir)?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    write(&cmd, "glovebox", dir)?;
    eprintln!("man pages written to {}", dir.display());
    Ok(())
}

async fn serve(a: ServeArgs) -> Result<()> {
    let key = match a.api_key {
        Some(k) if !k.trim().is_empty() => k.trim().to_string(),
        _ => {
            let (k, created) = glovebox_daemon::server::load_or_create_key(&a.data_dir).context("api key")?;
            if created {
                eprintln!("glovebox: created API key {k} (saved in {})", a.data_dir.join("api-key").display());
            }
            k
        }
    };
    let listener =
        tokio::net::TcpListener::bind(&a.listen).await.with_context(|| format!("cannot listen on {}", a.listen))?;
    let router = match &a.router_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--router-listen)"))?,
        ),
        None => None,
    };
    if a.cgroup_favor_dynmods {
        // Before the warm pool boots: its migrations are the first to gain.
        use glovebox_daemon::cgroup_tuning::{set_favor_dynmods, Favored};
        match set_favor_dynmods(true) {
            Ok(Favored::Already(p)) => tracing::info!("cgroup: favordynmods already on at {}", p.display()),
            Ok(Favored::Changed(p)) => tracing::info!("cgroup: favordynmods turned on at {} (stays on)", p.display()),
            Err(e) => tracing::warn!("cgroup: could not turn favordynmods on: {e}"),
        }
    }
    // Only now that key and port are ours: opening the manager boots the warm pool.
    let manager = embedded::open_daemon_manager(&a.data_dir, |cfg| {
        cfg.preview_domain = a.preview_domain.clone();
        cfg.defaults = a.limits.clone();
        cfg.warm_pool = a.warm_pool;
        cfg.link_pool = a.link_pool;
        cfg.code_zygote = a.code_zygote;
        cfg.retention = std::time::Duration::from_secs(a.retention_s);
        cfg.default_isolation = a.default_isolation;
    })?;
    tracing::info!("glovebox listening on http://{}", listener.local_addr()?);
    if let Some(r) = &router {
        tracing::info!(
            "router-facing listener (no API key: admit only agent-sandbox's router) on http://{}",
            r.local_addr()?
        );
    }
    let m = manager.clone();
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
    };
    glovebox_daemon::server::serve(manager, listener, router, key, shutdown).await?;
    if a.destroy_on_exit {
        m.destroy_all(api::EndReason::Killed).await;
    } else {
        m.leave_for_restart().await;
    }
    // Command records still queued for the store go in before the process ends.
    m.records.settle().await;
    Ok(())
}

/// The daemon's URL and key for the client commands.
pub fn remote() -> Result<Client> {
    let url = std::env::var("GLOVEBOX_URL").unwrap_or_else(|_| "http://127.0.0.1:7171".into());
    let key = match std::env::var("GLOVEBOX_API_KEY") {
        Ok(k) => k,
        Err(_) => {
            let dir = std::env::var("GLOVEBOX_DATA_DIR").unwrap_or_else(|_| "/var/lib/glovebox".into());
            std::fs::read_to_string(PathBuf::from(dir).join("api-key"))
                .map(|k| k.trim().to_string())
                .context("no API key: set GLOVEBOX_API_KEY (the daemon prints it on first start)")?
        }
    };
    Client::new(&url, &key)
}

pub fn kv(pairs: &[String], what: &str) -> Result<std::collections::BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("{what} must be K=V, got {p:?}"))
        })
        .collect()
}

/// `--isolation`: `process` or `gvisor`.
pub(crate) fn parse_isolation(s: Option<&str>) -> Result<Option<api::Isolation>> {
    s.map(str::parse).transpose().map_err(|_| anyhow::anyhow!("--isolation must be process or gvisor"))
}

async fn sandbox(c: SandboxCmd) -> Result<i32> {
    let client = remote()?;
    match c {
        SandboxCmd::Create {
            template,
            timeout,
            idle_timeout,
            on_idle,
            limits,
            net,
            env,
            metadata,
            volumes,
            snapshot,
            isolation,
        } => {
            let on_idle = on_idle
                .map(|o| serde_json::from_value(serde_json::Value::String(o)))
                .transpose()
                .map_err(|_| anyhow::anyhow!("--on-idle must be kill, pause or hibernate"))?;
            let req = CreateSandbox {
                template,
                network: net.policy()?,
                timeout_s: timeout.as_deref().map(units::duration_s).transpose()?,
                resources: limits.resources()?,
                env: kv(&env, "--env")?,
                metadata: kv(&metadata, "--metadata")?,
                idle_timeout_s: idle_timeout.as_deref().map(units::duration_s).transpose()?,
                on_idle,
                volumes: volumes.iter().map(|v| volume::parse_mount(v)).collect::<Result<_>>()?,
                auto_resume: None,
                snapshot,
                isolation: parse_isolation(isolation.as_deref())?,
            };
            let sb = client.create(&req).await?;
            println!("{}", sb.id);
        }
        SandboxCmd::Network { id, net } => {
            let sb: api::Sandbox = client
                .json(client.req(Method::PUT, &format!("/v1/sandboxes/{id}/network")).json(&net.policy()?))
                .await?;
            println!("{}", serde_json::to_string(&sb.network)?);
        }
        SandboxCmd::Ls => {
            let l: SandboxList = client.json(client.req(Method::GET, "/v1/sandboxes")).await?;
            println!("{:<18} {:<10} {:<26} EXPIRES", "ID", "STATE", "CREATED");
            for s in l.sandboxes {
                println!(
                    "{:<18} {:<10} {:<26} {}",
                    s.id,
                    format!("{:?}", s.state).to_lowercase(),
                    s.created_at,
                    s.expires_at
                );
            }
        }
        SandboxCmd::Exec { id, timeout, cwd, env, cmd } => {
            let req = ExecRequest {
                cmd: api::Command::Argv(cmd),
                cwd,
                env: kv(&env, "--env")?,
                stdin: None,
                stdin_base64: None,
                timeout_ms: timeout.as_deref().map(units::budget).transpose()?,
                max_output_bytes: None,
                output_tail_bytes: None,
                encoding: Encoding::Base64,
                background: false,
            };
            return run::stream_to_terminal(&client, &id, &req).await;
        }
        SandboxCmd::Shell { id, attach, cmd } => return shell::run(&client, &id, cmd, attach).await,
        SandboxCmd::Code { id, language, context, timeout, code } => {
            let code = if code == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("read code from stdin")?;
                s
            } else {
                code
            };
            let language: api::Language = serde_json::from_value(serde_json::Value::String(language))
                .map_err(|_| anyhow::anyhow!("--language must be python, javascript, typescript, r, java or bash"))?;
            let req = api::RunCode {
                code,
                language: Some(language),
                context_id: context,
                timeout_ms: timeout.as_deref().map(units::budget).transpose()?,
                env: Default::default(),
            };
            return run::code_to_terminal(&client, &id, &req).await;
        }
        SandboxCmd::Kill { id } => client.kill(&id).await?,
        SandboxCmd::Pause { id } => {
            let sb: api::Sandbox = client.json(client.req(Method::POST, &format!("/v1/sandboxes/{id}/pause"))).await?;
            println!("{}", sb.state.as_str());
        }
        SandboxCmd::Snapshot { id, name } => {
            let req =
                client.req(Method::POST, &format!("/v1/sandboxes/{id}/snapshots")).json(&api::CreateSnapshot { name });
            let s: api::SnapshotInfo = client.json(req).await?;
            println!("{}", s.name);
        }
        SandboxCmd::Fork { id, count } => {
            let req = client
                .req(Method::POST, &format!("/v1/sandboxes/{id}/fork"))
                .json(&api::ForkSandbox { count: Some(count) });
            let f: api::Forked = client.json(req).await?;
            for c in f.sandboxes {
                println!("{}", c.id);
            }
        }
        SandboxCmd::Resume { id } => {
            let sb: api::Sandbox = client.json(client.req(Method::POST, &format!("/v1/sandboxes/{id}/resume"))).await?;
            println!("{}", sb.state.as_str());
        }
        SandboxCmd::Expose { id, port, public } => {
            let req =
                client.req(Method::POST, &format!("/v1/sandboxes/{id}/ports/{port}")).json(&api::ExposePort { public });
            let p: api::ExposedPort = client.json(req).await?;
            if p.public {
                println!("{}", p.url);
            } else {
                println!("{}?gb_token={}", p.url, p.token);
            }
        }
    }
    Ok(0)
}

async fn files(c: FilesCmd) -> Result<i32> {
    let client = remote()?;
    match c {
        FilesCmd::Put { id, local, path } => {
            let info = run::upload(&client, &id, &local, &path).await?;
            println!("{} ({} bytes)", info.path, info.size);
        }
        FilesCmd::Get { id, path, local } => {
            let resp = client
                .send(client.req(Method::GET, &format!("/v1/sandboxes/{id}/files")).query(&[("path", &path)]))
                .await?;
            let mut stream = resp.bytes_stream();
            use futures_util::StreamExt;
            let mut out: Box<dyn Write> = match &local {
                Some(p) => Box::new(std::fs::File::create(p).with_context(|| format!("create {}", p.display()))?),
                None => Box::new(std::io::stdout().lock()),
            };
            while let Some(chunk) = stream.next().await {
                out.write_all(&chunk.context("download interrupted")?)?;
            }
            out.flush()?;
        }
        FilesCmd::Ls { id, path } => {
            let e: api::Entries = client
                .json(client.req(Method::GET, &format!("/v1/sandboxes/{id}/files/list")).query(&[("path", &path)]))
                .await?;
            for f in e.entries {
                let kind = match f.kind {
                    api::FileType::Dir => "d",
                    api::FileType::Symlink => "l",
                    api::FileType::File => "-",
                    api::FileType::Other => "?",
                };
                println!("{kind} {:>10} {:o} {}", f.size, f.mode & 0o7777, f.path);
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held while a test's environment variable is set: every parse reads the environment.
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// `serve` parsed from `argv` with the config file `toml`, as `main` does it.
    fn serve_with(argv: &[&str], toml: &str) -> Result<ServeArgs> {
        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
        parse_serve(argv, toml)
    }

    /// [`serve_with`] with `key=value` in the environment meanwhile.
    fn serve_with_env(key: &str, value: &str, argv: &[&str], toml: &str) -> Result<ServeArgs> {
        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
        std::env::set_var(key, value);
        let r = parse_serve(argv, toml);
        std::env::remove_var(key);
        r
    }

    fn parse_serve(argv: &[&str], toml: &str) -> Result<ServeArgs> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("config.toml");
        std::fs::write(&path, toml)?;
        let mut full = vec!["glovebox", "serve", "--config", path.to_str().context("utf-8 path")?];
        full.extend_from_slice(argv);
        let m = Cli::command().try_get_matches_from(full)?;
        let Cmd::Serve(mut a) = Cli::from_arg_matches(&m)?.cmd else { anyhow::bail!("not serve") };
        a.apply_config(m.subcommand_matches("serve").context("serve matches")?)?;
        Ok(a)
    }

    #[test]
    fn the_preview_domain_comes_from_the_flag_the_file_or_the_default() {
        let pick = |argv: &[&str], toml: &str| serve_with(argv, toml).map(|a| a.preview_domain).unwrap();
        assert_eq!(pick(&[], ""), "localhost");
        assert_eq!(pick(&[], "preview_domain = \"p.example\"\n"), "p.example");
        assert_eq!(pick(&["--preview-domain", "q.example"], "preview_domain = \"p.example\"\n"), "q.example");
    }

    #[test]
    fn the_router_listener_is_off_unless_asked_for() {
        let pick = |argv: &[&str], toml: &str| serve_with(argv, toml).map(|a| a.router_listen).unwrap();
        assert_eq!(pick(&[], ""), None);
        assert_eq!(pick(&[], "router_listen = \"0.0.0.0:8888\"\n").as_deref(), Some("0.0.0.0:8888"));
        let flag = pick(&["--router-listen", "127.0.0.1:9999"], "router_listen = \"0.0.0.0:8888\"\n");
        assert_eq!(flag.as_deref(), Some("127.0.0.1:9999"));
    }

    #[test]
    fn the_default_isolation_comes_from_the_flag_the_file_or_the_default() {
        let pick = |argv: &[&str], toml: &str| serve_with(argv, toml).map(|a| a.default_isolation);
        assert_eq!(pick(&[], "").unwrap(), api::Isolation::Process);
        assert_eq!(pick(&[], "default_isolation = \"gvisor\"\n").unwrap(), api::Isolation::Gvisor);
        let flag = pick(&["--default-isolation", "process"], "default_isolation = \"gvisor\"\n");
        assert_eq!(flag.unwrap(), api::Isolation::Process);
        let e = pick(&["--default-isolation", "vm"], "").err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("unknown isolation \"vm\" (process or gvisor)"), "{e}");
    }

    #[test]
    fn file_beats_built_in_default() {
        let a = serve_with(
            &[],
            "listen = \"127.0.0.1:7181\"\nwarm_pool = 0\nretention_s = 60\n[limits]\nmemory_mb = 2048\n",
        )
        .unwrap();
        assert_eq!(a.listen, "127.0.0.1:7181");
        assert_eq!((a.warm_pool, a.retention_s), (0, 60));
        assert_eq!((a.limits.memory_mb, a.limits.pids), (2048, api::Limits::default().pids));
    }

    #[test]
    fn flag_beats_file() {
        let a =
            serve_with(&["--warm-pool", "5", "--destroy-on-exit"], "warm_pool = 1\ndestroy_on_exit = false\n").unwrap();
        assert_eq!(a.warm_pool, 5);
        assert!(a.destroy_on_exit);
    }

    #[test]
    fn env_beats_file_and_flag_beats_env() {
        let from_env = serve_with_env("GLOVEBOX_LINK_POOL", "7", &[], "link_pool = 1\n").map(|a| a.link_pool);
        let from_flag =
            serve_with_env("GLOVEBOX_LINK_POOL", "7", &["--link-pool", "9"], "link_pool = 1\n").map(|a| a.link_pool);
        assert_eq!(from_env.unwrap(), 7);
        assert_eq!(from_flag.unwrap(), 9);
    }

    #[test]
    fn boolean_settings_take_one_and_zero_from_the_environment() {
        let pick = |v: &str| {
            serve_with_env("GLOVEBOX_CODE_ZYGOTE", v, &[], "").map(|a| a.code_zygote).map_err(|e| format!("{e:#}"))
        };
        for (v, want) in [("1", true), ("true", true), ("yes", true), ("on", true), ("0", false), ("false", false)] {
            assert_eq!(pick(v), Ok(want), "GLOVEBOX_CODE_ZYGOTE={v}");
        }
        let e = pick("maybe").unwrap_err();
        assert!(e.contains("maybe"), "{e}");
        assert!(serve_with(&["--code-zygote"], "").unwrap().code_zygote);
    }

    #[test]
    fn bad_file_is_an_error_naming_it() {
        let e = serve_with(&[], "link_pool = \"two\"\n").err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("config.toml: key `link_pool`"), "{e}");
        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
        let e = Cli::command()
            .try_get_matches_from(["glovebox", "serve", "--config", "/nonexistent/glovebox.toml"])
            .map_err(anyhow::Error::from)
            .and_then(|m| {
                let Cmd::Serve(mut a) = Cli::from_arg_matches(&m)?.cmd else { anyhow::bail!("not serve") };
                a.apply_config(m.subcommand_matches("serve").context("serve matches")?)
            });
        assert!(format!("{:#}", e.unwrap_err()).contains("/nonexistent/glovebox.toml"));
    }
}
