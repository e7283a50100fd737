//! End to end: `glovebox run` as a user types it, embedded (no daemon) and through a daemon.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::{assert_no_leaks, cli_embedded, ids_in_log, run_bounded, tempdir, Daemon, Outcome};

const T: Duration = Duration::from_secs(30);

fn run(mut c: Command, args: &[&str], stdin: Option<&[u8]>) -> Outcome {
    c.arg("run").args(args);
    run_bounded(&mut c, stdin, T)
}

fn assert_out(o: &Outcome, code: i32, stdout: &str) {
    assert_eq!((o.code(), o.stdout_str().as_str()), (Some(code), stdout), "stderr: {}", o.stderr_str());
}

#[test]
fn embedded_run_prints_42_and_leaves_nothing() {
    require_root!();
    let dir = tempdir("gbtest-embedded-");
    let o = run(cli_embedded(dir.path()), &["--", "python3", "-c", "print(6*7)"], None);
    assert_out(&o, 0, "42\n");
    let o2 = run(cli_embedded(dir.path()), &["--", "sh", "-c", "exit 3"], None);
    assert_eq!(o2.code(), Some(3), "{}", o2.stderr_str());
    let mut ids: BTreeSet<String> = ids_in_log(&o.stderr_str());
    ids.extend(ids_in_log(&o2.stderr_str()));
    assert_eq!(ids.len(), 2, "each run logs its sandbox: {}{}", o.stderr_str(), o2.stderr_str());
    assert_no_leaks(&ids, &[o.pid, o2.pid]);
}

/// Another Glovebox process on the host (a daemon, an embedded run) makes a sandbox's
/// directory under a hidden name and renames it whole; an embedded run's start-up
/// reconciliation, which removes sandbox directories naming no held uid slot, once caught a
/// daemon's directory between its `mkdir` and its slot file and removed it (the daemon's next
/// create failed: 500, "sandbox dir: No such file or directory"). One being made is left
/// alone while its maker holds the slot it names, and swept once nobody does.
#[test]
fn an_embedded_run_leaves_a_sandbox_directory_being_made_alone_while_its_slot_is_held() {
    require_root!();
    let run_dir = common::run_dir();
    let slots = glovebox_daemon::slots::Slots::new(&run_dir.join("slots")).expect("slots dir");
    let id = format!("gbtest{}", common::rand_token(10));
    let slot = slots.take(&id).expect("a free uid slot");
    let making = run_dir.join("sandboxes").join(format!(".making-{}-{id}", slot.index));
    std::fs::create_dir(&making).expect("mkdir");
    std::fs::write(making.join("slot"), slot.index.to_string()).expect("slot file");
    let dir = tempdir("gbtest-making-");
    let o = run(cli_embedded(dir.path()), &["--", "true"], None);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let kept = making.exists();
    let n = slot.index;
    drop(slot);
    assert!(kept, "an embedded run removed a sandbox directory being made: {}", o.stderr_str());
    assert!(!o.stderr_str().contains(&id), "it took it for an orphan: {}", o.stderr_str());
    // Its maker gone (the slot no longer held), the next process's sweep removes it.
    let o = run(cli_embedded(dir.path()), &["--", "true"], None);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let left = making.exists();
    if left {
        let _ = std::fs::remove_dir_all(&making);
    }
    assert!(!left, "a dead maker's directory (slot {n}) was not swept: {}", o.stderr_str());
}

#[test]
fn run_through_daemon_basics() {
    require_root!();
    let d = Daemon::start();

    let o = run(d.cli(), &["--", "python3", "-c", "print(6*7)"], None);
    assert_out(&o, 0, "42\n");

    let o = run(d.cli(), &["--", "sh", "-c", "exit 3"], None);
    assert_out(&o, 3, "");

    let o = run(d.cli(), &["--", "cat"], Some(b"hi\n"));
    assert_out(&o, 0, "hi\n");

    let o = run(d.cli(), &["--env", "A=B", "--", "sh", "-c", "echo $A"], None);
    assert_out(&o, 0, "B\n");

    // stdout and stderr stay apart.
    let o = run(d.cli(), &["--", "sh", "-c", "echo out; echo err >&2"], None);
    assert_out(&o, 0, "out\n");
    assert!(o.stderr_str().contains("err\n"), "{}", o.stderr_str());

    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), b"file content\x00\xff\n").unwrap();
    let spec = format!("{}:/home/user/x", local.path().display());
    let o = run(d.cli(), &["--file", &spec, "--", "cat", "/home/user/x"], None);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    assert_eq!(o.stdout, b"file content\x00\xff\n", "binary-safe round trip");

    d.shutdown_and_check_leaks();
}

