//! Resource limits under attack: memory, fork and disk bombs, output floods, CPU quota.
//! Each runs in a sandbox whose limits the test sets, bounded by a command timeout.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use common::{run_bounded, sandbox_body, Daemon};
use reqwest::Method;
use serde_json::{json, Value};

#[test]
fn memory_bomb_is_oom_killed_and_the_sandbox_survives() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "memory_mb": 64 } })));
    let t = Instant::now();
    let bomb =
        json!({ "cmd": ["python3", "-c", "x = []\nwhile True: x.append(bytearray(10**6))"], "timeout_ms": 20_000 });
    if common::under_gvisor() {
        // The guest's memory is the sentry's: the host's OOM killer ends the sentry, and the
        // whole sandbox with it (reason `oom`); a new sandbox shows memory that fits is fine.
        let (st, v) = d.post(&format!("/v1/sandboxes/{id}/exec"), &bomb);
        assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
        assert_eq!(
            (st, v["error"]["code"].as_str(), v["error"]["reason"].as_str()),
            (410, Some("sandbox_gone"), Some("oom")),
            "{v}"
        );
        let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
        assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("oom")), "{v}");
        common::skipped_under_gvisor("the sandbox surviving its command's OOM kill", "Limits");
        let id = d.create(sandbox_body(json!({ "resources": { "memory_mb": 64 } })));
        let r = d.exec(&id, json!({ "cmd": ["python3", "-c", "x = bytearray(20 * 10**6); print(len(x))"] }));
        assert_eq!((r["stdout"].as_str(), r["oom_killed"].as_bool()), (Some("20000000\n"), Some(false)), "{r}");
        d.shutdown_and_check_leaks();
        return;
    }
    let r = d.exec(&id, bomb);
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
    assert_eq!(r["timed_out"], false, "{r}");
    assert_eq!(r["oom_killed"], true, "{r}");
    assert!(r["exit_code"] == 137 || r["signal"] == 9, "{r}");
    // What the implementation does: the command dies, the sandbox stays.
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!((st, v["state"].as_str()), (200, Some("running")), "{v}");
    assert_eq!(d.sh_ok(&id, "echo alive"), "alive\n");
    // Memory that fits is fine (and oom_killed stays false).
    let r = d.exec(&id, json!({ "cmd": ["python3", "-c", "x = bytearray(20 * 10**6); print(len(x))"] }));
    assert_eq!((r["stdout"].as_str(), r["oom_killed"].as_bool()), (Some("20000000\n"), Some(false)), "{r}");
    d.shutdown_and_check_leaks();
}

/// The sandbox's disk and /dev/shm are tmpfs, whose pages are charged to its memory cgroup.
/// Filling either must end in ENOSPC for the writer, not in the OOM killer taking the agent
/// (and with it the whole sandbox).
#[test]
fn filling_ram_backed_storage_does_not_kill_the_sandbox() {
    require_root!();
    let d = Daemon::start();
    let mut failures = Vec::new();
    // Default limits (memory 512 MiB, disk 1 GiB): fill most of the disk budget.
    let id = d.create(sandbox_body(json!({})));
    let (st, r) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=1100 2>&1 | tail -1"], "timeout_ms": 20_000 }),
    );
    let (gst, g) = final_state(&d, &id, st);
    if st != 200 || gst != 200 {
        failures.push(format!("disk fill at default limits: exec {st} {r}; sandbox {gst} {g}"));
    }
    // memory 64 MiB: fill /dev/shm (capped at half the memory).
    let id = d.create(sandbox_body(json!({ "resources": { "memory_mb": 64 } })));
    let (st, r) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["sh", "-c", "head -c 200000000 /dev/zero > /dev/shm/fill; echo rc=$?"], "timeout_ms": 20_000 }),
    );
    let (gst, g) = final_state(&d, &id, st);
    if st != 200 || gst != 200 {
        failures.push(format!("/dev/shm fill at 64 MiB: exec {st} {r}; sandbox {gst} {g}"));
    } else if r["stdout"].as_str().unwrap_or("").contains("rc=0") {
        failures.push(format!("wrote 200 MB to /dev/shm with 64 MiB of memory: {r}"));
    }
    d.shutdown_and_check_leaks();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The sandbox's state; after a failed exec, waits briefly for the daemon to notice its end.
fn final_state(d: &Daemon, id: &str, exec_status: u16) -> (u16, Value) {
    let get = || d.get(&format!("/v1/sandboxes/{id}"));
    if exec_status == 200 {
        return get();
    }
    common::poll(Duration::from_secs(2), Duration::from_millis(50), || Some(get()).filter(|(st, _)| *st == 410))
        .unwrap_or_else(get)
}

