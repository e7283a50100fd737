//! A daemon you can run for months: sandboxes survive a daemon crash (SIGKILL) or a plain
//! stop (SIGTERM) and are re-adopted by the next start on the same data dir, with their ids,
//! clocks, commands and network; what a crash damaged is cleaned up and said why; idle
//! auto-stop counts running commands; finished commands stay readable after the sandbox;
//! lifecycle events are listed and streamed.
//!
//! Other daemons (other tests, in parallel) never touch these orphans: a sandbox's run dir
//! names the data dir that owns it, and only that data dir's daemon adopts or cleans it.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::{cgroup_dirs, leaks, poll, processes_of, run_dir, sandbox_body, Daemon};
use serde_json::{json, Value};

fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
}

/// Ids of the sandboxes the daemon lists (a list call is not activity on any sandbox).
fn listed(d: &Daemon) -> BTreeSet<String> {
    let (st, v) = d.get("/v1/sandboxes");
    assert_eq!(st, 200, "{v}");
    v["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
}

fn events_of(d: &Daemon, id: &str) -> Vec<Value> {
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}/events"));
    assert_eq!(st, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e["reason"].as_str() {
            Some(r) => format!("{}:{r}", e["type"].as_str().unwrap()),
            None => e["type"].as_str().unwrap().to_string(),
        })
        .collect()
}

fn background(d: &Daemon, id: &str, script: &str) -> u64 {
    let (st, v) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["sh", "-c", script], "background": true, "timeout_ms": 0 }),
    );
    assert_eq!(st, 202, "{v}");
    v["id"].as_u64().unwrap()
}

/// Whether sandbox `id` is listed by the agent's command list with this state.
fn command(d: &Daemon, id: &str, cid: u64) -> (u16, Value) {
    d.get(&format!("/v1/sandboxes/{id}/commands/{cid}"))
}

