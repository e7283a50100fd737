//! The manager on the fake backend: create, exec, the clocks, agent death and destroy, as a
//! caller sees them. No root, no namespaces.

use std::time::{Duration, Instant};

use glovebox_proto::api::{CreateSandbox, EndReason, ExecRequest};

use super::testing::{ended, fixture, fixture_with, request, Fixture};
use crate::error::Error;

fn exec(cmd: serde_json::Value) -> ExecRequest {
    serde_json::from_value(cmd).expect("exec request")
}

#[tokio::test]
async fn create_lists_and_destroy_answers_gone() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"metadata": {"k": "v"}}))).await.expect("create");
    let listed = f.m.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sb.id);
    assert_eq!(listed[0].metadata.get("k").map(String::as_str), Some("v"));
    assert_eq!(f.m.owner_of(&sb.id).as_deref(), Some(crate::tenants::DEFAULT_TENANT));
    assert!(f.m.destroy(&sb.id, EndReason::Killed).await);
    // Gone, with the reason (the API's 410), and no longer listed or destroyable.
    assert!(matches!(f.m.get(&sb.id), Err(Error::Gone { reason: EndReason::Killed, .. })));
    assert!(f.m.list().is_empty());
    assert!(!f.m.destroy(&sb.id, EndReason::Killed).await);
    assert!(!f.fake.agent(&sb.id).expect("booted").is_alive());
    // The store keeps the end: a manager that forgot still answers gone.
    assert_eq!(f.m.store.end_reason(&sb.id).expect("store"), Some(EndReason::Killed));
}

#[tokio::test]
async fn a_sandbox_being_destroyed_is_gone_from_the_moment_it_is_unlisted() {
    let f = fixture();
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    // The destroy's final usage reading comes right after the sandbox leaves the live list:
    // a request then must be told "gone, killed", never "not found".
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (m, id, seen2) = (std::sync::Arc::downgrade(&f.m), sb.id.clone(), seen.clone());
    f.fake.agent(&sb.id).expect("booted").on_stats(move || {
        if let Some(m) = m.upgrade() {
            let answer = match m.get(&id) {
                Ok(_) => "live".to_string(),
                Err(Error::Gone { reason, .. }) => format!("gone {}", reason.as_str()),
                Err(e) => format!("{e}"),
            };
            seen2.lock().expect("seen").push(answer);
        }
    });
    assert!(f.m.destroy(&sb.id, EndReason::Killed).await);
    let seen = seen.lock().expect("seen").clone();
    assert!(!seen.is_empty(), "the destroy read no usage");
    assert!(seen.iter().all(|a| a == "gone killed"), "while being destroyed, the sandbox was answered as {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroyed_sandboxs_release_waits_for_a_moment_with_no_request_in_flight() {
    let f = fixture();
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    let dir = sb.host.dir().to_path_buf();
    assert!(dir.exists());
    // Another sandbox's request in flight.
    let busy = f.m.sandbox_work.guard();
    let t = Instant::now();
    assert!(f.m.destroy(&sb.id, EndReason::Killed).await);
    tokio::time::sleep(Duration::from_millis(15)).await;
    // The wait is bounded (50 ms): only a check made well inside the bound says anything.
    let early = t.elapsed() < Duration::from_millis(40);
    let kept = dir.exists();
    drop(busy);
    if early {
        assert!(kept, "released while a request was in flight");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while dir.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(!dir.exists(), "not released once quiet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_requests_back_to_back_a_destroyed_sandbox_is_released_at_once() {
    let f = fixture();
    // Requests in flight with no gap between them for longer than the quiet wait's bound.
    let busy = f.m.sandbox_work.guard();
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    let dir = sb.host.dir().to_path_buf();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let t = Instant::now();
    assert!(f.m.destroy(&sb.id, EndReason::Killed).await);
    while dir.exists() && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Waiting for a quiet moment would have taken the whole bound (50 ms): the guard is held.
    assert!(t.elapsed() < Duration::from_millis(50), "released after {:?}", t.elapsed());
    assert!(f.m.sandbox_work.busy(), "the request in flight all along");
    drop(busy);
}

#[tokio::test]
async fn unknown_sandbox_is_not_found() {
    let f = fixture();
    assert!(matches!(f.m.get("nope"), Err(Error::SandboxNotFound(_))));
}

#[tokio::test]
async fn bad_requests_create_nothing() {
    let f = fixture();
    for bad in [
        serde_json::json!({"timeout_s": 0}),
        serde_json::json!({"idle_timeout_s": 0}),
        serde_json::json!({"resources": {"cpus": 0.0}}),
        serde_json::json!({"env": {"A=B": "x"}}),
    ] {
        assert!(matches!(f.m.create(request(bad.clone())).await, Err(Error::Invalid(_))), "{bad}");
    }
    assert!(matches!(
        f.m.create(request(serde_json::json!({"template": "missing"}))).await,
        Err(Error::NotFound { what: "template", .. })
    ));
    assert!(f.m.list().is_empty());
    assert!(lock_booted(&f).is_empty());
}

fn lock_booted(f: &Fixture) -> Vec<String> {
    crate::util::lock(&f.fake.booted).iter().map(|a| a.id().to_string()).collect()
}

#[tokio::test]
async fn exec_runs_through_the_agent() {
    let f = fixture();
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    let r =
        crate::ops::exec(&f.m, &sb, exec(serde_json::json!({"cmd": ["echo", "hello", "box"]}))).await.expect("exec");
    assert_eq!((r.exit_code, r.stdout.as_str(), r.timed_out), (0, "hello box\n", false));
    // A command over its time budget is reported timed out; the sandbox stays usable.
    let r = crate::ops::exec(&f.m, &sb, exec(serde_json::json!({"cmd": ["sleep", "10"], "timeout_ms": 50})))
        .await
        .expect("exec");
    assert!(r.timed_out);
    assert_eq!(r.signal, Some(9));
    assert!(f.m.get(&sb.id).is_ok());
}

#[tokio::test]
async fn lifetime_deadline_ends_the_sandbox() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"timeout_s": 1}))).await.expect("create");
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(5)).await, Some(EndReason::Timeout));
}

