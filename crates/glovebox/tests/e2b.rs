//! E2B compatibility: the official SDKs (pinned versions, installed by `tests/e2b/setup.sh`
//! from PyPI and npm), unmodified, against a daemon this test starts. The SDKs are pointed
//! at it the documented way: `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY`. Each
//! script in `tests/e2b/` asserts what a user would see and prints one `ok:` line a check.

mod common;
mod inet;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{run_bounded, Daemon};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b")
}

/// The SDKs, installed once per test run (`None` with the reason if that failed).
fn sdk() -> &'static Result<PathBuf, String> {
    static SDK: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    SDK.get_or_init(|| {
        let dest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        let out = run_bounded(
            Command::new("bash").arg(scripts().join("setup.sh")).arg(&dest),
            None,
            Duration::from_secs(600),
        );
        if out.code() != Some(0) {
            return Err(format!("setup.sh failed:\n{}\n{}", out.stdout_str(), out.stderr_str()));
        }
        Ok(dest)
    })
}

fn sdk_dir() -> PathBuf {
    match sdk() {
        Ok(d) => d.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// Runs `script` (Python, with the venv) or a `.mjs` (Node) against `d`; returns stdout
/// after asserting it passed all its checks (at least `min_checks`).
fn run_script(d: &Daemon, script: &str, min_checks: usize, timeout: Duration, env: &[(&str, &str)]) -> String {
    let dir = sdk_dir();
    let mut cmd = if script.ends_with(".mjs") {
        // ES modules resolve packages from the script's own directory up: run a copy that
        // sits beside the installed node_modules.
        let copy = dir.join("e2b-node").join(script);
        std::fs::copy(scripts().join(script), &copy).expect("copy the node script");
        let mut c = Command::new("node");
        c.arg(copy);
        c
    } else {
        let mut c = Command::new(dir.join("e2b-venv/bin/python"));
        c.arg("-u").arg(scripts().join(script));
        c
    };
    cmd.current_dir(scripts())
        .env("E2B_API_URL", &d.url)
        .env("E2B_SANDBOX_URL", &d.url)
        .env("E2B_API_KEY", &d.key)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_ACCESS_TOKEN")
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
    let closing = stdout.lines().any(|l| l.starts_with("e2b ") && l.ends_with("checks ok"));
    assert!(closing, "{script} did not finish:\n{stdout}");
    if !script.ends_with(".mjs") {
        assert!(oks >= min_checks, "{script} ran {oks} checks, expected at least {min_checks}:\n{stdout}");
    }
    eprintln!("{script}: {oks} checks in {:?}", out.elapsed);
    stdout
}

/// The code-interpreter template (built by scripts/test), if this run has it.
fn templates_dir() -> Option<String> {
    let dir = std::env::var("GLOVEBOX_TEMPLATES_DIR").ok()?;
    Path::new(&dir).join("templates/code-interpreter.json").is_file().then_some(dir)
}

#[test]
fn sandbox_lifecycle() {
    require_root!();
    let d = Daemon::start();
    run_script(&d, "lifecycle.py", 55, Duration::from_secs(180), &[]);
    d.shutdown_and_check_leaks();
}

#[test]
fn commands() {
    require_root!();
    let d = Daemon::start();
    run_script(&d, "commands.py", 30, Duration::from_secs(180), &[]);
    d.shutdown_and_check_leaks();
}

#[test]
fn envd_surface() {
    require_root!();
    let d = Daemon::start();
    run_script(&d, "envd.py", 27, Duration::from_secs(240), &[]);
    d.shutdown_and_check_leaks();
}

#[test]
fn files() {
    require_root!();
    let d = Daemon::start();
    run_script(&d, "files.py", 30, Duration::from_secs(240), &[]);
    d.shutdown_and_check_leaks();
}

#[test]
fn code_interpreter_tutorial() {
    require_root!();
    let Some(_) = templates_dir() else {
        eprintln!("SKIPPED: GLOVEBOX_TEMPLATES_DIR has no code-interpreter template (scripts/test builds it)");
        return;
    };
    let d = Daemon::start();
    run_script(&d, "code_interpreter.py", 16, Duration::from_secs(300), &[]);
    d.shutdown_and_check_leaks();
}

/// The seed tutorial's CSV pipeline with the default deny-all network: `pip install` inside
/// the sandbox succeeds because the template already has the packages.
#[test]
fn csv_pipeline_offline() {
    require_root!();
    let Some(_) = templates_dir() else {
        eprintln!("SKIPPED: GLOVEBOX_TEMPLATES_DIR has no code-interpreter template (scripts/test builds it)");
        return;
    };
    let d = Daemon::start();
    run_script(&d, "csv_pipeline.py", 8, Duration::from_secs(300), &[]);
    d.shutdown_and_check_leaks();
}

/// The template's python kernel is IPython.
#[test]
fn code_interpreter_ipython() {
    require_root!();
    let Some(_) = templates_dir() else {
        eprintln!("SKIPPED: GLOVEBOX_TEMPLATES_DIR has no code-interpreter template (scripts/test builds it)");
        return;
    };
    let d = Daemon::start();
    run_script(&d, "ipython.py", 50, Duration::from_secs(300), &[]);
    d.shutdown_and_check_leaks();
}

#[test]
fn node_sdk_smoke() {
    require_root!();
    let Some(_) = templates_dir() else {
        eprintln!("SKIPPED: GLOVEBOX_TEMPLATES_DIR has no code-interpreter template (scripts/test builds it)");
        return;
    };
    if !sdk_dir().join("e2b-node/node_modules/@e2b/code-interpreter").is_dir() {
        panic!("npm did not install @e2b/code-interpreter (is npm installed? scripts/deps installs it)");
    }
    let d = Daemon::start();
    run_script(&d, "smoke.mjs", 0, Duration::from_secs(300), &[]);
    d.shutdown_and_check_leaks();
}

#[test]
fn network_options() {
    require_root!();
    let inet = inet::Internet::start();
    // The fixture answers the host, so a block seen from a sandbox is the policy's doing.
    let probe = run_bounded(
        Command::new("python3").args([
            "-c",
            "import urllib.request; print(urllib.request.urlopen('http://198.51.100.10:8080/', timeout=3).status)",
        ]),
        None,
        Duration::from_secs(10),
    );
    assert_eq!(probe.stdout_str().trim(), "200", "the canary answers the host: {}", probe.stderr_str());
    let d = Daemon::start();
    let log = inet.log.display().to_string();
    run_script(
        &d,
        "network.py",
        15,
        Duration::from_secs(240),
        &[("GLOVEBOX_TEST_CANARY_LOG", &log), ("GLOVEBOX_TEST_OTHER_LOG", &format!("{log}.evil"))],
    );
    d.shutdown_and_check_leaks();
    drop(inet);
}