#[test]
fn sigkilled_daemon_restarts_and_readopts_every_intact_sandbox() {
    require_root!();
    let mut d = Daemon::start();
    // `a` has commands; `short` must still end at its original deadline; `net` has a link.
    let a =
        d.create(sandbox_body(json!({ "timeout_s": 120, "metadata": { "who": "a" }, "env": { "GREETING": "hi" } })));
    let short = d.create(sandbox_body(json!({ "timeout_s": 12 })));
    let net = d.create(sandbox_body(json!({ "network": { "mode": "allow-list", "allow": ["198.51.100.0/24"] } })));
    let mut others = Vec::new();
    for _ in 0..5 {
        others.push(d.create(sandbox_body(json!({}))));
    }
    let before: Vec<Value> = [&a, &short, &net].iter().map(|id| d.get(&format!("/v1/sandboxes/{id}")).1).collect();
    assert_eq!(d.sh_ok(&a, "echo $GREETING > /tmp/state; cat /tmp/state"), "hi\n");
    let fg = d.sh(&a, "echo foreground-out");
    let fg_id = fg["id"].as_u64().unwrap();
    let sleeper = background(&d, &a, "echo sleeping; exec sleep 300");
    let finisher = background(&d, &a, "sleep 2; echo finished-while-down; exit 7");
    let has_eth0 = |d: &Daemon| d.sh(&net, "cat /proc/net/dev")["stdout"].as_str().unwrap_or("").contains("eth0");
    assert!(has_eth0(&d), "the allow-list sandbox has its link");
    let running = poll(Duration::from_secs(5), Duration::from_millis(20), || {
        processes_of(&a).iter().any(|p| p.comm == "sleep").then_some(())
    });
    assert!(running.is_some(), "the background sleep runs: {:?}", processes_of(&a));

    d.crash();
    // The sandboxes outlive their daemon, and the leak check sees them (it can fail).
    std::thread::sleep(Duration::from_millis(200));
    for id in [&a, &short, &net] {
        assert!(!processes_of(id).is_empty(), "sandbox {id} died with the daemon");
        assert!(!cgroup_dirs(id).is_empty());
        assert!(run_dir().join("sandboxes").join(id).exists());
    }
    let ids: BTreeSet<String> = [a.clone(), short.clone()].into();
    assert!(!leaks(&ids, &[]).is_empty(), "the leak check misses a crashed daemon's sandboxes");
    // Let the second background command finish while nobody watches.
    std::thread::sleep(Duration::from_millis(2500));

    let t = Instant::now();
    let d = d.restart();
    let restart_ms = t.elapsed().as_millis();
    let log = d.log();
    let adopted_line = log.lines().find(|l| l.contains("sandboxes in")).unwrap_or("").to_string();
    eprintln!("restart with 8 sandboxes: /healthz answered after {restart_ms} ms; log: {adopted_line}");
    assert!(adopted_line.contains("re-adopted 8 sandboxes"), "{log}");

    // Same ids, same clocks, same configuration.
    for (id, old) in [&a, &short, &net].iter().zip(&before) {
        let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
        assert_eq!(st, 200, "{id} after restart: {v}");
        for k in ["created_at", "expires_at", "limits", "metadata", "network", "template", "state"] {
            assert_eq!(v[k], old[k], "{id}: {k} changed across the restart");
        }
    }
    assert_eq!(listed(&d), [a.clone(), short.clone(), net.clone()].into_iter().chain(others.clone()).collect());
    // The sandbox works and kept its files and environment.
    assert_eq!(d.sh_ok(&a, "cat /tmp/state; echo $GREETING"), "hi\nhi\n");
    // Its commands: the running one still runs, the one that finished while the daemon was
    // down has its output, the foreground one is on record.
    let (st, v) = d.get(&format!("/v1/sandboxes/{a}/commands"));
    assert_eq!(st, 200, "{v}");
    let cmds = v["commands"].as_array().unwrap();
    let find = |cid: u64| cmds.iter().find(|c| c["id"] == cid).cloned().unwrap_or(Value::Null);
    assert_eq!(find(sleeper)["running"], true, "{v}");
    assert_eq!(find(finisher)["running"], false, "{v}");
    let (st, r) = command(&d, &a, finisher);
    assert_eq!(st, 200, "{r}");
    assert_eq!((r["stdout"].as_str(), r["exit_code"].as_i64()), (Some("finished-while-down\n"), Some(7)), "{r}");
    let (st, r) = command(&d, &a, fg_id);
    assert_eq!((st, r["stdout"].as_str()), (200, Some("foreground-out\n")), "{r}");
    // The network link is rebuilt (asynchronously, right after the start).
    let relinked = poll(Duration::from_secs(10), Duration::from_millis(100), || has_eth0(&d).then_some(()));
    assert!(relinked.is_some(), "the allow-list sandbox has no link after the restart");
    // Events: created, then adopted.
    let ev = poll(Duration::from_secs(10), Duration::from_millis(100), || {
        let k = kinds(&events_of(&d, &a));
        (k == ["created", "adopted"]).then_some(k)
    });
    assert!(ev.is_some(), "events of {a}: {:?}", kinds(&events_of(&d, &a)));

    // The lifetime clock kept counting: `short` ends at the deadline it had before.
    let expires = before[1]["expires_at"].as_str().unwrap().to_string();
    let gone = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        let (st, v) = d.get(&format!("/v1/sandboxes/{short}"));
        (st == 410).then_some(v)
    });
    let gone = gone.expect("the short sandbox outlived its deadline");
    assert_eq!(gone["error"]["reason"], "timeout", "{gone}");
    let ended = events_of(&d, &short).into_iter().find(|e| e["type"] == "ended").expect("ended event");
    let lag = rfc3339_ms(ended["time"].as_str().unwrap()) - rfc3339_ms(&expires);
    assert!((0..2000).contains(&lag), "ended {lag} ms after its deadline {expires}: {ended}");

    // Killing the adopted sandbox: its commands' records outlive it.
    let (st, _) = d.delete(&format!("/v1/sandboxes/{a}"));
    assert_eq!(st, 204);
    // PID 1 is not the restarted daemon's child, yet the answer still means it is all gone.
    let left = processes_of(&a);
    assert!(left.is_empty(), "processes of the adopted sandbox right after its 204: {left:?}");
    let (st, r) = command(&d, &a, finisher);
    assert_eq!((st, r["stdout"].as_str()), (200, Some("finished-while-down\n")), "{r}");
    let (st, r) = command(&d, &a, sleeper);
    assert_eq!(st, 200, "the killed background command is on record: {r}");
    assert_eq!((r["stdout"].as_str(), r["signal"].as_i64()), (Some("sleeping\n"), Some(9)), "{r}");
    assert_eq!(kinds(&events_of(&d, &a)), ["created", "adopted", "ended:killed"]);
    assert!(leaks(&[a.clone(), short.clone()].into(), &[]).is_empty());
    d.shutdown_and_check_leaks();
}

