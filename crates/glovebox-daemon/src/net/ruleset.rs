//! A policy's firewall, as data: the one place the decision order is written.
//!
//! `ruleset` turns a checked `Policy` into the ordered rules of the sandbox's chains (deny
//! nets, allow nets with their ports, for allow-all the always-denied ranges and its accept,
//! and the final reject), the input rules for the services on the host end, and the redirection of
//! name-checked TCP to the proxy. The nftables programming (`nft`) is generated from it, and
//! the proxy asks it whether an address is denied; a property test holds it to
//! `Policy::verdict`.

use std::net::Ipv4Addr;

use glovebox_proto::api::NetworkMode;
use glovebox_proto::policy::{Net4, Policy, ALWAYS_DENIED};

/// Port the name-checking proxy listens on, on the host end of each sandbox's link.
pub const PROXY_PORT: u16 = 15001;

/// A transport protocol a rule can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    Tcp,
    Udp,
}

impl L4 {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4::Tcp => 6,
            L4::Udp => 17,
        }
    }
}

/// What a packet's protocol is, for evaluation: TCP, UDP or anything else (ICMP, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Other,
}

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    /// An ICMP error (port unreachable).
    Reject,
    /// A TCP reset: a connection the policy no longer allows closes at once.
    Reset,
}

/// One rule of the sandbox's outbound chain. Every field that is set must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The destination network; `None`: any destination.
    pub to: Option<Net4>,
    /// The transport protocol (and with it, maybe a destination port).
    pub l4: Option<L4>,
    /// The destination port (only with `l4`).
    pub port: Option<u16>,
    pub verdict: Verdict,
}

impl Rule {
    fn matches(&self, ip: Ipv4Addr, proto: Proto, port: u16) -> bool {
        let l4 = matches!((self.l4, proto), (None, _) | (Some(L4::Tcp), Proto::Tcp) | (Some(L4::Udp), Proto::Udp));
        self.to.is_none_or(|n| n.contains(ip)) && l4 && self.port.is_none_or(|p| p == port)
    }
}

/// A service on the host end the sandbox may reach (everything else to the host is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    pub l4: L4,
    pub port: u16,
}

/// Name-checked TCP: connections to `ports` go to the proxy on the host end, except those to
/// the host end itself and to `direct` networks (CIDR allows, routed as they are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub ports: Vec<u16>,
    pub direct: Vec<Net4>,
    pub to_port: u16,
}

/// The sandbox's firewall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    /// Outbound (forwarded) traffic, first match wins; the last rule matches everything.
    pub out: Vec<Rule>,
    /// Services on the host end.
    pub services: Vec<Service>,
    pub redirect: Option<Redirect>,
}

/// The firewall enforcing `policy`.
pub fn ruleset(policy: &Policy) -> Ruleset {
    let mut out = Vec::new();
    let mut services = Vec::new();
    let mut redirect = None;
    let rule = |to, l4, port, verdict| Rule { to, l4, port, verdict };
    if policy.mode != NetworkMode::DenyAll {
        for d in &policy.deny {
            out.push(rule(Some(*d), None, None, Verdict::Reject));
        }
        for a in &policy.allow {
            if a.ports.is_empty() {
                out.push(rule(Some(a.net), None, None, Verdict::Accept));
            }
            for l4 in [L4::Tcp, L4::Udp] {
                for p in &a.ports {
                    out.push(rule(Some(a.net), Some(l4), Some(*p), Verdict::Accept));
                }
            }
        }
        // An allow-list rejects the always-denied ranges with everything else that no rule
        // allows (TCP with a reset); allow-all needs them before its accept.
        if policy.mode == NetworkMode::AllowAll {
            for n in ALWAYS_DENIED {
                out.push(rule(Some(*n), None, None, Verdict::Reject));
            }
            out.push(rule(None, None, None, Verdict::Accept));
        }
        services.push(Service { l4: L4::Udp, port: 53 });
        let ports = policy.proxied_ports();
        if !ports.is_empty() {
            services.push(Service { l4: L4::Tcp, port: PROXY_PORT });
            let direct = policy.allow.iter().map(|a| a.net).collect();
            redirect = Some(Redirect { ports, direct, to_port: PROXY_PORT });
        }
    }
    out.push(rule(None, Some(L4::Tcp), None, Verdict::Reset));
    out.push(rule(None, None, None, Verdict::Reject));
    Ruleset { out, services, redirect }
}