const FORKER: &str = r#"
import os, time
pids, failed = [], 0
for i in range(200):
    try:
        p = os.fork()
    except OSError:
        failed += 1
        continue
    if p == 0:
        time.sleep(3)
        os._exit(0)
    pids.append(p)
print(len(pids), failed, flush=True)
for p in pids:
    os.kill(p, 9)
for p in pids:
    os.waitpid(p, 0)
"#;

#[test]
fn fork_bomb_is_capped_and_the_host_is_unaffected() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "pids": 32 } })));
    let r = std::thread::scope(|s| {
        let bomb = s.spawn(|| d.exec(&id, json!({ "cmd": ["python3", "-c", FORKER], "timeout_ms": 20_000 })));
        // Meanwhile the host still forks.
        let mut host_ok = 0;
        while !bomb.is_finished() && host_ok < 50 {
            let o = run_bounded(&mut Command::new("true"), None, Duration::from_secs(5));
            assert!(o.status.success());
            host_ok += 1;
        }
        bomb.join().unwrap()
    });
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap();
    let nums: Vec<u32> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (ok, failed) = (nums[0], nums[1]);
    assert!(ok <= 32, "{ok} forks succeeded under pids=32");
    assert!(ok >= 8, "only {ok} forks: the limit is far below what was asked");
    assert_eq!(ok + failed, 200);
    assert_eq!(d.sh_ok(&id, "echo alive"), "alive\n");

    // A real shell fork bomb, ended by the command timeout; the sandbox survives it. The
    // parent forks exactly once, before the bomb exists, then `exec`s its sleep: any later
    // fork of its own could lose the race against the bomb and exit 2 ("Cannot fork"). That
    // is why the bomb starts in a subshell: dash forks each element of a background pipeline
    // from the calling shell, so `b | b &` run by the parent would be two forks, the second
    // racing the first one's children.
    let t = Instant::now();
    let bomb = json!({ "cmd": ["sh", "-c", "b() { b | b & }; (b) & exec sleep 30"], "timeout_ms": 2000 });
    if common::under_gvisor() {
        // The guest stops at its 32 tasks, but gVisor's ptrace platform needs host stub
        // processes and threads beyond the host cap for a bomb's churn: the sentry may fail
        // to start one, and the whole sandbox then ends (reason `error`), as documented.
        let (st, v) = d.post(&format!("/v1/sandboxes/{id}/exec"), &bomb);
        assert!(t.elapsed() < Duration::from_secs(8), "bomb took {:?} to end", t.elapsed());
        match st {
            200 => assert_eq!(v["timed_out"], true, "{}", summary(&v)),
            _ => {
                assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("error")), "{v}");
                common::skipped_under_gvisor("the sandbox surviving a shell fork bomb (it ended)", "Limits");
                d.shutdown_and_check_leaks();
                return;
            }
        }
    } else {
        let r = d.exec(&id, bomb);
        assert!(t.elapsed() < Duration::from_secs(8), "bomb took {:?} to end", t.elapsed());
        assert_eq!(r["timed_out"], true, "{}", summary(&r));
    }
    let left = common::poll(Duration::from_secs(5), Duration::from_millis(100), || {
        let r = d.sh(&id, "ps -e --no-headers | wc -l");
        let n: u32 = r["stdout"].as_str()?.trim().parse().ok()?;
        // agent + zygote + 2 spares + sh + ps + wc
        (n <= 7).then_some(n)
    });
    assert!(left.is_some(), "fork bomb processes survived: {}", d.sh(&id, "ps -e")["stdout"]);
    d.shutdown_and_check_leaks();
}

#[test]
fn disk_fill_stops_at_the_cap() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "disk_mb": 32, "memory_mb": 256 } })));
    let r = d.sh(&id, "dd if=/dev/zero of=/tmp/fill bs=1M count=100");
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("No space left"), "{r}");
    let size: u64 = d.sh_ok(&id, "stat -c %s /tmp/fill").trim().parse().unwrap();
    assert!(size <= 33 << 20, "wrote {size} bytes with a 32 MiB cap");
    let df = d.sh_ok(&id, "df -m / | tail -1");
    let total: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!((28..=36).contains(&total), "df shows {total} MiB for a 32 MiB disk: {df}");
    // The home directory and the file API share the same cap.
    let r = d.sh(&id, "dd if=/dev/zero of=/home/user/more bs=1M count=10");
    assert_ne!(r["exit_code"], 0, "{r}");
    let (st, v) =
        d.send(d.req(Method::PUT, &format!("/v1/sandboxes/{id}/files?path=/home/user/up")).body(vec![0u8; 8 << 20]));
    assert_eq!((st, v["error"]["code"].as_str()), (507, Some("disk_full")), "{v}");
    // Freeing space makes it usable again.
    d.sh_ok(&id, "rm -f /tmp/fill /home/user/more; dd if=/dev/zero of=/tmp/ok bs=1M count=8 2>/dev/null");
    d.shutdown_and_check_leaks();
}

