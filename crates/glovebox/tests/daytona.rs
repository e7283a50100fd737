//! Daytona compatibility: the official `daytona` Python SDK (a pinned version, installed by
//! `tests/daytona/setup.sh` from PyPI), unmodified, against a daemon this test starts. The SDK
//! is pointed at it the documented way: `DaytonaConfig(api_key=…, api_url=…)` with
//! `api_url = <daemon>/daytona/api`. Each script in `tests/daytona/` asserts what a user would
//! see and prints one `ok:` line a check.

mod common;
mod inet;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{run_bounded, Daemon};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/daytona")
}

/// The SDK's venv, installed once per test run (or why that failed).
fn venv() -> PathBuf {
    static SDK: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let sdk = SDK.get_or_init(|| {
        let dest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        let out = run_bounded(
            Command::new("bash").arg(scripts().join("setup.sh")).arg(&dest),
            None,
            Duration::from_secs(600),
        );
        if out.code() != Some(0) {
            return Err(format!("setup.sh failed:\n{}\n{}", out.stdout_str(), out.stderr_str()));
        }
        Ok(dest.join("daytona-venv"))
    });
    match sdk {
        Ok(d) => d.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// Runs `script` with the venv's Python against `d`; returns its stdout after asserting it
/// passed all its checks (at least `min_checks`).
fn run_script(d: &Daemon, script: &str, min_checks: usize, timeout: Duration, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(venv().join("bin/python"));
    cmd.arg("-u")
        .arg(scripts().join(script))
        .current_dir(scripts())
        .env("DAYTONA_API_URL", format!("{}/daytona/api", d.url))
        .env("DAYTONA_API_KEY", &d.key)
        .env_remove("DAYTONA_JWT_TOKEN")
        .env_remove("DAYTONA_ORGANIZATION_ID")
        .env_remove("DAYTONA_TARGET")
        .env_remove("DAYTONA_USE_DEPRECATED_POLLING")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_bounded(&mut cmd, None, timeout);
    let stdout = out.stdout_str();
    assert_eq!(
        out.code(),
        Some(0),
        "{script} failed after {:?}:\n--- stdout\n{stdout}\n--- stderr\n{}\n--- daemon log\n{}",
        out.elapsed,
        out.stderr_str(),
        d.log()
    );
    let oks = stdout.lines().filter(|l| l.starts_with("ok: ")).count();
    let closing = stdout.lines().any(|l| l.starts_with("daytona ") && l.ends_with("checks ok"));
    assert!(closing, "{script} did not finish:\n{stdout}");
    assert!(oks >= min_checks, "{script} ran {oks} checks, expected at least {min_checks}:\n{stdout}");
    eprintln!("{script}: {oks} checks in {:?}", out.elapsed);
    stdout
}

/// The program: block-all, ephemeral, auto-stop 5, code_run, delete.
#[test]
fn seed_program() {
    require_root!();
    let d = Daemon::start();
    let out = run_script(&d, "seed.py", 14, Duration::from_secs(120), &[]);
    if let Some(ms) = out.lines().find(|l| l.starts_with("create_ms: ")) {
        eprintln!("daytona create through the SDK: {}", ms.trim_start_matches("create_ms: "));
    }
    d.shutdown_and_check_leaks();
}

#[test]
fn everyday_surface() {
    require_root!();
    let d = Daemon::start();
    run_script(&d, "everyday.py", 91, Duration::from_secs(180), &[]);
    d.shutdown_and_check_leaks();
}

/// Preview links: the header token, signed URLs (expiring, revocable), public sandboxes.
#[test]
fn preview_links() {
    require_root!();
    let d = Daemon::start();
    run_script(&d, "previews.py", 30, Duration::from_secs(180), &[]);
    d.shutdown_and_check_leaks();
}

#[test]
fn network_rules() {
    require_root!();
    let inet = inet::Internet::start();
    let d = Daemon::start();
    let log = inet.log.display().to_string();
    run_script(
        &d,
        "network.py",
        13,
        Duration::from_secs(180),
        &[("GLOVEBOX_TEST_CANARY_LOG", &log), ("GLOVEBOX_TEST_OTHER_LOG", &format!("{log}.evil"))],
    );
    d.shutdown_and_check_leaks();
    drop(inet);
}
