//! What the controller knows of the Glovebox nodes: for each, where its daemon answers,
//! whether it takes new sandboxes, whether it answers at all (and since when not), its load,
//! and which of the controller's sandboxes it held at its last listing.
//!
//! Health is decided here, from observations the refresh loop feeds in (pure; time is
//! passed in): a node that fails one scrape, or whose daemon pod disappears, is *suspect*
//! (no new sandboxes go there, its claims keep their state: a daemon restarting for an
//! upgrade re-adopts its sandboxes within seconds); one that stays silent for the grace
//! period is *lost* (its claims are told so). A lost node that answers again is up again —
//! for new claims; its old claims stay lost and their sandboxes are swept as orphans.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use crate::load::NodeLoad;
use crate::placement::{Candidate, LoadBook};

/// Where a node's daemon is and whether it may take new sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTarget {
    /// The node's name (the Kubernetes node, or a simulated node).
    pub name: String,
    /// Base URL of its daemon's HTTP API, e.g. `http://10.244.1.7:7171`.
    pub url: String,
    /// The address the router reaches the node's sandboxes at (its daemon pod's IP).
    pub address: String,
    /// False while the node is cordoned or its daemon pod is not ready or terminating.
    pub schedulable: bool,
}

/// One of the controller's sandboxes in a node's listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSandbox {
    pub id: String,
    /// The claim it was made for (its `glovebox.dev/claim-uid` metadata).
    pub claim_uid: Option<String>,
    /// When the daemon created it.
    pub created_at: Option<SystemTime>,
}

/// What one look at a node found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub load: NodeLoad,
    pub live: Vec<LiveSandbox>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Listed, not looked at yet.
    Unknown,
    Up,
    /// Silent since `since` (for `why`), for less than the grace period.
    Suspect {
        since: Instant,
        why: String,
    },
    /// Silent for the grace period or longer.
    Lost {
        since: Instant,
        why: String,
    },
}

/// A change worth a pass over every claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Up(String),
    Lost(String),
}

#[derive(Debug, Clone)]
pub struct NodeState {
    pub target: NodeTarget,
    /// Whether the node is in the latest list of targets (its daemon pod exists).
    pub present: bool,
    pub health: Health,
    pub book: LoadBook,
    pub warm: u64,
    /// The controller's sandboxes at the last listing, by id.
    pub live: BTreeMap<String, LiveSandbox>,
    /// When the last listing began (wall clock, to compare with a claim's bound-at).
    pub listed_at: Option<SystemTime>,
    /// Sandboxes this controller made, with when: a listing begun before one was made does
    /// not show it, and must not make it look gone (a claim whose cached object lags behind
    /// the controller's own write finds its sandbox here instead of getting a second one).
    made: Vec<(Instant, LiveSandbox)>,
}

/// How a claim's node stands, for the reconcile core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeStanding {
    Up,
    /// Silent for less than the grace period: wait.
    Suspect,
    Lost {
        why: String,
    },
    /// Not a node the controller knows (never seen, or removed from the cluster).
    Unknown,
}

#[derive(Debug, Clone)]
pub struct ClusterView {
    pub nodes: BTreeMap<String, NodeState>,
    /// How long a node may be silent before its claims are told it is lost.
    pub grace: Duration,
}

impl ClusterView {
    pub fn new(grace: Duration) -> ClusterView {
        ClusterView { nodes: BTreeMap::new(), grace }
    }

    /// The current list of nodes (from the daemon pods, or the simulation's list). A node
    /// missing from it becomes suspect, then lost; it is kept until then.
    pub fn set_targets(&mut self, targets: Vec<NodeTarget>, now: Instant) -> Vec<Transition> {
        for n in self.nodes.values_mut() {
            n.present = false;
        }
        for t in targets {
            match self.nodes.get_mut(&t.name) {
                Some(n) => {
                    n.target = t;
                    n.present = true;
                }
                None => {
                    let state = NodeState {
                        target: t.clone(),
                        present: true,
                        health: Health::Unknown,
                        book: LoadBook::default(),
                        warm: 0,
                        live: BTreeMap::new(),
                        listed_at: None,
                        made: Vec::new(),
                    };
                    self.nodes.insert(t.name, state);
                }
            }
        }
        let absent: Vec<String> = self.nodes.values().filter(|n| !n.present).map(|n| n.target.name.clone()).collect();
        for name in absent {
            self.failed(&name, "its Glovebox daemon pod is gone", now);
        }
        self.tick(now)
    }

