//! Sandbox networking beyond loopback, enforced entirely on the host side: the `Net` facade
//! the manager calls, over rooms of their own for the policy's rules as data (`ruleset`),
//! the links (`link`, rtnetlink) and the firewall (`nft`, nf_tables), both spoken over
//! netlink in process (`netlink`): no helper binary is run.
//!
//! A sandbox whose policy is not `deny-all` gets a veth pair: `gb<slot>` in the host's
//! namespace, `eth0` in the sandbox's, a /30 of the sandbox network per uid slot (host .1,
//! sandbox .2), a default route via the host end. Every packet the sandbox sends crosses the
//! daemon's `inet glovebox_<pid>` table (or one of its shards, made as links pile up: see
//! [`SHARD_LINKS`]), where the sandbox's own chain applies its
//! `Ruleset` (deny rules, then allow rules, then the always-denied ranges, then allow-all)
//! and rejects the rest (TCP with a reset, so connections the policy no longer allows close
//! at once). Traffic to the host itself is limited to the sandbox's resolver and proxy;
//! replies come back only as part of connections the sandbox opened. Sandboxes have no
//! IPv6. The sandbox, root in its own namespaces but without CAP_NET_ADMIN, can change none
//! of it.
//!
//! DNS: the sandbox's `/etc/resolv.conf` names the host end, where the daemon's resolver
//! answers while the policy is not deny-all (`egress`).

mod link;
mod netlink;
mod nflog;
mod nft;
pub mod ruleset;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use glovebox_proto::policy::Policy;

use crate::error::{Error, Result};
pub use link::ifname;
pub use nflog::Logged;
pub use ruleset::{ruleset, Ruleset};

/// Where a sandbox's logged packets go (see [`Net::watch`]).
pub type Sink = Arc<dyn Fn(&Logged) + Send + Sync>;
type Sinks = Mutex<HashMap<u32, Sink>>;

/// Tables are per daemon process (`glovebox_<pid>`, and its shards `glovebox_<pid>_<n>`):
/// each handles only the interfaces in its own `ifaces` set, so several Glovebox processes on
/// a host never drop each other's traffic, and a daemon's exit can remove its tables.
const TABLE_PREFIX: &str = "glovebox_";

/// Links a table holds before the next one (a shard) is made. The kernel validates a whole
/// table (every chain its verdict maps jump to) on each commit that adds a jump or a verdict,
/// so with one table every allow-list create or policy update cost more with each sandbox
/// linked before it; but every packet the host receives or forwards passes each table's base
/// chains, so a table more costs every host packet a little (measured in docs/benchmarks.md,
/// "Shards made as needed"). A daemon with up to this many links has one table, as it
/// always had; past it, a sandbox's commit validates at most this many links' chains.
/// `GLOVEBOX_SHARD_LINKS` sets another (tests fill several shards with a few links).
const SHARD_LINKS: usize = 64;

/// The name of shard `shard` of the tables named `base` (shard 0 is `base` itself).
fn shard_table(base: &str, shard: usize) -> String {
    match shard {
        0 => base.to_string(),
        n => format!("{base}_{n}"),
    }
}

/// Which shard holds each linked slot's hold and chains, and how many each holds; a table
/// exists for every entry of `links`.
struct Shards {
    links: Vec<usize>,
    of: HashMap<u32, usize>,
    /// Links per shard ([`SHARD_LINKS`]).
    cap: usize,
}

impl Shards {
    /// One table (shard 0, made with the daemon's first link), `cap` links to a shard.
    fn new(cap: usize) -> Shards {
        Shards { links: vec![0], of: HashMap::new(), cap: cap.max(1) }
    }

    /// The shard slot `slot` goes to: its own if placed already, else the first with room,
    /// else `None` (a shard must be made: it will be `self.links.len()`).
    fn pick(&self, slot: u32) -> Option<usize> {
        self.of.get(&slot).copied().or_else(|| self.links.iter().position(|n| *n < self.cap))
    }

