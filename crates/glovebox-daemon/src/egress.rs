//! Name-based egress: the filtering resolver, the SNI/Host-checking transparent proxy, and
//! the audit log of one sandbox. All of it runs on the host side of the sandbox's link.
//!
//! - DNS: a query for a name the policy does not allow is answered NXDOMAIN here and never
//!   sent upstream (no exfiltration through names); allowed ones are forwarded, and the A
//!   records of the answer are remembered as "this name resolved to these addresses".
//! - TCP on the ports of domain rules is redirected (nftables DNAT) to the proxy, which reads
//!   the TLS ClientHello's SNI or the HTTP Host header, and connects upstream only if the name
//!   is allowed for that port AND the original destination is an address DNS gave this
//!   sandbox for that name (no domain fronting), and the address is not denied.
//! - A connection to a name whose rule injects headers (credential brokering) is handed to
//!   `broker` over TLS only; plain HTTP to such a name is refused, so a credential never
//!   crosses the network in clear text.
//! - Every DNS query and connection attempt is recorded (bounded ring).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use glovebox_proto::api::EgressEntry;
use glovebox_proto::policy::Policy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::secrets::SecretStore;

const AUDIT_MAX: usize = 10_000;
/// Packets the firewall logs are listed up to this many a second per sandbox (in bursts of
/// up to `PACKET_BURST`); the rest are counted (`EgressLog::unlisted`).
const PACKETS_PER_S: f64 = 50.0;
const PACKET_BURST: f64 = 200.0;
const PEEK_MAX: usize = 16 * 1024;
const PEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// Egress attempts denied by any sandbox's policy (a daemon-wide metric).
pub static DENIED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A sandbox's egress state, shared by its resolver, proxy and the API.
pub struct Egress {
    pub policy: RwLock<Policy>,
    resolved: Mutex<HashMap<Ipv4Addr, HashSet<String>>>,
    audit: Mutex<VecDeque<EgressEntry>>,
    /// Proxied connections: name, port, the brokering rule they run under (if any), task.
    conns: Mutex<Vec<Conn>>,
    /// Bytes sent and received over every recorded connection (usage metering; the audit
    /// ring forgets old entries, these totals do not).
    pub bytes_up: std::sync::atomic::AtomicU64,
    pub bytes_down: std::sync::atomic::AtomicU64,
    /// Where brokered headers' `${secret:NAME}` come from, and whose secrets they are.
    secrets: Arc<SecretStore>,
    owner: String,
    /// The sandbox's CA, made when a policy first brokers.
    ca: Mutex<Option<Arc<crate::broker::Ca>>>,
    /// Listing budget for logged packets: tokens and when they were last topped up.
    packet_budget: Mutex<(f64, std::time::Instant)>,
    /// Logged packets over the budget: counted, not listed.
    pub unlisted: std::sync::atomic::AtomicU64,
}

