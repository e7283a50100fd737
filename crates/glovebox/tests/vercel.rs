//! Vercel Sandbox compatibility: the official `@vercel/sandbox` SDK (the version pinned in
//! `tests/vercel/package.json`, installed from npm by `tests/vercel/setup.sh`), unmodified,
//! against a daemon this test starts. The SDK is pointed at it the documented way: a `fetch`
//! that rewrites its API base to `<daemon>/vercel`, and the daemon's key as the token.
//!
//! `ports.mjs` reaches a server inside a sandbox at the SDK's `domain(port)`.
//!
//! The network checks use the test's own internet (`inet`): a canary listener the sandbox
//! must (allow-all) or must not (deny-all, allow-list) reach, and an HTTPS server that logs
//! the Authorization header a brokering rule adds outside the sandbox.

mod common;
mod inet;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::{rand_token, run_bounded, Daemon};
use inet::{Internet, NET};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vercel")
}

/// Installs the pinned SDK under target/ (cached, once per run) and returns its directory.
fn sdk_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(install_sdk).clone()
}

fn install_sdk() -> PathBuf {
    let dest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let out =
        run_bounded(Command::new("bash").arg(scripts().join("setup.sh")).arg(&dest), None, Duration::from_secs(600));
    assert_eq!(out.code(), Some(0), "setup.sh failed:\n{}\n{}", out.stdout_str(), out.stderr_str());
    dest.join("vercel-node")
}

/// Daemons start one at a time: one test points its daemon's DNS at the test internet
/// through the environment, which the others must not inherit.
static START: Mutex<()> = Mutex::new(());

/// Runs `script` (copied, with the helpers it imports, beside the installed node_modules,
/// since ES modules resolve packages from their own directory up) against `d`; returns its
/// stdout after asserting it finished with at least `min_checks` checks.
fn run_script(d: &Daemon, script: &str, min_checks: usize, env: &[(&str, &str)]) -> String {
    let copy = sdk_dir().join(script);
    for f in [script, "checks.mjs"] {
        std::fs::copy(scripts().join(f), sdk_dir().join(f)).expect("copy the script");
    }
    let mut cmd = Command::new("node");
    cmd.arg(&copy)
        .env("GLOVEBOX_URL", &d.url)
        .env("GLOVEBOX_API_KEY", &d.key)
        .env_remove("VERCEL_OIDC_TOKEN")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_bounded(&mut cmd, None, Duration::from_secs(180));
    let stdout = out.stdout_str();
    assert_eq!(
        out.code(),
        Some(0),
        "{script} failed after {:?}:\n--- stdout\n{stdout}\n--- stderr\n{}\n--- daemon log\n{}",
        out.elapsed,
        out.stderr_str(),
        d.log()
    );
    assert!(stdout.lines().any(|l| l.starts_with("vercel ") && l.ends_with("checks ok")), "did not finish:\n{stdout}");
    let oks = stdout.lines().filter(|l| l.starts_with("ok: ")).count();
    assert!(oks >= min_checks, "{script} ran {oks} checks:\n{stdout}");
    eprintln!("{stdout}{script}: {oks} checks in {:?}", out.elapsed);
    stdout
}

#[test]
fn official_sdk_runs_against_glovebox() {
    require_root!();
    let inet = Internet::start();
    let d = {
        let _one = START.lock().unwrap_or_else(|p| p.into_inner());
        // Names resolve at the test internet, whose HTTPS server only the daemon trusts.
        std::env::set_var("GLOVEBOX_DNS_UPSTREAM", format!("{NET}:53"));
        std::env::set_var("GLOVEBOX_UPSTREAM_CA", &inet.ca);
        let d = Daemon::start();
        std::env::remove_var("GLOVEBOX_DNS_UPSTREAM");
        std::env::remove_var("GLOVEBOX_UPSTREAM_CA");
        d
    };
    let secret = format!("vercel-secret-{}", rand_token(24));
    let log = inet.log.display().to_string();
    run_script(&d, "sdk.mjs", 45, &[("GLOVEBOX_TEST_CANARY_LOG", &log), ("GLOVEBOX_TEST_SECRET", &secret)]);
    assert!(!d.log().contains(&secret), "the brokered secret is not logged");
    d.shutdown_and_check_leaks();
    drop(inet);
}

/// `ports` at create and update, `routes`, `domain(port)` with a path appended: private
/// (the URL is the token), another port's token refused, public through the native API.
#[test]
fn preview_ports() {
    require_root!();
    let d = {
        let _one = START.lock().unwrap_or_else(|p| p.into_inner());
        Daemon::start()
    };
    run_script(&d, "ports.mjs", 25, &[]);
    d.shutdown_and_check_leaks();
}

/// Install then lock down, against the public npm registry (reachable from CI).
#[test]
fn install_then_lock_down() {
    require_root!();
    let d = {
        let _one = START.lock().unwrap_or_else(|p| p.into_inner());
        Daemon::start()
    };
    run_script(&d, "install.mjs", 10, &[]);
    d.shutdown_and_check_leaks();
}