/// Labels and an idle timeout changed on a live sandbox are what a restarted daemon re-adopts,
/// and the adopted sandbox's idle clock follows a later change.
#[test]
fn labels_and_idle_timeout_changed_live_survive_a_restart() {
    require_root!();
    let mut d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "timeout_s": 120, "metadata": { "who": "a" } })));
    let path = format!("/v1/sandboxes/{id}");
    let patch = |d: &Daemon, body: Value| d.send(d.req(reqwest::Method::PATCH, &path).json(&body));
    let (st, v) = patch(&d, json!({ "metadata": { "who": "b" }, "idle_timeout_s": 600 }));
    assert_eq!(st, 200, "{v}");
    d.crash();
    let d = d.restart();
    let (st, v) = d.get(&path);
    assert_eq!(st, 200, "{v}");
    assert_eq!((&v["metadata"], &v["idle_timeout_s"]), (&json!({ "who": "b" }), &json!(600)), "{v}");
    // The adopted sandbox's idle clock takes a new timeout (watched through the list: a
    // request to the sandbox is activity).
    let (st, v) = patch(&d, json!({ "idle_timeout_s": 1 }));
    assert_eq!(st, 200, "{v}");
    let ended = poll(Duration::from_secs(10), Duration::from_millis(200), || (!listed(&d).contains(&id)).then_some(()));
    assert!(ended.is_some(), "{id} still listed 10 s after its new 1 s idle timeout");
    let (st, v) = d.get(&path);
    assert_eq!((st, &v["error"]["reason"]), (410, &json!("idle")), "{v}");
    d.shutdown_and_check_leaks();
}

/// Milliseconds since the epoch of an RFC 3339 UTC time as the API writes it.
fn rfc3339_ms(s: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| s[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let (hh, mm, ss, ms) = (n(11..13), n(14..16), n(17..19), n(20..23));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000) + ms
}

#[test]
fn damaged_sandboxes_are_cleaned_up_at_restart_and_say_why() {
    require_root!();
    let mut d = Daemon::start();
    let broken = d.create(sandbox_body(json!({})));
    let intact = d.create(sandbox_body(json!({})));
    let range = d.uid_range(&broken).expect("uid range");
    d.crash();
    // Kill the sandbox's processes while no daemon runs.
    for p in processes_of(&broken) {
        kill9(p.pid);
    }
    let dead =
        poll(Duration::from_secs(5), Duration::from_millis(20), || processes_of(&broken).is_empty().then_some(()));
    assert!(dead.is_some(), "{:?}", processes_of(&broken));
    let d = d.restart();
    let clean = poll(Duration::from_secs(5), Duration::from_millis(50), || {
        leaks(&[broken.clone()].into(), &[]).is_empty().then_some(())
    });
    assert!(clean.is_some(), "after restart: {:?}", leaks(&[broken.clone()].into(), &[]));
    assert!(common::processes_in_range(range).is_empty());
    let (st, v) = d.get(&format!("/v1/sandboxes/{broken}"));
    assert_eq!(
        (st, v["error"]["code"].as_str(), v["error"]["reason"].as_str()),
        (410, Some("sandbox_gone"), Some("daemon_restart")),
        "{v}"
    );
    let (st, v) = d.post(&format!("/v1/sandboxes/{broken}/exec"), &json!({ "cmd": ["true"] }));
    assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("daemon_restart")), "{v}");
    let ev = events_of(&d, &broken);
    assert_eq!(kinds(&ev), ["created", "ended:daemon_restart"], "{ev:?}");
    assert_eq!(ev[1]["state"], "killed");
    assert!(ev[1]["detail"].as_str().unwrap_or("").contains("PID 1"), "{ev:?}");
    // The intact one is back; the daemon-wide list has both stories.
    assert_eq!(d.sh_ok(&intact, "echo still here"), "still here\n");
    let (st, v) = d.get("/v1/events");
    assert_eq!(st, 200);
    let all = v["events"].as_array().unwrap();
    assert!(all.iter().any(|e| e["sandbox_id"] == broken.as_str() && e["reason"] == "daemon_restart"), "{v}");
    assert!(all.iter().any(|e| e["sandbox_id"] == intact.as_str() && e["type"] == "adopted"), "{v}");
    // The new daemon's own sandboxes do not collide with the old ones' leftovers.
    let c = d.create(sandbox_body(json!({})));
    assert_eq!(d.sh_ok(&c, "echo fresh"), "fresh\n");
    // A second restart still remembers why `broken` is gone (the reason is in the store).
    let mut d = d;
    d.crash();
    let d = d.restart();
    let (st, v) = d.get(&format!("/v1/sandboxes/{broken}"));
    assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("daemon_restart")), "{v}");
    d.shutdown_and_check_leaks();
}