type Conn = (String, u16, Option<glovebox_proto::policy::DomainRule>, tokio::task::AbortHandle);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Egress {
    pub fn new(policy: Policy, secrets: Arc<SecretStore>, owner: &str) -> Arc<Egress> {
        Arc::new(Egress {
            policy: RwLock::new(policy),
            resolved: Mutex::new(HashMap::new()),
            audit: Mutex::new(VecDeque::new()),
            conns: Mutex::new(Vec::new()),
            bytes_up: Default::default(),
            bytes_down: Default::default(),
            secrets,
            owner: owner.to_string(),
            ca: Mutex::new(None),
            packet_budget: Mutex::new((PACKET_BURST, std::time::Instant::now())),
            unlisted: Default::default(),
        })
    }

    /// A packet the sandbox's firewall logged (a denial, or the first packet of a connection
    /// an address rule allowed): listed with the rule that decided it, within the budget.
    pub fn packet(&self, p: &crate::net::Logged) {
        use std::sync::atomic::Ordering::Relaxed;
        let listed = {
            let mut b = lock(&self.packet_budget);
            let now = std::time::Instant::now();
            b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * PACKETS_PER_S).min(PACKET_BURST);
            b.1 = now;
            let ok = b.0 >= 1.0;
            if ok {
                b.0 -= 1.0;
            }
            ok
        };
        if !listed {
            self.unlisted.fetch_add(1, Relaxed);
            if !p.allowed {
                DENIED.fetch_add(1, Relaxed);
            }
            return;
        }
        let why = crate::net::ruleset(&self.policy()).explain(p.dst, p.proto, p.port);
        self.record(entry(&p.proto_name(), "", Some(p.dst), p.port, p.allowed, &format!("packet filter: {why}")));
    }

    /// The sandbox's CA, made on first call (`label` names it). Returns it and whether it is new.
    pub fn ensure_ca(&self, label: &str) -> Result<(Arc<crate::broker::Ca>, bool), crate::broker::BrokerError> {
        let mut ca = lock(&self.ca);
        if let Some(c) = ca.as_ref() {
            return Ok((c.clone(), false));
        }
        let c = Arc::new(crate::broker::Ca::new(label)?);
        *ca = Some(c.clone());
        Ok((c, true))
    }

    /// Checks that every secret `p` references exists (for a clear 400 at create/update).
    pub fn check_secrets(secrets: &SecretStore, owner: &str, p: &Policy) -> Result<(), String> {
        for n in p.secret_refs() {
            if secrets.get(owner, &n).is_none() {
                return Err(format!("network.allow: secret {n:?} does not exist (create it with PUT /v1/secrets/{n})"));
            }
        }
        Ok(())
    }

    fn policy(&self) -> Policy {
        self.policy.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn record(&self, e: EgressEntry) {
        use std::sync::atomic::Ordering::Relaxed;
        self.bytes_up.fetch_add(e.bytes_up, Relaxed);
        self.bytes_down.fetch_add(e.bytes_down, Relaxed);
        if !e.allowed {
            DENIED.fetch_add(1, Relaxed);
        }
        let mut a = lock(&self.audit);
        if a.len() >= AUDIT_MAX {
            a.pop_front();
        }
        a.push_back(e);
    }

    pub fn entries(&self) -> Vec<EgressEntry> {
        lock(&self.audit).iter().cloned().collect()
    }

    /// Replaces the policy and closes proxied connections it no longer allows, and brokered
    /// ones whose rule changed (or plain ones that would now be brokered): a connection never
    /// goes on with headers its policy no longer gives it.
    pub fn set_policy(&self, p: Policy) {
        let mut conns = lock(&self.conns);
        conns.retain(|(name, port, rule, h)| {
            if h.is_finished() {
                return false;
            }
            if !p.allows_name_port(name, *port) || p.broker(name, *port) != rule.as_ref() {
                h.abort();
                return false;
            }
            true
        });
        drop(conns);
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = p;
    }

    fn resolved_to(&self, ip: Ipv4Addr, name: &str) -> bool {
        let n = name.trim_end_matches('.').to_ascii_lowercase();
        lock(&self.resolved).get(&ip).is_some_and(|s| s.contains(&n))
    }
}

fn entry(kind: &str, name: &str, ip: Option<Ipv4Addr>, port: u16, allowed: bool, reason: &str) -> EgressEntry {
    EgressEntry {
        time: crate::util::rfc3339(SystemTime::now()),
        kind: kind.into(),
        name: name.into(),
        ip: ip.map(|i| i.to_string()),
        port,
        allowed,
        reason: reason.into(),
        bytes_up: 0,
        bytes_down: 0,
        injected_headers: Vec::new(),
    }
}

/// The question name and type of a DNS query, if it parses.
fn question(q: &[u8]) -> Option<(String, u16, usize)> {
    if q.len() < 12 || u16::from_be_bytes([q[4], q[5]]) != 1 {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let n = *q.get(i)? as usize;
        if n == 0 {
            break;
        }
        if n > 63 || labels.len() > 127 {
            return None;
        }
        labels.push(std::str::from_utf8(q.get(i + 1..i + 1 + n)?).ok()?.to_ascii_lowercase());
        i += 1 + n;
    }
    let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
    Some((labels.join("."), qtype, i + 5))
}

