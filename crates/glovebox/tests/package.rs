//! The Debian package end to end: build it from the debug binaries, `dpkg -i` it, start the
//! daemon the way the installed unit does (systemctl when systemd runs the host, else the
//! unit's ExecStart as our child), drive it with the Python SDK, stop it, `dpkg --purge`,
//! and check nothing is left. The daemon reads the config file this test writes to
//! /etc/glovebox/config.toml: its own port and data dir prove the file was read.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const LOCK: &str = "/run/lock/glovebox-system-install.lock";
const ETC: &str = "/etc/glovebox";
const VAR: &str = "/var/lib/glovebox";
const UNIT: &str = "/lib/systemd/system/glovebox.service";
const LISTEN: &str = "127.0.0.1:7181";

fn systemd_runs_host() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

fn dpkg(args: &[&str]) -> Outcome {
    let o = run_bounded(
        Command::new("dpkg").args(args).env("DEBIAN_FRONTEND", "noninteractive"),
        None,
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "dpkg {args:?}: {}\n{}", o.stdout_str(), o.stderr_str());
    o
}

fn systemctl(args: &[&str]) {
    let o = run_bounded(Command::new("systemctl").args(args), None, Duration::from_secs(40));
    assert!(o.status.success(), "systemctl {args:?}: {}", o.stderr_str());
}

/// What the host had before the test; put back at the end, even when the test fails.
struct Host {
    etc_aside: Option<PathBuf>,
    var_mode: Option<u32>,
    child: Option<Child>,
    installed: bool,
}

