//! Sandbox networking beyond loopback, enforced entirely on the host side.
//!
//! A sandbox whose policy is not `deny-all` gets a veth pair: `gb<slot>` in the host's
//! namespace, `eth0` in the sandbox's, a /30 of the sandbox network per uid slot (host .1,
//! sandbox .2), a default route via the host end. Every packet the sandbox sends crosses the
//! host's `inet glovebox` nftables table, where the sandbox's own chain applies its policy
//! (`policy::Policy`: deny rules, then allow rules, then the always-denied ranges, then
//! allow-all) and rejects the rest (TCP with a reset, so connections the policy no longer
//! allows close at once). Traffic to the host itself is limited to the sandbox's DNS
//! forwarder; replies come back only as part of connections the sandbox opened. Sandboxes
//! have no IPv6. The sandbox, root in its own namespaces but without CAP_NET_ADMIN, can change
//! none of it.
//!
//! DNS: the sandbox's `/etc/resolv.conf` names the host end, where the daemon forwards
//! queries to the host's resolver (or `GLOVEBOX_DNS_UPSTREAM`) while the policy is not
//! deny-all. (Domain allow-lists, which need an answering-only resolver and an SNI-checking
//! proxy, are not implemented yet.)

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;

use glovebox_proto::api::NetworkMode;
use glovebox_proto::policy::{Policy, ALWAYS_DENIED};

use crate::error::{Error, Result};

/// Tables are per daemon process (`glovebox_<pid>`): each handles only the interfaces in its
/// own `ifaces` set, so several Glovebox processes on a host never drop each other's traffic,
/// and a daemon's exit can remove its table.
const TABLE_PREFIX: &str = "glovebox_";

/// The sandbox network: 10.213.0.0/16, one /30 per uid slot (16,384 slots).
pub fn link_addrs(slot: u32) -> (Ipv4Addr, Ipv4Addr) {
    let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) + slot * 4;
    (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
}

fn ifname(slot: u32) -> String {
    format!("gb{slot}")
}