/// An NXDOMAIN answer to query `q` (question section copied).
fn nxdomain(q: &[u8], qend: usize) -> Vec<u8> {
    let mut r = Vec::with_capacity(qend);
    r.extend_from_slice(&q[..2]);
    r.extend_from_slice(&[0x81, 0x83, 0, 1, 0, 0, 0, 0, 0, 0]);
    r.extend_from_slice(&q[12..qend]);
    r
}

/// The A records of a DNS answer.
fn a_records(r: &[u8]) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    if r.len() < 12 {
        return out;
    }
    let qd = u16::from_be_bytes([r[4], r[5]]) as usize;
    let an = u16::from_be_bytes([r[6], r[7]]) as usize;
    let mut i = 12;
    let skip_name = |mut i: usize| -> Option<usize> {
        loop {
            let n = *r.get(i)? as usize;
            if n == 0 {
                return Some(i + 1);
            }
            if n & 0xc0 == 0xc0 {
                return Some(i + 2);
            }
            i += 1 + n;
        }
    };
    for _ in 0..qd {
        match skip_name(i) {
            Some(j) => i = j + 4,
            None => return out,
        }
    }
    for _ in 0..an {
        let Some(j) = skip_name(i) else { return out };
        let Some(h) = r.get(j..j + 10) else { return out };
        let (ty, len) = (u16::from_be_bytes([h[0], h[1]]), u16::from_be_bytes([h[8], h[9]]) as usize);
        if ty == 1 && len == 4 {
            if let Some(a) = r.get(j + 10..j + 14) {
                out.push(Ipv4Addr::new(a[0], a[1], a[2], a[3]));
            }
        }
        i = j + 10 + len;
    }
    out
}

/// Runs the filtering resolver on `sock` until `stop`.
pub fn spawn_resolver(sock: tokio::net::UdpSocket, upstream: SocketAddr, eg: Arc<Egress>, stop: CancellationToken) {
    let sock = Arc::new(sock);
    let inflight = Arc::new(tokio::sync::Semaphore::new(64));
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1500];
        loop {
            let (n, from) = tokio::select! {
                r = sock.recv_from(&mut buf) => match r { Ok(x) => x, Err(_) => continue },
                _ = stop.cancelled() => return,
            };
            let q = buf[..n].to_vec();
            let Some((name, qtype, qend)) = question(&q) else { continue };
            if !eg.policy().allows_name(&name) {
                eg.record(entry("dns", &name, None, 53, false, "name not allowed (answered NXDOMAIN, not forwarded)"));
                let _ = sock.send_to(&nxdomain(&q, qend), from).await;
                continue;
            }
            let Ok(permit) = inflight.clone().try_acquire_owned() else { continue };
            let (sock, eg) = (sock.clone(), eg.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let Ok(up) = tokio::net::UdpSocket::bind("0.0.0.0:0").await else { return };
                if up.send_to(&q, upstream).await.is_err() {
                    return;
                }
                let mut ans = vec![0u8; 4096];
                if let Ok(Ok((m, _))) = tokio::time::timeout(Duration::from_secs(2), up.recv_from(&mut ans)).await {
                    let ips = a_records(&ans[..m]);
                    if !ips.is_empty() {
                        let mut r = lock(&eg.resolved);
                        for ip in &ips {
                            r.entry(*ip).or_default().insert(name.clone());
                        }
                    }
                    let first = ips.first().copied();
                    eg.record(entry(
                        "dns",
                        &name,
                        first,
                        53,
                        true,
                        if qtype == 1 { "forwarded" } else { "forwarded (non-A)" },
                    ));
                    let _ = sock.send_to(&ans[..m], from).await;
                }
            });
        }
    });
}

