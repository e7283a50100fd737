//! Pause and resume on the fake backend: the lifetime clock stops and restarts with what was
//! left, the idle clock pauses rather than kills when asked to, both are idempotent, and the
//! store keeps the pause. No root.

use std::time::{Duration, Instant};

use glovebox_proto::api::{EndReason, SandboxState};

use super::testing::{ended, fixture, request};
use crate::error::Error;

#[tokio::test]
async fn a_paused_sandbox_does_not_time_out_and_resumes_with_what_was_left() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"timeout_s": 1}))).await.expect("create");
    let agent = f.fake.agent(&sb.id).expect("booted");
    f.m.pause(&sb.id).expect("pause");
    assert!(agent.is_frozen());
    assert_eq!(sb.view().state, SandboxState::Paused);
    let left = sb.clock.paused().expect("paused");
    assert!(left <= Duration::from_secs(1) && left > Duration::from_millis(500), "{left:?}");
    // Well past its deadline: still there, still paused, the time left unchanged.
    assert_eq!(ended(&f.m, &sb.id, Duration::from_millis(1500)).await, None);
    assert_eq!(sb.clock.paused(), Some(left));
    let t = Instant::now();
    f.m.resume(&sb.id).expect("resume");
    assert!(!agent.is_frozen());
    assert_eq!(sb.view().state, SandboxState::Running);
    // The clock restarts with what was left: the sandbox times out about `left` later.
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(3)).await, Some(EndReason::Timeout));
    let took = t.elapsed();
    assert!(took + Duration::from_millis(100) >= left && took < left + Duration::from_millis(700), "{took:?}");
}

#[tokio::test]
async fn pause_and_resume_are_idempotent_and_stored() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"timeout_s": 600}))).await.expect("create");
    f.m.pause(&sb.id).expect("pause");
    let left = sb.clock.paused().expect("paused");
    f.m.pause(&sb.id).expect("pause again");
    assert_eq!(sb.clock.paused(), Some(left), "a second pause keeps the first one's clock");
    let stored = f.m.store.sandbox(&sb.id).expect("store").expect("record");
    assert_eq!(stored.config.paused_left_ms, Some(left.as_millis() as u64));
    f.m.resume(&sb.id).expect("resume");
    f.m.resume(&sb.id).expect("resume again");
    assert_eq!(sb.view().state, SandboxState::Running);
    let stored = f.m.store.sandbox(&sb.id).expect("store").expect("record");
    assert_eq!(stored.config.paused_left_ms, None);
    // Gone sandboxes answer gone.
    f.m.destroy(&sb.id, EndReason::Killed).await;
    assert!(matches!(f.m.pause(&sb.id), Err(Error::Gone { .. })));
    assert!(matches!(f.m.resume(&sb.id), Err(Error::Gone { .. })));
}

#[tokio::test]
async fn a_new_timeout_while_paused_is_the_time_left_at_resume() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"timeout_s": 600}))).await.expect("create");
    f.m.pause(&sb.id).expect("pause");
    f.m.set_timeout(&sb.id, 1).expect("timeout");
    assert_eq!(sb.clock.paused(), Some(Duration::from_secs(1)));
    assert_eq!(ended(&f.m, &sb.id, Duration::from_millis(1300)).await, None, "paused: no time-out");
    f.m.resume(&sb.id).expect("resume");
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(3)).await, Some(EndReason::Timeout));
}

#[tokio::test]
async fn idle_pause_pauses_rather_than_kills_and_a_paused_sandbox_is_not_idle_killed() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"idle_timeout_s": 1, "on_idle": "pause"}))).await.expect("create");
    let t = Instant::now();
    while sb.clock.paused().is_none() && t.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sb.clock.paused().is_some(), "paused by its idle clock");
    assert!(f.fake.agent(&sb.id).expect("booted").is_frozen());
    // Paused, it stays (its idle clock is off too).
    assert_eq!(ended(&f.m, &sb.id, Duration::from_millis(1500)).await, None);
    assert_eq!(sb.view().on_idle, Some(glovebox_proto::api::OnIdle::Pause));
    // Resumed, its idle period starts anew and ends in a pause again.
    f.m.resume(&sb.id).expect("resume");
    assert!(sb.clock.paused().is_none());
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(sb.clock.paused().is_some());
}

#[tokio::test]
async fn idle_kill_stays_the_default() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"idle_timeout_s": 1}))).await.expect("create");
    assert_eq!(sb.view().on_idle, None);
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(3)).await, Some(EndReason::Idle));
}

#[tokio::test]
async fn hibernate_is_refused_with_its_own_code() {
    let f = fixture();
    let r = f.m.create(request(serde_json::json!({"idle_timeout_s": 1, "on_idle": "hibernate"}))).await;
    let Err(e) = r else { panic!("hibernate accepted") };
    assert_eq!(e.code(), glovebox_proto::api::ErrorCode::HibernateUnavailable);
    assert!(e.to_string().contains("not available on this host: "), "{e}");
    assert!(f.m.list().is_empty());
}
