//! Leader election, the decision (pure): which replica of the controller may reconcile, from a
//! `coordination.k8s.io/v1` Lease, the way client-go's `leaderelection` decides it.
//!
//! - No Lease: create it, holding it.
//! - Ours: renew it (write a new `renewTime`).
//! - Released (no holder): take it.
//! - Another's: take it only once its record has not changed for the Lease's whole
//!   `leaseDurationSeconds`, measured on this replica's own clock from when it first saw that
//!   record — never by comparing the holder's `renewTime` with this clock, so clock skew
//!   between machines cannot make a live leader look expired.
//!
//! Every write goes through the API server's optimistic concurrency (the record's
//! `resourceVersion`): of two replicas taking an expired Lease at once, one gets a conflict
//! and stays a follower. The holder stops reconciling when it cannot renew for
//! `renew_deadline`, which is shorter than the Lease's duration, so it has stopped before any
//! other replica may take over (`controller::leader`).

use std::time::Duration;

use tokio::time::Instant;

/// What a Lease says, as far as the decision needs it; two records are the same
/// observation when all of it is equal.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Held {
    /// `holderIdentity`; none or empty: released.
    pub holder: Option<String>,
    /// `renewTime` and `acquireTime`, as written (only compared).
    pub renew_time: Option<String>,
    pub acquire_time: Option<String>,
    /// `leaseDurationSeconds`.
    pub duration: Option<Duration>,
    pub transitions: i32,
}

impl Held {
    fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }
}

/// What to do with the Lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is none: create it, holding it.
    Create,
    /// It is ours: renew it.
    Renew,
    /// Released, or its holder silent for its whole duration: take it.
    TakeOver,
    /// Another replica holds it; it may be taken at `expires` if nothing changes before.
    Follow { holder: String, expires: Instant },
}

/// One replica's view of the Lease over time.
#[derive(Debug)]
pub struct Elector {
    pub identity: String,
    /// Used when the Lease names no duration.
    pub default_duration: Duration,
    /// The last record seen held by another, and when it was first seen so.
    seen: Option<(Held, Instant)>,
}

impl Elector {
    pub fn new(identity: impl Into<String>, default_duration: Duration) -> Elector {
        Elector { identity: identity.into(), default_duration, seen: None }
    }

    /// The decision for the Lease as read at `now` (`None`: there is none).
    pub fn decide(&mut self, lease: Option<&Held>, now: Instant) -> Decision {
        let Some(h) = lease else {
            self.seen = None;
            return Decision::Create;
        };
        let holder = match h.holder() {
            None => {
                self.seen = None;
                return Decision::TakeOver;
            }
            Some(me) if me == self.identity => {
                self.seen = None;
                return Decision::Renew;
            }
            Some(other) => other.to_string(),
        };
        let since = match &self.seen {
            Some((prev, at)) if prev == h => *at,
            _ => {
                self.seen = Some((h.clone(), now));
                now
            }
        };
        let expires = since + h.duration.unwrap_or(self.default_duration);
        if now >= expires {
            self.seen = None;
            Decision::TakeOver
        } else {
            Decision::Follow { holder, expires }
        }
    }

    /// The `leaseTransitions` to write when taking `lease` over (a new holder is a
    /// transition; taking one's own released Lease back is too, as client-go counts it).
    pub fn transitions_after_takeover(lease: &Held) -> i32 {
        lease.transitions.saturating_add(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: &str, renew: &str) -> Held {
        Held {
            holder: Some(holder.into()),
            renew_time: Some(renew.into()),
            acquire_time: Some("2026-12-07T04:00:00.000000Z".into()),
            duration: Some(Duration::from_secs(15)),
            transitions: 3,
        }
    }

    #[test]
    fn a_missing_lease_is_created_and_ours_is_renewed() {
        let t = Instant::now();
        let mut e = Elector::new("pod-a", Duration::from_secs(15));
        assert_eq!(e.decide(None, t), Decision::Create);
        assert_eq!(e.decide(Some(&held("pod-a", "r1")), t), Decision::Renew);
    }

    #[test]
    fn another_holders_lease_is_taken_only_after_it_stayed_the_same_for_its_duration() {
        let t = Instant::now();
        let mut e = Elector::new("pod-a", Duration::from_secs(60));
        let r1 = held("pod-b", "r1");
        let at = |s: u64| t + Duration::from_secs(s);
        assert_eq!(e.decide(Some(&r1), t), Decision::Follow { holder: "pod-b".into(), expires: at(15) });
        assert!(matches!(e.decide(Some(&r1), at(14)), Decision::Follow { .. }));
        assert_eq!(e.decide(Some(&r1), at(15)), Decision::TakeOver, "15 s without a change");
    }

    #[test]
    fn a_holder_that_keeps_renewing_is_never_taken() {
        let t = Instant::now();
        let mut e = Elector::new("pod-a", Duration::from_secs(15));
        for i in 0..20u64 {
            // Renewed every 10 s: each record is new when seen, whatever this clock says.
            let r = held("pod-b", &format!("r{i}"));
            let d = e.decide(Some(&r), t + Duration::from_secs(10 * i));
            assert!(matches!(d, Decision::Follow { .. }), "at {i}: {d:?}");
        }
    }

    #[test]
    fn the_holders_clock_does_not_count() {
        // A renewTime far in the past (the holder's clock is behind) is no expiry: only how
        // long this replica has seen the same record counts.
        let t = Instant::now();
        let mut e = Elector::new("pod-a", Duration::from_secs(15));
        let old = held("pod-b", "1970-01-01T00:00:00.000000Z");
        assert!(matches!(e.decide(Some(&old), t), Decision::Follow { .. }));
    }

    #[test]
    fn a_released_lease_is_taken_at_once_and_the_duration_defaults() {
        let t = Instant::now();
        let mut e = Elector::new("pod-a", Duration::from_secs(20));
        let released = Held { holder: Some(String::new()), ..held("x", "r1") };
        assert_eq!(e.decide(Some(&released), t), Decision::TakeOver);
        let no_duration = Held { duration: None, ..held("pod-b", "r1") };
        assert_eq!(
            e.decide(Some(&no_duration), t),
            Decision::Follow { holder: "pod-b".into(), expires: t + Duration::from_secs(20) }
        );
        assert_eq!(Elector::transitions_after_takeover(&held("pod-b", "r1")), 4);
    }
}
