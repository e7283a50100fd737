//! The cgroup v2 driver on a real unified hierarchy (issue 29). These machines are a cgroup v1
//! hybrid, so the daemon's v2 driver runs here only against a fake tree; most users' hosts
//! are v2. scripts/qemu-cgroup-v2 boots Debian's own kernel under QEMU (TCG, no KVM needed)
//! with `cgroup_no_v1=all`, runs `glovebox serve` inside and drives it through a smoke suite
//! (scripts/qemu-cgroup-v2-guest): create, exec, memory limit → OOM reported, pids limit, CPU
//! quota, timeout kill, deny-all egress, teardown. The guest has no network device.
//!
//! A boot whose guest kernel locks up (a soft lockup: seen once in CI, both vCPUs stuck in the
//! daemon's threads from its start; never reproduced here in 14 boots, 3 of them with the host
//! loaded) panics fast and is booted once more by the script; a second lock-up, or any check
//! that fails, fails the test.
//!
//! First run: the kernel package is downloaded from the Debian archive and the guest's root
//! image built into target/qemu/ (~70 s here in all); later runs boot in ~50 s.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Every check the guest script runs; each must report PASS.
const CHECKS: &[&str] = &[
    "only-cgroup2",
    "daemon-start",
    "run-dir",
    "create",
    "exec",
    "limits-set",
    "memory-oom",
    "pids-limit",
    "cpu-quota",
    "timeout-kill",
    "deny-all-egress",
    "teardown",
    "daemon-exit-clean",
    "doctor-migrations",
];

fn qemu_pids() -> BTreeSet<u32> {
    let mut found = BTreeSet::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "qemu-system-x86") {
            found.insert(pid);
        }
    }
    found
}

#[test]
fn the_v2_driver_passes_its_smoke_suite_in_a_unified_hierarchy_guest() {
    require_root!();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo");
    // The guest reads the binaries from the repository it mounts over 9p.
    let bin = glovebox_bin();
    let want = repo.join("target/x86_64-unknown-linux-gnu/debug/glovebox");
    assert_eq!(
        bin.canonicalize().expect("glovebox binary"),
        want,
        "the guest runs the debug build under the repository's target/ (is CARGO_TARGET_DIR set elsewhere?)"
    );
    assert!(
        Command::new("qemu-system-x86_64").arg("--version").output().is_ok(),
        "qemu-system-x86_64 is missing: scripts/deps installs it"
    );

    let before = qemu_pids();
    let out = tempdir("qemu-v2");
    let t0 = Instant::now();
    let o = run_bounded(
        Command::new(repo.join("scripts/qemu-cgroup-v2")).arg(out.path()).env("GLOVEBOX_QEMU_TIMEOUT", "600"),
        None,
        Duration::from_secs(900),
    );
    let took = t0.elapsed();
    let console = fs::read_to_string(out.path().join("console.log")).unwrap_or_default();
    let result = fs::read_to_string(out.path().join("result")).unwrap_or_default();
    // A first boot whose guest kernel locked up (the script boots once more; see there).
    let first = fs::read_to_string(out.path().join("console-1.log")).ok();
    let context = format!(
        "scripts/qemu-cgroup-v2 exited {:?} after {:.0} s\n--- stderr\n{}\n--- guest console\n{}{}",
        o.code(),
        took.as_secs_f64(),
        o.stderr_str(),
        console,
        first
            .as_deref()
            .map(|c| format!("\n--- the first boot's console (its kernel locked up)\n{c}"))
            .unwrap_or_default()
    );
    eprintln!("qemu-cgroup-v2: {:.0} s", took.as_secs_f64());
    if let Some(c) = &first {
        let lockups: Vec<&str> = c.lines().filter(|l| l.contains("soft lockup")).take(3).collect();
        eprintln!("qemu-cgroup-v2: the first boot's guest kernel locked up, booted again: {lockups:?}");
    }

    // The evidence that the guest saw a unified hierarchy only.
    let mounts: Vec<&str> = console
        .lines()
        .skip_while(|l| !l.starts_with("guest: cgroup mounts:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert!(
        !mounts.is_empty() && mounts.iter().all(|m| m.split_whitespace().nth(2) == Some("cgroup2")),
        "the guest's cgroup mounts are not cgroup2 alone: {mounts:?}\n{context}"
    );
    assert!(console.contains("cgroup_no_v1=all"), "the guest kernel's cmdline lacks cgroup_no_v1=all\n{context}");
    for c in CHECKS {
        let line = result.lines().find(|l| l.split_whitespace().nth(1) == Some(c));
        assert!(
            line.is_some_and(|l| l.split_whitespace().nth(2) == Some("PASS")),
            "check {c}: {}\n{context}",
            line.unwrap_or("not run")
        );
    }
    assert_eq!(result.lines().last(), Some("RESULT PASS"), "{context}");
    assert_eq!(o.code(), Some(0), "{context}");
    // QEMU is gone with the guest.
    let left: Vec<u32> = qemu_pids().difference(&before).copied().collect();
    assert!(left.is_empty(), "qemu processes left behind: {left:?}");
}
