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

use common::{run_checks, sandboxd_sdk_python, Daemon};
use serde_json::json;

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sandboxd")
}

#[test]
fn sdk_runs_commands_files_and_a_pty() {
    require_root!();
    let py = sandboxd_sdk_python();
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
        .env("GLOVEBOX_OTHER_SANDBOX", &other);
    let (stdout, oks) = run_checks(&d, &mut cmd, "sandboxd ");
    assert!(oks >= 35, "sdk.py ran {oks} checks:\n{stdout}");

    // The sandboxes are still there and answer (the SDK's calls left them usable), then go.
    assert_eq!(d.sh_ok(&sb, "echo still-here").trim(), "still-here");
    for id in [&sb, &other] {
        let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
        assert!(st == 204 || st == 200, "delete {id}: {st} {v}");
    }
    d.shutdown_and_check_leaks();
}
