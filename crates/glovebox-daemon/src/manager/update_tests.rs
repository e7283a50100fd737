//! Live label and idle-timeout changes on the fake backend: what the API and the store see,
//! and the idle clock following the new timeout.

use std::time::Duration;

use glovebox_proto::api::{CreateSandbox, EndReason};

use super::testing::{ended, fixture, request};
use crate::error::Error;

fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[tokio::test]
async fn labels_and_idle_timeout_change_live_and_are_stored() {
    let f = fixture();
    let sb = f.m.create(request(serde_json::json!({"metadata": {"a": "1"}}))).await.expect("create");
    f.m.update(&sb.id, Some(labels(&[("b", "2")])), Some(600)).expect("update");
    let v = f.m.get(&sb.id).expect("live").view();
    assert_eq!(v.metadata, labels(&[("b", "2")]));
    assert_eq!(v.idle_timeout_s, Some(600));
    assert_eq!(f.m.list()[0].metadata, labels(&[("b", "2")]), "the list filters see the new labels");
    let stored = f.m.store.sandbox(&sb.id).expect("store").expect("record").config;
    assert_eq!((stored.metadata, stored.idle_timeout_s), (labels(&[("b", "2")]), Some(600)));
    // Only what is given changes; 0 turns the idle clock off.
    f.m.update(&sb.id, None, Some(0)).expect("update");
    let v = sb.view();
    assert_eq!((v.metadata, v.idle_timeout_s), (labels(&[("b", "2")]), None));
    f.m.update(&sb.id, Some(labels(&[])), None).expect("update");
    assert!(sb.view().metadata.is_empty());
    let stored = f.m.store.sandbox(&sb.id).expect("store").expect("record").config;
    assert_eq!((stored.metadata.len(), stored.idle_timeout_s), (0, None));
}

#[tokio::test]
async fn a_bad_update_changes_nothing() {
    let f = fixture();
    let sb =
        f.m.create(request(serde_json::json!({"metadata": {"a": "1"}, "idle_timeout_s": 60}))).await.expect("create");
    let too_long = glovebox_proto::api::MAX_TIMEOUT_S + 1;
    let r = f.m.update(&sb.id, Some(labels(&[("b", "2")])), Some(too_long));
    assert!(matches!(r, Err(Error::Invalid(_))), "{:?}", r.err());
    let v = sb.view();
    assert_eq!((v.metadata, v.idle_timeout_s), (labels(&[("a", "1")]), Some(60)));
    assert!(matches!(f.m.update("nope", None, Some(1)), Err(Error::SandboxNotFound(_))));
}

#[tokio::test]
async fn a_new_idle_timeout_is_used_from_the_next_check() {
    let f = fixture();
    // No idle clock at create: setting one ends the sandbox once idle that long.
    let sb = f.m.create(CreateSandbox::default()).await.expect("create");
    f.m.update(&sb.id, None, Some(1)).expect("update");
    assert_eq!(ended(&f.m, &sb.id, Duration::from_secs(5)).await, Some(EndReason::Idle));
    // A 1 s idle clock made longer, or turned off, no longer ends it.
    for later in [3600, 0] {
        let sb = f.m.create(request(serde_json::json!({"idle_timeout_s": 1}))).await.expect("create");
        f.m.update(&sb.id, None, Some(later)).expect("update");
        assert_eq!(ended(&f.m, &sb.id, Duration::from_millis(2500)).await, None, "idle {later}");
        assert_eq!(sb.view().idle_timeout_s, (later > 0).then_some(later));
    }
}