    fn place(&mut self, slot: u32, shard: usize) {
        if self.of.insert(slot, shard).is_none() {
            self.links[shard] += 1;
        }
    }

    /// Forgets slot `slot`; returns the shards past the first that may go now: the last ones,
    /// empty, while those before them keep a quarter of a shard's room free (so a daemon
    /// hovering at a shard's edge does not make and drop a table on every create).
    fn release(&mut self, slot: u32) -> Vec<usize> {
        if let Some(s) = self.of.remove(&slot) {
            self.links[s] -= 1;
        }
        let mut gone = Vec::new();
        while self.links.len() > 1 && self.links.last() == Some(&0) {
            let held: usize = self.links.iter().sum();
            let room = (self.links.len() - 1) * self.cap;
            if room.saturating_sub(held) < self.cap / 4 {
                break;
            }
            self.links.pop();
            gone.push(self.links.len());
        }
        gone
    }
}

/// The sandbox network: 10.213.0.0/16, one /30 per uid slot (16,384 slots).
pub fn link_addrs(slot: u32) -> (Ipv4Addr, Ipv4Addr) {
    let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + slot * 4;
    (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
}

/// The sandbox's `/etc/resolv.conf`: its resolver is on the host end of its link.
pub fn resolv_conf(slot: u32) -> String {
    let (host, _) = link_addrs(slot);
    format!("nameserver {host}\noptions timeout:2 attempts:2\n")
}

/// The sandbox's chain (with `_in` and `_nat` beside it).
fn chain(slot: u32) -> String {
    format!("sb{slot}")
}

/// The slot whose sandbox end has address `a`.
fn slot_of(a: Ipv4Addr) -> Option<u32> {
    let off = u32::from(a).checked_sub(u32::from(Ipv4Addr::new(10, 213, 0, 0)))?;
    (off < 1 << 16 && off % 4 == 2).then_some(off / 4)
}

/// The host-side firewall and forwarding, set up on first use.
pub struct Net {
    /// The first table's name; the shards' are made from it ([`shard_table`]).
    table: String,
    shards: Mutex<Shards>,
    ready: OnceLock<std::result::Result<(), String>>,
    /// The netlink log group this daemon's rules log to (`None`: no packet audit on this
    /// host, e.g. without nfnetlink_log), and who hears of each sandbox's packets.
    log: OnceLock<Option<u16>>,
    sinks: Arc<Sinks>,
}

impl Default for Net {
    fn default() -> Self {
        Self::new()
    }
}

impl Net {
    pub fn new() -> Net {
        Net {
            table: format!("{TABLE_PREFIX}{}", std::process::id()),
            shards: Mutex::new(Shards::new(
                std::env::var("GLOVEBOX_SHARD_LINKS").ok().and_then(|v| v.parse().ok()).unwrap_or(SHARD_LINKS),
            )),
            ready: OnceLock::new(),
            log: OnceLock::new(),
            sinks: Arc::default(),
        }
    }

    /// Creates this daemon's table, enables forwarding and starts reading its log group.
    fn ensure(&self) -> Result<()> {
        let r = self.ready.get_or_init(|| {
            nft::create_table(&self.table).map_err(|e| format!("firewall table {}: {e}", self.table))?;
            self.log.get_or_init(|| self.start_log());
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(|e| format!("enable IPv4 forwarding: {e}"))
        });
        r.clone().map_err(Error::Unavailable)
    }

    /// The table that holds slot `slot`'s hold and chains: its own if it has one, else the
    /// first with room, made if none has.
    fn place(&self, slot: u32) -> Result<String> {
        self.ensure()?;
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        let shard = match shards.pick(slot) {
            Some(s) => s,
            None => {
                let s = shards.links.len();
                let table = shard_table(&self.table, s);
                nft::create_table(&table).map_err(|e| Error::Unavailable(format!("firewall table {table}: {e}")))?;
                shards.links.push(0);
                s
            }
        };
        shards.place(slot, shard);
        Ok(shard_table(&self.table, shard))
    }

    /// Binds a log group and reads it on a thread of its own, handing each packet to the
    /// sink of the sandbox that sent it; the thread ends with the first packet after this
    /// `Net` is gone. None (and a warning) where the kernel has no packet logging.
    fn start_log(&self) -> Option<u16> {
        let start = 0x4000 + (std::process::id() % 0x3000) as u16;
        let log = match nflog::Nflog::open(start) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("no packet audit (the egress log lists names and proxied connections only): {e}");
                return None;
            }
        };
        let group = log.group;
        let sinks: Weak<Sinks> = Arc::downgrade(&self.sinks);
        let spawned = std::thread::Builder::new().name("nflog".into()).spawn(move || loop {
            let Some(sinks) = sinks.upgrade() else { return };
            let mut batch: Vec<Logged> = Vec::new();
            if let Err(e) = log.read(|p| batch.push(p)) {
                tracing::warn!("packet audit stopped: {e}");
                return;
            }
            let sinks = sinks.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for p in &batch {
                if let Some(sink) = slot_of(p.src).and_then(|s| sinks.get(&s)) {
                    sink(p);
                }
            }
        });
        match spawned {
            Ok(_) => Some(group),
            Err(e) => {
                tracing::warn!("no packet audit: {e}");
                None
            }
        }
    }

    /// Sends the packets the firewall logs for slot `slot` to `sink`, until [`Net::detach`].
    pub fn watch(&self, slot: u32, sink: Sink) {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner()).insert(slot, sink);
    }

    fn log_group(&self) -> Option<u16> {
        self.log.get().copied().flatten()
    }

    /// Links namespace `ns` ahead of the sandbox that will run in it, as slot `slot`: the
    /// veth pair, both ends' addresses and the default route, the host end held shut (own,
    /// but in no verdict map: the base chains drop all it sends) until [`Net::attach`] gives
    /// it the sandbox's rules. Made off the requests' path (see `backend::made_ahead`): the
    /// attach then only adds to the table, without waiting for the kernel's network
    /// configuration lock.
    pub fn link_ahead(&self, slot: u32, ns: std::os::fd::BorrowedFd<'_>) -> Result<()> {
        self.ensure()?;
        let dev = ifname(slot);
        self.make_link(slot, link::Netns::Fd(ns))
            .and_then(|_| self.place(slot))
            .and_then(|t| nft::hold(&t, &dev, true).map_err(|e| Error::Internal(format!("hold {dev}: {e}"))))
            .inspect_err(|_| self.cut(slot))
    }

    /// Holds shut a link an earlier daemon made for slot `slot` (its table died with it): this
    /// daemon's base chains drop everything it sends until [`Net::attach`] gives it rules. For
    /// a sandbox whose link cannot be made again (gVisor's netstack owns it from its start).
    pub fn hold_stale(&self, slot: u32) -> Result<()> {
        let dev = ifname(slot);
        let table = self.place(slot)?;
        nft::hold(&table, &dev, true)
            .map_err(|e| Error::Internal(format!("hold {dev}: {e}")))
            .inspect_err(|_| self.detach(slot))
    }

    /// Gives the sandbox (PID 1 `pid`, uid slot `slot`) its link and applies `policy`; a
    /// sandbox started in a namespace linked ahead (`ahead`) only gets its rules.
    pub fn attach(&self, slot: u32, pid: i32, policy: &Policy, ahead: bool) -> Result<()> {
        self.ensure()?;
        let linked = if ahead { Ok(()) } else { self.make_link(slot, link::Netns::Pid(pid)) };
        linked.and_then(|_| self.apply(slot, policy, true)).inspect_err(|_| self.cut(slot))
    }

    /// The veth pair into `ns`, with its addresses and the sandbox's default route.
    fn make_link(&self, slot: u32, ns: link::Netns<'_>) -> Result<()> {
        let (host, sb) = link_addrs(slot);
        let dev = ifname(slot);
        // The alias names the daemon that owns the link (its first table's name), for leak checks
        // on a host where several daemons run.
        link::create(&dev, ns, host, &self.table)
            .and_then(|_| link::configure_peer(ns, sb, host))
            .map_err(|e| Error::Internal(format!("link {dev}: {e}")))
    }

    /// After a failed link: the sandbox lives on (to be destroyed), so its link is cut here,
    /// not left to its namespace, and its rules go.
    fn cut(&self, slot: u32) {
        if let Err(e) = link::delete(&ifname(slot)) {
            tracing::debug!("{e}");
        }
        self.detach(slot);
    }

    /// Replaces the sandbox's rules atomically (one nf_tables transaction).
    pub fn apply(&self, slot: u32, policy: &Policy, first: bool) -> Result<()> {
        let table = self.place(slot)?;
        let (host, _) = link_addrs(slot);
        nft::apply(&table, &ifname(slot), &chain(slot), host, &ruleset(policy), first, self.log_group())
            .map_err(|e| Error::Internal(format!("firewall rules of {}: {e}", ifname(slot))))
    }

    /// Removes the rules of a sandbox whose processes are gone. Its link is not deleted here:
    /// the kernel removes the veth pair with the sandbox's namespace, in the same pass that
    /// removes the namespace's loopback, where a delete of its own would hold the kernel's
    /// network configuration lock a second time (about 20 ms, which the next sandbox's link
    /// would wait for). A link still there when the slot is reused is deleted then.
    pub fn detach(&self, slot: u32) {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner()).remove(&slot);
        let dev = ifname(slot);
        // A slot in no shard has nothing in any table (its link failed before its hold). Its
        // shard stays while the slot is counted in it, so the lock need not be held meanwhile.
        let Some(shard) = self.shards.lock().unwrap_or_else(|p| p.into_inner()).of.get(&slot).copied() else {
            return;
        };
        let table = shard_table(&self.table, shard);
        if let Err(e) = nft::remove(&table, &dev, &chain(slot)) {
            // A link made ahead and never attached has no chains: only its hold goes.
            if let Err(h) = nft::hold(&table, &dev, false) {
                tracing::debug!("firewall rules of {dev}: {e}; {h}");
            }
        }
        let mut shards = self.shards.lock().unwrap_or_else(|p| p.into_inner());
        for s in shards.release(slot) {
            if let Err(e) = nft::delete_table(&shard_table(&self.table, s)) {
                tracing::warn!("{e}");
            }
        }
    }

    /// Removes this daemon's tables (at shutdown, once its sandboxes are gone).
    pub fn teardown_table(&self) {
        if self.ready.get().is_some() {
            let shards = self.shards.lock().unwrap_or_else(|p| p.into_inner()).links.len();
            for s in 0..shards {
                if let Err(e) = nft::delete_table(&shard_table(&self.table, s)) {
                    tracing::warn!("{e}");
                }
            }
        }
    }
}

