//! A streaming `multipart/form-data` reader, for the front-ends whose SDKs upload files as
//! forms (E2B's `/files`, the agent-sandbox python-runtime's `/upload` and sandboxd's `PUT`):
//! parts one after another, each part's data in chunks as it arrives, never the whole body.

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(ct: &str) -> Option<String> {
    let rest = ct.strip_prefix("multipart/form-data")?;
    rest.split(';').map(str::trim).find_map(|p| p.strip_prefix("boundary=")).map(|b| b.trim_matches('"').to_string())
}

/// Longest part header block accepted.
const MAX_PART_HEADERS: usize = 16 << 10;

/// A streaming `multipart/form-data` reader: parts one after another, each part's data in
/// chunks as it arrives (a 50 MiB upload is never held whole).
pub struct Reader<S> {
    body: S,
    buf: Vec<u8>,
    /// `\r\n--<boundary>`.
    delim: Vec<u8>,
    /// Inside a part's data.
    in_part: bool,
    done: bool,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A body that is not the form it says it is.
#[derive(Debug, thiserror::Error)]
#[error("malformed multipart body: {0}")]
pub struct Malformed(String);

fn bad(msg: &str) -> Malformed {
    Malformed(msg.to_string())
}

impl<S, E> Reader<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub fn new(body: S, boundary: &str) -> Self {
        // A leading CRLF lets the first delimiter match like every later one.
        Reader {
            body,
            buf: b"\r\n".to_vec(),
            delim: format!("\r\n--{boundary}").into_bytes(),
            in_part: false,
            done: false,
        }
    }

    /// Reads more of the body; false at its end.
    async fn fill(&mut self) -> Result<bool, Malformed> {
        match self.body.next().await {
            Some(Ok(b)) => {
                self.buf.extend_from_slice(&b);
                Ok(true)
            }
            Some(Err(e)) => Err(bad(&e.to_string())),
            None => Ok(false),
        }
    }

    /// Skips to the next part; its filename, or `None` at the end of the body.
    pub async fn next_part(&mut self) -> Result<Option<Option<String>>, Malformed> {
        while self.in_part {
            if self.chunk().await?.is_none() {
                break;
            }
        }
        if self.done {
            return Ok(None);
        }
        // Find the delimiter, then what follows it: `--` (the end) or CRLF and headers.
        loop {
            if let Some(i) = find(&self.buf, &self.delim) {
                let after = i + self.delim.len();
                if self.buf.len() >= after + 2 {
                    if &self.buf[after..after + 2] == b"--" {
                        self.done = true;
                        return Ok(None);
                    }
                    if let Some(end) = find(&self.buf[after..], b"\r\n\r\n") {
                        let headers = String::from_utf8_lossy(&self.buf[after + 2..after + end]).into_owned();
                        self.buf.drain(..after + end + 4);
                        self.in_part = true;
                        return Ok(Some(filename(&headers)));
                    }
                }
            }
            if self.buf.len() > MAX_PART_HEADERS + self.delim.len() {
                return Err(bad("part headers too long"));
            }
            if !self.fill().await? {
                return Err(bad("ends before its closing delimiter"));
            }
        }
    }

    /// The next chunk of the current part's data; `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, Malformed> {
        if !self.in_part {
            return Ok(None);
        }
        // Where a delimiter could still start (earlier bytes were searched already), so
        // a body arriving in tiny pieces costs linear time, not quadratic.
        let mut from = 0;
        loop {
            if let Some(i) = find(&self.buf[from..], &self.delim).map(|i| i + from) {
                if i == 0 {
                    self.in_part = false;
                    return Ok(None);
                }
                let data: Vec<u8> = self.buf.drain(..i).collect();
                return Ok(Some(Bytes::from(data)));
            }
            // Everything but a possible start of the delimiter is data.
            let safe = self.buf.len().saturating_sub(self.delim.len() - 1);
            if safe >= 64 << 10 {
                let data: Vec<u8> = self.buf.drain(..safe).collect();
                return Ok(Some(Bytes::from(data)));
            }
            from = safe;
            if !self.fill().await? {
                return Err(bad("ends inside a part"));
            }
        }
    }
}

/// The `filename` of a part's `Content-Disposition`.
fn filename(headers: &str) -> Option<String> {
    headers.lines().find(|l| l.to_ascii_lowercase().starts_with("content-disposition:")).and_then(|l| {
        let i = l.find("filename=\"")? + "filename=\"".len();
        let rest = &l[i..];
        let end = rest.find('"')?;
        Some(rest[..end].replace("%22", "\"").replace("%0D", "\r").replace("%0A", "\n"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(body: &[u8], split: usize) -> Vec<(Option<String>, Vec<u8>)> {
        let chunks: Vec<Result<Bytes, String>> = body.chunks(split).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut mp = Reader::new(futures_util::stream::iter(chunks), "XyZ");
            let mut out = Vec::new();
            while let Some(name) = mp.next_part().await.unwrap() {
                let mut data = Vec::new();
                while let Some(c) = mp.chunk().await.unwrap() {
                    data.extend_from_slice(&c);
                }
                out.push((name, data));
            }
            out
        })
    }

    #[test]
    fn multipart_parts_split_anywhere() {
        let big = vec![b'\r'; 200_000];
        let mut body = Vec::new();
        body.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/a/b.txt\"\r\n");
        body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\nhello\r\n--X\r\n");
        body.extend_from_slice(b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c\"\r\n\r\n");
        body.extend_from_slice(&big);
        body.extend_from_slice(b"\r\n--XyZ--\r\n");
        for split in [1, 3, 7, 64, 1 << 20] {
            let p = parts(&body, split);
            assert_eq!(p.len(), 2, "split {split}");
            assert_eq!(p[0].0.as_deref(), Some("/a/b.txt"));
            assert_eq!(p[0].1, b"hello\r\n--X\r\n");
            assert_eq!(p[1].0.as_deref(), Some("c"));
            assert_eq!(p[1].1, big);
        }
    }

    #[test]
    fn boundaries() {
        assert_eq!(boundary("multipart/form-data; boundary=abc").as_deref(), Some("abc"));
        assert_eq!(boundary("multipart/form-data; boundary=\"q\"").as_deref(), Some("q"));
        assert_eq!(boundary("application/octet-stream"), None);
    }
}