#[tokio::test]
async fn set_timeout_moves_the_deadline() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"timeout_s": 1}))).await.expect("create");
    f.m.set_timeout(&sb.id, 3600).expect("set timeout");
    assert_eq!(ended(&f.m, &sb.id, Duration::from_millis(1500)).await, None);
    assert!(matches!(f.m.set_timeout(&sb.id, 0), Err(Error::Invalid(_))));
}

#[tokio::test]
async fn idle_sandbox_ends_idle() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"idle_timeout_s": 1}))).await.expect("create");
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(5)).await, Some(EndReason::Idle));
}

#[tokio::test]
async fn activity_keeps_an_idle_clock_from_ending() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"idle_timeout_s": 1}))).await.expect("create");
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        sb.activity.touch();
    }
    assert!(f.m.get(&sb.id).is_ok(), "ended while in use");
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(5)).await, Some(EndReason::Idle));
}

#[tokio::test]
async fn agent_death_ends_the_sandbox_and_calls_answer_gone() {
    let f = fixture();
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    f.fake.agent(&sb.id).expect("booted").die();
    let r = crate::ops::exec(&f.m, &sb, exec(serde_json::json!({"cmd": ["echo", "x"]}))).await;
    assert!(matches!(r, Err(Error::Gone { reason: EndReason::Error, .. })), "{r:?}");
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(5)).await, Some(EndReason::Error));
}

/// A request that finds the sandbox's processes gone before its watch sees the exit (a gVisor
/// sentry takes a while to exit once killed) answers gone, and from then on so does everyone:
/// no GET or list says `running` after a 410, and the woken watch destroys it.
#[tokio::test]
async fn once_a_call_answers_gone_every_later_call_does() {
    let f = fixture();
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    let agent = f.fake.agent(&sb.id).expect("booted");
    agent.doom();
    let r = crate::ops::exec(&f.m, &sb, exec(serde_json::json!({"cmd": ["echo", "x"]}))).await;
    assert!(matches!(r, Err(Error::Gone { reason: EndReason::Error, .. })), "{r:?}");
    assert!(matches!(f.m.get(&sb.id), Err(Error::Gone { reason: EndReason::Error, .. })));
    assert!(f.m.list().iter().all(|s| s.id != sb.id), "listed after a call answered gone");
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(5)).await, Some(EndReason::Error));
    let t = Instant::now();
    while f.m.registry.live(&sb.id).is_some() && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(f.m.registry.live(&sb.id).is_none(), "the watch did not destroy it");
    agent.die();
}

#[tokio::test]
async fn destroy_all_ends_every_sandbox() {
    let f = fixture();
    let a = f.m.create(CreateSandbox::default()).await.expect("create");
    let b = f.m.create(CreateSandbox::default()).await.expect("create");
    f.m.destroy_all(EndReason::Killed).await;
    assert_eq!(f.m.live_count(), 0);
    for id in [&a.id, &b.id] {
        assert!(matches!(f.m.get(id), Err(Error::Gone { reason: EndReason::Killed, .. })));
    }
}

#[tokio::test]
async fn observers_record_the_life_and_the_commands() {
    let f = fixture();
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    let r = crate::ops::exec(&f.m, &sb, exec(serde_json::json!({"cmd": ["echo", "kept"]}))).await.expect("exec");
    f.m.destroy_because(&sb.id, EndReason::Killed, Some("by the test")).await;
    let rows = f.m.store.events(Some(&sb.id), 0, 10).expect("events");
    let kinds: Vec<(&str, Option<&str>, Option<&str>)> =
        rows.iter().map(|e| (e.kind.as_str(), e.reason.as_deref(), e.detail.as_deref())).collect();
    assert_eq!(kinds, [("created", None, None), ("ended", Some("killed"), Some("by the test"))]);
    // The end is stored with its usage; the command's record outlives the sandbox.
    assert_eq!(f.m.store.end_reason(&sb.id).expect("store"), Some(EndReason::Killed));
    assert_eq!(f.m.usage_of(&sb.id).map(|u| u.sandbox_id), Some(sb.id.clone()));
    f.m.records.settle().await;
    let rec = f.m.store.command(&sb.id, r.id).expect("store").expect("command record");
    assert_eq!((rec.exit.exit_code, rec.stdout.as_slice()), (0, &b"kept\n"[..]));
}

