//! Network policy decisions, as pure functions: parsing and checking a `NetworkPolicy`
//! (every error says which rule is wrong and why), and the ordered verdict list the host-side
//! firewall enforces. Installing it is the daemon's business (`glovebox-daemon::net`).

use std::fmt;
use std::net::Ipv4Addr;

use crate::api::{NetworkMode, NetworkPolicy};

/// An IPv4 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net4 {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Net4 {
    pub const fn new(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Net4 {
        Net4 { addr: Ipv4Addr::new(a, b, c, d), prefix }
    }

    fn mask(&self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix as u32)
        }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (u32::from(ip) & self.mask()) == (u32::from(self.addr) & self.mask())
    }

    /// Whether the two networks share any address.
    pub fn overlaps(&self, o: &Net4) -> bool {
        let m = self.mask() & o.mask();
        (u32::from(self.addr) & m) == (u32::from(o.addr) & m)
    }
}

impl fmt::Display for Net4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(u32::from(self.addr) & self.mask()), self.prefix)
    }
}

/// Denied unless explicitly allowed, whatever the mode: "this" network, private ranges,
/// shared address space, loopback, link-local (the cloud metadata address among them),
/// multicast and reserved space.
pub const ALWAYS_DENIED: &[Net4] = &[
    Net4::new(0, 0, 0, 0, 8),
    Net4::new(10, 0, 0, 0, 8),
    Net4::new(100, 64, 0, 0, 10),
    Net4::new(127, 0, 0, 0, 8),
    Net4::new(169, 254, 0, 0, 16),
    Net4::new(172, 16, 0, 0, 12),
    Net4::new(192, 168, 0, 0, 16),
    Net4::new(224, 0, 0, 0, 4),
    Net4::new(240, 0, 0, 0, 4),
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub net: Net4,
    /// Empty: every port (TCP and UDP).
    pub ports: Vec<u16>,
}

/// A checked policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub mode: NetworkMode,
    pub allow: Vec<Rule>,
    pub deny: Vec<Net4>,
}

impl Policy {
    pub fn deny_all() -> Policy {
        Policy { mode: NetworkMode::DenyAll, allow: Vec::new(), deny: Vec::new() }
    }

    /// Whether the sandbox needs a network interface at all.
    pub fn needs_link(&self) -> bool {
        self.mode != NetworkMode::DenyAll
    }

    /// The verdict for one destination (what the firewall will do), for tests and audits.
    pub fn verdict(&self, ip: Ipv4Addr, port: u16) -> bool {
        if self.mode == NetworkMode::DenyAll || self.deny.iter().any(|n| n.contains(ip)) {
            return false;
        }
        if self.allow.iter().any(|r| r.net.contains(ip) && (r.ports.is_empty() || r.ports.contains(&port))) {
            return true;
        }
        if ALWAYS_DENIED.iter().any(|n| n.contains(ip)) {
            return false;
        }
        self.mode == NetworkMode::AllowAll
    }
}

fn parse_net(s: &str) -> Result<Net4, String> {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, p.parse::<u8>().map_err(|_| format!("bad prefix length in {s:?}"))?),
        None => (s, 32),
    };
    if prefix > 32 {
        return Err(format!("prefix length of {s:?} is over 32"));
    }
    let addr: Ipv4Addr = addr.parse().map_err(|_| {
        if addr.contains(':') {
            format!("{s:?}: IPv6 rules are not supported (sandboxes have no IPv6 route)")
        } else if addr.chars().any(|c| c.is_ascii_alphabetic()) {
            format!("{s:?}: domain rules are not supported yet; allow CIDRs or IPs, or use allow-all")
        } else {
            format!("{s:?} is not an IPv4 address or CIDR")
        }
    })?;
    Ok(Net4 { addr, prefix })
}

fn parse_rule(s: &str) -> Result<Rule, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty rule".into());
    }
    // `net:ports` — but an IPv6 address also has colons; let parse_net explain that case.
    let (net, ports) = match s.rsplit_once(':') {
        Some((n, p)) if !n.contains(':') && p.split(',').all(|x| x.trim().parse::<u32>().is_ok()) => (n, Some(p)),
        _ => (s, None),
    };
    let net = parse_net(net)?;
    let mut out = Vec::new();
    if let Some(p) = ports {
        for x in p.split(',') {
            let n: u32 = x.trim().parse().map_err(|_| format!("bad port {x:?} in {s:?}"))?;
            if n == 0 || n > 65535 {
                return Err(format!("port {n} in {s:?} is out of range (1-65535)"));
            }
            out.push(n as u16);
        }
        out.sort_unstable();
        out.dedup();
    }
    Ok(Rule { net, ports: out })
}

