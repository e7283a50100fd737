//! The packet filter's audit: the rules that deny a sandbox's packets, and those that accept
//! a new connection by address, end in an nf_tables `log group N`; the kernel copies each
//! such packet's first bytes to the netlink socket bound to group N (nfnetlink_log), read
//! here. What a packet tells: the sandbox (by its source address: one /30 per uid slot),
//! the protocol, the destination address and port, and the verdict (the rule's prefix).
//!
//! Groups are host-wide and one socket may bind each: a daemon takes the first free one
//! from a start its pid picks, and its table's rules name that one.

use std::net::Ipv4Addr;

use rustix::io::Errno;
use rustix::net::netlink::NETFILTER;

use super::netlink::{attrs, Batch, NlError, Socket, NLM_F_ACK};

const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;

/// Bytes of each packet copied: an IPv4 header with options (60) and the ports after it.
pub const SNAPLEN: u32 = 64;
/// The prefixes the rules log with.
pub const PREFIX_DENIED: &str = "gb-deny";
pub const PREFIX_ALLOWED: &str = "gb-allow";
/// Groups this many apart from the start are tried before giving up.
const TRIES: u16 = 256;

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// The IP protocol number (6 TCP, 17 UDP, 1 ICMP …).
    pub proto: u8,
    /// The destination port (TCP, UDP), else 0.
    pub port: u16,
    pub allowed: bool,
}

impl Logged {
    /// `tcp`, `udp`, `icmp` or `ip/<number>`.
    pub fn proto_name(&self) -> String {
        match self.proto {
            6 => "tcp".into(),
            17 => "udp".into(),
            1 => "icmp".into(),
            n => format!("ip/{n}"),
        }
    }
}

/// A socket bound to this daemon's log group.
pub struct Nflog {
    sock: Socket,
    pub group: u16,
}

fn ulog_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_ULOG << 8) | msg
}

fn config(group: u16) -> Batch {
    let g = group.to_be_bytes();
    let mut b = Batch::new();
    // nfgenmsg: AF_UNSPEC, version 0, the group as the resource id.
    b.begin(ulog_type(NFULNL_MSG_CONFIG), NLM_F_ACK, format!("bind log group {group}")).raw(&[0, 0, g[0], g[1]]);
    b.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]).end();
    let mut mode = SNAPLEN.to_be_bytes().to_vec();
    mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
    b.begin(ulog_type(NFULNL_MSG_CONFIG), NLM_F_ACK, format!("copy mode of log group {group}"))
        .raw(&[0, 0, g[0], g[1]])
        .attr(NFULA_CFG_MODE, &mode)
        .end();
    b
}

impl Nflog {
    /// Binds the first free group from `start` on.
    pub fn open(start: u16) -> Result<Nflog, NlError> {
        let sock = Socket::open(Some(NETFILTER))?;
        sock.no_timeout_and_room(4 << 20)?;
        let mut last = None;
        for i in 0..TRIES {
            let group = start.wrapping_add(i).max(1);
            match sock.request(&config(group)) {
                Ok(()) => return Ok(Nflog { sock, group }),
                Err(e) if e.errno == Errno::BUSY => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| NlError::new("bind a log group", Errno::BUSY)))
    }

    /// Blocks for the next datagram of logged packets and hands each to `f`. Returns how
    /// many the kernel dropped since the last call because this socket's buffer was full
    /// (counted as 1 per overflow: the kernel does not say how many).
    pub fn read(&self, mut f: impl FnMut(Logged)) -> Result<u64, NlError> {
        match self.sock.recv_all(|ty, payload| {
            if ty == ulog_type(NFULNL_MSG_PACKET) {
                if let Some(p) = parse(payload) {
                    f(p);
                }
            }
        }) {
            Ok(()) => Ok(0),
            Err(e) if e.errno == Errno::NOBUFS => Ok(1),
            Err(e) => Err(e),
        }
    }
}

