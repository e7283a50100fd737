//! Netlink, the kernel's configuration protocol: a socket, message building (`nlmsghdr`,
//! attributes, nesting, 4-byte alignment) and reading the kernel's answers (acks, errors,
//! dumps). Both route (`link`) and nf_tables (`nft`) configuration go through here, in
//! process, with no helper binaries.
//!
//! Every request is sent on a socket of its own, asks for an ack per message, and waits at
//! most `TIMEOUT` for the answers, so a lost answer is an error, never a hang.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, Protocol, RecvFlags, SendFlags, SocketType};

const NLMSG_HDRLEN: usize = 16;
const NLA_HDRLEN: usize = 4;
pub const NLA_F_NESTED: u16 = 0x8000;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
/// For nf_tables rules: append to the chain.
pub const NLM_F_APPEND: u16 = 0x800;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

const TIMEOUT: Duration = Duration::from_secs(5);

/// A failed request: what was asked and the kernel's errno.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {errno}")]
pub struct NlError {
    pub what: String,
    pub errno: Errno,
}

impl NlError {
    pub fn new(what: &str, errno: Errno) -> NlError {
        NlError { what: what.to_string(), errno }
    }
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// Messages being built into one buffer (a single request, or an nf_tables batch).
#[derive(Default)]
pub struct Batch {
    buf: Vec<u8>,
    /// Start of the message being built.
    msg: usize,
    /// Starts of the attributes being nested.
    nests: Vec<usize>,
    /// Sequence numbers of the messages that ask for an ack, with what each one does.
    acked: Vec<(u32, String)>,
    seq: u32,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Starts a message; `what` names it in errors. Finish it with `end`.
    pub fn begin(&mut self, ty: u16, flags: u16, what: impl Into<String>) -> &mut Batch {
        self.seq += 1;
        self.msg = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]); // length, set by `end`
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
        if flags & NLM_F_ACK != 0 {
            self.acked.push((self.seq, what.into()));
        }
        self
    }

    /// Appends a fixed header (`ifinfomsg`, `nfgenmsg`, …), padded.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Batch {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    fn pad(&mut self) {
        self.buf.resize(align(self.buf.len()), 0);
    }

    pub fn attr(&mut self, ty: u16, data: &[u8]) -> &mut Batch {
        let len = NLA_HDRLEN + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    /// A NUL-terminated string attribute.
    pub fn str(&mut self, ty: u16, s: &str) -> &mut Batch {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(ty, &v)
    }

    /// A big-endian u32 (nf_tables' byte order for numbers).
    pub fn be32(&mut self, ty: u16, v: u32) -> &mut Batch {
        self.attr(ty, &v.to_be_bytes())
    }

    pub fn ne32(&mut self, ty: u16, v: u32) -> &mut Batch {
        self.attr(ty, &v.to_ne_bytes())
    }

    /// Opens a nested attribute; close it with `close`.
    pub fn open(&mut self, ty: u16) -> &mut Batch {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self
    }

    pub fn close(&mut self) -> &mut Batch {
        // Unbalanced calls are a bug in this module's callers; an unclosed nest is caught by
        // the kernel as a malformed message.
        if let Some(at) = self.nests.pop() {
            let len = (self.buf.len() - at) as u16;
            self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    /// The messages built so far.
    #[cfg(test)]
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Finishes the message begun last.
    pub fn end(&mut self) {
        let len = (self.buf.len() - self.msg) as u32;
        self.buf[self.msg..self.msg + 4].copy_from_slice(&len.to_ne_bytes());
    }
}

/// A netlink socket of one protocol (route: `None`; nf_tables: `Protocol::NETFILTER`).
pub struct Socket {
    fd: OwnedFd,
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Socket {
    pub fn open(protocol: Option<Protocol>) -> Result<Socket, NlError> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            rustix::net::SocketFlags::CLOEXEC,
            protocol,
        )
        .map_err(|e| NlError::new("netlink socket", e))?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 0)).map_err(|e| NlError::new("netlink bind", e))?;
        rustix::net::sockopt::set_socket_timeout(&fd, rustix::net::sockopt::Timeout::Recv, Some(TIMEOUT))
            .map_err(|e| NlError::new("netlink timeout", e))?;
        Ok(Socket { fd })
    }

    fn send(&self, b: &Batch) -> Result<(), NlError> {
        let n = rustix::net::send(&self.fd, &b.buf, SendFlags::empty()).map_err(|e| NlError::new("netlink send", e))?;
        if n != b.buf.len() {
            return Err(NlError::new("netlink send (short)", Errno::MSGSIZE));
        }
        Ok(())
    }

    /// Reads one datagram of messages and hands each `(type, payload)` to `f`, which says
    /// whether more are wanted.
    fn recv(&self, mut f: impl FnMut(u16, u32, &[u8]) -> Result<bool, NlError>) -> Result<bool, NlError> {
        let mut buf = vec![0u8; 64 * 1024];
        let (n, _) = rustix::net::recv(&self.fd, &mut buf[..], RecvFlags::empty())
            .map_err(|e| NlError::new("netlink answer", if e == Errno::AGAIN { Errno::TIMEDOUT } else { e }))?;
        let mut at = 0;
        while at + NLMSG_HDRLEN <= n {
            let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
            if len < NLMSG_HDRLEN || at + len > n {
                return Err(NlError::new("netlink answer (malformed)", Errno::PROTO));
            }
            let ty = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            let seq = u32::from_ne_bytes([buf[at + 8], buf[at + 9], buf[at + 10], buf[at + 11]]);
            if !f(ty, seq, &buf[at + NLMSG_HDRLEN..at + len])? {
                return Ok(false);
            }
            at += align(len);
        }
        Ok(true)
    }

    /// For a socket that listens (the log group): reads block until something comes, and
    /// the kernel may queue up to `bytes` (more needs CAP_NET_ADMIN, which the daemon has).
    pub fn no_timeout_and_room(&self, bytes: usize) -> Result<(), NlError> {
        use rustix::net::sockopt;
        sockopt::set_socket_timeout(&self.fd, sockopt::Timeout::Recv, None)
            .map_err(|e| NlError::new("netlink timeout", e))?;
        // SO_RCVBUFFORCE: past net.core.rmem_max; the plain one where that is refused.
        sockopt::set_socket_recv_buffer_size_force(&self.fd, bytes)
            .or_else(|_| sockopt::set_socket_recv_buffer_size(&self.fd, bytes))
            .map_err(|e| NlError::new("netlink buffer", e))?;
        Ok(())
    }

    /// Reads one datagram and hands each message's `(type, payload)` to `f`.
    pub fn recv_all(&self, mut f: impl FnMut(u16, &[u8])) -> Result<(), NlError> {
        self.recv(|ty, _, payload| {
            f(ty, payload);
            Ok(true)
        })
        .map(|_| ())
    }

    /// Sends `b` and waits for an ack of each message that asked for one; the first error
    /// names the message it answers.
    pub fn request(&self, b: &Batch) -> Result<(), NlError> {
        self.send(b)?;
        let mut left = b.acked.len();
        while left > 0 {
            self.recv(|ty, seq, payload| {
                if ty != NLMSG_ERROR {
                    return Ok(true);
                }
                let code = payload.get(..4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).unwrap_or(0);
                let what =
                    b.acked.iter().find(|(s, _)| *s == seq).map(|(_, w)| w.as_str()).unwrap_or("netlink request");
                if code != 0 {
                    return Err(NlError::new(what, Errno::from_raw_os_error(-code)));
                }
                left = left.saturating_sub(1);
                Ok(left > 0)
            })?;
        }
        Ok(())
    }

    /// Sends a dump request and returns each answer's payload (after the fixed header the
    /// caller knows the size of).
    pub fn dump(&self, b: &Batch) -> Result<Vec<Vec<u8>>, NlError> {
        self.send(b)?;
        let mut out = Vec::new();
        let mut more = true;
        while more {
            more = self.recv(|ty, _, payload| match ty {
                NLMSG_DONE => Ok(false),
                NLMSG_ERROR => {
                    let code = payload.get(..4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).unwrap_or(0);
                    Err(NlError::new("netlink dump", Errno::from_raw_os_error(-code)))
                }
                _ => {
                    out.push(payload.to_vec());
                    Ok(true)
                }
            })?;
        }
        Ok(out)
    }
}

/// The attributes in `buf`, as `(type without flags, payload)`.
pub fn attrs(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut v = Vec::new();
    while buf.len() >= NLA_HDRLEN {
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        if len < NLA_HDRLEN || len > buf.len() {
            break;
        }
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & !(NLA_F_NESTED | 0x4000);
        v.push((ty, &buf[NLA_HDRLEN..len]));
        buf = &buf[align(len).min(buf.len())..];
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_nests_are_sized_and_aligned() {
        let mut b = Batch::new();
        b.begin(16, NLM_F_ACK, "test").raw(&[1, 2, 3]).str(3, "gb1").open(18).be32(1, 7).close().end();
        let len = u32::from_ne_bytes([b.buf[0], b.buf[1], b.buf[2], b.buf[3]]) as usize;
        assert_eq!(len, b.buf.len());
        assert_eq!(len % 4, 0);
        let body = &b.buf[NLMSG_HDRLEN + 4..];
        let a = attrs(body);
        assert_eq!(a[0], (3, &b"gb1\0"[..]));
        assert_eq!(a[1].0, 18);
        assert_eq!(attrs(a[1].1), vec![(1, &7u32.to_be_bytes()[..])]);
        assert_eq!(b.acked, vec![(1, "test".to_string())]);
    }
}