#[test]
fn run_timeout_exits_124_on_time() {
    require_root!();
    let d = Daemon::start();
    let o = run(d.cli(), &["--timeout", "2s", "--", "python3", "-c", "while True: pass"], None);
    assert_eq!(o.code(), Some(124), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("timed out"), "says why: {}", o.stderr_str());
    assert!(o.elapsed >= Duration::from_secs(2), "returned before its budget: {:?}", o.elapsed);
    assert!(o.elapsed < Duration::from_secs(4), "took {:?} for a 2 s budget", o.elapsed);
    d.shutdown_and_check_leaks();
}

#[test]
fn run_errors_are_clear() {
    require_root!();
    let d = Daemon::start();

    // A missing program: 127, like a shell, with the name in the message.
    let o = run(d.cli(), &["--", "no-such-program-xyz"], None);
    assert_eq!(o.code(), Some(127), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("no-such-program-xyz"), "{}", o.stderr_str());

    // A bad size: Glovebox's own failure (125), naming the value.
    let o = run(d.cli(), &["--memory", "12Q", "--", "true"], None);
    assert_eq!(o.code(), Some(125), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("12Q"), "{}", o.stderr_str());

    let o = run(d.cli(), &["--timeout", "2 days", "--", "true"], None);
    assert_eq!(o.code(), Some(125), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("bad duration"), "{}", o.stderr_str());

    // Limits the daemon refuses: 125 with the daemon's reason.
    let o = run(d.cli(), &["--memory", "1", "--", "true"], None);
    assert_eq!(o.code(), Some(125), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("memory_mb"), "{}", o.stderr_str());

    // An unknown isolation tier: 125 before anything is created, naming the tiers there are.
    for args in [&["run", "--isolation", "vm", "--", "true"][..], &["sandbox", "create", "--isolation", "vm"][..]] {
        let o = run_bounded(d.cli().args(args), None, T);
        assert_eq!(o.code(), Some(125), "{args:?}: {}", o.stderr_str());
        assert!(o.stderr_str().contains("--isolation must be process or gvisor"), "{}", o.stderr_str());
    }

    // An unknown flag: clap's usage error (2), naming the flag.
    let o = run(d.cli(), &["--bogus", "--", "true"], None);
    assert_eq!(o.code(), Some(2), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("--bogus"), "{}", o.stderr_str());

    // --file that does not exist: refused before anything is created.
    let o = run(d.cli(), &["--file", "/nonexistent/gbtest", "--", "true"], None);
    assert_eq!(o.code(), Some(125), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("/nonexistent/gbtest"), "{}", o.stderr_str());

    // A daemon that is not there: 125 with where it looked.
    let mut c = Command::new(common::glovebox_bin());
    c.env("GLOVEBOX_URL", "http://127.0.0.1:9").env("GLOVEBOX_API_KEY", "x");
    let o = run(c, &["--", "true"], None);
    assert_eq!(o.code(), Some(125), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("127.0.0.1:9"), "{}", o.stderr_str());

    // A wrong key: 125 and "invalid API key".
    let mut c = d.cli();
    c.env("GLOVEBOX_API_KEY", "wrong");
    let o = run(c, &["--", "true"], None);
    assert_eq!(o.code(), Some(125), "stderr: {}", o.stderr_str());
    assert!(o.stderr_str().contains("invalid API key"), "{}", o.stderr_str());

    d.shutdown_and_check_leaks();
}

