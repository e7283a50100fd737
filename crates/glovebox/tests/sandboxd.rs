//! agent-sandbox compatibility: the `k8s-agent-sandbox` Python SDK (the version pinned in
//! `tests/sandboxd/setup.sh`, installed from PyPI), unmodified, against a daemon this test
//! starts. Its direct-URL mode is pointed at the daemon by configuration only (`api_url`, the
//! daemon's key in `extra_headers`, the sandbox's id), and its shipped sandboxd
//! `ProcessService` stubs at the daemon's own port with `x-sandbox-id` and the key as call
//! metadata. `tests/sandboxd/sdk.py` asserts what a user would see and prints one `ok:` line a
//! check.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{run_bounded, Daemon};
use serde_json::json;

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sandboxd")
}

/// The SDK's venv, installed by the project's script (cached under target/).
fn venv() -> PathBuf {
    let dest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let out =
        run_bounded(Command::new("bash").arg(scripts().join("setup.sh")).arg(&dest), None, Duration::from_secs(600));
    assert_eq!(out.code(), Some(0), "setup.sh failed:\n{}\n{}", out.stdout_str(), out.stderr_str());
    dest.join("sandboxd-venv")
}

#[test]
fn sdk_runs_commands_files_and_a_pty() {
    require_root!();
    let py = venv().join("bin/python");
    let d = Daemon::start();
    let env = json!({ "SANDBOX_REGION": "test-region", "SANDBOX_API_TOKEN": "not-for-metadata" });
    let sb = d.create(json!({ "env": env }));
    let other = d.create(json!({}));

    let mut cmd = Command::new(&py);
    cmd.arg("-u")
        .arg(scripts().join("sdk.py"))
        .env("GLOVEBOX_URL", &d.url)
        .env("GLOVEBOX_API_KEY", &d.key)
        .env("GLOVEBOX_SANDBOX", &sb)
        .env("GLOVEBOX_OTHER_SANDBOX", &other)
        // No kubeconfig of the user's is read, and nothing goes through a proxy.
        .env("KUBECONFIG", "/dev/null")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("ALL_PROXY");
    let out = run_bounded(&mut cmd, None, Duration::from_secs(300));
    let stdout = out.stdout_str();
    assert_eq!(
        out.code(),
        Some(0),
        "sdk.py failed after {:?}:\n--- stdout\n{stdout}\n--- stderr\n{}\n--- daemon log\n{}",
        out.elapsed,
        out.stderr_str(),
        d.log()
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("sandboxd ") && l.ends_with("checks ok")),
        "did not finish:\n{stdout}"
    );
    let oks = stdout.lines().filter(|l| l.starts_with("ok: ")).count();
    assert!(oks >= 35, "sdk.py ran {oks} checks:\n{stdout}");
    eprintln!("{stdout}sdk.py: {oks} checks in {:?}", out.elapsed);

    // The sandboxes are still there and answer (the SDK's calls left them usable), then go.
    assert_eq!(d.sh_ok(&sb, "echo still-here").trim(), "still-here");
    for id in [&sb, &other] {
        let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
        assert!(st == 204 || st == 200, "delete {id}: {st} {v}");
    }
    d.shutdown_and_check_leaks();
}