/// The TLS SNI of a ClientHello, if `b` starts with one.
pub fn sni(b: &[u8]) -> Option<String> {
    if b.len() < 5 || b[0] != 0x16 {
        return None;
    }
    let hs = b.get(5..)?;
    if *hs.first()? != 1 {
        return None;
    }
    let mut i = 4 + 2 + 32;
    let sid = *hs.get(i)? as usize;
    i += 1 + sid;
    let cs = u16::from_be_bytes([*hs.get(i)?, *hs.get(i + 1)?]) as usize;
    i += 2 + cs;
    let cm = *hs.get(i)? as usize;
    i += 1 + cm;
    let ext_end = i + 2 + u16::from_be_bytes([*hs.get(i)?, *hs.get(i + 1)?]) as usize;
    i += 2;
    while i + 4 <= ext_end {
        let ty = u16::from_be_bytes([*hs.get(i)?, *hs.get(i + 1)?]);
        let len = u16::from_be_bytes([*hs.get(i + 2)?, *hs.get(i + 3)?]) as usize;
        if ty == 0 {
            let d = hs.get(i + 4..i + 4 + len)?;
            let nlen = u16::from_be_bytes([*d.get(3)?, *d.get(4)?]) as usize;
            let name = std::str::from_utf8(d.get(5..5 + nlen)?).ok()?;
            return Some(name.to_ascii_lowercase());
        }
        i += 4 + len;
    }
    None
}

/// The Host header of an HTTP/1 request head, if `b` holds one (port stripped).
pub fn http_host(b: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(b.get(..b.windows(4).position(|w| w == b"\r\n\r\n")?)?).ok()?;
    text.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("host")
            .then(|| v.trim().rsplit_once(':').map_or(v.trim(), |(h, _)| h).to_ascii_lowercase())
    })
}

/// Runs the proxy on `listener` until `stop`.
pub fn spawn_proxy(listener: tokio::net::TcpListener, eg: Arc<Egress>, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            let (conn, _) = tokio::select! {
                r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                _ = stop.cancelled() => return,
            };
            // Relayed requests are small writes: Nagle would hold them back for an ACK.
            let _ = conn.set_nodelay(true);
            let eg2 = eg.clone();
            tokio::spawn(async move { proxy_one(conn, eg2).await });
        }
    });
}

async fn proxy_one(mut conn: tokio::net::TcpStream, eg: Arc<Egress>) {
    let dst: SocketAddrV4 = match rustix::net::sockopt::ip_original_dst(&conn) {
        Ok(d) => d,
        Err(_) => return,
    };
    let (ip, port) = (*dst.ip(), dst.port());
    let mut head = vec![0u8; PEEK_MAX];
    let mut n = 0;
    let mut tls = false;
    let name = loop {
        let r = tokio::time::timeout(PEEK_TIMEOUT, conn.read(&mut head[n..])).await;
        match r {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => {
                eg.record(entry("tcp", "", Some(ip), port, false, "no TLS SNI or HTTP Host before timeout"));
                return;
            }
            Ok(Ok(k)) => n += k,
        }
        if let Some(h) = sni(&head[..n]) {
            tls = true;
            break h;
        }
        if let Some(h) = http_host(&head[..n]) {
            break h;
        }
        if n >= PEEK_MAX {
            eg.record(entry("tcp", "", Some(ip), port, false, "no TLS SNI or HTTP Host"));
            return;
        }
    };
    let pol = eg.policy();
    let denied_ip = crate::net::ruleset(&pol).denies_address(ip);
    let verdict = if !pol.allows_name_port(&name, port) {
        Err("name not allowed on this port")
    } else if !eg.resolved_to(ip, &name) {
        Err("destination is not an address this sandbox resolved for the name (domain fronting?)")
    } else if denied_ip {
        Err("destination address is denied")
    } else {
        Ok(())
    };
    if let Err(why) = verdict {
        eg.record(entry("tcp", &name, Some(ip), port, false, why));
        return;
    }
    if let Some(rule) = pol.broker(&name, port) {
        return brokered(conn, head[..n].to_vec(), dst, name, tls, rule.clone(), eg).await;
    }
    let Ok(Ok(mut up)) = tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(dst)).await
    else {
        eg.record(entry("tcp", &name, Some(ip), port, false, "upstream unreachable"));
        return;
    };
    let _ = up.set_nodelay(true);
    if up.write_all(&head[..n]).await.is_err() {
        return;
    }
    // Track it so a policy change can close it.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let copy = tokio::spawn(async move {
        let r = tokio::io::copy_bidirectional_with_sizes(&mut conn, &mut up, 64 << 10, 64 << 10).await;
        let _ = tx.send(());
        r
    });
    lock(&eg.conns).push((name.clone(), port, None, copy.abort_handle()));
    let mut e = entry("tcp", &name, Some(ip), port, true, "allowed by name");
    match copy.await {
        Ok(Ok((a, b))) => {
            e.bytes_up = a + n as u64;
            e.bytes_down = b;
        }
        Ok(Err(_)) => {}
        Err(_) => e.reason = "closed by a policy change".into(),
    }
    drop(rx);
    eg.record(e);
}