/// One NFULNL_MSG_PACKET's payload (after the netlink header): nfgenmsg, then attributes.
fn parse(payload: &[u8]) -> Option<Logged> {
    let mut prefix = None;
    let mut packet = None;
    for (ty, v) in attrs(payload.get(4..)?) {
        match ty {
            NFULA_PREFIX => prefix = Some(v.split(|b| *b == 0).next().unwrap_or(v)),
            NFULA_PAYLOAD => packet = Some(v),
            _ => {}
        }
    }
    let allowed = match prefix? {
        p if p == PREFIX_ALLOWED.as_bytes() => true,
        p if p == PREFIX_DENIED.as_bytes() => false,
        _ => return None,
    };
    let ip = packet?;
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let proto = ip[9];
    let port = match proto {
        6 | 17 => ip.get(ihl + 2..ihl + 4).map_or(0, |p| u16::from_be_bytes([p[0], p[1]])),
        _ => 0,
    };
    Some(Logged {
        src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        proto,
        port,
        allowed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(prefix: &str, ip: &[u8]) -> Vec<u8> {
        let mut b = Batch::new();
        b.begin(ulog_type(NFULNL_MSG_PACKET), 0, "packet").raw(&[2, 0, 0, 7]).str(NFULA_PREFIX, prefix);
        b.attr(NFULA_PAYLOAD, ip).end();
        let buf = b.bytes();
        buf[16..].to_vec()
    }

    fn ipv4(proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 213, 0, 6, 198, 51, 100, 20];
        ip.extend_from_slice(l4);
        ip
    }

    #[test]
    fn packets_tell_protocol_destination_and_verdict() {
        let tcp = parse(&message(PREFIX_DENIED, &ipv4(6, &[0x9c, 0x40, 0, 80, 0, 0, 0, 0]))).expect("tcp");
        assert_eq!(
            tcp,
            Logged {
                src: Ipv4Addr::new(10, 213, 0, 6),
                dst: Ipv4Addr::new(198, 51, 100, 20),
                proto: 6,
                port: 80,
                allowed: false
            }
        );
        let udp = parse(&message(PREFIX_ALLOWED, &ipv4(17, &[0, 53, 0x27, 0x0f]))).expect("udp");
        assert_eq!((udp.proto_name(), udp.port, udp.allowed), ("udp".to_string(), 9999, true));
        let icmp = parse(&message(PREFIX_DENIED, &ipv4(1, &[8, 0, 0, 0]))).expect("icmp");
        assert_eq!((icmp.proto_name(), icmp.port), ("icmp".to_string(), 0));
        // A truncated transport header: the port is unknown, the rest still counts.
        assert_eq!(parse(&message(PREFIX_DENIED, &ipv4(6, &[0x9c]))).map(|p| p.port), Some(0));
    }

    #[test]
    fn other_prefixes_and_malformed_packets_are_not_read() {
        assert_eq!(parse(&message("someone-else", &ipv4(6, &[0, 1, 0, 80]))), None);
        assert_eq!(parse(&message(PREFIX_DENIED, &[0x60; 40])), None, "IPv6");
        assert_eq!(parse(&message(PREFIX_DENIED, &[0x45, 0, 0])), None, "short");
        assert_eq!(parse(&[1, 2]), None);
    }

    #[test]
    fn the_config_binds_the_group_and_copies_the_headers() {
        let b = config(0x1234);
        let buf = b.bytes();
        // First message: type ULOG/CONFIG, nfgenmsg with the group big-endian, then the bind.
        assert_eq!(u16::from_ne_bytes([buf[4], buf[5]]), (4 << 8) | 1);
        assert_eq!(&buf[16..20], &[0, 0, 0x12, 0x34]);
        assert_eq!(&buf[20..25], &[5, 0, 1, 0, NFULNL_CFG_CMD_BIND]);
    }
}