/// Waits (at most 5 s) for the warm pool to hold one sandbox; the ids booted so far.
async fn one_warm(f: &Fixture) -> Vec<String> {
    let t = Instant::now();
    while f.m.warm_count() < 1 && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(f.m.warm_count(), 1, "the pool filled");
    lock_booted(f)
}

#[tokio::test]
async fn a_warm_sandbox_is_handed_out_and_replaced() {
    let f = fixture_with(|cfg| cfg.warm_pool = 1);
    let booted = one_warm(&f).await;
    let pool = crate::util::lock(&f.fake.boot_limits).clone();
    assert!(pool.iter().all(crate::backend::jail::in_memory), "warm sandboxes have in-memory disks: {pool:?}");
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    assert_eq!(Some(&sb.id), booted.last(), "the create took the warm sandbox");
    // Other limits than the pool's are applied to a warm sandbox...
    let booted = one_warm(&f).await;
    let sb = f.m.create(request(serde_json::json!({"resources": {"cpus": 0.5}}))).await.expect("create");
    assert_eq!(Some(&sb.id), booted.last());
    assert_eq!(sb.limits.cpus, 0.5);
    // ...but a disk size its tmpfs cannot take boots a fresh one.
    let booted = one_warm(&f).await;
    let sb = f.m.create(request(serde_json::json!({"resources": {"disk_mb": 64}}))).await.expect("create");
    assert!(!booted.contains(&sb.id));
    assert_eq!(f.m.warm_count(), 1);
    // So does a disk-backed one, even of the pool's in-memory size's limits otherwise.
    let pool_disk = f.m.limits_for(&Default::default()).expect("defaults").disk_mb;
    let sb = f.m.create(request(serde_json::json!({"resources": {"disk_mb": pool_disk + 1}}))).await.expect("create");
    assert!(!booted.contains(&sb.id));
    assert_eq!(f.m.warm_count(), 1);
    f.m.destroy_all(EndReason::Killed).await;
    assert_eq!(f.m.warm_count(), 0, "shutdown discards the pool");
}

/// A shutdown while the pool refills leaves nothing booted running: the boot under way ends
/// by discarding its sandbox, and the shutdown waits for it.
#[tokio::test]
async fn a_shutdown_during_a_refill_leaves_no_sandbox_running() {
    let f = fixture_with(|cfg| cfg.warm_pool = 1);
    f.m.refill_pool();
    // The refill is under way (waiting for a quiet moment or booting) when the shutdown comes.
    f.m.destroy_all(EndReason::Killed).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alive: Vec<String> =
        crate::util::lock(&f.fake.booted).iter().filter(|a| a.is_alive()).map(|a| a.id().to_string()).collect();
    assert!(alive.is_empty(), "booted sandboxes left running after shutdown: {alive:?}");
    assert_eq!(f.m.warm_count(), 0);
    f.m.refill_pool();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(crate::util::lock(&f.fake.booted).iter().all(|a| !a.is_alive()), "a closed pool refilled");
}

/// `limits_for` gives the disk cap in force: left out, the in-memory disk that fits (at most
/// the default); asked for, that size (on disk when it does not fit in memory).
#[tokio::test]
async fn the_disk_asked_for_is_the_cap_in_force() {
    use crate::backend::jail::in_memory;
    let f = fixture();
    let l = |v: serde_json::Value| f.m.limits_for(&serde_json::from_value(v).expect("resources")).expect("limits");
    let d = l(serde_json::json!({"memory_mb": 512}));
    assert_eq!((d.disk_mb, in_memory(&d)), (384, true), "512 MiB of memory leaves 384 for the disk");
    let d = l(serde_json::json!({"memory_mb": 8192}));
    assert_eq!((d.disk_mb, in_memory(&d)), (f.m.cfg.defaults.disk_mb, true), "at most the default when left out");
    let d = l(serde_json::json!({"memory_mb": 512, "disk_mb": 200}));
    assert_eq!((d.disk_mb, in_memory(&d)), (200, true));
    let d = l(serde_json::json!({"memory_mb": 512, "disk_mb": 2048}));
    assert_eq!((d.disk_mb, in_memory(&d)), (2048, false), "more than fits in memory is disk-backed");
    let d = l(serde_json::json!({"memory_mb": 16, "disk_mb": 1}));
    assert_eq!((d.disk_mb, in_memory(&d)), (4, true), "the smallest in-memory disk is 4 MiB");
}

#[test]
fn tmpfs_id_maps_from_linux_6_3() {
    for (release, idmaps) in [
        ("6.1.0-57-amd64", false),
        ("5.15.0-91-generic", false),
        ("6.3.0", true),
        ("6.12.48+deb13-amd64", true),
        ("7.0.1", true),
        ("", false),
    ] {
        assert_eq!(super::tmpfs_idmaps(release), idmaps, "{release:?}");
    }
}
