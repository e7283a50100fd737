//! The server's accepted connections, and a handle a request can use to end its own
//! connection with a TCP reset.

use std::sync::Arc;

/// Lets a handler end its connection with a TCP reset instead of an orderly close: what a
/// proxy in front of a sandbox does to a stream whose sandbox died, and what clients (E2B's
/// SDKs among them) read as "the connection was dropped", not as a malformed answer. Each
/// request carries its connection's handle as an extension; arm it, then fail the body.
#[derive(Clone, Default)]
pub struct ResetOnClose(Arc<std::sync::atomic::AtomicBool>);

impl ResetOnClose {
    pub fn arm(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn armed(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// An accepted connection: the socket, closed with `SO_LINGER 0` (a reset) once armed.
pub struct Conn {
    tcp: tokio::net::TcpStream,
    reset: ResetOnClose,
}

impl Conn {
    pub fn new(tcp: tokio::net::TcpStream, reset: ResetOnClose) -> Conn {
        Conn { tcp, reset }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.reset.armed() {
            let _ = rustix::net::sockopt::set_socket_linger(&self.tcp, Some(std::time::Duration::ZERO));
        }
    }
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    /// An armed connection sends no FIN first: the peer must see the reset, not an end.
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.reset.armed() {
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}
