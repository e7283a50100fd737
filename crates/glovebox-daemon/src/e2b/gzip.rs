//! Streaming gzip for envd's `/files`: uploads sent with `Content-Encoding: gzip` are
//! inflated as they arrive, downloads deflated as they leave. Neither holds a whole file.
//!
//! Invariant: inflating is fed at most [`STEP`] compressed bytes at a time, so one step
//! yields at most about a thousand times that (deflate's best ratio) — a small hostile body
//! cannot make one step allocate without bound.

use std::io::Write;
use std::pin::Pin;

use axum::body::Bytes;
use flate2::write::{GzEncoder, MultiGzDecoder};
use flate2::Compression;
use futures_util::{Stream, StreamExt};

/// An upload body, plain or inflated.
pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

/// Compressed bytes fed to the decoder per step.
const STEP: usize = 1024;

/// Inflates a gzip body (one or more members).
pub fn decompress<S, E>(body: S) -> impl Stream<Item = Result<Bytes, String>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    struct St<S> {
        body: S,
        dec: Option<MultiGzDecoder<Vec<u8>>>,
        pending: Bytes,
    }
    let st = St { body, dec: Some(MultiGzDecoder::new(Vec::new())), pending: Bytes::new() };
    futures_util::stream::unfold(st, |mut st| async move {
        loop {
            let dec = st.dec.as_mut()?;
            if !st.pending.is_empty() {
                let step = st.pending.split_to(st.pending.len().min(STEP));
                if let Err(e) = dec.write_all(&step) {
                    st.dec = None;
                    return Some((Err(format!("gzip: {e}")), st));
                }
                if !dec.get_ref().is_empty() {
                    let out = Bytes::from(std::mem::take(dec.get_mut()));
                    return Some((Ok(out), st));
                }
                continue;
            }
            match st.body.next().await {
                Some(Ok(c)) => st.pending = c,
                Some(Err(e)) => {
                    st.dec = None;
                    return Some((Err(e.to_string()), st));
                }
                None => {
                    let mut dec = st.dec.take()?;
                    return match dec.try_finish() {
                        Ok(()) if dec.get_ref().is_empty() => None,
                        Ok(()) => Some((Ok(Bytes::from(std::mem::take(dec.get_mut()))), st)),
                        Err(e) => Some((Err(format!("gzip: {e}")), st)),
                    };
                }
            }
        }
    })
}

/// Deflates a download into one gzip member.
pub fn compress<S>(body: S) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    let st = (Box::pin(body), Some(GzEncoder::new(Vec::new(), Compression::fast())));
    futures_util::stream::unfold(st, |(mut body, mut enc)| async move {
        loop {
            let e = enc.as_mut()?;
            match body.next().await {
                Some(Ok(c)) => {
                    if let Err(err) = e.write_all(&c) {
                        return Some((Err(err), (body, None)));
                    }
                    if !e.get_ref().is_empty() {
                        let out = Bytes::from(std::mem::take(e.get_mut()));
                        return Some((Ok(out), (body, enc)));
                    }
                }
                Some(Err(err)) => return Some((Err(err), (body, None))),
                None => {
                    let e = enc.take()?;
                    return match e.finish() {
                        Ok(v) => Some((Ok(Bytes::from(v)), (body, None))),
                        Err(err) => Some((Err(err), (body, None))),
                    };
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn collect<S: Stream<Item = Result<Bytes, E>>, E>(s: S) -> Result<Vec<u8>, E> {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut out = Vec::new();
            let mut s = Box::pin(s);
            while let Some(c) = s.next().await {
                out.extend_from_slice(&c?);
            }
            Ok(out)
        })
    }

    fn chunks(data: &[u8], n: usize) -> impl Stream<Item = Result<Bytes, String>> + Send + Unpin + 'static {
        let v: Vec<Result<Bytes, String>> = data.chunks(n).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        futures_util::stream::iter(v)
    }

    #[test]
    fn inflates_split_anywhere_and_round_trips() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut two = gz(&data[..1000]);
        two.extend(gz(&data[1000..]));
        for split in [1, 7, 4096, 1 << 20] {
            assert_eq!(collect(decompress(chunks(&two, split))).unwrap(), data, "split {split}");
        }
        let plain = futures_util::stream::iter(vec![Ok(Bytes::from(data.clone()))]);
        let packed = collect(compress(plain)).unwrap();
        assert_eq!(collect(decompress(chunks(&packed, 100))).unwrap(), data);
    }

    #[test]
    fn bombs_come_out_in_bounded_pieces_and_bad_bodies_fail() {
        let zeros = gz(&vec![0u8; 64 << 20]);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let biggest = rt.block_on(async {
            let mut s = Box::pin(decompress(chunks(&zeros, 1 << 20)));
            let mut biggest = 0;
            while let Some(c) = s.next().await {
                biggest = biggest.max(c.unwrap().len());
            }
            biggest
        });
        assert!(biggest <= 2 << 20, "one step produced {biggest} bytes");
        assert!(collect(decompress(chunks(b"not gzip at all", 4))).is_err());
        let cut = gz(b"hello world");
        assert!(collect(decompress(chunks(&cut[..cut.len() - 4], 4))).is_err());
    }
}
