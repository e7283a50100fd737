//! `glovebox-agent`: PID 1 of every sandbox.
//!
//! Started by the daemon as `glovebox-agent jail` (config on stdin); the jailer half
//! (`glovebox_jail::jailer`) builds the sandbox and returns here only inside it. From then on
//! this process reaps every orphan, runs commands, and serves file requests, one request per
//! connection on the listening socket the jailer bound on the host side. Before it forks
//! anything it confines itself ([`confine`]): everything it starts inherits that.

mod capped;
mod conn;
mod exec;
mod files;
mod forward;
mod spare;
mod walk;
mod watch;
mod zygote;

use std::sync::Arc;

use glovebox_proto::agent::{ErrorCode, Reply, Request, VERSION};
use glovebox_proto::frame::Kind;
use tokio::net::UnixListener;

const HOME: &str = "/home/user";

fn main() {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("jail") => {
            let booted = glovebox_jail::jailer::main_from_stdin();
            std::process::exit(serve(booted));
        }
        // The gVisor tier's host-side helper: builds the root, starts runsc, never returns.
        Some("gvisor") => glovebox_jail::gvisor::main_from_stdin(),
        // PID 1 of a guest kernel (gVisor's sentry): the runtime made the sandbox.
        Some("init") => {
            let rest: Vec<String> = args.collect();
            let booted = glovebox_jail::guest::InitArgs::parse(&rest).and_then(|a| glovebox_jail::guest::init(&a));
            match booted {
                Ok(b) => std::process::exit(serve(b)),
                Err(e) => {
                    eprintln!("agent: init: {e}");
                    std::process::exit(1);
                }
            }
        }
        Some("spare") => spare::main(),
        Some("zygote") => zygote::main(),
        // A template's python kernel zygote (host side: builds its root, drops to its uid).
        Some("kernel-zygote") => glovebox_jail::kzygote::main_from_stdin(),
        Some("--version") => println!("glovebox-agent {}", env!("CARGO_PKG_VERSION")),
        _ => {
            eprintln!("glovebox-agent: started by the glovebox daemon as `glovebox-agent jail`, not by hand");
            std::process::exit(2);
        }
    }
}

fn serve(booted: glovebox_jail::jailer::Booted) -> i32 {
    // The daemon compiles the filter once for every sandbox; compiling it here (the
    // policy's parse is most of a millisecond) is the fallback.
    let compiled = match booted.seccomp {
        Some(p) => Ok(p),
        None => glovebox_jail::seccomp::compile(),
    };
    let seccomp = match compiled {
        Ok(p) => Arc::new(p),
        Err(e) => {
            eprintln!("agent: seccomp: {e}");
            return 1;
        }
    };
    // Before anything is forked (and while single-threaded, as both apply to the calling
    // thread): the zygote, the spares and every command inherit it.
    if let Err(e) = confine(booted.agent_seccomp) {
        eprintln!("agent: {e}");
        return 1;
    }
    // Still single-threaded: the one moment the zygote can be forked without an exec.
    let setup = glovebox_jail::child::ChildSetup::root(seccomp.clone());
    let zygote = match zygote::Zygote::fork_at_boot(&setup) {
        Ok(z) => Some(z),
        Err(e) => {
            eprintln!("agent: zygote: {e}; starting one later");
            None
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().max_blocking_threads(8).build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agent: runtime: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        let files = match files::Files::open(std::path::Path::new("/"), HOME) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                eprintln!("agent: open root: {e}");
                return 1;
            }
        };
        let exec = match exec::Exec::start(booted.command_cgroup, seccomp, HOME, zygote) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("agent: {e}");
                return 1;
            }
        };
        let std_listener = std::os::unix::net::UnixListener::from(booted.listener);
        if let Err(e) = std_listener.set_nonblocking(true) {
            eprintln!("agent: listener: {e}");
            return 1;
        }
        let listener = match UnixListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("agent: listener: {e}");
                return 1;
            }
        };
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    eprintln!("agent: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let exec = exec.clone();
            let files = files.clone();
            tokio::spawn(async move {
                if let Err(e) = handle(stream, &exec, &files).await {
                    eprintln!("agent: connection: {e}");
                }
            });
        }
    })
}

/// The agent confines itself: Landlock where the kernel has it (best effort, logged when it
/// cannot), then its own seccomp filter (fails closed: a sandbox whose agent runs unfiltered
/// does not start). Landlock first, so the filter need not allow the Landlock calls. What
/// each refuses, and why no more: `glovebox_jail::landlock`, `seccomp/agent.json`.
fn confine(prog: Option<seccompiler::BpfProgram>) -> Result<(), String> {
    match glovebox_jail::landlock::restrict_self() {
        Ok(glovebox_jail::landlock::Outcome::Enforced(_)) => {}
        Ok(glovebox_jail::landlock::Outcome::Unsupported(why)) => eprintln!("agent: {why}; running without it"),
        Err(e) => eprintln!("agent: landlock: {e}; running without it"),
    }
    let prog = match prog {
        Some(p) => p,
        None => glovebox_jail::seccomp::compile_agent().map_err(|e| format!("agent seccomp: {e}"))?,
    };
    glovebox_jail::seccomp::install(&prog).map_err(|e| format!("agent seccomp: {e}"))
}

async fn handle(
    stream: tokio::net::UnixStream,
    exec: &exec::Exec,
    files: &files::Files,
) -> Result<(), conn::ConnError> {
    let (mut r, mut w) = conn::split(stream);
    let Some((kind, body)) = r.next().await? else { return Ok(()) };
    if kind != Kind::Json {
        return w.error(ErrorCode::Protocol, "expected a request").await;
    }
    let req: Request = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return w.error(ErrorCode::Protocol, format!("bad request: {e}")).await,
    };
    match req {
        Request::Ping => w.json(&Reply::Pong { version: VERSION }).await,
        Request::Exec(spec) => exec.run(spec, r, w).await,
        Request::Attach { id } => exec.attach(id, &mut w).await,
        Request::Session { id } => exec.session(id, r, &mut w).await,
        Request::Resize { id, cols, rows } => {
            exec.resize(id, glovebox_proto::agent::PtySize { cols, rows }, &mut w).await
        }
        Request::Signal { id, signal } => exec.signal(id, signal, &mut w).await,
        Request::Stdin { id } => exec.stdin(id, &mut r, &mut w).await,
        Request::CloseStdin { id } => exec.close_stdin(id, &mut w).await,
        Request::List => exec.list(&mut w).await,
        Request::Release { id } => exec.release(id, &mut w).await,
        Request::Usage => exec.usage(&mut w).await,
        req @ (Request::ReadFile { .. }
        | Request::WriteFile { .. }
        | Request::ListDir { .. }
        | Request::Stat { .. }
        | Request::MakeDir { .. }
        | Request::Remove { .. }
        | Request::Rename { .. }) => files.handle(req, &mut r, &mut w).await,
        Request::WatchDir { path, recursive } => watch::serve(files, &path, recursive, r, w).await,
        Request::ConnectPort { port } => forward::connect_port(port, r, w).await,
        Request::EndData | Request::EndStdin | Request::WatchSync => {
            w.error(ErrorCode::Protocol, "unexpected message").await
        }
    }
}