/// `--isolation gvisor` on `run` and `sandbox create`: the command runs on gVisor's kernel.
#[test]
fn run_and_create_take_an_isolation() {
    require_root!();
    assert!(std::path::Path::new("/usr/bin/runsc").is_file(), "runsc is not installed: scripts/deps installs it");
    let d = Daemon::start();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let o = run(d.cli(), &["--isolation", "gvisor", "--", "uname", "-r"], None);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    assert_ne!(o.stdout_str(), host_release, "ran on the host kernel");
    let o = run(d.cli(), &["--isolation", "process", "--", "uname", "-r"], None);
    assert_out(&o, 0, &host_release);
    let o = run_bounded(d.cli().args(["sandbox", "create", "--isolation", "gvisor"]), None, T);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let id = o.stdout_str().trim().to_string();
    d.register(&id);
    let (_, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(v["isolation"], "gvisor", "{v}");
    d.shutdown_and_check_leaks();
}

#[test]
fn sandbox_and_files_subcommands() {
    require_root!();
    let d = Daemon::start();
    let mut c = d.cli();
    c.args(["sandbox", "create", "--timeout", "60s", "--memory", "128M"]);
    let o = run_bounded(&mut c, None, T);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let id = o.stdout_str().trim().to_string();
    assert_eq!(id.len(), 16, "prints the id: {id:?}");
    d.register(&id);

    let mut c = d.cli();
    c.args(["sandbox", "ls"]);
    let o = run_bounded(&mut c, None, T);
    assert!(o.stdout_str().contains(&id), "{}", o.stdout_str());

    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), b"up and back\n").unwrap();
    let mut c = d.cli();
    c.args(["files", "put", &id]).arg(local.path()).arg("/home/user/f.txt");
    let o = run_bounded(&mut c, None, T);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());

    let mut c = d.cli();
    c.args(["sandbox", "exec", &id, "--", "sh", "-c", "cat /home/user/f.txt; exit 4"]);
    let o = run_bounded(&mut c, None, T);
    assert_eq!((o.code(), o.stdout_str().as_str()), (Some(4), "up and back\n"), "{}", o.stderr_str());

    let mut c = d.cli();
    c.args(["files", "get", &id, "/home/user/f.txt"]);
    let o = run_bounded(&mut c, None, T);
    assert_eq!(o.stdout, b"up and back\n", "{}", o.stderr_str());

    let mut c = d.cli();
    c.args(["files", "ls", &id]);
    let o = run_bounded(&mut c, None, T);
    assert!(o.stdout_str().contains("f.txt"), "{}", o.stdout_str());

    let mut c = d.cli();
    c.args(["sandbox", "kill", &id]);
    let o = run_bounded(&mut c, None, T);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());

    let mut c = d.cli();
    c.args(["sandbox", "exec", &id, "--", "true"]);
    let o = run_bounded(&mut c, None, T);
    assert_eq!(o.code(), Some(125), "{}", o.stderr_str());
    assert!(o.stderr_str().contains("sandbox_gone"), "{}", o.stderr_str());
    d.shutdown_and_check_leaks();
}

#[test]
fn doctor_reports_this_host_and_boots_a_sandbox() {
    require_root!();
    let dir = tempdir("gbtest-doctor-");
    let mut c = cli_embedded(dir.path());
    c.arg("doctor").arg("--data-dir").arg(dir.path());
    let o = run_bounded(&mut c, None, T);
    let out = o.stdout_str();
    assert_eq!(o.code(), Some(0), "doctor failed:\n{out}\n{}", o.stderr_str());
    // Every line is a verdict or the fix under one; the kernel and cgroup layout are named.
    for l in out.lines().filter(|l| !l.starts_with("      → ") && !l.starts_with("glovebox doctor:")) {
        assert!(["ok  ", "warn", "FAIL"].iter().any(|t| l.starts_with(t)), "unexpected line {l:?} in:\n{out}");
    }
    assert!(out.lines().any(|l| l.starts_with("ok    kernel ")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("ok    cgroup v")), "{out}");
    assert!(out.contains("ok    a sandbox boots and runs `true`"), "{out}");
    assert!(out.ends_with("glovebox doctor: this host can run Glovebox\n"), "{out}");
    // The check boots its sandbox in a throwaway data dir and leaves nothing.
    assert_no_leaks(&ids_in_log(&o.stderr_str()), &[o.pid]);
}

#[test]
fn completions_and_man_pages_come_from_the_cli() {
    let dir = tempdir("gbtest-man-");
    let mut c = cli_embedded(dir.path());
    c.args(["completions", "bash"]);
    let o = run_bounded(&mut c, None, T);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    assert!(o.stdout_str().contains("_glovebox()") && o.stdout_str().contains("doctor"), "{}", o.stdout_str());
    let mut c = cli_embedded(dir.path());
    c.arg("man").arg(dir.path().join("man1"));
    let o = run_bounded(&mut c, None, T);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let page = std::fs::read_to_string(dir.path().join("man1/glovebox-sandbox-exec.1")).expect("a page per subcommand");
    assert!(page.contains(".TH glovebox-sandbox-exec"), "{page}");
    let o = run_bounded(cli_embedded(dir.path()).args(["completions", "nosuchshell"]), None, T);
    assert_eq!(o.code(), Some(2), "a bad shell is a usage error: {}", o.stderr_str());
}

