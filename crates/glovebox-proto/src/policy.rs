//! Network policy decisions, as pure functions: parsing and checking a `NetworkPolicy`
//! (every error says which rule is wrong and why), and the ordered verdict list the host-side
//! firewall enforces. Installing it is the daemon's business (`glovebox-daemon::net`).

use std::fmt;
use std::net::Ipv4Addr;

use crate::api::{AllowRule, NetworkMode, NetworkPolicy};

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

/// An allowed name: exact (`api.example.test`) or every subdomain (`*.example.test`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRule {
    /// Lower case, without a trailing dot; for wildcards, the suffix after `*.`.
    pub name: String,
    pub wildcard: bool,
    /// Empty: 80 and 443.
    pub ports: Vec<u16>,
    /// Headers the proxy sets on every request to this (exact) name: credential brokering.
    pub inject: Vec<Header>,
}

/// One part of a brokered header value.
#[derive(Clone, PartialEq, Eq)]
pub enum Part {
    Lit(String),
    /// A secret of the host-side store, by name.
    Secret(String),
}

/// A brokered header: lower-case name and its value template. `Debug` shows no values.
#[derive(Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Vec<Part>,
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Header({}: <{} parts>)", self.name, self.value.len())
    }
}

impl Header {
    /// The value with secrets filled in by `lookup` (None if a secret is missing: the error
    /// names it).
    pub fn render(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.value {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Secret(n) => out.push_str(&lookup(n).ok_or_else(|| format!("secret {n:?} does not exist"))?),
            }
        }
        Ok(out)
    }
}

/// Headers a broker may not set: they frame or route the request, so injecting them would
/// let a policy break HTTP rather than add a credential.
const UNBROKERABLE: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "proxy-connection",
];

/// Secret names: `[A-Za-z0-9_.-]`, 1..=64, starting with a letter or `_`.
pub fn valid_secret_name(n: &str) -> bool {
    n.len() <= 64
        && n.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Whether `v` may be (part of) an HTTP header value: no control characters but tab.
pub fn valid_header_value(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn parse_header(name: &str, value: &str) -> Result<Header, String> {
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || name.len() > 128 || !name.chars().all(tchar) {
        return Err(format!("{name:?} is not a valid header name"));
    }
    let lower = name.to_ascii_lowercase();
    if UNBROKERABLE.contains(&lower.as_str()) || lower.starts_with("proxy-") {
        return Err(format!("header {name:?} cannot be injected (it frames or routes the request)"));
    }
    if value.len() > 8192 {
        return Err(format!("value of header {name:?} is over 8 KiB"));
    }
    let mut parts = Vec::new();
    let mut rest = value;
    while let Some(i) = rest.find("${secret:") {
        if i > 0 {
            parts.push(Part::Lit(rest[..i].to_string()));
        }
        let after = &rest[i + "${secret:".len()..];
        let end = after.find('}').ok_or_else(|| format!("header {name:?}: unterminated ${{secret:…}} reference"))?;
        let sname = &after[..end];
        if !valid_secret_name(sname) {
            return Err(format!("header {name:?}: {sname:?} is not a valid secret name"));
        }
        parts.push(Part::Secret(sname.to_string()));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Lit(rest.to_string()));
    }
    if parts.iter().any(|p| matches!(p, Part::Lit(l) if !valid_header_value(l))) {
        return Err(format!("value of header {name:?} has control characters (CR, LF, NUL, …)"));
    }
    Ok(Header { name: lower, value: parts })
}

impl DomainRule {
    pub fn matches(&self, name: &str) -> bool {
        let n = name.trim_end_matches('.').to_ascii_lowercase();
        if self.wildcard {
            n.len() > self.name.len() + 1
                && n.ends_with(&self.name)
                && n.as_bytes()[n.len() - self.name.len() - 1] == b'.'
        } else {
            n == self.name
        }
    }

    pub fn allows_port(&self, port: u16) -> bool {
        if self.ports.is_empty() {
            port == 80 || port == 443
        } else {
            self.ports.contains(&port)
        }
    }
}

/// A checked policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub mode: NetworkMode,
    pub allow: Vec<Rule>,
    pub domains: Vec<DomainRule>,
    pub deny: Vec<Net4>,
}

impl Policy {
    pub fn deny_all() -> Policy {
        Policy { mode: NetworkMode::DenyAll, allow: Vec::new(), domains: Vec::new(), deny: Vec::new() }
    }