/// Checks a policy; the error names the rule and the problem.
pub fn parse(p: &NetworkPolicy) -> Result<Policy, String> {
    if p.allow.len() + p.deny.len() > 256 {
        return Err("at most 256 rules".into());
    }
    let allow = p
        .allow
        .iter()
        .map(|r| parse_rule(r).map_err(|e| format!("network.allow: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let deny = p
        .deny
        .iter()
        .map(|r| {
            let r = parse_rule(r).map_err(|e| format!("network.deny: {e}"))?;
            if !r.ports.is_empty() {
                return Err(format!("network.deny: {}: deny rules take no ports", r.net));
            }
            Ok(r.net)
        })
        .collect::<Result<Vec<_>, _>>()?;
    match p.mode {
        NetworkMode::DenyAll if !allow.is_empty() || !deny.is_empty() => {
            return Err("network: deny-all takes no allow or deny rules (use allow-list)".into())
        }
        NetworkMode::AllowList if allow.is_empty() => {
            return Err("network: allow-list needs at least one allow rule".into())
        }
        NetworkMode::AllowAll if !allow.is_empty() => {
            return Err("network: allow-all takes no allow rules (they would change nothing); use allow-list".into())
        }
        _ => {}
    }
    for r in &allow {
        if let Some(d) = deny.iter().find(|d| **d == r.net) {
            return Err(format!("network: {d} is both allowed and denied"));
        }
    }
    Ok(Policy { mode: p.mode, allow, deny })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pol(mode: NetworkMode, allow: &[&str], deny: &[&str]) -> NetworkPolicy {
        NetworkPolicy {
            mode,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn precedence() {
        let p =
            parse(&pol(NetworkMode::AllowList, &["198.51.100.0/24:443", "203.0.113.7"], &["198.51.100.9"])).unwrap();
        assert!(p.verdict("198.51.100.1".parse().unwrap(), 443));
        assert!(!p.verdict("198.51.100.1".parse().unwrap(), 80), "port not allowed");
        assert!(!p.verdict("198.51.100.9".parse().unwrap(), 443), "deny wins");
        assert!(p.verdict("203.0.113.7".parse().unwrap(), 22));
        assert!(!p.verdict("203.0.113.8".parse().unwrap(), 22), "not listed");
        let all = parse(&pol(NetworkMode::AllowAll, &[], &["203.0.113.0/24"])).unwrap();
        assert!(all.verdict("198.51.100.1".parse().unwrap(), 80));
        assert!(!all.verdict("203.0.113.5".parse().unwrap(), 80));
        for always in ["169.254.169.254", "10.1.2.3", "192.168.0.1", "127.0.0.1", "172.16.5.5", "100.64.0.1"] {
            assert!(!all.verdict(always.parse().unwrap(), 80), "{always} is denied by default");
        }
        let explicit = parse(&pol(NetworkMode::AllowList, &["10.9.0.0/16"], &[])).unwrap();
        assert!(explicit.verdict("10.9.1.1".parse().unwrap(), 80), "explicitly allowed private range");
        assert!(!parse(&NetworkPolicy::default()).unwrap().verdict("198.51.100.1".parse().unwrap(), 80));
    }

    #[test]
    fn clear_errors() {
        let e = |p: NetworkPolicy| parse(&p).unwrap_err();
        assert!(e(pol(NetworkMode::AllowList, &[], &[])).contains("at least one"));
        assert!(e(pol(NetworkMode::DenyAll, &["198.51.100.1"], &[])).contains("deny-all takes no"));
        assert!(e(pol(NetworkMode::AllowList, &["api.good.test"], &[])).contains("domain rules"));
        assert!(e(pol(NetworkMode::AllowList, &["::1"], &[])).contains("IPv6"));
        assert!(e(pol(NetworkMode::AllowList, &["198.51.100.0/33"], &[])).contains("over 32"));
        assert!(e(pol(NetworkMode::AllowList, &["198.51.100.1:0"], &[])).contains("out of range"));
        assert!(e(pol(NetworkMode::AllowList, &["198.51.100.1:70000"], &[])).contains("out of range"));
        assert!(e(pol(NetworkMode::AllowList, &["1.2.3"], &[])).contains("not an IPv4"));
        assert!(e(pol(NetworkMode::AllowList, &["198.51.100.0/24"], &["198.51.100.0/24"]))
            .contains("both allowed and denied"));
        assert!(e(pol(NetworkMode::AllowAll, &[], &["198.51.100.1:80"])).contains("no ports"));
    }

    proptest! {
        #[test]
        fn parse_never_panics(rules in proptest::collection::vec(".{0,40}", 0..6)) {
            let p = NetworkPolicy { mode: NetworkMode::AllowList, allow: rules.clone(), deny: rules };
            let _ = parse(&p);
        }

        #[test]
        fn verdict_matches_the_rules(a in any::<u32>(), prefix in 0u8..=32, ip in any::<u32>(), port in 1u16..) {
            let net = Net4 { addr: Ipv4Addr::from(a), prefix };
            let p = parse(&NetworkPolicy { mode: NetworkMode::AllowList, allow: vec![net.to_string()], deny: vec![] }).unwrap();
            let ip = Ipv4Addr::from(ip);
            prop_assert_eq!(p.verdict(ip, port), net.contains(ip));
        }
    }
}