/// Cuts a sandbox's link left by an earlier daemon (whose table, and so its filtering, died
/// with it): the sandbox is offline until it is linked again, never unfiltered.
pub fn cut_stale_link(slot: u32) {
    if let Err(e) = link::delete(&ifname(slot)) {
        tracing::debug!("{e}");
    }
}

/// Whether nf_tables answers over netlink (for `glovebox doctor`): the number of `inet`
/// tables the kernel lists.
pub fn probe_nftables() -> std::result::Result<usize, String> {
    nft::inet_tables().map(|t| t.len()).map_err(|e| e.to_string())
}

/// Removes the tables (and links) of Glovebox processes that are no longer running.
pub fn reap_stale_tables() {
    let tables = match nft::inet_tables() {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!("{e}");
            return;
        }
    };
    for name in tables {
        let Some(pid) = owner_pid(&name) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            if let Err(e) = nft::delete_table(&name) {
                tracing::warn!("stale table: {e}");
            }
        }
    }
}

/// The pid of the Glovebox process whose table (any shard) is `name`.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(TABLE_PREFIX)?;
    let (pid, shard) = rest.split_once('_').unwrap_or((rest, "0"));
    shard.parse::<u32>().ok()?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_names_its_owner() {
        let base = format!("{TABLE_PREFIX}4242");
        assert_eq!(shard_table(&base, 0), "glovebox_4242");
        assert_eq!(shard_table(&base, 3), "glovebox_4242_3");
        for shard in 0..20 {
            assert_eq!(owner_pid(&shard_table(&base, shard)), Some(4242));
        }
        for other in ["glovebox_test_4242", "glovebox_", "glovebox_4242_x", "other_4242", "glovebox_4242_3_1"] {
            assert_eq!(owner_pid(other), None, "{other}");
        }
    }

    /// Places `n` more slots from `from` as `Net::place` does (making a shard when all are
    /// full); returns the shard each went to.
    fn fill(s: &mut Shards, from: u32, n: u32) -> Vec<usize> {
        (from..from + n)
            .map(|slot| {
                let shard = s.pick(slot).unwrap_or_else(|| {
                    s.links.push(0);
                    s.links.len() - 1
                });
                s.place(slot, shard);
                shard
            })
            .collect()
    }

    #[test]
    fn one_table_until_it_is_full_then_shards_in_turn() {
        let mut s = Shards::new(SHARD_LINKS);
        let n = SHARD_LINKS as u32;
        assert!(fill(&mut s, 0, n).iter().all(|&t| t == 0), "the first table takes the first {n}");
        assert_eq!(s.links, [SHARD_LINKS]);
        assert_eq!(fill(&mut s, n, 1), [1]);
        // A slot placed again stays where it is, counted once.
        assert_eq!(s.pick(3), Some(0));
        s.place(n, 1);
        assert_eq!(s.links, [SHARD_LINKS, 1]);
        // A freed place in an earlier table is taken before a later one's.
        assert!(s.release(5).is_empty(), "shard 1 still holds a link");
        assert_eq!(fill(&mut s, 10_000, 1), [0]);
    }

    #[test]
    fn an_emptied_last_shard_goes_once_the_others_have_room() {
        let mut s = Shards::new(SHARD_LINKS);
        let n = SHARD_LINKS as u32;
        fill(&mut s, 0, n + 1);
        // Shard 1 emptied while shard 0 is full: kept (the next create would make it again).
        assert!(s.release(n).is_empty());
        assert_eq!(s.links, [SHARD_LINKS, 0]);
        // Shard 0 with a quarter of its room free: the empty shard goes.
        for slot in 0..n / 4 - 1 {
            assert!(s.release(slot).is_empty(), "slot {slot}");
        }
        assert_eq!(s.release(n / 4 - 1), [1]);
        assert_eq!(s.links, [SHARD_LINKS - SHARD_LINKS / 4]);
        // The first table is never dropped here, nor a slot counted twice.
        for slot in 0..n + 1 {
            assert!(s.release(slot).is_empty());
        }
        assert_eq!(s.links, [0]);
    }

    #[test]
    fn link_addresses_are_disjoint_per_slot() {
        assert_eq!(link_addrs(0), (Ipv4Addr::new(10, 213, 0, 1), Ipv4Addr::new(10, 213, 0, 2)));
        assert_eq!(link_addrs(1), (Ipv4Addr::new(10, 213, 0, 5), Ipv4Addr::new(10, 213, 0, 6)));
        assert_eq!(link_addrs(16_383).1, Ipv4Addr::new(10, 213, 255, 254));
    }

    #[test]
    fn a_logged_packet_names_its_slot_by_the_sandbox_address() {
        for slot in [0, 1, 77, 16_383] {
            assert_eq!(slot_of(link_addrs(slot).1), Some(slot));
            assert_eq!(slot_of(link_addrs(slot).0), None, "the host end sends no sandbox traffic");
        }
        assert_eq!(slot_of(Ipv4Addr::new(10, 214, 0, 2)), None);
        assert_eq!(slot_of(Ipv4Addr::new(10, 212, 255, 254)), None);
    }
}