/// A disk larger than fits in memory is disk-backed (an ext4 image on the host's disk): it
/// holds 4× the sandbox's memory, filling it ends in ENOSPC for the writer and not in the
/// OOM killer, and nothing of it is left on the host once the sandbox is gone. A sandbox
/// that names no disk keeps the in-memory one, sized to fit.
#[test]
fn a_disk_four_times_the_memory_fills_to_its_cap_without_an_oom() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "memory_mb": 128, "disk_mb": 512 } })));
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!((st, v["limits"]["disk_mb"].as_u64()), (200, Some(512)), "{v}");
    let df = d.sh_ok(&id, "df -m /tmp | tail -1");
    let total: u64 = df.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!((480..=512).contains(&total), "df shows {total} MiB for a 512 MiB disk: {df}");
    // The image is unlinked once mounted: only the sandbox's mount holds it.
    let images: Vec<_> = std::fs::read_dir(d.data_dir.join("disks")).map(|r| r.flatten().collect()).unwrap_or_default();
    assert!(images.is_empty(), "disk images left named on the host: {images:?}");
    let r = d.exec(
        &id,
        json!({ "cmd": ["sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=700; r=$?; sync; exit $r"], "timeout_ms": 120_000 }),
    );
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(r["stderr"].as_str().unwrap_or("").contains("No space left"), "{r}");
    let size: u64 = d.sh_ok(&id, "stat -c %s /tmp/fill").trim().parse().unwrap_or(0);
    assert!((450 << 20..=512 << 20).contains(&size), "wrote {size} bytes on a 512 MiB disk with 128 MiB of memory");
    // Alive, and its agent was never OOM-killed (the same processes answer).
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!((st, v["state"].as_str()), (200, Some("running")), "{v}");
    d.sh_ok(&id, "rm /tmp/fill && dd if=/dev/zero of=/tmp/ok bs=1M count=64 2>/dev/null");
    // A fork's child has the parent's files and a disk of its own of the same size.
    if common::under_gvisor() {
        common::skipped_under_gvisor("forking the sandbox (no snapshots or forks)", "What the tier does not do");
    } else {
        let (st, v) = d.post(&format!("/v1/sandboxes/{id}/fork"), &json!({ "count": 1 }));
        assert_eq!(st, 201, "{v}");
        let kid = v["sandboxes"][0]["id"].as_str().unwrap_or_default().to_string();
        d.register(&kid);
        assert_eq!(v["sandboxes"][0]["limits"]["disk_mb"].as_u64(), Some(512), "{v}");
        assert_eq!(d.sh_ok(&kid, "stat -c %s /tmp/ok").trim(), (64u64 << 20).to_string());
        let df = d.sh_ok(&kid, "df -m /tmp | tail -1");
        assert!(df.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()).is_some_and(|t| t >= 480), "{df}");
    }
    // Named no disk: the in-memory one, sized to fit (a quarter of 128 MiB is /dev/shm's,
    // an eighth the processes').
    let small = d.create(sandbox_body(json!({ "resources": { "memory_mb": 128 } })));
    let (_, v) = d.get(&format!("/v1/sandboxes/{small}"));
    let mb = v["limits"]["disk_mb"].as_u64().unwrap_or(0);
    assert!((64..=96).contains(&mb), "an in-memory disk of {mb} MiB with 128 MiB of memory: {v}");
    d.shutdown_and_check_leaks();
}

/// A command writing `mib` MiB of zeros to its stdout: `head`'s 8 KiB writes, or under
/// gVisor `dd`'s 1 MiB ones, where every system call costs tens of µs (1 GiB through `head`
/// alone takes 10 s of them there; docs/gvisor.md, "The contract suite under gVisor").
fn zeros(mib: u64) -> Vec<String> {
    match common::under_gvisor() {
        false => vec!["head".into(), "-c".into(), (mib << 20).to_string(), "/dev/zero".into()],
        true => vec!["dd".into(), "if=/dev/zero".into(), "bs=1M".into(), format!("count={mib}"), "status=none".into()],
    }
}

