//! Modal compatibility: the official `modal` Python client (the version pinned in
//! `tests/modal/setup.sh`, installed from PyPI), unmodified, against a daemon this test
//! starts. The client is pointed at it the documented way: `MODAL_SERVER_URL` = the daemon's
//! address (plain HTTP/2 on loopback), `MODAL_TOKEN_ID` any `ak-…` id, `MODAL_TOKEN_SECRET`
//! the daemon's key. Each script in `tests/modal/` asserts what a user would see and prints
//! one `ok:` line a check.
//!
//! The network checks use the test's own internet (`inet`): canary listeners in a network
//! namespace the test made, which a blocked sandbox must not reach.

mod common;
mod inet;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{run_bounded, Daemon};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/modal")
}

/// The client's venv, installed once per test run (or why that failed).
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
        Ok(dest.join("modal-venv"))
    });
    match sdk {
        Ok(d) => d.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// Runs `script` with the venv's Python against `d` (its key as the token secret unless
/// `env` says otherwise); returns its stdout after asserting it finished with at least
/// `min_checks` checks (0: a program that is not a check script, which must exit 0).
fn run_script(
    d: &Daemon,
    script: &str,
    min_checks: usize,
    timeout: Duration,
    env: &[(&str, &str)],
) -> (String, Duration) {
    let home = common::tempdir("gbtest-modal-home-");
    let mut cmd = Command::new(venv().join("bin/python"));
    cmd.arg("-u")
        .arg(scripts().join(script))
        .current_dir(scripts())
        // No ~/.modal.toml of the user's is read: HOME is empty.
        .env("HOME", home.path())
        .env("MODAL_SERVER_URL", &d.url)
        .env("MODAL_TOKEN_ID", "ak-glovebox")
        .env("MODAL_TOKEN_SECRET", &d.key)
        .env_remove("MODAL_PROFILE")
        .env_remove("MODAL_ENVIRONMENT")
        .env_remove("MODAL_SANDBOX_V2")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("ALL_PROXY");
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
    if min_checks > 0 {
        let oks = stdout.lines().filter(|l| l.starts_with("ok: ")).count();
        let closing = stdout.lines().any(|l| l.starts_with("modal ") && l.ends_with("checks ok"));
        assert!(closing, "{script} did not finish:\n{stdout}");
        assert!(oks >= min_checks, "{script} ran {oks} checks, expected at least {min_checks}:\n{stdout}");
        eprintln!("{script}: {oks} checks in {:?}", out.elapsed);
    }
    (stdout, out.elapsed)
}

fn value<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).unwrap_or_else(|| panic!("no {key} in:\n{out}"))
}

/// The seed program, unchanged but for configuration; the image built once and reused; then
/// the everyday calls, the network policy and the refusals on the same daemon.
#[test]
fn seed_program_and_everyday_calls() {
    require_root!();
    let inet = inet::Internet::start();
    let d = Daemon::start();

    // The image, built (the pip_install step runs)...
    let (first, _) = run_script(&d, "build_image.py", 0, Duration::from_secs(600), &[]);
    let built_s: f64 = value(&first, "build_s:").parse().expect("build_s");
    assert_eq!(value(&first, "cache_hit:"), "False", "{first}");
    let image = value(&first, "image:").to_string();
    let template = format!("modal-{}", image.trim_start_matches("im-"));
    let log = d.log();
    assert!(log.contains(&format!("modal: building template {template}")), "{log}");
    assert!(log.contains(&format!("modal: built template {template}")), "{log}");

    // ...the seed program, unchanged...
    let (out, took) = run_script(&d, "seed.py", 0, Duration::from_secs(300), &[]);
    assert_eq!(out, "6\nexit code: 0\n", "the seed program's output");
    eprintln!("seed.py: {took:?}");

    // ...and the image again: the server has it (no step runs, nothing is built again).
    let (second, _) = run_script(&d, "build_image.py", 0, Duration::from_secs(120), &[]);
    let cached_s: f64 = value(&second, "build_s:").parse().expect("build_s");
    assert_eq!(value(&second, "cache_hit:"), "True", "{second}");
    assert_eq!(value(&second, "image:"), image, "the same image");
    let log = d.log();
    assert_eq!(log.matches(&format!("modal: building template {template}")).count(), 1, "built once:\n{log}");
    assert!(log.contains(&format!("modal: image is built (template {template}): cache hit")), "{log}");
    eprintln!("image Image.debian_slim().pip_install(\"pandas\"): built in {built_s:.2} s, cached {cached_s:.3} s");

    let canary = inet.log.display().to_string();
    run_script(&d, "everyday.py", 30, Duration::from_secs(600), &[("GLOVEBOX_TEST_CANARY_LOG", &canary)]);
    // The unsupported call was logged with its feature.
    assert!(
        d.log().contains("modal: refused modal.client.ModalClient/VolumeGetOrCreate (Modal Volumes)"),
        "{}",
        d.log()
    );
    d.shutdown_and_check_leaks();
    drop(inet);
}

/// A wrong secret is an authentication error naming the problem.
#[test]
fn bad_token_is_refused() {
    require_root!();
    let d = Daemon::start();
    run_script(&d, "auth.py", 2, Duration::from_secs(120), &[("MODAL_TOKEN_SECRET", "not-a-key")]);
    d.shutdown_and_check_leaks();
}
