//! Async framed I/O over a unix stream (feature `tokio`): the one codec both ends use.

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
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

/// Reads frames through a small buffer: a frame's header and a small body (every JSON
/// message) arrive in one read instead of two. A body larger than the buffer is read past it.
pub struct Reader(BufReader<OwnedReadHalf>);
pub struct Writer(OwnedWriteHalf);

const READ_BUFFER: usize = 8 << 10;

pub fn split(s: UnixStream) -> (Reader, Writer) {
    let (r, w) = s.into_split();
    (Reader(BufReader::with_capacity(READ_BUFFER, r)), Writer(w))
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
    /// The bytes already read past the last frame, and the socket: for a connection that
    /// goes on unframed (see `Request::ConnectPort`).
    pub fn into_raw(self) -> (Vec<u8>, OwnedReadHalf) {
        let early = self.0.buffer().to_vec();
        (early, self.0.into_inner())
    }

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
            self.header_and(&h, chunk).await?;
        }
        Ok(())
    }

    pub async fn json<T: Serialize>(&mut self, msg: &T) -> Result<(), ConnError> {
        let body = serde_json::to_vec(msg)?;
        let h = frame::header(Kind::Json, body.len())?;
        self.header_and(&h, &body).await
    }

    /// A header and its body in one write where the socket takes them (each write wakes the
    /// reader; two per frame cost the other side a wake-up and a read).
    async fn header_and(&mut self, h: &[u8], body: &[u8]) -> Result<(), ConnError> {
        let mut done = 0;
        let total = h.len() + body.len();
        while done < h.len() {
            let bufs = [std::io::IoSlice::new(&h[done..]), std::io::IoSlice::new(body)];
            match self.0.write_vectored(&bufs).await? {
                0 => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
                n => done += n,
            }
        }
        if done < total {
            self.0.write_all(&body[done - h.len()..]).await?;
        }
        Ok(())
    }

    pub async fn error(&mut self, code: ErrorCode, message: impl Into<String>) -> Result<(), ConnError> {
        self.json(&Reply::Error { code, message: message.into() }).await
    }

    pub async fn flush(&mut self) -> Result<(), ConnError> {
        self.0.flush().await?;
        Ok(())
    }

    /// The socket, for a connection that goes on unframed (see [`Reader::into_raw`]).
    pub fn into_raw(self) -> OwnedWriteHalf {
        self.0
    }
}

/// A connection gone unframed after its request and reply: what was read past the reply
/// first, then the socket; writes go straight to it.
pub type RawStream = tokio::io::Join<tokio::io::Chain<std::io::Cursor<Vec<u8>>, OwnedReadHalf>, OwnedWriteHalf>;

/// [`RawStream`] from a connection's two halves.
pub fn into_raw(r: Reader, w: Writer) -> RawStream {
    let (early, read) = r.into_raw();
    tokio::io::join(std::io::Cursor::new(early).chain(read), w.into_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that goes on unframed after a reply loses none of the bytes that arrived
    /// with the reply (the reader's buffer had them), and writes reach the other end.
    #[test]
    fn a_connection_gone_raw_keeps_the_bytes_read_with_the_reply() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (a, b) = UnixStream::pair().unwrap();
            let (mut ra, mut wa) = split(a);
            let (mut rb, wb) = split(b);
            wa.json(&Reply::Ok).await.unwrap();
            wa.0.write_all(b"early bytes").await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            assert!(matches!(rb.json::<Reply>().await.unwrap(), Reply::Ok));
            let mut raw = into_raw(rb, wb);
            drop(wa);
            let mut got = Vec::new();
            raw.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"early bytes");
            raw.write_all(b"back").await.unwrap();
            drop(raw);
            let mut back = Vec::new();
            ra.0.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"back");
        });
    }

    /// Frames cross a socket whole and in order when a writer's header-and-body writes are cut
    /// short (a body bigger than the socket's buffer, read slowly) and when many small frames
    /// arrive in one read of the reader's buffer.
    #[test]
    fn frames_survive_short_writes_and_shared_reads() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (a, b) = UnixStream::pair().unwrap();
            let (_ra, mut w) = split(a);
            let (mut r, _wb) = split(b);
            let big: Vec<u8> = (0..(3 * frame::CHUNK + 12_345)).map(|i| (i * 7 % 251) as u8).collect();
            let sent = big.clone();
            let writer = tokio::spawn(async move {
                for i in 0..100u32 {
                    w.json(&Reply::Pong { version: i }).await.unwrap();
                }
                w.data(Kind::Stdout, &sent).await.unwrap();
                w.json(&Reply::Pong { version: 7 }).await.unwrap();
            });
            // Let the writer fill the socket before anything is read.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            for i in 0..100u32 {
                match r.json::<Reply>().await.unwrap() {
                    Reply::Pong { version } => assert_eq!(version, i),
                    other => panic!("unexpected {other:?}"),
                }
            }
            let mut got = Vec::new();
            while got.len() < big.len() {
                let (kind, body) = r.next().await.unwrap().expect("a data frame");
                assert_eq!(kind, Kind::Stdout);
                assert!(body.len() <= frame::CHUNK);
                got.extend_from_slice(&body);
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            assert_eq!(got, big);
            assert!(matches!(r.json::<Reply>().await.unwrap(), Reply::Pong { version: 7 }));
            writer.await.unwrap();
            drop(_ra);
        });
    }
}
