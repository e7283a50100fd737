//! `multipart/form-data`, as much as the Daytona SDK's file transfers use: reading a
//! buffered upload (fields and files), and writing a download's parts.

/// One part of a form.
#[derive(Debug, PartialEq)]
pub struct Part {
    pub name: String,
    pub filename: Option<String>,
    pub data: Vec<u8>,
}

/// The boundary named by a `Content-Type: multipart/form-data; boundary=…` header.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim().eq_ignore_ascii_case("boundary").then(|| v.trim().trim_matches('"').to_string())
    })
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (from..=hay.len() - needle.len()).find(|&i| &hay[i..i + needle.len()] == needle)
}

/// A `Content-Disposition` parameter (`name`, `filename`), quotes and escapes undone.
fn param(disposition: &str, key: &str) -> Option<String> {
    let mut rest = disposition;
    while let Some(i) = rest.find(';') {
        rest = rest[i + 1..].trim_start();
        let (k, v) = rest.split_once('=')?;
        if k.trim().eq_ignore_ascii_case(key) {
            let v = v.trim_start();
            return Some(match v.strip_prefix('"') {
                Some(q) => {
                    let mut out = String::new();
                    let mut chars = q.chars();
                    while let Some(c) = chars.next() {
                        match c {
                            '\\' => out.extend(chars.next()),
                            '"' => break,
                            c => out.push(c),
                        }
                    }
                    out
                }
                None => v.split(';').next().unwrap_or("").trim().to_string(),
            });
        }
    }
    None
}

/// The parts of a whole form body.
pub fn parse(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delim = format!("--{boundary}");
    let mut at = find(body, delim.as_bytes(), 0).ok_or("no multipart boundary in the body")?;
    let mut parts = Vec::new();
    loop {
        at += delim.len();
        if body[at..].starts_with(b"--") {
            return Ok(parts);
        }
        at = find(body, b"\r\n", at).ok_or("truncated multipart body")? + 2;
        let head_end = find(body, b"\r\n\r\n", at).ok_or("truncated multipart headers")?;
        let head = String::from_utf8_lossy(&body[at..head_end]);
        let disposition = head
            .split("\r\n")
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition")))
            .map(|(_, v)| v.trim().to_string())
            .ok_or("a multipart part without Content-Disposition")?;
        let data_start = head_end + 4;
        let end_marker = format!("\r\n{delim}");
        let data_end = find(body, end_marker.as_bytes(), data_start).ok_or("truncated multipart part")?;
        parts.push(Part {
            name: param(&disposition, "name").unwrap_or_default(),
            filename: param(&disposition, "filename"),
            data: body[data_start..data_end].to_vec(),
        });
        at = data_end + 2;
    }
}

/// Writes forms: parts then `finish`.
pub struct Writer {
    pub boundary: String,
    pub body: Vec<u8>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer { boundary: format!("glovebox{}", crate::util::random_token(24)), body: Vec::new() }
    }

    pub fn content_type(&self) -> String {
        format!("multipart/form-data; boundary={}", self.boundary)
    }

    /// A part named `name` for file `filename` (quoted: `"` and `\` escaped, line breaks
    /// dropped).
    pub fn part(&mut self, name: &str, filename: &str, content_type: &str, data: &[u8]) {
        let quoted: String = filename
            .chars()
            .filter(|c| *c != '\r' && *c != '\n')
            .flat_map(|c| match c {
                '"' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        let head = format!(
            "--{}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{quoted}\"\r\nContent-Type: {content_type}\r\n\r\n",
            self.boundary
        );
        self.body.extend_from_slice(head.as_bytes());
        self.body.extend_from_slice(data);
        self.body.extend_from_slice(b"\r\n");
    }

    pub fn finish(mut self) -> (String, Vec<u8>) {
        self.body.extend_from_slice(format!("--{}--\r\n", self.boundary).as_bytes());
        (self.content_type(), self.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_forms_read_back() {
        let mut w = Writer::new();
        w.part("file", "/tmp/a \"b\".txt", "application/octet-stream", b"one\r\n--two");
        w.part("error", "/x", "application/json", b"{}");
        let ct = w.content_type();
        let (_, body) = w.finish();
        let b = boundary(&ct).unwrap();
        let parts = parse(&body, &b).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "file");
        assert_eq!(parts[0].filename.as_deref(), Some("/tmp/a \"b\".txt"));
        assert_eq!(parts[0].data, b"one\r\n--two");
        assert_eq!(parts[1].name, "error");
    }

    #[test]
    fn reads_what_httpx_sends() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"files[0].path\"\r\n\r\n/tmp/f\r\n--XyZ\r\nContent-Disposition: form-data; name=\"files[0].file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\x01\r\n--XyZ--\r\n";
        let parts = parse(body, &boundary("multipart/form-data; boundary=XyZ").unwrap()).unwrap();
        assert_eq!(parts[0], Part { name: "files[0].path".into(), filename: None, data: b"/tmp/f".to_vec() });
        assert_eq!(parts[1].data, b"\x00\x01");
        assert!(parse(b"garbage", "XyZ").is_err());
        assert!(boundary("application/json").is_none());
    }
}
