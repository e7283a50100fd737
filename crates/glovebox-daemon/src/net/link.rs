//! A sandbox's link, over rtnetlink: the veth pair (`gb<slot>` on the host, `eth0` created
//! directly in the sandbox's network namespace, named by a process in it or by a descriptor
//! of a namespace made ahead), its addresses, and the sandbox's default route via the host
//! end. The sandbox's side is configured from a short-lived thread that has joined the
//! sandbox's network namespace, so the daemon's own threads never change namespace.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use rustix::io::Errno;

use super::netlink::{Batch, NlError, Socket, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_PID: u16 = 19;
const IFLA_IFALIAS: u16 = 20;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_GATEWAY: u16 = 5;
const RTA_OIF: u16 = 4;

const AF_INET: u8 = 2;
const IFF_UP: u32 = 1;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RTN_UNICAST: u8 = 1;

/// The sandbox's end, inside its namespace.
pub const PEER: &str = "eth0";

/// The network namespace a peer goes into: that of a process, or one held by a descriptor.
#[derive(Clone, Copy)]
pub enum Netns<'a> {
    Pid(i32),
    Fd(BorrowedFd<'a>),
}

/// The host end of slot `slot`'s link. The only place the name is spelled.
pub fn ifname(slot: u32) -> String {
    format!("gb{slot}")
}

/// `struct ifinfomsg`: family, type, index, flags, change mask.
fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}

/// Adds `addr/30` to link `index` (`struct ifaddrmsg` + local and address attributes).
fn add_addr(b: &mut Batch, index: u32, dev: &str, addr: Ipv4Addr) {
    let mut h = [0u8; 8];
    h[0] = AF_INET;
    h[1] = 30;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    b.begin(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, format!("address {addr}/30 on {dev}"))
        .raw(&h)
        .attr(IFA_LOCAL, &addr.octets())
        .attr(IFA_ADDRESS, &addr.octets())
        .end();
}

fn index_of(sock: &Socket, name: &str) -> Result<u32, NlError> {
    rustix::net::netdevice::name_to_index(sock.as_fd(), name)
        .map_err(|errno| NlError { what: format!("index of {name}"), errno })
}

/// Creates the veth pair for a sandbox's namespace `ns`: the host end `dev` with
/// `host/30`, `alias`, up; the peer `eth0` in `ns`. A link of that name left behind (a
/// crashed daemon's, or one whose namespace the kernel has not finished removing) is deleted
/// and the creation retried.
pub fn create(dev: &str, ns: Netns<'_>, host: Ipv4Addr, alias: &str) -> Result<(), NlError> {
    let sock = Socket::open(None)?;
    let (ns_attr, ns_val) = match ns {
        Netns::Pid(pid) => (IFLA_NET_NS_PID, pid as u32),
        Netns::Fd(fd) => (IFLA_NET_NS_FD, fd.as_raw_fd() as u32),
    };
    let mut b = Batch::new();
    b.begin(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, format!("create veth {dev}"))
        .raw(&ifinfomsg(0, IFF_UP, IFF_UP))
        .str(IFLA_IFNAME, dev)
        .open(IFLA_LINKINFO)
        .str(IFLA_INFO_KIND, "veth")
        .open(IFLA_INFO_DATA)
        .open(VETH_INFO_PEER)
        .raw(&ifinfomsg(0, 0, 0))
        .str(IFLA_IFNAME, PEER)
        .ne32(ns_attr, ns_val)
        .close()
        .close()
        .close()
        .end();
    match sock.request(&b) {
        Err(e) if e.errno == Errno::EXIST => {
            delete(dev)?;
            sock.request(&b)?;
        }
        r => r?,
    }
    let index = index_of(&sock, dev)?;
    let mut b = Batch::new();
    b.begin(RTM_NEWLINK, NLM_F_ACK, format!("alias of {dev}"))
        .raw(&ifinfomsg(index, 0, 0))
        .str(IFLA_IFALIAS, alias)
        .end();
    add_addr(&mut b, index, dev, host);
    sock.request(&b)
}