#[test]
fn output_flood_is_capped_counted_and_bounded_in_memory() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let gib: u64 = 1 << 30;
    let t = Instant::now();
    let flood = format!("{} & {} >&2; wait", zeros(1024).join(" "), zeros(512).join(" "));
    let r = d.exec(&id, json!({ "cmd": ["sh", "-c", flood], "encoding": "base64", "timeout_ms": 30_000 }));
    assert!(t.elapsed() < Duration::from_secs(15), "flood took {:?}", t.elapsed());
    assert_eq!(r["exit_code"], 0, "{}", summary(&r));
    assert_eq!((r["stdout_truncated"].as_bool(), r["stderr_truncated"].as_bool()), (Some(true), Some(true)));
    assert_eq!((r["stdout_bytes"].as_u64(), r["stderr_bytes"].as_u64()), (Some(gib), Some(gib / 2)));
    let b64 = base64::engine::general_purpose::STANDARD;
    let out = b64.decode(r["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(out.len(), 1 << 20, "default cap is 1 MiB");
    // Half the cap from the start, the marker, the rest from the end; every byte accounted for.
    let (head, dropped, tail) = split_capped(&out);
    assert_eq!(head.len(), 1 << 19);
    assert_eq!(head.len() as u64 + dropped + tail.len() as u64, gib);
    assert!(head.iter().chain(tail).all(|b| *b == 0));
    assert_eq!(b64.decode(r["stderr"].as_str().unwrap()).unwrap().len(), 1 << 20);

    // A custom cap, in UTF-8.
    let r = d.exec(
        &id,
        json!({ "cmd": ["sh", "-c", "yes | head -c 100000"], "max_output_bytes": 1000, "timeout_ms": 10_000 }),
    );
    assert_eq!(r["stdout"].as_str().map(str::len), Some(1000), "{}", summary(&r));
    assert_eq!((r["stdout_bytes"].as_u64(), r["stdout_truncated"].as_bool()), (Some(100_000), Some(true)));

    // Streamed: the NDJSON stream carries at most the cap, then the real count.
    let resp = d
        .req(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "cmd": zeros(1024), "encoding": "base64", "timeout_ms": 30_000 }))
        .send()
        .unwrap();
    let mut streamed = 0usize;
    let mut last = Value::Null;
    for l in BufReader::new(resp).lines() {
        let v: Value = serde_json::from_str(&l.unwrap()).unwrap();
        if v["type"] == "stdout" {
            streamed += b64.decode(v["data"].as_str().unwrap()).unwrap().len();
        }
        last = v;
    }
    assert_eq!(streamed, 1 << 20, "streamed bytes beyond the cap");
    assert_eq!((last["type"].as_str(), last["stdout_bytes"].as_u64()), (Some("exited"), Some(gib)), "{last}");

    // Through the CLI, as a user: the first MiB, and a note on stderr.
    let mut c = d.cli();
    c.args(["run", "--"]).args(zeros(1024));
    let o = run_bounded(&mut c, None, Duration::from_secs(30));
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    assert_eq!(o.stdout.len(), 1 << 20);
    assert!(o.stderr_str().contains("truncated") && o.stderr_str().contains("1073741824"), "{}", o.stderr_str());

    let peak = d.peak_rss_kib();
    assert!(peak < 100 * 1024, "daemon peak RSS {peak} KiB after 3.5 GiB of output");
    d.shutdown_and_check_leaks();
}

/// Capped output: the head, the count in the marker between head and tail, and the tail.
fn split_capped(out: &[u8]) -> (&[u8], u64, &[u8]) {
    const OPEN: &[u8] = b"\n[glovebox: ";
    const CLOSE: &[u8] = b" bytes dropped]\n";
    let at = out.windows(OPEN.len()).position(|w| w == OPEN).expect("no marker in the capped output");
    let rest = &out[at + OPEN.len()..];
    let end = rest.windows(CLOSE.len()).position(|w| w == CLOSE).expect("marker not closed");
    let dropped = std::str::from_utf8(&rest[..end]).unwrap().parse().expect("dropped count");
    (&out[..at], dropped, &rest[end + CLOSE.len()..])
}