fn run(cmd: &mut Command, input: Option<&str>) -> Result<()> {
    use std::io::Write;
    let what = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Unavailable(format!("{what}: {e} (install iproute2 and nftables)")))?;
    if let (Some(i), Some(mut stdin)) = (input, child.stdin.take()) {
        let _ = stdin.write_all(i.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| Error::Internal(format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(Error::Internal(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(())
}

fn nft(script: &str) -> Result<()> {
    run(Command::new("nft").arg("-f").arg("-"), Some(script))
}

/// The host-side firewall and forwarding, set up on first use.
pub struct Net {
    table: String,
    ready: std::sync::OnceLock<std::result::Result<(), String>>,
}

impl Default for Net {
    fn default() -> Self {
        Self::new()
    }
}

impl Net {
    pub fn new() -> Net {
        Net { table: format!("{TABLE_PREFIX}{}", std::process::id()), ready: std::sync::OnceLock::new() }
    }

    /// Creates this daemon's table and enables forwarding.
    fn ensure(&self) -> Result<()> {
        let r = self.ready.get_or_init(|| {
            let t = &self.table;
            let base = format!(
                "table inet {t}\ndelete table inet {t}\n\
                 table inet {t} {{\n\
                   set ifaces {{ type ifname; }}\n\
                   map out {{ type ifname : verdict; }}\n\
                   map in {{ type ifname : verdict; }}\n\
                   map nat {{ type ifname : verdict; }}\n\
                   chain prerouting {{ type nat hook prerouting priority -100;\n\
                     iifname @ifaces iifname vmap @nat\n\
                   }}\n\
                   chain forward {{ type filter hook forward priority 0; policy accept;\n\
                     iifname @ifaces iifname vmap @out\n\
                     iifname @ifaces drop\n\
                     oifname @ifaces ct state established,related accept\n\
                     oifname @ifaces drop\n\
                   }}\n\
                   chain input {{ type filter hook input priority 0; policy accept;\n\
                     iifname @ifaces ct state established,related accept\n\
                     iifname @ifaces iifname vmap @in\n\
                     iifname @ifaces drop\n\
                   }}\n\
                   chain postrouting {{ type nat hook postrouting priority 100;\n\
                     iifname @ifaces oifname != @ifaces masquerade\n\
                   }}\n\
                 }}\n"
            );
            nft(&base).map_err(|e| e.to_string())?;
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(|e| format!("enable IPv4 forwarding: {e}"))
        });
        r.clone().map_err(Error::Unavailable)
    }

    /// Gives the sandbox (PID 1 `pid`, uid slot `slot`) its link and applies `policy`.
    pub fn attach(&self, slot: u32, pid: i32, policy: &Policy) -> Result<()> {
        self.ensure()?;
        let (host, sb) = link_addrs(slot);
        let dev = ifname(slot);
        // The sandbox end is created in the sandbox's namespace, already named eth0; a link
        // left for this slot by a crashed daemon is removed only if it is in the way (one
        // process fewer on every create).
        let host_side = format!(
            "link add {dev} type veth peer name eth0 netns {pid}\n\
             addr add {host}/30 dev {dev}\n\
             link set {dev} alias {owner}\n\
             link set {dev} up\n",
            // Names the daemon that owns the link (its table's name), for leak checks on a
            // host where several daemons run.
            owner = self.table
        );
        let ip_batch = |script: &str| run(Command::new("ip").arg("-batch").arg("-"), Some(script));
        let host_r = match ip_batch(&host_side) {
            Err(e) if e.to_string().contains("File exists") => {
                let _ = run(Command::new("ip").args(["link", "del", &dev]), None);
                ip_batch(&host_side)
            }
            r => r,
        };
        let r = host_r
            .and_then(|_| {
                run(
                    Command::new("nsenter").arg(format!("--net=/proc/{pid}/ns/net")).args(["ip", "-batch", "-"]),
                    Some(&format!(
                        "addr add {sb}/30 dev eth0\n\
                 link set eth0 up\n\
                 route add default via {host}\n"
                    )),
                )
            })
            .and_then(|_| self.apply(slot, policy, true));
        if let Err(e) = r {
            self.detach(slot);
            return Err(e);
        }
        Ok(())
    }

    /// Replaces the sandbox's rules atomically (one nft transaction).
    pub fn apply(&self, slot: u32, policy: &Policy, first: bool) -> Result<()> {
        self.ensure()?;
        let (host, _) = link_addrs(slot);
        let dev = ifname(slot);
        let chain = format!("sb{slot}");
        let t = &self.table;
        let mut rules = String::new();
        let mut add = |r: String| {
            rules.push_str(&format!("add rule inet {t} {chain} {r}\n"));
        };
        if policy.mode != NetworkMode::DenyAll {
            for d in &policy.deny {
                add(format!("ip daddr {d} counter reject"));
            }
            for a in &policy.allow {
                if a.ports.is_empty() {
                    add(format!("ip daddr {} counter accept", a.net));
                } else {
                    let ports = a.ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
                    add(format!("ip daddr {} tcp dport {{ {ports} }} counter accept", a.net));
                    add(format!("ip daddr {} udp dport {{ {ports} }} counter accept", a.net));
                }
            }
            if policy.mode == NetworkMode::AllowAll {
                let denied = ALWAYS_DENIED.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ");
                add(format!("ip daddr {{ {denied} }} counter reject"));
                add("meta nfproto ipv4 counter accept".to_string());
            }
        }
        // Everything else: TCP gets a reset (connections the policy no longer allows close
        // at once), the rest an ICMP error.
        add("meta l4proto tcp counter reject with tcp reset".to_string());
        add("counter reject".to_string());
        let mut dns = String::new();
        let mut nat = String::new();
        if policy.mode != NetworkMode::DenyAll {
            dns.push_str(&format!("add rule inet {t} {chain}_in ip daddr {host} udp dport 53 accept\n"));
            let ports = policy.proxied_ports();
            if !ports.is_empty() {
                let ports = ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
                let proxy = crate::egress::PROXY_PORT;
                // Name-checked TCP goes to the proxy; CIDR allows are routed as they are.
                let direct = policy.allow.iter().map(|a| a.net.to_string()).collect::<Vec<_>>();
                let skip =
                    if direct.is_empty() { String::new() } else { format!("ip daddr != {{ {} }} ", direct.join(", ")) };
                nat.push_str(&format!(
                    "add rule inet {t} {chain}_nat ip daddr != {host} {skip}tcp dport {{ {ports} }} dnat ip to {host}:{proxy}\n"
                ));
                dns.push_str(&format!("add rule inet {t} {chain}_in ip daddr {host} tcp dport {proxy} accept\n"));
            }
        }
        let elements = if first {
            format!(
                "add element inet {t} out {{ \"{dev}\" : jump {chain} }}\n\
                 add element inet {t} in {{ \"{dev}\" : jump {chain}_in }}\n\
                 add element inet {t} nat {{ \"{dev}\" : jump {chain}_nat }}\n\
                 add element inet {t} ifaces {{ \"{dev}\" }}\n"
            )
        } else {
            String::new()
        };
        nft(&format!(
            "add chain inet {t} {chain}\nflush chain inet {t} {chain}\n\
             add chain inet {t} {chain}_in\nflush chain inet {t} {chain}_in\n\
             add chain inet {t} {chain}_nat\nflush chain inet {t} {chain}_nat\n\
             {rules}{dns}{nat}{elements}"
        ))
    }

    /// Removes the sandbox's link and rules (the veth also dies with its namespace).
    pub fn detach(&self, slot: u32) {
        let dev = ifname(slot);
        let t = &self.table;
        let _ = run(Command::new("ip").args(["link", "del", &dev]), None);
        let _ = nft(&format!(
            "delete element inet {t} ifaces {{ \"{dev}\" }}\n\
             delete element inet {t} out {{ \"{dev}\" }}\ndelete element inet {t} in {{ \"{dev}\" }}\n\
             delete element inet {t} nat {{ \"{dev}\" }}\n\
             delete chain inet {t} sb{slot}\ndelete chain inet {t} sb{slot}_in\ndelete chain inet {t} sb{slot}_nat\n"
        ));
    }

    /// Removes this daemon's table (at shutdown, once its sandboxes are gone).
    pub fn teardown_table(&self) {
        if self.ready.get().is_some() {
            let _ = nft(&format!("delete table inet {}\n", self.table));
        }
    }
}

/// Removes the tables (and links) of Glovebox processes that are no longer running.
pub fn reap_stale_tables() {
    let Ok(out) = Command::new("nft").args(["list", "tables"]).stderr(Stdio::null()).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.trim().strip_prefix("table inet ") else { continue };
        let Some(pid) = name.strip_prefix(TABLE_PREFIX).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = nft(&format!("delete table inet {name}\n"));
        }
    }
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
pub fn spawn_services(
    slot: u32,
    eg: std::sync::Arc<crate::egress::Egress>,
    stop: Arc<tokio::sync::Notify>,
) -> Result<()> {
    let (host, _) = link_addrs(slot);
    let upstream =
        dns_upstream().ok_or_else(|| Error::Unavailable("no DNS upstream (set GLOVEBOX_DNS_UPSTREAM)".into()))?;
    let udp = std::net::UdpSocket::bind((host, 53)).map_err(|e| Error::Internal(format!("dns bind {host}: {e}")))?;
    udp.set_nonblocking(true).map_err(|e| Error::Internal(e.to_string()))?;
    let udp = tokio::net::UdpSocket::from_std(udp).map_err(|e| Error::Internal(e.to_string()))?;
    let tcp = std::net::TcpListener::bind((host, crate::egress::PROXY_PORT))
        .map_err(|e| Error::Internal(format!("proxy bind {host}: {e}")))?;
    tcp.set_nonblocking(true).map_err(|e| Error::Internal(e.to_string()))?;
    let tcp = tokio::net::TcpListener::from_std(tcp).map_err(|e| Error::Internal(e.to_string()))?;
    crate::egress::spawn_resolver(udp, upstream, eg.clone(), stop.clone());
    crate::egress::spawn_proxy(tcp, eg, stop);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_addresses_are_disjoint_per_slot() {
        assert_eq!(link_addrs(0), (Ipv4Addr::new(10, 213, 0, 1), Ipv4Addr::new(10, 213, 0, 2)));
        assert_eq!(link_addrs(1), (Ipv4Addr::new(10, 213, 0, 5), Ipv4Addr::new(10, 213, 0, 6)));
        assert_eq!(link_addrs(16_383).1, Ipv4Addr::new(10, 213, 255, 254));
        assert!(ifname(16_383).len() < 15, "fits IFNAMSIZ with the peer suffix");
    }
}