/// A connection to a brokered name: TLS terminated and re-originated by `broker`, with the
/// rule's headers (secrets filled in now, so a rotated secret applies to new connections).
async fn brokered(
    conn: tokio::net::TcpStream,
    head: Vec<u8>,
    dst: SocketAddrV4,
    name: String,
    tls: bool,
    rule: glovebox_proto::policy::DomainRule,
    eg: Arc<Egress>,
) {
    let (ip, port) = (*dst.ip(), dst.port());
    let rule_name = format!("rule {}", rule.name);
    let deny = |why: String| {
        let mut e = entry("tcp", &name, Some(ip), port, false, &why);
        e.injected_headers = rule.inject.iter().map(|h| h.name.clone()).collect();
        eg.record(e);
    };
    if !tls {
        deny(format!("{rule_name} brokers credentials: plain HTTP refused (use HTTPS)"));
        return;
    }
    let Some(ca) = lock(&eg.ca).clone() else {
        deny(format!("{rule_name}: the sandbox has no CA yet"));
        return;
    };
    let mut headers = Vec::new();
    for h in &rule.inject {
        let v = match h.render(|n| eg.secrets.get(&eg.owner, n).map(|v| v.expose().to_string())) {
            Ok(v) => v,
            Err(why) => return deny(format!("{rule_name}: {why}")),
        };
        let (Ok(k), Ok(mut v)) =
            (hyper::header::HeaderName::from_bytes(h.name.as_bytes()), hyper::header::HeaderValue::from_str(&v))
        else {
            return deny(format!("{rule_name}: header {} is not valid HTTP", h.name));
        };
        v.set_sensitive(true);
        headers.push((k, v));
    }
    let names: Vec<String> = rule.inject.iter().map(|h| h.name.clone()).collect();
    let task = tokio::spawn(crate::broker::serve(conn, head, dst, name.clone(), headers, ca));
    lock(&eg.conns).push((name.clone(), port, Some(rule.clone()), task.abort_handle()));
    let mut e = entry("tcp", &name, Some(ip), port, true, "");
    e.injected_headers = names;
    match task.await {
        Ok(Ok(s)) => {
            e.bytes_up = s.bytes_up;
            e.bytes_down = s.bytes_down;
            e.reason = format!(
                "brokered by {rule_name}: TLS terminated, {} request(s) with injected headers{}",
                s.requests,
                if s.refused > 0 { format!(", {} refused (Host is another name)", s.refused) } else { String::new() }
            );
        }
        Ok(Err(err)) => {
            e.allowed = false;
            e.reason = format!("{rule_name}: {err}");
        }
        Err(_) => e.reason = format!("brokered by {rule_name}: closed by a policy change"),
    }
    eg.record(e);
}

/// The resolver the DNS forwarder asks: `GLOVEBOX_DNS_UPSTREAM`, else the first nameserver
/// of the host's /etc/resolv.conf.
fn dns_upstream() -> Option<SocketAddr> {
    if let Ok(v) = std::env::var("GLOVEBOX_DNS_UPSTREAM") {
        return v.parse().ok().or_else(|| v.parse::<Ipv4Addr>().ok().map(|ip| SocketAddr::from((ip, 53))));
    }
    let conf = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok())
        .find(|ip| ip.is_ipv4())
        .map(|ip| SocketAddr::new(ip, 53))
}

