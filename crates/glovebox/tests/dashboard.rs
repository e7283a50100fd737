//! The web dashboard (`/ui`) in a real browser: Debian's Chromium, headless, driven over the
//! DevTools protocol by `tests/ui/dashboard.mjs` (playwright-core, pinned and installed by
//! `tests/ui/setup.sh` from npm). The script logs in, sees a sandbox appear, types into its
//! terminal, sees a denied connection in the egress view, downloads a file, runs code cells
//! (streamed output, a PNG result, hostile output kept as text), and saves a
//! screenshot per step in `target/ui-screenshots/`.
//!
//! The denied connection goes to the test's own "internet" (a network namespace holding
//! TEST-NET-2 addresses, `inet`): no packet leaves the machine.

mod common;
mod inet;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{poll, run_bounded, wait_bounded, Daemon};
use inet::{Internet, EVIL, NET};

const CHROMIUM: &str = "/usr/bin/chromium";
/// The whole browser session (about 20 s when it works).
const SESSION: Duration = Duration::from_secs(240);

fn target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
}

/// Host processes whose command line names `needle` (the browser's own profile directory).
fn processes_naming(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// Kills every process naming the profile (on the way out, whatever happened).
struct BrowserSweep(String);

impl Drop for BrowserSweep {
    fn drop(&mut self) {
        for pid in processes_naming(&self.0) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

#[test]
fn the_dashboard_in_a_real_browser() {
    require_root!();
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: run scripts/deps (it installs Debian's chromium)");
    let setup = run_bounded(
        Command::new("bash").arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/setup.sh")).arg(target()),
        None,
        Duration::from_secs(600),
    );
    assert_eq!(setup.code(), Some(0), "setup.sh failed:\n{}\n{}", setup.stdout_str(), setup.stderr_str());

    let inet = Internet::start();
    std::env::set_var("GLOVEBOX_DNS_UPSTREAM", format!("{NET}:53"));
    let d = Daemon::start();

    let shots = target().join("ui-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let profile = common::tempdir("gbtest-chromium-");
    let profile_path = profile.path().to_string_lossy().into_owned();
    let sweep = BrowserSweep(profile_path.clone());
    // The driver's and the browser's own temp files (downloads, artefacts) go here.
    let scratch = common::tempdir("gbtest-ui-tmp-");

    // ES modules resolve packages from the script's directory up: run a copy beside them.
    let node_dir = target().join("ui-node");
    let script = node_dir.join("dashboard.mjs");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui/dashboard.mjs"), &script).expect("copy the script");
    let started = Instant::now();
    let mut child = Command::new("node")
        .arg(&script)
        .current_dir(&node_dir)
        .env("GB_URL", &d.url)
        .env("GB_KEY", &d.key)
        .env("GB_NET", NET)
        .env("GB_EVIL", EVIL)
        .env("GB_PROFILE", &profile_path)
        .env("GB_SHOTS", &shots)
        .env("GB_CHROMIUM", CHROMIUM)
        .env("TMPDIR", scratch.path())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node");
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let read = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let (out, err) = (read(Box::new(out)), read(Box::new(err)));
    let status = wait_bounded(&mut child, SESSION);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(sweep); // a browser the script could not close goes now
    let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    let elapsed = started.elapsed();
    eprintln!("--- dashboard.mjs ({elapsed:?}) ---\n{stdout}\n{stderr}");

    // Every sandbox the script made is checked for leaks with the others.
    for id in stdout.lines().filter_map(|l| l.strip_prefix("sandbox: ")) {
        d.register(id.trim());
    }
    let status = status.unwrap_or_else(|| panic!("the browser session ran over {SESSION:?}"));
    assert!(status.success(), "dashboard.mjs failed ({status})");
    let checks = stdout.lines().filter(|l| l.starts_with("ok: ")).count();
    assert_eq!(checks, 51, "not every check of the script passed");

    // The screenshots are real PNGs of a rendered page.
    for name in [
        "01-login",
        "02-sandboxes",
        "03-terminal",
        "04-commands",
        "05-network",
        "06-files",
        "07-usage",
        "08-daemon",
        "09-code",
    ] {
        let png = std::fs::read(shots.join(format!("{name}.png"))).unwrap_or_default();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "{name}.png: {} bytes", png.len());
    }

    // Nothing of the browser is left: no process, no profile directory.
    let left = poll(Duration::from_secs(5), Duration::from_millis(100), || {
        processes_naming(&profile_path).is_empty().then_some(())
    });
    assert!(left.is_some(), "browser processes are left: {:?}", processes_naming(&profile_path));
    drop(profile);
    assert!(!Path::new(&profile_path).exists(), "the browser profile is left");
    let tmp_left: Vec<_> =
        std::fs::read_dir(scratch.path()).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(tmp_left.is_empty(), "the browser session left temp files: {tmp_left:?}");
    drop(scratch);
    let _ = std::fs::remove_file(&script);

    let (_, list) = d.get("/v1/sandboxes");
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0), "sandboxes left: {list}");
    d.shutdown_and_check_leaks();
    drop(inet);
}