#[test]
fn sigterm_leaves_sandboxes_running_for_the_next_start() {
    require_root!();
    let mut d = Daemon::start_keeping();
    let id = d.create(sandbox_body(json!({})));
    let cid = background(&d, &id, "echo kept; exec sleep 300");
    d.stop();
    assert!(!processes_of(&id).is_empty(), "SIGTERM killed the sandbox");
    let d = d.restart();
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 200, "{v}");
    assert_eq!(d.sh_ok(&id, "echo works"), "works\n");
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}/commands"));
    assert_eq!(st, 200);
    assert!(v["commands"].as_array().unwrap().iter().any(|c| c["id"] == cid && c["running"] == true), "{v}");
    // The harness deletes what a keeping daemon still has before its SIGTERM.
    d.shutdown_and_check_leaks();
}

#[test]
fn idle_stop_counts_running_commands_and_keepalives() {
    require_root!();
    let d = Daemon::start();
    let busy = d.create(sandbox_body(json!({ "idle_timeout_s": 2 })));
    let idle = d.create(sandbox_body(json!({ "idle_timeout_s": 2 })));
    let kept = d.create(sandbox_body(json!({ "idle_timeout_s": 2 })));
    let (st, v) = d.post("/v1/sandboxes", &json!({ "idle_timeout_s": 0 }));
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{v}");
    let (_, v) = d.get(&format!("/v1/sandboxes/{busy}"));
    assert_eq!(v["idle_timeout_s"], 2, "{v}");
    let t0 = Instant::now();
    let mut idle_gone_at = None;
    std::thread::scope(|s| {
        // A foreground command longer than the idle period, then a background one, with no
        // other API call on that sandbox meanwhile.
        let fg = s.spawn(|| d.sh(&busy, "sleep 3; echo done"));
        let mut bg = false;
        while t0.elapsed() < Duration::from_millis(8500) {
            let l = listed(&d);
            assert!(l.contains(&busy), "a sandbox running a command was stopped as idle");
            if idle_gone_at.is_none() && !l.contains(&idle) {
                idle_gone_at = Some(t0.elapsed());
            }
            if !bg && fg.is_finished() {
                background(&d, &busy, "sleep 4");
                bg = true;
            }
            if t0.elapsed() < Duration::from_secs(6) {
                let (st, v) = d.post(&format!("/v1/sandboxes/{kept}/keepalive"), &json!({}));
                assert_eq!(st, 200, "a kept-alive sandbox was stopped: {v}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        assert!(bg);
        let r = fg.join().unwrap();
        assert_eq!(r["stdout"], "done\n", "{r}");
    });
    let at = idle_gone_at.expect("the idle sandbox was not stopped");
    assert!(at >= Duration::from_secs(2) && at < Duration::from_secs(5), "stopped after {at:?}");
    let (st, v) = d.get(&format!("/v1/sandboxes/{idle}"));
    assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("idle")), "{v}");
    assert_eq!(kinds(&events_of(&d, &idle)), ["created", "ended:idle"]);
    assert_eq!(events_of(&d, &idle)[1]["state"], "stopped");
    // Once its command ended (at ~7 s) the busy one idles out too, and so does the kept one
    // after its keep-alives stopped (at 6 s).
    for id in [&busy, &kept] {
        let gone =
            poll(Duration::from_secs(8), Duration::from_millis(200), || (!listed(&d).contains(id)).then_some(()));
        assert!(gone.is_some(), "{id} never idled out");
        let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
        assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("idle")), "{v}");
    }
    d.shutdown_and_check_leaks();
}

