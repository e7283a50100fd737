//! A daemon killed with SIGKILL leaves its sandboxes running; the next daemon on the same
//! host cleans every one of them up and says why they are gone.
//!
//! Alone in its own test binary: restart reconciliation cleans up orphans in the host-wide
//! run dir, so no other test's daemon may start (and reconcile) between the crash and the
//! restart.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{cgroup_dirs, leaks, processes_of, run_dir, sandbox_body, Daemon};
use serde_json::json;

#[test]
fn restart_after_sigkill_cleans_up_everything() {
    require_root!();
    let mut d = Daemon::start();
    let a = d.create(sandbox_body(json!({})));
    let b = d.create(sandbox_body(json!({})));
    let (st, v) = d.post(&format!("/v1/sandboxes/{a}/exec"), &json!({ "cmd": ["sleep", "300"], "background": true }));
    assert_eq!(st, 202, "{v}");
    let sleeping = common::poll(Duration::from_secs(5), Duration::from_millis(20), || {
        processes_of(&a).iter().any(|p| p.comm == "sleep").then_some(())
    });
    assert!(sleeping.is_some(), "the background sleep runs: {:?}", processes_of(&a));
    let ranges: Vec<(u32, u32)> = [&a, &b].iter().map(|id| d.uid_range(id).expect("uid range")).collect();

    d.crash();
    // The sandboxes outlive their daemon...
    std::thread::sleep(Duration::from_millis(200));
    for id in [&a, &b] {
        assert!(!processes_of(id).is_empty(), "sandbox {id} died with the daemon (unexpected)");
        assert!(!cgroup_dirs(id).is_empty());
        assert!(run_dir().join("sandboxes").join(id).exists());
    }
    // ...and the leak check sees them (it can fail).
    let ids: BTreeSet<String> = [a.clone(), b.clone()].into();
    assert!(!leaks(&ids, &[]).is_empty(), "the leak check misses a crashed daemon's sandboxes");

    let d = d.restart();
    // Reconciliation runs before the new daemon answers: nothing of the old sandboxes is left.
    let clean =
        common::poll(Duration::from_secs(5), Duration::from_millis(50), || leaks(&ids, &[]).is_empty().then_some(()));
    assert!(clean.is_some(), "after restart: {:?}", leaks(&ids, &[]));
    for r in &ranges {
        assert!(
            common::processes_in_range(*r).iter().all(|p| p.comm != "sleep"),
            "{:?}",
            common::processes_in_range(*r)
        );
    }
    for id in [&a, &b] {
        let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
        assert_eq!((st, v["error"]["code"].as_str()), (410, Some("sandbox_gone")), "{v}");
        assert_eq!(v["error"]["reason"], "daemon_restart", "{v}");
    }
    // The new daemon works, and its slots do not collide with the old ones' leftovers.
    let c = d.create(sandbox_body(json!({})));
    assert_eq!(d.sh_ok(&c, "echo fresh"), "fresh\n");
    d.shutdown_and_check_leaks();
}