impl Host {
    fn save(scratch: &Path) -> Host {
        let etc_aside = Path::new(ETC).exists().then(|| {
            let aside = scratch.join("etc-glovebox");
            fs::rename(ETC, &aside).expect("move /etc/glovebox aside");
            aside
        });
        let var_mode = fs::metadata(VAR).ok().map(|m| m.permissions().mode() & 0o7777);
        Host { etc_aside, var_mode, child: None, installed: false }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            if wait_bounded(&mut c, Duration::from_secs(20)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if self.installed {
            let _ = Command::new("dpkg").args(["--purge", "glovebox"]).status();
        }
        let _ = fs::remove_dir_all(ETC);
        if let Some(aside) = &self.etc_aside {
            let _ = fs::rename(aside, ETC);
        }
        match self.var_mode {
            Some(mode) => {
                let _ = fs::create_dir_all(VAR);
                let _ = fs::set_permissions(VAR, fs::Permissions::from_mode(mode));
            }
            None => {
                let _ = fs::remove_dir(VAR);
            }
        }
    }
}

/// The unit's ExecStart, as argv (the unit quotes nothing).
fn exec_start(unit: &str) -> Vec<String> {
    let line = unit.lines().find_map(|l| l.trim().strip_prefix("ExecStart=")).expect("the unit has an ExecStart line");
    line.split_whitespace().map(str::to_string).collect()
}

const SMOKE: &str = r#"
from glovebox import Sandbox
sb = Sandbox.create(timeout=60)
print("id", sb.id)
print("pids", sb.info().limits.pids)
r = sb.commands.run("echo $((6*7))")
print("stdout", r.stdout.strip())
print("killed", sb.kill())
"#;

#[test]
fn deb_installs_serves_and_purges() {
    require_root!();
    if Command::new("dpkg-deb").arg("--version").stdout(Stdio::null()).status().is_err() {
        panic!("dpkg-deb is missing: this test needs a Debian host (CI is one)");
    }
    let _ = fs::create_dir_all("/run/lock");
    let lock = fs::File::create(LOCK).expect("open the install lock");
    lock.lock().expect("take the install lock");

    let installed_before =
        run_bounded(Command::new("dpkg-query").args(["-W", "-f=${Status}", "glovebox"]), None, Duration::from_secs(20));
    assert!(
        !installed_before.stdout_str().contains("installed"),
        "a glovebox package is installed on this host; the test would replace it"
    );

    let bin = glovebox_bin();
    let profile = if bin.components().any(|c| c.as_os_str() == "release") { "release" } else { "debug" };
    let scratch = tempdir("pkg");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = run_bounded(
        Command::new(repo.join("scripts/package-deb")).args(["--profile", profile, "--out"]).arg(scratch.path()),
        None,
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "scripts/package-deb: {}", o.stderr_str());
    let deb = o.stdout_str().trim().to_string();
    let contents = dpkg(&["--contents", &deb]).stdout_str();
    for f in [
        "./usr/bin/glovebox",
        "./usr/bin/glovebox-agent",
        "./lib/systemd/system/glovebox.service",
        "./etc/glovebox/config.toml",
        "./usr/share/doc/glovebox/copyright",
        "./usr/share/man/man1/glovebox.1.gz",
        "./usr/share/bash-completion/completions/glovebox",
        "./usr/share/glovebox/templates/code-interpreter/Dockerfile",
    ] {
        assert!(contents.lines().any(|l| l.ends_with(f)), "{f} missing from the package:\n{contents}");
    }

    let mut host = Host::save(scratch.path());
    dpkg(&["-i", &deb]);
    host.installed = true;
    assert_eq!(fs::metadata(VAR).expect("postinst makes /var/lib/glovebox").permissions().mode() & 0o777, 0o700);
    assert!(
        fs::read_to_string(format!("{ETC}/config.toml"))
            .expect("the conffile")
            .contains("#listen = \"127.0.0.1:7171\""),
        "the shipped config is the commented default"
    );

    let data = scratch.path().join("data");
    fs::write(
        format!("{ETC}/config.toml"),
        format!(
            "listen = \"{LISTEN}\"\ndata_dir = \"{}\"\nwarm_pool = 0\nlink_pool = 0\ndestroy_on_exit = true\n[limits]\npids = 300\n",
            data.display()
        ),
    )
    .expect("write the config");
    let log_path = scratch.path().join("serve.log");
    if systemd_runs_host() {
        systemctl(&["restart", "glovebox"]);
    } else {
        let argv = exec_start(&fs::read_to_string(UNIT).expect("the installed unit"));
        assert_eq!(argv[0], "/usr/bin/glovebox");
        let log = fs::File::create(&log_path).expect("log file");
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start the unit's command");
        host.child = Some(child);
    }
    let log = || fs::read_to_string(&log_path).unwrap_or_default();

    let url = format!("http://{LISTEN}");
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build().expect("http client");
    let up = poll(Duration::from_secs(30), Duration::from_millis(50), || {
        http.get(format!("{url}/healthz")).send().ok().filter(|r| r.status().is_success())
    });
    assert!(up.is_some(), "the packaged daemon did not answer on {LISTEN} (the config's address) in 30 s:\n{}", log());
    let key = fs::read_to_string(data.join("api-key")).expect("the key is in the config's data dir").trim().to_string();

    let o = run_bounded(
        Command::new("python3")
            .args(["-c", SMOKE])
            .env("PYTHONPATH", repo.join("sdk/python/src"))
            .env("GLOVEBOX_URL", &url)
            .env("GLOVEBOX_API_KEY", &key),
        None,
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "SDK smoke test failed: {}\n{}\ndaemon log:\n{}",
        o.stdout_str(),
        o.stderr_str(),
        log()
    );
    let out = o.stdout_str();
    let field = |k: &str| out.lines().find_map(|l| l.strip_prefix(&format!("{k} "))).unwrap_or_default().to_string();
    assert_eq!(field("stdout"), "42", "{out}");
    assert_eq!(field("pids"), "300", "the config's default limit applies: {out}");
    assert_eq!(field("killed"), "True", "{out}");
    let ids: BTreeSet<String> = [field("id")].into_iter().filter(|s| !s.is_empty()).collect();
    assert_eq!(ids.len(), 1, "{out}");

    let mut owners = Vec::new();
    if systemd_runs_host() {
        systemctl(&["stop", "glovebox"]);
    } else if let Some(mut c) = host.child.take() {
        owners.push(c.id());
        let _ = Command::new("kill").arg(c.id().to_string()).status();
        let status = wait_bounded(&mut c, Duration::from_secs(20)).expect("serve ends within 20 s of SIGTERM");
        assert!(status.success(), "serve exited {status:?} on SIGTERM:\n{}", log());
    }
    assert!(http.get(format!("{url}/healthz")).send().is_err(), "the daemon still answers after it was stopped");

    dpkg(&["--purge", "glovebox"]);
    host.installed = false;
    for gone in
        ["/usr/bin/glovebox", "/usr/bin/glovebox-agent", UNIT, ETC, "/usr/share/glovebox", "/usr/share/doc/glovebox"]
    {
        assert!(!Path::new(gone).exists(), "{gone} is left after dpkg --purge");
    }
    assert_no_leaks(&ids, &owners);
    drop(host);
    drop(lock);
}