#[test]
fn finished_commands_are_readable_after_the_sandbox_is_gone_and_events_stream() {
    require_root!();
    let d = Daemon::start();
    // Follow the daemon-wide stream while the sandbox lives and dies.
    let url = format!("{}/v1/events?follow=true&timeout_s=20", d.url);
    let key = d.key.clone();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let follower = std::thread::spawn(move || {
        let c = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap();
        let resp = c.get(url).bearer_auth(key).send().expect("follow");
        assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
        for line in BufReader::new(resp).lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).expect("an NDJSON event");
            let end = v["type"] == "ended";
            if tx.send(v).is_err() || end {
                break;
            }
        }
    });
    let id = d.create(sandbox_body(json!({})));
    let r = d.exec(&id, json!({ "cmd": ["sh", "-c", "echo out; echo err >&2; exit 3"] }));
    let fg = r["id"].as_u64().unwrap();
    let big = d.exec(&id, json!({ "cmd": ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x"] }));
    let big_id = big["id"].as_u64().unwrap();
    let bg = background(&d, &id, "echo from-background");
    let done = poll(Duration::from_secs(5), Duration::from_millis(50), || {
        (command(&d, &id, bg).1["stdout"] == "from-background\n").then_some(())
    });
    assert!(done.is_some());
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204);
    let (st, r) = command(&d, &id, fg);
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        (r["stdout"].as_str(), r["stderr"].as_str(), r["exit_code"].as_i64()),
        (Some("out\n"), Some("err\n"), Some(3)),
        "{r}"
    );
    assert!(r["duration_ms"].as_u64().is_some());
    let (st, r) = command(&d, &id, bg);
    assert_eq!((st, r["stdout"].as_str(), r["exit_code"].as_i64()), (200, Some("from-background\n"), Some(0)), "{r}");
    // Output is kept capped: 64 KiB of the 100,000 bytes, marked truncated.
    let (st, r) = command(&d, &id, big_id);
    assert_eq!(st, 200);
    assert_eq!(
        (r["stdout"].as_str().unwrap().len(), r["stdout_truncated"].as_bool(), r["stdout_bytes"].as_u64()),
        (65_536, Some(true), Some(100_000))
    );
    // A command that never existed: the sandbox's own answer (gone).
    let (st, v) = command(&d, &id, 999);
    assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("killed")), "{v}");
    let got: Vec<Value> = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(10)).ok()).collect();
    follower.join().unwrap();
    let mine: Vec<String> = kinds(&got.into_iter().filter(|e| e["sandbox_id"] == id.as_str()).collect::<Vec<_>>());
    assert_eq!(mine, ["created", "ended:killed"]);
    // Paging: `after` skips what was seen.
    let (_, all) = d.get("/v1/events");
    let seqs: Vec<i64> = all["events"].as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let (_, rest) = d.get(&format!("/v1/events?after={}", seqs[0]));
    assert_eq!(rest["events"].as_array().unwrap().len(), seqs.len() - 1);
    let (st, v) = d.get("/v1/events?limit=0");
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")));
    let (st, _) = d.get("/v1/sandboxes/nope/events");
    assert_eq!(st, 404);
    d.shutdown_and_check_leaks();
}