    /// A look at `node` that began at `began` (`began_wall` on the wall clock) succeeded.
    pub fn observed(
        &mut self,
        node: &str,
        obs: Observation,
        began: Instant,
        began_wall: SystemTime,
    ) -> Option<Transition> {
        let n = self.nodes.get_mut(node)?;
        if !n.present {
            // A late answer from a node whose pod is gone changes nothing.
            return None;
        }
        let was_up = n.health == Health::Up;
        let was_lost = matches!(n.health, Health::Lost { .. });
        n.health = Health::Up;
        n.book.scraped(obs.load.running, began);
        n.warm = obs.load.warm;
        n.live = obs.live.into_iter().map(|s| (s.id.clone(), s)).collect();
        n.made.retain(|(t, _)| *t >= began);
        for (_, s) in &n.made {
            n.live.entry(s.id.clone()).or_insert_with(|| s.clone());
        }
        n.listed_at = Some(began_wall);
        (!was_up && was_lost).then(|| Transition::Up(node.to_string()))
    }

    /// `node` did not answer (a scrape, or a create that could not reach it).
    pub fn failed(&mut self, node: &str, why: &str, now: Instant) {
        let Some(n) = self.nodes.get_mut(node) else { return };
        n.health = match &n.health {
            Health::Suspect { since, .. } => Health::Suspect { since: *since, why: why.to_string() },
            Health::Lost { since, .. } => Health::Lost { since: *since, why: why.to_string() },
            Health::Up | Health::Unknown => Health::Suspect { since: now, why: why.to_string() },
        };
    }

    /// Suspect nodes silent for the grace period become lost.
    pub fn tick(&mut self, now: Instant) -> Vec<Transition> {
        let mut out = Vec::new();
        for n in self.nodes.values_mut() {
            if let Health::Suspect { since, why } = &n.health {
                if now.saturating_duration_since(*since) >= self.grace {
                    out.push(Transition::Lost(n.target.name.clone()));
                    n.health = Health::Lost { since: *since, why: why.clone() };
                }
            }
        }
        out
    }

    pub fn standing(&self, node: &str) -> NodeStanding {
        match self.nodes.get(node).map(|n| &n.health) {
            None => NodeStanding::Unknown,
            Some(Health::Up) => NodeStanding::Up,
            Some(Health::Unknown) | Some(Health::Suspect { .. }) => NodeStanding::Suspect,
            Some(Health::Lost { why, .. }) => NodeStanding::Lost { why: why.clone() },
        }
    }

    /// Nodes that may take a new sandbox, with their load.
    pub fn candidates(&self) -> Vec<Candidate> {
        self.nodes
            .values()
            .filter(|n| n.present && n.target.schedulable && n.health == Health::Up)
            .map(|n| Candidate { name: n.target.name.clone(), load: n.book.load(), warm: n.warm })
            .collect()
    }

    /// A one-line account of why no node can take a sandbox.
    pub fn why_none(&self) -> String {
        if self.nodes.is_empty() {
            return "no Glovebox node is known".to_string();
        }
        let each: Vec<String> = self
            .nodes
            .values()
            .map(|n| {
                let state = match &n.health {
                    Health::Unknown => "not looked at yet".to_string(),
                    Health::Up if !n.target.schedulable => "cordoned or its daemon not ready".to_string(),
                    Health::Up => "up".to_string(),
                    Health::Suspect { why, .. } => format!("not answering ({why})"),
                    Health::Lost { why, .. } => format!("lost ({why})"),
                };
                format!("{}: {state}", n.target.name)
            })
            .collect();
        format!("no Glovebox node takes sandboxes ({})", each.join("; "))
    }