impl Ruleset {
    /// What the outbound chain does with a packet to `ip`, `port` over `proto`.
    pub fn decide(&self, ip: Ipv4Addr, proto: Proto, port: u16) -> Verdict {
        self.out
            .iter()
            .find(|r| r.matches(ip, proto, port))
            .map(|r| r.verdict)
            // Unreachable: the last rule matches everything; rejecting is the closed answer.
            .unwrap_or(Verdict::Reject)
    }

    /// The rule that decides a packet to `ip`, `port` over IP protocol `proto`, in words
    /// (for the egress audit).
    pub fn explain(&self, ip: Ipv4Addr, proto: u8, port: u16) -> String {
        let p = match proto {
            6 => Proto::Tcp,
            17 => Proto::Udp,
            _ => Proto::Other,
        };
        let Some(r) = self.out.iter().find(|r| r.matches(ip, p, port)) else {
            return "no rule allows it".into();
        };
        let what = match (r.l4, r.port) {
            (Some(l4), Some(port)) => format!(" {}/{port}", if l4 == L4::Tcp { "tcp" } else { "udp" }),
            _ => String::new(),
        };
        match (r.to, r.verdict) {
            (Some(n), Verdict::Accept) => format!("allowed by rule {n}{what}"),
            (Some(n), _) => format!("denied by rule {n}"),
            (None, Verdict::Accept) => "allowed: allow-all".into(),
            (None, _) => "denied: no rule allows this address, protocol and port".into(),
        }
    }

