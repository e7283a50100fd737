//! The official E2B Python suites — `e2b-dev/E2B`'s `packages/python-sdk/tests/sync` and
//! `e2b-dev/code-interpreter`'s `python/tests/{sync,images,charts}`, vendored unmodified
//! under `tests/e2b-official/` at the commits named in its README — against a daemon this
//! test starts, with the SDK versions those commits were written for.
//!
//! `tests/e2b-official/run.py` judges a run: each test passes or is listed in
//! `expectations.txt` with the reason (tests that would reach the internet or belong to other
//! issues are not run at all). It prints `N passed, N failed` per suite; the line is also
//! appended to `target/e2b-official-summary.txt`, which `scripts/test` prints at the end.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{run_bounded, Daemon};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv with the pinned SDKs and pytest, installed once per run.
fn venv_python() -> PathBuf {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = VENV.get_or_init(|| {
        let dest = root().join("target");
        let out = run_bounded(
            Command::new("bash").arg(root().join("tests/e2b-official/setup.sh")).arg(&dest),
            None,
            Duration::from_secs(600),
        );
        if out.code() != Some(0) {
            return Err(format!("setup.sh failed:\n{}\n{}", out.stdout_str(), out.stderr_str()));
        }
        Ok(dest.join("e2b-official-venv/bin/python"))
    });
    match r {
        Ok(p) => p.clone(),
        Err(e) => panic!("{e}"),
    }
}

fn run_suite(suite: &str, d: &Daemon) {
    let python = venv_python();
    let mut cmd = Command::new(&python);
    cmd.arg(root().join("tests/e2b-official/run.py"))
        .arg(suite)
        .arg("--python")
        .arg(&python)
        .env("E2B_API_URL", &d.url)
        .env("E2B_SANDBOX_URL", &d.url)
        .env("E2B_API_KEY", &d.key)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_ACCESS_TOKEN")
        .env_remove("E2B_TESTS_TEMPLATE")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy");
    let out = run_bounded(&mut cmd, None, Duration::from_secs(1500));
    let stdout = out.stdout_str();
    let summary: Vec<&str> = stdout.lines().filter(|l| l.starts_with(&format!("{suite}: "))).collect();
    if let Ok(mut f) =
        std::fs::OpenOptions::new().create(true).append(true).open(root().join("target/e2b-official-summary.txt"))
    {
        for l in &summary {
            let _ = writeln!(f, "{l}");
        }
    }
    eprintln!("{}", summary.join("\n"));
    assert_eq!(
        out.code(),
        Some(0),
        "the official {suite} suite failed after {:?}:\n--- stdout\n{stdout}\n--- stderr\n{}\n--- daemon log (tail)\n{}",
        out.elapsed,
        out.stderr_str(),
        tail(&d.log(), 200)
    );
    assert!(summary.iter().any(|l| l.contains(" passed, ")), "run.py printed no summary:\n{stdout}");
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

#[test]
fn official_e2b_python_suite() {
    require_root!();
    let d = Daemon::start_with_pool(2);
    run_suite("e2b", &d);
    d.shutdown_and_check_leaks();
}

#[test]
fn official_code_interpreter_python_suite() {
    require_root!();
    let dir = std::env::var("GLOVEBOX_TEMPLATES_DIR").unwrap_or_default();
    assert!(
        Path::new(&dir).join("templates/code-interpreter.json").is_file(),
        "GLOVEBOX_TEMPLATES_DIR ({dir:?}) has no code-interpreter template: run the suite with scripts/test, which builds it"
    );
    let d = Daemon::start_with_pool(2);
    run_suite("code-interpreter", &d);
    d.shutdown_and_check_leaks();
}
