//! A port inside the sandbox, reached through the agent: `Request::ConnectPort` connects to
//! `127.0.0.1:PORT` here and relays that connection's bytes over the daemon's, unframed. The
//! daemon uses it where it cannot reach the sandbox's loopback from the host itself (gVisor:
//! the network stack is the sentry's).

use std::net::Ipv4Addr;
use std::time::Duration;

use glovebox_proto::agent::{ErrorCode, Reply};

use crate::conn::{ConnError, Reader, Writer};

/// How long a connect to the sandbox's own loopback may take (refused or accepted at once,
/// unless the listener's backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to `port`, answers, then relays both ways until either side closes.
pub async fn connect_port(port: u16, r: Reader, mut w: Writer) -> Result<(), ConnError> {
    let connect = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port));
    let mut tcp = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return w.error(ErrorCode::NotFound, format!("nothing listens on port {port}: {e}")).await,
        Err(_) => return w.error(ErrorCode::NotFound, format!("port {port} did not accept in time")).await,
    };
    let _ = tcp.set_nodelay(true);
    w.json(&Reply::Ok).await?;
    let mut daemon = glovebox_proto::io::into_raw(r, w);
    // Ends when both directions have: a half-close is passed on as a shutdown.
    tokio::io::copy_bidirectional(&mut daemon, &mut tcp).await?;
    Ok(())
}
