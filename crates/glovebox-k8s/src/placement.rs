//! Where a claim's sandbox goes: the least-loaded Glovebox node that takes new sandboxes.
//!
//! A node's load is its last `/metrics` scrape plus what this controller did to it since
//! ([`LoadBook`]): creates in flight and creates and destroys that finished after the scrape
//! began. Without that book every claim arriving between two scrapes (5 s apart in a
//! cluster) would go to the same node. Ties go to the node with more warm sandboxes (its
//! create is a hand-out, not a boot), then are spread by the claim's own key, so equal
//! nodes share a burst evenly and a claim's retry lands where its first try did.

use std::time::Instant;

/// One node placement may choose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub load: u64,
    pub warm: u64,
}

/// The least-loaded candidate; `None` when there is none. `spread` breaks exact ties (the
/// same value always picks the same node among the same ties).
pub fn pick(candidates: &[Candidate], spread: u64) -> Option<&str> {
    let best = candidates.iter().map(|c| (c.load, std::cmp::Reverse(c.warm))).min()?;
    let mut ties: Vec<&Candidate> = candidates.iter().filter(|c| (c.load, std::cmp::Reverse(c.warm)) == best).collect();
    ties.sort_by(|a, b| a.name.cmp(&b.name));
    let i = (spread % ties.len() as u64) as usize;
    Some(ties[i].name.as_str())
}

/// A stable 64-bit key of a string (FNV-1a), for [`pick`]'s `spread`.
pub fn spread_key(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// One node's load as this controller knows it between scrapes.
#[derive(Debug, Clone, Default)]
pub struct LoadBook {
    scraped: u64,
    in_flight: u64,
    /// Finished creates (+1) and destroys (-1), with when they finished.
    changes: Vec<(Instant, i64)>,
}

impl LoadBook {
    /// A create was sent to the node.
    pub fn begin(&mut self) {
        self.in_flight += 1;
    }

    /// A create sent with [`LoadBook::begin`] came back (`created`: with a sandbox).
    pub fn end(&mut self, created: bool, at: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if created {
            self.changes.push((at, 1));
        }
    }

    /// This controller destroyed one of the node's sandboxes.
    pub fn removed(&mut self, at: Instant) {
        self.changes.push((at, -1));
    }

    /// A scrape that began at `began` counted `running` sandboxes: changes that finished
    /// before it began are in that count now.
    pub fn scraped(&mut self, running: u64, began: Instant) {
        self.scraped = running;
        self.changes.retain(|(t, _)| *t >= began);
    }

    pub fn load(&self) -> u64 {
        let delta: i64 = self.changes.iter().map(|(_, d)| d).sum();
        let base = self.scraped as i64 + self.in_flight as i64 + delta;
        base.max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn c(name: &str, load: u64, warm: u64) -> Candidate {
        Candidate { name: name.into(), load, warm }
    }

    #[test]
    fn least_loaded_wins() {
        let nodes = [c("a", 5, 0), c("b", 3, 0), c("c", 4, 9)];
        assert_eq!(pick(&nodes, 0), Some("b"));
        assert_eq!(pick(&[], 0), None);
    }

    #[test]
    fn ties_go_to_the_warmer_node_then_are_spread() {
        assert_eq!(pick(&[c("a", 2, 0), c("b", 2, 1)], 0), Some("b"));
        let even = [c("b", 1, 0), c("a", 1, 0), c("c", 1, 0)];
        let picks: Vec<_> = (0..3).map(|s| pick(&even, s).unwrap()).collect();
        assert_eq!(picks, ["a", "b", "c"], "sorted by name, then chosen by the key");
        assert_eq!(pick(&even, 7), pick(&even, 7), "the same key, the same node");
    }

    #[test]
    fn spread_keys_differ_and_are_stable() {
        assert_eq!(spread_key("uid-1"), spread_key("uid-1"));
        assert_ne!(spread_key("uid-1"), spread_key("uid-2"));
    }

    #[test]
    fn the_book_counts_what_the_last_scrape_could_not_see() {
        let t0 = Instant::now();
        let mut b = LoadBook::default();
        b.scraped(4, t0);
        b.begin();
        b.begin();
        assert_eq!(b.load(), 6, "creates in flight count at once");
        b.end(true, t0 + Duration::from_millis(10));
        b.end(false, t0 + Duration::from_millis(11));
        assert_eq!(b.load(), 5, "a refused create is not load");
        b.removed(t0 + Duration::from_millis(12));
        assert_eq!(b.load(), 4);
        // A scrape that began after both changes includes them; one that began before
        // does not, and the book keeps them.
        b.scraped(4, t0 + Duration::from_millis(5));
        assert_eq!(b.load(), 4, "4 + created - removed");
        b.scraped(4, t0 + Duration::from_millis(20));
        assert_eq!(b.load(), 4);
        b.scraped(0, t0 + Duration::from_millis(30));
        b.removed(t0 + Duration::from_millis(31));
        assert_eq!(b.load(), 0, "never below zero");
    }

    #[test]
    fn a_burst_between_scrapes_is_spread_evenly() {
        // 300 claims arrive between two scrapes of three idle nodes, and none is done yet.
        let mut books = [LoadBook::default(), LoadBook::default(), LoadBook::default()];
        let names = ["a", "b", "c"];
        let mut count = [0u32; 3];
        for i in 0..300u64 {
            let cands: Vec<Candidate> = names.iter().zip(&books).map(|(n, b)| c(n, b.load(), 0)).collect();
            let chosen = pick(&cands, spread_key(&format!("uid-{i}"))).unwrap();
            let k = names.iter().position(|n| *n == chosen).unwrap();
            books[k].begin();
            count[k] += 1;
        }
        assert_eq!(count, [100, 100, 100]);
    }
}
