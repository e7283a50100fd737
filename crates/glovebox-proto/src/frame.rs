//! Framing of the agent channel.
//!
//! A frame is `len: u32 BE` (of what follows), `kind: u8`, then `len - 1` payload bytes.
//! Control messages are JSON (`Kind::Json`); bulk data (command output, stdin, file
//! contents) travels raw in its own frame kinds, so output stays binary-safe and is never
//! escaped. Both ends treat the other as untrusted: a frame larger than [`MAX_FRAME`] or of an
//! unknown kind is a protocol error, never an allocation.

use thiserror::Error;

/// Largest payload a frame may carry. Data is chunked well below this.
pub const MAX_FRAME: usize = 1 << 20;

/// Size of the data chunks senders cut bulk data into.
pub const CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A JSON control message (request, event, reply).
    Json = 0,
    /// Bytes a command wrote to stdout.
    Stdout = 1,
    /// Bytes a command wrote to stderr.
    Stderr = 2,
    /// Bytes for a command's stdin.
    Stdin = 3,
    /// File contents (upload or download).
    Data = 4,
}

impl Kind {
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            0 => Kind::Json,
            1 => Kind::Stdout,
            2 => Kind::Stderr,
            3 => Kind::Stdin,
            4 => Kind::Data,
            _ => return None,
        })
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    #[error("empty frame")]
    Empty,
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
}

/// The 5-byte header for a frame of `kind` carrying `payload_len` bytes.
pub fn header(kind: Kind, payload_len: usize) -> Result<[u8; 5], FrameError> {
    if payload_len > MAX_FRAME {
        return Err(FrameError::TooLarge(payload_len));
    }
    // payload_len <= MAX_FRAME (1 MiB), so the sum fits in u32.
    let len = (payload_len as u32) + 1;
    let b = len.to_be_bytes();
    Ok([b[0], b[1], b[2], b[3], kind as u8])
}

/// Encodes one whole frame.
pub fn encode(kind: Kind, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    let h = header(kind, payload.len())?;
    let mut out = Vec::with_capacity(5 + payload.len());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Parses a frame header; returns the kind and the payload length that follows.
pub fn parse_header(h: [u8; 5]) -> Result<(Kind, usize), FrameError> {
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if len == 0 {
        return Err(FrameError::Empty);
    }
    let payload = len - 1;
    if payload > MAX_FRAME {
        return Err(FrameError::TooLarge(payload));
    }
    let kind = Kind::from_u8(h[4]).ok_or(FrameError::UnknownKind(h[4]))?;
    Ok((kind, payload))
}

/// Splits as many whole frames as `buf` holds off its front. Used where a reader has a
/// byte buffer rather than an async stream (tests, fuzzing).
/// One decoded frame: its kind and payload.
pub type Frame = (Kind, Vec<u8>);

pub fn decode_all(mut buf: &[u8]) -> Result<(Vec<Frame>, usize), FrameError> {
    let mut frames = Vec::new();
    let mut used = 0;
    while buf.len() >= 5 {
        let (kind, n) = parse_header([buf[0], buf[1], buf[2], buf[3], buf[4]])?;
        if buf.len() < 5 + n {
            break;
        }
        frames.push((kind, buf[5..5 + n].to_vec()));
        buf = &buf[5 + n..];
        used += 5 + n;
    }
    Ok((frames, used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let mut wire = encode(Kind::Json, b"{}").unwrap();
        wire.extend(encode(Kind::Stdout, &[0, 255, 10]).unwrap());
        let (frames, used) = decode_all(&wire).unwrap();
        assert_eq!(used, wire.len());
        assert_eq!(frames, vec![(Kind::Json, b"{}".to_vec()), (Kind::Stdout, vec![0, 255, 10])]);
    }

    #[test]
    fn rejects_oversized_and_unknown() {
        let big = ((MAX_FRAME as u32) + 2).to_be_bytes();
        assert_eq!(parse_header([big[0], big[1], big[2], big[3], 0]), Err(FrameError::TooLarge(MAX_FRAME + 1)));
        assert_eq!(parse_header([0, 0, 0, 1, 9]), Err(FrameError::UnknownKind(9)));
        assert_eq!(parse_header([0, 0, 0, 0, 0]), Err(FrameError::Empty));
        assert!(encode(Kind::Data, &vec![0; MAX_FRAME + 1]).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_all(&bytes);
        }

        #[test]
        fn partial_frames_wait(payload in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..600) {
            let wire = encode(Kind::Data, &payload).unwrap();
            let cut = cut.min(wire.len());
            let (frames, used) = decode_all(&wire[..cut]).unwrap();
            if cut == wire.len() {
                prop_assert_eq!(frames.len(), 1);
                prop_assert_eq!(used, wire.len());
            } else {
                prop_assert!(frames.is_empty());
                prop_assert_eq!(used, 0);
            }
        }
    }
}