#[test]
fn capped_output_keeps_the_head_and_the_tail_with_the_true_dropped_count() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let gib: u64 = 1 << 30;
    let r = d.exec(&id, json!({ "cmd": ["sh", "-c", "yes | head -c 1073741824"], "timeout_ms": 60_000 }));
    assert_eq!(r["exit_code"], 0, "{}", summary(&r));
    assert_eq!((r["stdout_bytes"].as_u64(), r["stdout_truncated"].as_bool()), (Some(gib), Some(true)));
    let out = r["stdout"].as_str().unwrap().as_bytes();
    assert_eq!(out.len(), 1 << 20, "head, marker and tail fill the cap");
    let (head, dropped, tail) = split_capped(out);
    assert_eq!(head.len(), 1 << 19, "default split: half the cap is head");
    assert_eq!(head.len() as u64 + dropped + tail.len() as u64, gib, "the marker counts every dropped byte");
    assert!(head.starts_with(b"y\ny\n") && tail.ends_with(b"y\ny\n"), "head and tail are the output's own");
    assert!(head.chunks(2).chain(tail.rchunks(2)).all(|c| c == b"y\n" || c == b"y" || c == b"\n"));

    // The command's last line survives a flood before it, with a custom split.
    let script = "seq 1 3000000; echo LAST-LINE";
    let r = d.exec(
        &id,
        json!({ "cmd": ["sh", "-c", script], "max_output_bytes": 4096, "output_tail_bytes": 1024, "timeout_ms": 60_000 }),
    );
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(out.len(), 4096, "{}", summary(&r));
    assert!(out.starts_with("1\n2\n3\n") && out.ends_with("2999999\n3000000\nLAST-LINE\n"), "{out}");
    let (head, dropped, tail) = split_capped(out.as_bytes());
    assert_eq!(
        (head.len(), head.len() as u64 + dropped + tail.len() as u64),
        (3072, r["stdout_bytes"].as_u64().unwrap())
    );

    // Streamed: the head live, then the marker and the tail before `exited`.
    let resp = d
        .req(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "cmd": ["sh", "-c", script], "max_output_bytes": 4096, "timeout_ms": 60_000 }))
        .send()
        .unwrap();
    let mut streamed = String::new();
    for l in BufReader::new(resp).lines() {
        let v: Value = serde_json::from_str(&l.unwrap()).unwrap();
        if v["type"] == "stdout" {
            streamed.push_str(v["data"].as_str().unwrap());
        }
    }
    assert_eq!(streamed.len(), 4096);
    assert!(streamed.ends_with("3000000\nLAST-LINE\n") && streamed.contains(" bytes dropped]\n"), "{streamed}");

    // Head only, as asked: no marker, no tail.
    let r = d.exec(&id, json!({ "cmd": ["sh", "-c", script], "max_output_bytes": 100, "output_tail_bytes": 0 }));
    let seq: String = (1..100).map(|i| format!("{i}\n")).collect();
    assert_eq!(r["stdout"].as_str(), Some(&seq[..100]), "{}", summary(&r));
    let (st, v) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["true"], "max_output_bytes": 100, "output_tail_bytes": 101 }),
    );
    assert_eq!(st, 400, "{v}");
    d.shutdown_and_check_leaks();
}

#[test]
fn cpu_quota_is_enforced() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "cpus": 0.25 } })));
    let probe = "import time\nt = time.time()\nwhile time.time() - t < 2: pass\nprint(time.process_time())";
    let used_ms = || d.get(&format!("/v1/sandboxes/{id}/metrics")).1["cpu_usage_ms"].as_u64().unwrap_or(0);
    let before = used_ms();
    let r = d.exec(&id, json!({ "cmd": ["python3", "-c", probe], "timeout_ms": 20_000 }));
    let inside: f64 = r["stdout"].as_str().unwrap().trim().parse().unwrap_or_else(|_| panic!("{r}"));
    // Under gVisor the guest counts as its CPU time the time the host throttled the sentry
    // (docs/gvisor.md, "Limits"): what the host's cgroup measured (the API's) is the truth.
    let cpu = match common::under_gvisor() {
        false => inside,
        true => (used_ms() - before) as f64 / 1000.0,
    };
    assert!(cpu < 0.8, "used {cpu} s of CPU in 2 s wall with cpus=0.25");
    assert!(cpu > 0.05, "got {cpu} s of CPU: not running at all?");
    d.shutdown_and_check_leaks();
}

fn summary(r: &Value) -> String {
    let mut r = r.clone();
    for k in ["stdout", "stderr"] {
        if let Some(s) = r[k].as_str() {
            r[k] = json!(format!("<{} chars>", s.len()));
        }
    }
    r.to_string()
}