    /// The sandbox made for claim `uid` on an up node, if a listing has one (a create whose
    /// claim was not updated: the controller stopped between the two).
    pub fn sandbox_of_claim(&self, uid: &str) -> Option<(String, String)> {
        self.nodes.values().filter(|n| n.health == Health::Up).find_map(|n| {
            n.live.values().find(|s| s.claim_uid.as_deref() == Some(uid)).map(|s| (n.target.name.clone(), s.id.clone()))
        })
    }

    /// Whether `node`'s last listing, begun after `since`, lacks sandbox `id` (so it ended).
    pub fn listed_without(&self, node: &str, id: &str, since: SystemTime) -> bool {
        let Some(n) = self.nodes.get(node) else { return false };
        n.health == Health::Up && n.listed_at.is_some_and(|t| t > since) && !n.live.contains_key(id)
    }

    pub fn url(&self, node: &str) -> Option<&str> {
        self.nodes.get(node).map(|n| n.target.url.as_str())
    }

    pub fn address(&self, node: &str) -> Option<&str> {
        self.nodes.get(node).map(|n| n.target.address.as_str())
    }

    pub fn begin_create(&mut self, node: &str) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.book.begin();
        }
    }

    pub fn end_create(&mut self, node: &str, created: Option<&LiveSandbox>, at: Instant) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.book.end(created.is_some(), at);
            if let Some(s) = created {
                n.live.insert(s.id.clone(), s.clone());
                n.made.push((at, s.clone()));
            }
        }
    }

    pub fn removed(&mut self, node: &str, id: &str, at: Instant) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.made.retain(|(_, s)| s.id != id);
            if n.live.remove(id).is_some() {
                n.book.removed(at);
            }
        }
    }

    /// Sandboxes on up nodes that no claim holds, created at least `min_age` before `now`:
    /// `holds(claim_uid, node, id)` says whether a claim still holds one.
    pub fn orphans(
        &self,
        holds: impl Fn(Option<&str>, &str, &str) -> bool,
        now: SystemTime,
        min_age: Duration,
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for n in self.nodes.values().filter(|n| n.health == Health::Up) {
            for s in n.live.values() {
                let old_enough = s.created_at.is_none_or(|t| now.duration_since(t).is_ok_and(|age| age >= min_age));
                if old_enough && !holds(s.claim_uid.as_deref(), &n.target.name, &s.id) {
                    out.push((n.target.name.clone(), s.id.clone()));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &str) -> NodeTarget {
        NodeTarget {
            name: name.into(),
            url: format!("http://{name}:7171"),
            address: format!("10.0.0.{}", name.len()),
            schedulable: true,
        }
    }

    fn obs(running: u64, live: &[(&str, &str)]) -> Observation {
        Observation {
            load: NodeLoad { running, warm: 0 },
            live: live
                .iter()
                .map(|(id, uid)| LiveSandbox { id: id.to_string(), claim_uid: Some(uid.to_string()), created_at: None })
                .collect(),
        }
    }

    fn view(names: &[&str], t: Instant) -> ClusterView {
        let mut v = ClusterView::new(Duration::from_secs(30));
        v.set_targets(names.iter().map(|n| target(n)).collect(), t);
        for n in names {
            v.observed(n, obs(0, &[]), t, SystemTime::now());
        }
        v
    }

    #[test]
    fn a_silent_node_is_suspect_then_lost_then_up_again() {
        let t = Instant::now();
        let mut v = view(&["a", "b"], t);
        assert_eq!(v.standing("a"), NodeStanding::Up);
        v.failed("a", "connection refused", t + Duration::from_secs(1));
        assert_eq!(v.standing("a"), NodeStanding::Suspect);
        assert_eq!(v.candidates().len(), 1, "no new sandboxes on a suspect node");
        assert!(v.tick(t + Duration::from_secs(30)).is_empty(), "29 s of silence is within the grace");
        v.failed("a", "timed out", t + Duration::from_secs(20));
        assert_eq!(v.tick(t + Duration::from_secs(31)), vec![Transition::Lost("a".into())]);
        assert_eq!(v.standing("a"), NodeStanding::Lost { why: "timed out".into() });
        assert!(v.tick(t + Duration::from_secs(60)).is_empty(), "lost once");
        let back = v.observed("a", obs(0, &[]), t + Duration::from_secs(61), SystemTime::now());
        assert_eq!(back, Some(Transition::Up("a".into())));
        assert_eq!(v.standing("a"), NodeStanding::Up);
        assert_eq!(v.standing("zz"), NodeStanding::Unknown);
    }

    #[test]
    fn a_node_whose_pod_is_gone_is_lost_after_the_grace() {
        let t = Instant::now();
        let mut v = view(&["a", "b"], t);
        assert!(v.set_targets(vec![target("b")], t + Duration::from_secs(1)).is_empty());
        assert_eq!(v.standing("a"), NodeStanding::Suspect, "a daemon pod replaced in an upgrade comes back");
        assert!(v.observed("a", obs(0, &[]), t, SystemTime::now()).is_none(), "a late answer counts for nothing");
        let lost = v.set_targets(vec![target("b")], t + Duration::from_secs(31));
        assert_eq!(lost, vec![Transition::Lost("a".into())]);
        assert!(v.why_none().contains("a: lost (its Glovebox daemon pod is gone)"), "{}", v.why_none());
    }

    #[test]
    fn cordoned_nodes_take_nothing_new() {
        let t = Instant::now();
        let mut v = view(&["a", "b"], t);
        let mut a = target("a");
        a.schedulable = false;
        v.set_targets(vec![a, target("b")], t);
        let names: Vec<_> = v.candidates().into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["b"]);
        assert_eq!(v.standing("a"), NodeStanding::Up, "its sandboxes are fine");
    }

    #[test]
    fn listings_tell_ended_sandboxes_and_orphans() {
        let t = Instant::now();
        let mut v = view(&["a"], t);
        let bound = SystemTime::now();
        assert!(!v.listed_without("a", "s1", bound), "no listing since the binding");
        let later = bound + Duration::from_secs(1);
        v.observed("a", obs(2, &[("s2", "u2"), ("s3", "u3")]), t, later);
        assert!(v.listed_without("a", "s1", bound));
        assert!(!v.listed_without("a", "s2", bound));
        assert_eq!(v.sandbox_of_claim("u3"), Some(("a".into(), "s3".into())));
        let held = |uid: Option<&str>, _: &str, _: &str| uid == Some("u2");
        assert_eq!(v.orphans(held, later, Duration::ZERO), vec![("a".into(), "s3".into())]);
    }

    #[test]
    fn a_listing_begun_before_a_create_does_not_hide_it() {
        let t = Instant::now();
        let mut v = view(&["a"], t);
        let made = LiveSandbox { id: "s9".into(), claim_uid: Some("u9".into()), created_at: None };
        v.begin_create("a");
        v.end_create("a", Some(&made), t + Duration::from_millis(10));
        v.observed("a", obs(0, &[]), t + Duration::from_millis(5), SystemTime::now());
        assert_eq!(v.sandbox_of_claim("u9"), Some(("a".into(), "s9".into())), "still known");
        v.observed("a", obs(0, &[]), t + Duration::from_millis(20), SystemTime::now());
        assert_eq!(v.sandbox_of_claim("u9"), None, "a listing begun after the create is believed");
    }

    #[test]
    fn young_sandboxes_are_not_orphans_yet() {
        let t = Instant::now();
        let mut v = view(&["a"], t);
        let now = SystemTime::now();
        let mut o = obs(1, &[("s1", "u1")]);
        o.live[0].created_at = Some(now - Duration::from_secs(5));
        v.observed("a", o, t, now);
        let none = |_: Option<&str>, _: &str, _: &str| false;
        assert!(v.orphans(none, now, Duration::from_secs(60)).is_empty());
        assert_eq!(v.orphans(none, now, Duration::from_secs(2)).len(), 1);
    }
}