/// Inside namespace `ns`: gives `eth0` the address `addr/30`, brings it up and routes
/// everything via `gateway`.
pub fn configure_peer(ns: Netns<'_>, addr: Ipv4Addr, gateway: Ipv4Addr) -> Result<(), NlError> {
    let opened;
    let fd = match ns {
        Netns::Fd(fd) => fd,
        Netns::Pid(pid) => {
            let path = format!("/proc/{pid}/ns/net");
            opened = std::fs::File::open(&path).map_err(|e| NlError {
                what: format!("open {path}"),
                errno: e.raw_os_error().map(Errno::from_raw_os_error).unwrap_or(Errno::IO),
            })?;
            opened.as_fd()
        }
    };
    // The thread joins the namespace and ends with the work, so no other thread's
    // namespace changes; the socket it opens belongs to the namespace it was opened in.
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(fd, Some(rustix::thread::LinkNameSpaceType::Network))
                .map_err(|errno| NlError { what: "join the sandbox's network namespace".into(), errno })?;
            let sock = Socket::open(None)?;
            let index = index_of(&sock, PEER)?;
            let mut b = Batch::new();
            b.begin(RTM_NEWLINK, NLM_F_ACK, format!("{PEER} up")).raw(&ifinfomsg(index, IFF_UP, IFF_UP)).end();
            add_addr(&mut b, index, PEER, addr);
            let mut rt = [0u8; 12];
            rt[0] = AF_INET;
            rt[4] = RT_TABLE_MAIN;
            rt[5] = RTPROT_BOOT;
            rt[7] = RTN_UNICAST;
            b.begin(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, format!("default route via {gateway}"))
                .raw(&rt)
                .attr(RTA_GATEWAY, &gateway.octets())
                .ne32(RTA_OIF, index)
                .end();
            sock.request(&b)
        })
        .join()
        .unwrap_or_else(|_| Err(NlError { what: "network namespace thread panicked".into(), errno: Errno::IO }))
    })
}

/// Deletes the host's link `dev` (its peer goes with it).
pub fn delete(dev: &str) -> Result<(), NlError> {
    let sock = Socket::open(None)?;
    let mut b = Batch::new();
    b.begin(RTM_DELLINK, NLM_F_ACK, format!("delete link {dev}")).raw(&ifinfomsg(0, 0, 0)).str(IFLA_IFNAME, dev).end();
    sock.request(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_kernel() {
        assert!(ifname(16_383).len() < 16, "IFNAMSIZ");
        assert_eq!(ifname(7), "gb7");
    }

    /// A process alone in a new network namespace, killed on drop.
    struct Sleeper(std::process::Child);

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn host_has(dev: &str) -> bool {
        std::path::Path::new(&format!("/sys/class/net/{dev}")).exists()
    }

    #[test]
    fn a_stale_link_is_replaced_and_the_peer_configured() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let ns =
            Sleeper(std::process::Command::new("unshare").args(["--net", "sleep", "30"]).spawn().expect("unshare"));
        let pid = ns.0.id() as i32;
        let mine = format!("/proc/{pid}/ns/net");
        let entered = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            std::fs::read_link(&mine).ok() != std::fs::read_link("/proc/self/ns/net").ok()
        });
        assert!(entered, "the child never got its own network namespace");
        let dev = format!("gbt{}", std::process::id() % 100_000);
        let (host, peer) = (Ipv4Addr::new(10, 213, 255, 249), Ipv4Addr::new(10, 213, 255, 250));
        create(&dev, Netns::Pid(pid), host, "glovebox_test").expect("create");
        // What a crashed daemon leaves: the same name again is deleted and made anew.
        create(&dev, Netns::Pid(pid), host, "glovebox_test").expect("create over a stale link");
        configure_peer(Netns::Pid(pid), peer, host).expect("configure the peer");
        let alias = std::fs::read_to_string(format!("/sys/class/net/{dev}/ifalias")).expect("alias");
        assert_eq!(alias.trim(), "glovebox_test");
        delete(&dev).expect("delete");
        assert!(!host_has(&dev), "{dev} is still there");
        let e = delete(&dev).expect_err("a second delete finds nothing");
        assert_eq!(e.errno, Errno::NODEV, "{e}");
    }

    #[test]
    fn a_namespace_made_ahead_is_linked_by_its_descriptor() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let ns = glovebox_jail::sys::new_netns().expect("new network namespace");
        let dev = format!("gbf{}", std::process::id() % 100_000);
        let (host, peer) = (Ipv4Addr::new(10, 213, 255, 245), Ipv4Addr::new(10, 213, 255, 246));
        create(&dev, Netns::Fd(ns.as_fd()), host, "glovebox_test").expect("create");
        configure_peer(Netns::Fd(ns.as_fd()), peer, host).expect("configure the peer");
        assert!(host_has(&dev));
        // The peer is inside that namespace: its address is there already.
        let e = configure_peer(Netns::Fd(ns.as_fd()), peer, host).expect_err("the address is there already");
        assert_eq!(e.errno, Errno::EXIST, "{e}");
        drop(ns);
        // The namespace's end takes the pair with it (the kernel's cleanup runs on its own).
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            !host_has(&dev)
        });
        assert!(gone, "{dev} outlived its namespace");
    }
}
