//! Async framed I/O over a unix stream (feature `tokio`): the one codec both ends use.

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::agent::{ErrorCode, Reply};
use crate::frame::{self, Kind};

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame: {0}")]
    Frame(#[from] frame::FrameError),
    #[error("bad message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("peer closed the connection")]
    Closed,
    #[error("unexpected {0} frame")]
    Unexpected(&'static str),
}

/// Connects to an agent socket.
pub async fn connect(path: &std::path::Path) -> Result<(Reader, Writer), ConnError> {
    Ok(split(UnixStream::connect(path).await?))
}

pub struct Reader(OwnedReadHalf);
pub struct Writer(OwnedWriteHalf);

pub fn split(s: UnixStream) -> (Reader, Writer) {
    let (r, w) = s.into_split();
    (Reader(r), Writer(w))
}

impl Reader {
    /// The next frame, or `None` at a clean end of stream.
    pub async fn next(&mut self) -> Result<Option<(Kind, Vec<u8>)>, ConnError> {
        let mut h = [0u8; 5];
        match self.0.read_exact(&mut h).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let (kind, n) = frame::parse_header(h)?;
        let mut payload = vec![0u8; n];
        self.0.read_exact(&mut payload).await?;
        Ok(Some((kind, payload)))
    }
}

impl Reader {
    /// The next frame, which must be a JSON message of type `T`.
    pub async fn json<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, ConnError> {
        match self.next().await? {
            None => Err(ConnError::Closed),
            Some((Kind::Json, body)) => Ok(serde_json::from_slice(&body)?),
            Some(_) => Err(ConnError::Unexpected("data")),
        }
    }
}

impl Writer {
    pub async fn data(&mut self, kind: Kind, bytes: &[u8]) -> Result<(), ConnError> {
        for chunk in bytes.chunks(frame::CHUNK) {
            let h = frame::header(kind, chunk.len())?;
            self.0.write_all(&h).await?;
            self.0.write_all(chunk).await?;
        }
        Ok(())
    }

    pub async fn json<T: Serialize>(&mut self, msg: &T) -> Result<(), ConnError> {
        let body = serde_json::to_vec(msg)?;
        let h = frame::header(Kind::Json, body.len())?;
        self.0.write_all(&h).await?;
        self.0.write_all(&body).await?;
        Ok(())
    }

    pub async fn error(&mut self, code: ErrorCode, message: impl Into<String>) -> Result<(), ConnError> {
        self.json(&Reply::Error { code, message: message.into() }).await
    }

    pub async fn flush(&mut self) -> Result<(), ConnError> {
        self.0.flush().await?;
        Ok(())
    }
}