    /// Whether DNS may answer `name` (allow-all: anything; allow-list: a domain rule names it).
    pub fn allows_name(&self, name: &str) -> bool {
        match self.mode {
            NetworkMode::DenyAll => false,
            NetworkMode::AllowAll => true,
            NetworkMode::AllowList => self.domains.iter().any(|d| d.matches(name)),
        }
    }

    /// Whether a proxied connection to `name` on `port` is allowed (the destination address
    /// must also be one DNS gave this sandbox for `name`; the proxy checks that).
    pub fn allows_name_port(&self, name: &str, port: u16) -> bool {
        match self.mode {
            NetworkMode::DenyAll => false,
            NetworkMode::AllowAll => true,
            NetworkMode::AllowList => self.domains.iter().any(|d| d.matches(name) && d.allows_port(port)),
        }
    }

    /// TCP ports whose traffic goes through the name-checking proxy.
    pub fn proxied_ports(&self) -> Vec<u16> {
        let mut v: Vec<u16> = Vec::new();
        for d in &self.domains {
            if d.ports.is_empty() {
                v.extend([80, 443]);
            } else {
                v.extend(&d.ports);
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The brokering rule for a connection to `name` on `port`, if any (exact names only).
    pub fn broker(&self, name: &str, port: u16) -> Option<&DomainRule> {
        if self.mode != NetworkMode::AllowList {
            return None;
        }
        self.domains.iter().find(|d| !d.inject.is_empty() && d.matches(name) && d.allows_port(port))
    }

    /// Whether any rule brokers credentials (the sandbox then needs its CA).
    pub fn brokers(&self) -> bool {
        self.domains.iter().any(|d| !d.inject.is_empty())
    }

    /// Names of the secrets the policy references.
    pub fn secret_refs(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .domains
            .iter()
            .flat_map(|d| &d.inject)
            .flat_map(|h| &h.value)
            .filter_map(|p| match p {
                Part::Secret(n) => Some(n.clone()),
                Part::Lit(_) => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
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
        } else {
            format!("{s:?} is not an IPv4 address or CIDR")
        }
    })?;
    Ok(Net4 { addr, prefix })
}

/// `443,8443` (from rule `s`, for messages) → sorted, deduplicated ports.
fn parse_ports(ports: Option<&str>, s: &str) -> Result<Vec<u16>, String> {
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
    Ok(out)
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
    let out = parse_ports(ports, s)?;
    Ok(Rule { net, ports: out })
}

fn looks_like_domain(s: &str) -> bool {
    let host = s
        .rsplit_once(':')
        .map_or(s, |(h, p)| if p.split(',').all(|x| x.trim().parse::<u32>().is_ok()) { h } else { s });
    host.chars().any(|c| c.is_ascii_alphabetic()) && !host.contains('/') && !host.contains("::")
}

fn parse_domain(s: &str) -> Result<DomainRule, String> {
    let s = s.trim();
    let (host, ports) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest.to_string()),
        None => (false, host.clone()),
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() > 253 || !name.contains('.') || !name.split('.').all(label_ok) {
        return Err(format!("{s:?} is not a valid domain (use name.tld or *.name.tld)"));
    }
    let out = parse_ports(ports, s)?;
    Ok(DomainRule { name, wildcard, ports: out, inject: Vec::new() })
}

/// Checks a policy; the error names the rule and the problem.
pub fn parse(p: &NetworkPolicy) -> Result<Policy, String> {
    if p.allow.len() + p.deny.len() > 256 {
        return Err("at most 256 rules".into());
    }
    let mut domains = Vec::new();
    let mut allow = Vec::new();
    for r in &p.allow {
        match r {
            AllowRule::Rule(r) if looks_like_domain(r) => {
                domains.push(parse_domain(r).map_err(|e| format!("network.allow: {e}"))?)
            }
            AllowRule::Rule(r) => allow.push(parse_rule(r).map_err(|e| format!("network.allow: {e}"))?),
            AllowRule::Domain(d) => {
                let e = |m: String| format!("network.allow: {:?}: {m}", d.domain);
                if !looks_like_domain(&d.domain) {
                    return Err(e("\"domain\" takes a name (CIDR rules are strings)".into()));
                }
                let mut rule = parse_domain(&d.domain).map_err(|m| format!("network.allow: {m}"))?;
                if d.inject_headers.len() > 32 {
                    return Err(e("at most 32 inject_headers".into()));
                }
                if rule.wildcard && !d.inject_headers.is_empty() {
                    return Err(e(
                        "inject_headers needs an exact domain (a wildcard would send the credential to every subdomain)"
                            .into(),
                    ));
                }
                let mut seen = std::collections::BTreeSet::new();
                for (k, v) in &d.inject_headers {
                    let h = parse_header(k, v).map_err(e)?;
                    if !seen.insert(h.name.clone()) {
                        return Err(e(format!("header {k:?} is given twice (names are case-insensitive)")));
                    }
                    rule.inject.push(h);
                }
                domains.push(rule);
            }
        }
    }
    // A brokered name must be brokered one way only: another rule for the same exact name
    // (with other headers, or none) would make which headers apply depend on rule order.
    for (i, a) in domains.iter().enumerate() {
        for b in &domains[i + 1..] {
            let same = !a.wildcard && !b.wildcard && a.name == b.name;
            let overlap_ports = a.ports.is_empty() && b.ports.is_empty()
                || a.ports.iter().any(|p| b.allows_port(*p))
                || b.ports.iter().any(|p| a.allows_port(*p));
            if same && overlap_ports && (!a.inject.is_empty() || !b.inject.is_empty()) {
                return Err(format!(
                    "network.allow: {:?} has more than one rule and one of them injects headers (merge them)",
                    a.name
                ));
            }
        }
    }
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
        NetworkMode::DenyAll if !allow.is_empty() || !domains.is_empty() || !deny.is_empty() => {
            return Err("network: deny-all takes no allow or deny rules (use allow-list)".into())
        }
        NetworkMode::AllowList if allow.is_empty() && domains.is_empty() => {
            return Err("network: allow-list needs at least one allow rule".into())
        }
        NetworkMode::AllowAll if !allow.is_empty() || !domains.is_empty() => {
            return Err("network: allow-all takes no allow rules (they would change nothing); use allow-list".into())
        }
        _ => {}
    }
    for r in &allow {
        if let Some(d) = deny.iter().find(|d| **d == r.net) {
            return Err(format!("network: {d} is both allowed and denied"));
        }
    }
    Ok(Policy { mode: p.mode, allow, domains, deny })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pol(mode: NetworkMode, allow: &[&str], deny: &[&str]) -> NetworkPolicy {
        NetworkPolicy {
            mode,
            allow: allow.iter().map(|s| AllowRule::from(*s)).collect(),
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
        assert!(e(pol(NetworkMode::AllowList, &["bad_name.test"], &[])).contains("not a valid domain"));
        assert!(e(pol(NetworkMode::AllowList, &["localhost"], &[])).contains("not a valid domain"));
        assert!(e(pol(NetworkMode::AllowAll, &["api.good.test"], &[])).contains("allow-all takes no"));
        assert!(e(pol(NetworkMode::AllowList, &["::1"], &[])).contains("IPv6"));
        assert!(e(pol(NetworkMode::AllowList, &["198.51.100.0/33"], &[])).contains("over 32"));
        assert!(e(pol(NetworkMode::AllowList, &["198.51.100.1:0"], &[])).contains("out of range"));
        assert!(e(pol(NetworkMode::AllowList, &["198.51.100.1:70000"], &[])).contains("out of range"));
        assert!(e(pol(NetworkMode::AllowList, &["1.2.3"], &[])).contains("not an IPv4"));
        assert!(e(pol(NetworkMode::AllowList, &["198.51.100.0/24"], &["198.51.100.0/24"]))
            .contains("both allowed and denied"));
        assert!(e(pol(NetworkMode::AllowAll, &[], &["198.51.100.1:80"])).contains("no ports"));
    }

    #[test]
    fn domains() {
        let p =
            parse(&pol(NetworkMode::AllowList, &["api.good.test", "*.pkg.test:8443", "198.51.100.0/24"], &[])).unwrap();
        assert_eq!(p.domains.len(), 2);
        assert_eq!(p.allow.len(), 1);
        assert!(p.allows_name("API.Good.Test."));
        assert!(!p.allows_name("good.test"));
        assert!(!p.allows_name("evil-api.good.test"));
        assert!(p.allows_name("a.b.pkg.test"));
        assert!(!p.allows_name("pkg.test"), "a wildcard names subdomains only");
        assert!(!p.allows_name("xpkg.test"));
        assert!(p.allows_name_port("api.good.test", 443));
        assert!(!p.allows_name_port("api.good.test", 8443));
        assert!(p.allows_name_port("x.pkg.test", 8443));
        assert!(!p.allows_name_port("x.pkg.test", 443));
        assert_eq!(p.proxied_ports(), vec![80, 443, 8443]);
        assert!(!parse(&NetworkPolicy::default()).unwrap().allows_name("api.good.test"));
    }

    fn broker_pol(domain: &str, headers: &[(&str, &str)]) -> NetworkPolicy {
        let d = crate::api::DomainAllow {
            domain: domain.into(),
            inject_headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        NetworkPolicy { mode: NetworkMode::AllowList, allow: vec![AllowRule::Domain(d)], deny: vec![] }
    }

    #[test]
    fn brokering_rules() {
        let p =
            parse(&broker_pol("api.good.test:8443", &[("Authorization", "Bearer ${secret:tok}"), ("X-Org", "acme")]))
                .unwrap();
        let b = p.broker("API.good.test", 8443).expect("brokered");
        assert_eq!(b.inject.len(), 2);
        assert!(p.broker("api.good.test", 443).is_none(), "only on the rule's ports");
        assert!(p.brokers());
        assert_eq!(p.secret_refs(), vec!["tok".to_string()]);
        let auth = b.inject.iter().find(|h| h.name == "authorization").unwrap();
        assert_eq!(auth.render(|n| (n == "tok").then(|| "s3cr3t".into())).unwrap(), "Bearer s3cr3t");
        assert!(auth.render(|_| None).unwrap_err().contains("\"tok\""));
        assert!(!format!("{p:?}").contains("acme"), "Debug shows no header values");
        let e = |p: NetworkPolicy| parse(&p).unwrap_err();
        assert!(e(broker_pol("*.good.test", &[("Authorization", "x")])).contains("exact domain"));
        assert!(e(broker_pol("api.good.test", &[("Bad Name", "x")])).contains("not a valid header name"));
        assert!(e(broker_pol("api.good.test", &[("X-A", "a\r\nX-B: b")])).contains("control characters"));
        assert!(e(broker_pol("api.good.test", &[("Host", "evil.test")])).contains("cannot be injected"));
        assert!(e(broker_pol("api.good.test", &[("Content-Length", "0")])).contains("cannot be injected"));
        assert!(e(broker_pol("api.good.test", &[("X-A", "${secret:tok")])).contains("unterminated"));
        assert!(e(broker_pol("api.good.test", &[("X-A", "${secret:b@d}")])).contains("not a valid secret name"));
        assert!(e(broker_pol("api.good.test", &[("X-A", "a"), ("x-a", "b")])).contains("twice"));
        assert!(e(broker_pol("203.0.113.0/24", &[("X-A", "a")])).contains("takes a name"));
        let mut twice = broker_pol("api.good.test", &[("X-A", "a")]);
        twice.allow.push("api.good.test".into());
        assert!(e(twice).contains("more than one rule"));
        let mut other_port = broker_pol("api.good.test:8443", &[("X-A", "a")]);
        other_port.allow.push("api.good.test:8080".into());
        assert!(parse(&other_port).is_ok(), "brokered on 8443, plain on 8080");
        assert!(valid_secret_name("openai_key-2.prod") && !valid_secret_name("2x") && !valid_secret_name(""));
    }

    proptest! {
        #[test]
        fn parse_never_panics(rules in proptest::collection::vec(".{0,40}", 0..6)) {
            let p = NetworkPolicy { mode: NetworkMode::AllowList, allow: rules.iter().map(|r| AllowRule::from(r.as_str())).collect(), deny: rules };
            let _ = parse(&p);
        }

        #[test]
        fn verdict_matches_the_rules(a in any::<u32>(), prefix in 0u8..=32, ip in any::<u32>(), port in 1u16..) {
            let net = Net4 { addr: Ipv4Addr::from(a), prefix };
            let p = parse(&NetworkPolicy { mode: NetworkMode::AllowList, allow: vec![net.to_string().into()], deny: vec![] }).unwrap();
            let ip = Ipv4Addr::from(ip);
            prop_assert_eq!(p.verdict(ip, port), net.contains(ip));
        }
    }
}