#[test]
fn template_commands_work_embedded_without_a_daemon() {
    require_root!();
    let dir = tempdir("gbtest-tplembed-");
    let spec = dir.path().join("Dockerfile");
    std::fs::write(&spec, "FROM host\nRUN echo built-here > /opt/marker\n").unwrap();
    let t = Duration::from_secs(120);
    let cli = |args: &[&str]| {
        let mut c = cli_embedded(dir.path());
        c.args(args);
        run_bounded(&mut c, None, t)
    };
    let o = cli(&["template", "build", "-f", spec.to_str().unwrap(), "-t", "embedded-tpl"]);
    assert_eq!(o.code(), Some(0), "build: {}\n{}", o.stdout_str(), o.stderr_str());
    assert!(o.stderr_str().contains("working on"), "says it runs embedded: {}", o.stderr_str());
    assert!(o.stderr_str().contains("Step 1/"), "progress lines: {}", o.stderr_str());
    let o = cli(&["template", "ls"]);
    assert!(o.stdout_str().lines().any(|l| l.starts_with("embedded-tpl ")), "ls: {}", o.stdout_str());
    let o = cli(&["run", "--template", "embedded-tpl", "--", "cat", "/opt/marker"]);
    assert_out(&o, 0, "built-here\n");
    let o = cli(&["template", "rm", "embedded-tpl"]);
    assert_eq!(o.code(), Some(0), "rm: {}", o.stderr_str());
    let o = cli(&["template", "ls"]);
    assert!(!o.stdout_str().contains("embedded-tpl"), "removed: {}", o.stdout_str());
}

/// The mountinfo line of the host's cgroup2 mount, without its superblock options: what a
/// change of `favordynmods` must leave as it was.
fn cgroup2_line_but_super_options() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info.lines().rfind(|l| {
        l.contains(" - cgroup2 ")
            && matches!(l.split(' ').nth(4), Some("/sys/fs/cgroup") | Some("/sys/fs/cgroup/unified"))
    })?;
    Some(line.rsplit_once(' ').map(|(head, _)| head.to_string()).unwrap_or_default())
}

#[test]
fn serve_turns_favordynmods_on_keeping_the_mount_s_other_options() {
    require_root!();
    use glovebox_daemon::cgroup_tuning::{cgroup2_mount, set_favor_dynmods};
    let Some(before) = cgroup2_mount().unwrap() else {
        eprintln!("SKIPPED: this host has no cgroup2 mount");
        return;
    };
    // Whatever this test finds is put back, pass or fail.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Err(e) = set_favor_dynmods(self.0) {
                eprintln!("could not restore favordynmods={}: {e}", self.0);
            }
        }
    }
    let _restore = Restore(before.favors_dynmods());
    set_favor_dynmods(false).unwrap();
    let line = cgroup2_line_but_super_options().unwrap();
    let others = |o: &[String]| o.iter().filter(|o| *o != "favordynmods").cloned().collect::<Vec<_>>();
    let off = cgroup2_mount().unwrap().unwrap();
    assert!(!off.favors_dynmods(), "{off:?}");

    let dir = tempdir("gbtest-dynmods-");
    let mut c = cli_embedded(dir.path());
    c.arg("doctor").arg("--no-boot").arg("--data-dir").arg(dir.path());
    let o = run_bounded(&mut c, None, T);
    assert!(o.stdout_str().contains("warn  cgroup migrations: favordynmods off"), "{}", o.stdout_str());

    let d = Daemon::start_after("export GLOVEBOX_CGROUP_FAVOR_DYNMODS=1;");
    let on = cgroup2_mount().unwrap().unwrap();
    assert!(on.favors_dynmods(), "serve --cgroup-favor-dynmods left {on:?}");
    assert_eq!(others(&on.options), others(&off.options), "the superblock's other options changed");
    assert_eq!(cgroup2_line_but_super_options().unwrap(), line, "the mount's own options changed");
    let id = d.create(serde_json::json!({}));
    let r = d.exec(&id, serde_json::json!({"cmd": ["true"]}));
    assert_eq!(r["exit_code"], 0, "{r}");
    let mut c = cli_embedded(dir.path());
    c.arg("doctor").arg("--no-boot").arg("--data-dir").arg(dir.path());
    let o = run_bounded(&mut c, None, T);
    assert!(o.stdout_str().contains("ok    cgroup migrations: favordynmods on"), "{}", o.stdout_str());
    d.shutdown_and_check_leaks();
    // It stays on after the daemon (a host setting, as documented).
    assert!(cgroup2_mount().unwrap().unwrap().favors_dynmods());
}