/// Starts the sandbox's resolver and proxy on the host end of its link.
/// Nothing is started for a sandbox already being destroyed (`stop` cancelled). `stop` is a
/// level, not an edge: a service whose task has not run yet when the destroy cancels it
/// still sees it (with a notification, such a task kept its address bound for good, and the
/// next sandbox on the slot failed to bind it).
pub fn spawn_services(slot: u32, eg: Arc<Egress>, stop: CancellationToken) -> crate::error::Result<()> {
    if stop.is_cancelled() {
        return Ok(());
    }
    let (host, _) = crate::net::link_addrs(slot);
    let upstream = dns_upstream()
        .ok_or_else(|| crate::error::Error::Unavailable("no DNS upstream (set GLOVEBOX_DNS_UPSTREAM)".into()))?;
    let udp = std::net::UdpSocket::bind((host, 53))
        .map_err(|e| crate::error::Error::Internal(format!("dns bind {host}: {e}")))?;
    udp.set_nonblocking(true).map_err(|e| crate::error::Error::Internal(e.to_string()))?;
    let udp = tokio::net::UdpSocket::from_std(udp).map_err(|e| crate::error::Error::Internal(e.to_string()))?;
    let tcp = std::net::TcpListener::bind((host, crate::net::ruleset::PROXY_PORT))
        .map_err(|e| crate::error::Error::Internal(format!("proxy bind {host}: {e}")))?;
    tcp.set_nonblocking(true).map_err(|e| crate::error::Error::Internal(e.to_string()))?;
    let tcp = tokio::net::TcpListener::from_std(tcp).map_err(|e| crate::error::Error::Internal(e.to_string()))?;
    spawn_resolver(udp, upstream, eg.clone(), stop.clone());
    spawn_proxy(tcp, eg, stop);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A destroy that comes before the services' tasks first run (a create answered, then
    /// destroyed at once) still stops them: their sockets are closed and the address is free
    /// for the next sandbox on the slot.
    #[tokio::test(flavor = "current_thread")]
    async fn services_stopped_before_they_first_run_close_their_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = Arc::new(SecretStore::open(dir.path()).unwrap());
        let eg = Egress::new(Policy::deny_all(), secrets, "default");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let (tcp_at, udp_at) = (tcp.local_addr().unwrap(), udp.local_addr().unwrap());
        let stop = CancellationToken::new();
        // On this one thread, neither task runs before the cancel.
        spawn_proxy(tcp, eg.clone(), stop.clone());
        spawn_resolver(udp, "127.0.0.1:9".parse().unwrap(), eg, stop.clone());
        stop.cancel();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        std::net::TcpListener::bind(tcp_at).expect("the proxy's address is free again");
        std::net::UdpSocket::bind(udp_at).expect("the resolver's address is free again");
    }

    #[test]
    fn parses_dns() {
        // Query for api.good.test A.
        let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in ["api", "good", "test"] {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        let (name, qtype, end) = question(&q).unwrap();
        assert_eq!((name.as_str(), qtype, end), ("api.good.test", 1, q.len()));
        let nx = nxdomain(&q, end);
        assert_eq!(&nx[..2], &[0x12, 0x34]);
        assert_eq!(nx[3] & 0x0f, 3, "rcode NXDOMAIN");
        // An answer with one A record (compressed name pointer).
        let mut r = nx.clone();
        r[3] = 0x80;
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 203, 0, 113, 10]);
        assert_eq!(a_records(&r), vec![Ipv4Addr::new(203, 0, 113, 10)]);
        assert!(question(&[0; 5]).is_none());
        assert!(a_records(&[0xff; 40]).len() <= 4);
    }

    #[test]
    fn reads_host_and_sni() {
        assert_eq!(http_host(b"GET / HTTP/1.1\r\nHost: Api.Good.Test:8080\r\n\r\n").as_deref(), Some("api.good.test"));
        assert_eq!(http_host(b"GET / HTTP/1.1\r\nHost: api.good.test\r\n"), None, "incomplete head");
        // A minimal ClientHello with SNI "api.good.test".
        let name = b"api.good.test";
        let mut ext = vec![0, 0];
        let sni_list_len = (name.len() + 3) as u16;
        ext.extend_from_slice(&(sni_list_len + 2).to_be_bytes());
        ext.extend_from_slice(&sni_list_len.to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
        ext.extend_from_slice(name);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1, 0, 0, body.len() as u8];
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        assert_eq!(sni(&rec).as_deref(), Some("api.good.test"));
        assert_eq!(sni(&rec[..20]), None);
        assert_eq!(sni(b"GET / HTTP/1.1\r\n"), None);
    }
}