    /// Whether the address rules deny `ip` whatever the port: what the proxy checks after
    /// a name is allowed. The first rule naming a network that holds `ip` decides; an
    /// address no such rule names is denied if it is in an always-denied range.
    pub fn denies_address(&self, ip: Ipv4Addr) -> bool {
        match self.out.iter().find(|r| r.to.is_some_and(|n| n.contains(ip))) {
            Some(r) => r.verdict != Verdict::Accept,
            None => ALWAYS_DENIED.iter().any(|n| n.contains(ip)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glovebox_proto::api::NetworkPolicy;
    use proptest::prelude::*;

    fn parse(v: serde_json::Value) -> Policy {
        let np: NetworkPolicy = serde_json::from_value(v).expect("policy json");
        glovebox_proto::policy::parse(&np).expect("valid policy")
    }

    #[test]
    fn order_is_deny_allow_always_denied_then_the_mode() {
        let p = parse(serde_json::json!({
            "mode": "allow-list",
            "allow": ["198.51.100.0/24", "10.1.0.0/16:5432"],
            "deny": ["198.51.100.7/32"],
        }));
        let r = ruleset(&p);
        let ip = |s: &str| s.parse::<Ipv4Addr>().expect("ip");
        assert_eq!(r.decide(ip("198.51.100.7"), Proto::Tcp, 80), Verdict::Reject, "deny first");
        assert_eq!(r.decide(ip("198.51.100.8"), Proto::Other, 0), Verdict::Accept);
        assert_eq!(r.decide(ip("10.1.2.3"), Proto::Tcp, 5432), Verdict::Accept, "allow beats always-denied");
        assert_eq!(r.decide(ip("10.1.2.3"), Proto::Tcp, 22), Verdict::Reset, "not allowed: TCP reset");
        assert_eq!(r.decide(ip("169.254.169.254"), Proto::Udp, 80), Verdict::Reject);
        assert_eq!(r.decide(ip("10.1.2.3"), Proto::Other, 0), Verdict::Reject, "ports allow only TCP and UDP");
        assert_eq!(r.decide(ip("203.0.113.1"), Proto::Udp, 53), Verdict::Reject);
        assert_eq!(r.services, vec![Service { l4: L4::Udp, port: 53 }]);
        assert_eq!(r.redirect, None, "no names, no proxy");
        assert!(r.denies_address(ip("198.51.100.7")));
        assert!(!r.denies_address(ip("10.1.2.3")));
        assert!(r.denies_address(ip("169.254.169.254")));
        assert!(!r.denies_address(ip("203.0.113.1")));
    }

    #[test]
    fn allow_all_rejects_the_always_denied_ranges_before_accepting() {
        let p = parse(serde_json::json!({ "mode": "allow-all" }));
        let r = ruleset(&p);
        assert_eq!(r.decide(Ipv4Addr::new(169, 254, 169, 254), Proto::Tcp, 80), Verdict::Reject);
        assert_eq!(r.decide(Ipv4Addr::new(198, 51, 100, 1), Proto::Tcp, 80), Verdict::Accept);
        assert!(r.denies_address(Ipv4Addr::new(10, 0, 0, 1)));
        assert!(!r.denies_address(Ipv4Addr::new(198, 51, 100, 1)));
    }

    #[test]
    fn deny_all_rejects_everything_and_offers_no_service() {
        let r = ruleset(&Policy::deny_all());
        assert_eq!(r.decide(Ipv4Addr::new(1, 1, 1, 1), Proto::Tcp, 443), Verdict::Reset);
        assert_eq!(r.decide(Ipv4Addr::new(1, 1, 1, 1), Proto::Udp, 53), Verdict::Reject);
        assert!(r.services.is_empty() && r.redirect.is_none());
    }

    #[test]
    fn names_send_their_ports_through_the_proxy() {
        let p = parse(serde_json::json!({
            "mode": "allow-list",
            "allow": ["api.example.test", "*.example.test:8443", "198.51.100.0/24"],
        }));
        let r = ruleset(&p);
        let red = r.redirect.expect("a redirect");
        assert_eq!(red.ports, vec![80, 443, 8443]);
        assert_eq!(red.direct, vec![Net4::new(198, 51, 100, 0, 24)]);
        assert!(r.services.contains(&Service { l4: L4::Tcp, port: red.to_port }));
    }

    fn net() -> impl Strategy<Value = Net4> {
        // Small nets drawn near a few interesting places (the always-denied ranges among
        // them) so that random addresses hit them.
        (prop::sample::select(vec![[10u8, 0], [169, 254], [198, 51], [192, 168], [8, 8]]), any::<u8>(), 8u8..=32)
            .prop_map(|(ab, c, prefix)| Net4::new(ab[0], ab[1], c & 3, 0, prefix))
    }

    fn policy() -> impl Strategy<Value = Policy> {
        let mode = prop::sample::select(vec![NetworkMode::DenyAll, NetworkMode::AllowList, NetworkMode::AllowAll]);
        let rule = (net(), prop::collection::vec(prop::sample::select(vec![22u16, 53, 80, 443]), 0..3))
            .prop_map(|(net, ports)| glovebox_proto::policy::Rule { net, ports });
        (mode, prop::collection::vec(rule, 0..4), prop::collection::vec(net(), 0..3))
            .prop_map(|(mode, allow, deny)| Policy { mode, allow, domains: Vec::new(), deny })
    }

    fn dest() -> impl Strategy<Value = (Ipv4Addr, Proto, u16)> {
        let ip = (prop::sample::select(vec![[10u8, 0], [169, 254], [198, 51], [192, 168], [8, 8]]), any::<u16>())
            .prop_map(|(ab, cd)| Ipv4Addr::new(ab[0], ab[1], (cd >> 8) as u8 & 3, cd as u8));
        let proto = prop::sample::select(vec![Proto::Tcp, Proto::Udp, Proto::Other]);
        (ip, proto, prop::sample::select(vec![22u16, 53, 80, 443, 8080]))
    }

    proptest! {
        #[test]
        fn the_ruleset_decides_as_the_policy(p in policy(), (ip, proto, port) in dest()) {
            let r = ruleset(&p);
            let v = r.decide(ip, proto, port);
            match proto {
                Proto::Tcp | Proto::Udp => prop_assert_eq!(v == Verdict::Accept, p.verdict(ip, port)),
                // Port rules allow only TCP and UDP: other protocols see the policy without them.
                Proto::Other => {
                    let mut q = p.clone();
                    q.allow.retain(|a| a.ports.is_empty());
                    prop_assert_eq!(v == Verdict::Accept, q.verdict(ip, 0));
                }
            }
            if v == Verdict::Reset {
                prop_assert_eq!(proto, Proto::Tcp);
            }
        }

        #[test]
        fn the_proxy_denies_addresses_as_the_policy(p in policy(), (ip, _, _) in dest()) {
            // An address is denied when a deny rule holds it, or an always-denied range
            // holds it and no allow rule does.
            let want = p.deny.iter().any(|d| d.contains(ip))
                || (ALWAYS_DENIED.iter().any(|d| d.contains(ip)) && !p.allow.iter().any(|a| a.net.contains(ip)));
            // Deny-all never reaches the proxy (no name is allowed).
            prop_assume!(p.mode != NetworkMode::DenyAll);
            prop_assert_eq!(ruleset(&p).denies_address(ip), want);
        }
    }

    #[test]
    fn allow_rules_parse_into_the_rules_the_ruleset_reads() {
        // The property tests build `Policy` directly; this pins that parsing gives that shape.
        let p = parse(serde_json::json!({ "mode": "allow-list", "allow": ["198.51.100.0/24:443"] }));
        assert_eq!(
            p.allow,
            vec![glovebox_proto::policy::Rule { net: Net4::new(198, 51, 100, 0, 24), ports: vec![443] }]
        );
    }
}
