//! Results: Glovebox's own words, then what came from the sandbox, delimited and capped.

use super::*;

/// Output from the sandbox, as it will be shown between the delimiters.
pub(super) struct Block {
    pub(super) label: String,
    pub(super) text: String,
    /// Bytes the source produced (may exceed `text`).
    pub(super) total: u64,
    /// `text` is already only part of the output.
    pub(super) cut: bool,
    /// `text` ends where the output ended (a command's): a cut here keeps its end too.
    pub(super) ends: bool,
}

pub(super) struct Report {
    /// Lines written by Glovebox (trusted).
    pub(super) head: Vec<String>,
    pub(super) blocks: Vec<Block>,
    pub(super) images: Vec<Value>,
    pub(super) is_error: bool,
}

impl Report {
    pub(super) fn says(line: impl Into<String>) -> Report {
        Report { head: vec![line.into()], blocks: Vec::new(), images: Vec::new(), is_error: false }
    }

    pub(super) fn failure(e: anyhow::Error) -> Report {
        let mut r = Report::says(format!("glovebox: {e:#}"));
        r.is_error = true;
        r
    }

    pub(super) fn noted(mut self, note: String) -> Report {
        self.head.insert(0, note);
        self
    }

    pub(super) fn line(&mut self, l: impl Into<String>) {
        self.head.push(l.into());
    }

    pub(super) fn block(&mut self, label: impl Into<String>, text: String, total: u64, cut: bool) {
        self.push_block(label, text, total, cut, false);
    }

    /// A command's output: capped by the daemon to its first and last parts, and cut the
    /// same way here if it must be.
    pub(super) fn output_block(&mut self, label: impl Into<String>, text: String, total: u64, cut: bool) {
        self.push_block(label, text, total, cut, true);
    }

    pub(super) fn push_block(&mut self, label: impl Into<String>, text: String, total: u64, cut: bool, ends: bool) {
        if !text.is_empty() || cut {
            self.blocks.push(Block { label: label.into(), text, total, cut, ends });
        }
    }

    /// The MCP `CallToolResult`: one text item of at most about `cap` bytes, then images.
    pub(super) fn render(self, cap: usize) -> Value {
        let mut out = self.head.join("\n");
        out.push('\n');
        if !self.blocks.is_empty() {
            out.push_str(UNTRUSTED_NOTE);
            out.push('\n');
        }
        let texts: Vec<String> = self.blocks.iter().map(|b| defuse(&b.text)).collect();
        // Room for the labels, delimiters and truncation notes (about 120 bytes a block).
        let overhead = out.len() + self.blocks.iter().map(|b| b.label.len() + 120).sum::<usize>();
        let shares = fair_shares(&texts.iter().map(String::len).collect::<Vec<_>>(), cap.saturating_sub(overhead));
        for ((b, text), share) in self.blocks.iter().zip(&texts).zip(shares) {
            let shown = if b.ends { head_and_tail(text, share) } else { prefix(text, share).to_string() };
            if b.ends && (shown.len() < text.len() || b.cut) {
                out.push_str(&format!(
                    "{} ({} bytes; truncated, only the first and the last parts are shown):\n",
                    b.label, b.total
                ));
            } else if shown.len() < text.len() || b.cut {
                out.push_str(&format!(
                    "{} ({} bytes; truncated, only the first {} bytes are shown):\n",
                    b.label,
                    b.total,
                    shown.len()
                ));
            } else {
                out.push_str(&format!("{}:\n", b.label));
            }
            out.push_str(OPEN);
            out.push('\n');
            out.push_str(&shown);
            if !shown.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(CLOSE);
            out.push('\n');
        }
        let mut content = vec![json!({ "type": "text", "text": out.trim_end() })];
        content.extend(self.images);
        json!({ "content": content, "isError": self.is_error })
    }
}

/// Makes tags that could pass for our delimiters inert (`<` → `&lt;`), case-insensitively and
/// with any `/` or spacing, so output cannot close its block and speak as Glovebox.
pub(super) fn defuse(s: &str) -> String {
    let lower = s.to_ascii_lowercase(); // same byte offsets as `s`
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for (i, _) in lower.match_indices('<') {
        let rest = lower[i + 1..].trim_start_matches(|c: char| c == '/' || c == '\\' || c.is_whitespace());
        if rest.starts_with("untrusted-output") {
            out.push_str(&s[last..i]);
            out.push_str("&lt;");
            last = i + 1;
        }
    }
    out.push_str(&s[last..]);
    out
}

/// Splits `budget` bytes among texts of `lens`: short ones whole, the rest evenly.
pub(super) fn fair_shares(lens: &[usize], budget: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| lens[i]);
    let mut shares = vec![0; lens.len()];
    let mut left = budget;
    for (k, &i) in order.iter().enumerate() {
        shares[i] = lens[i].min(left / (lens.len() - k));
        left -= shares[i];
    }
    shares
}

/// The longest prefix of `s` of at most `n` bytes that ends on a character boundary.
pub(super) fn prefix(s: &str, n: usize) -> &str {
    let mut n = n.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// At most `n` bytes of `s`: all of it, or its start and end around a marker of the bytes
/// left out (as the daemon's own cap does).
pub(super) fn head_and_tail(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    // Room for the marker (a count of up to 20 digits).
    let room = n.saturating_sub(48);
    let head = prefix(s, room - room / 2);
    let mut from = s.len() - room / 2;
    while !s.is_char_boundary(from) {
        from += 1;
    }
    let tail = &s[from..];
    format!("{head}\n[glovebox: {} bytes dropped]\n{tail}", s.len() - head.len() - tail.len())
}

/// A path or name for Glovebox's own lines: quoted, escaped, inert.
pub(super) fn quoted(s: &str) -> String {
    defuse(&format!("{s:?}"))
}

pub(super) fn exec_report(r: &ExecResult) -> Report {
    let status = if r.timed_out {
        format!("timed out after {} ms and was killed (exit code {}, timed_out: true)", r.duration_ms, r.exit_code)
    } else if let Some(sig) = r.signal {
        format!("was killed by signal {sig} after {} ms (exit code {})", r.duration_ms, r.exit_code)
    } else {
        format!("exited with code {} after {} ms", r.exit_code, r.duration_ms)
    };
    let mut rep = Report::says(format!("run_command: the command {status}."));
    if r.oom_killed {
        rep.line("A process ran out of memory and was killed.");
    }
    rep.output_block("stdout", r.stdout.clone(), r.stdout_bytes, r.stdout_truncated);
    rep.output_block("stderr", r.stderr.clone(), r.stderr_bytes, r.stderr_truncated);
    if rep.blocks.is_empty() {
        rep.line("No output.");
    }
    rep
}

pub(super) fn code_report(lang: Language, ex: &Execution) -> Report {
    let lang = lang.as_str();
    let n = ex.execution_count;
    let mut rep = match &ex.error {
        None => Report::says(format!("run_code ({lang}): ran without error (execution {n}).")),
        Some(e) if e.name == "TimeoutError" => {
            Report::says(format!("run_code ({lang}): timed out; the cell was interrupted (state is kept)."))
        }
        Some(e) if e.name == "GloveboxError" => {
            let mut r = Report::says(format!("run_code ({lang}): Glovebox could not run the code."));
            r.is_error = true;
            r
        }
        Some(_) => Report::says(format!("run_code ({lang}): the code raised an error (execution {n}).")),
    };
    if ex.context_restarted {
        rep.line(format!("The {lang} interpreter was restarted: variables and imports from earlier calls are lost."));
    }
    let stdout = ex.logs.stdout.concat();
    let stderr = ex.logs.stderr.concat();
    let (so, se) = (stdout.len() as u64, stderr.len() as u64);
    rep.block("stdout", stdout, so, false);
    rep.block("stderr", stderr, se, false);
    let mut image_bytes = 0;
    for r in &ex.results {
        let label = if r.is_main_result { "result" } else { "displayed result" };
        let mut attached = None;
        for mime in ["image/png", "image/jpeg"] {
            let Some(b64) = r.data.get(mime).and_then(Value::as_str) else { continue };
            if attached.is_some() {
                break;
            }
            if base64::engine::general_purpose::STANDARD.decode(b64).is_err() {
                continue;
            }
            if image_bytes + b64.len() > MAX_IMAGE_B64 {
                rep.line(format!("A {mime} {label} of {} bytes was left out (images are capped at 8 MiB).", b64.len()));
                continue;
            }
            image_bytes += b64.len();
            rep.images.push(json!({ "type": "image", "data": b64, "mimeType": mime }));
            attached = Some(mime);
        }
        let others: Vec<String> = r
            .data
            .keys()
            .filter(|k| k.as_str() != "text/plain" && Some(k.as_str()) != attached)
            .map(|k| k.chars().filter(|c| c.is_ascii_alphanumeric() || "/+.-".contains(*c)).collect())
            .collect();
        let mut label = label.to_string();
        if let Some(m) = attached {
            label.push_str(&format!(" ({m} attached as image content)"));
        }
        if !others.is_empty() {
            label.push_str(&format!(" (not shown: {})", others.join(", ")));
        }
        match r.data.get("text/plain").and_then(Value::as_str) {
            Some(t) => {
                let total = t.len() as u64;
                rep.block(label, t.to_string(), total, false);
            }
            None => rep.line(format!("A {label}.")),
        }
    }
    if let Some(e) = &ex.error {
        let mut text = format!("{}: {}\n", e.name, e.value);
        if !e.traceback.trim().is_empty() {
            text.push_str(&format!("\n{}", e.traceback));
        }
        let total = text.len() as u64;
        rep.block("error", text, total, false);
    }
    if rep.blocks.is_empty() && rep.images.is_empty() {
        rep.line("No output.");
    }
    rep
}

pub(super) fn image_type(b: &[u8]) -> Option<&'static str> {
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if b.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else {
        None
    }
}

pub(super) fn read_report(path: &str, d: Download, cap: usize) -> Report {
    let size = d.size.unwrap_or(d.head.len() as u64);
    let whole = d.head.len() as u64 >= size;
    if let Some(mime) = image_type(&d.head).filter(|_| whole) {
        let b64 = base64::engine::general_purpose::STANDARD.encode(&d.head);
        if b64.len() <= MAX_IMAGE_B64 {
            let mut rep = Report::says(format!("read_file: {} is a {mime} image of {size} bytes.", quoted(path)));
            rep.images.push(json!({ "type": "image", "data": b64, "mimeType": mime }));
            return rep;
        }
    }
    let head = &d.head[..d.head.len().min(cap)];
    let text = match std::str::from_utf8(head) {
        Ok(t) => Some(t),
        // Cut inside a character at the end of a shortened read: still text.
        Err(e) if e.error_len().is_none() && (head.len() as u64) < size => {
            std::str::from_utf8(&head[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    match text.filter(|t| !t.contains('\0')) {
        Some(t) => {
            let mut rep = Report::says(format!("read_file: {} ({size} bytes).", quoted(path)));
            rep.block("content", t.to_string(), size, (t.len() as u64) < size);
            if size == 0 {
                rep.line("The file is empty.");
            }
            rep
        }
        None => Report::says(format!(
            "read_file: {} is a binary file of {size} bytes, not shown as text; inspect it with run_command \
             (e.g. `xxd`, `file` or `base64`).",
            quoted(path)
        )),
    }
}

pub(super) fn list_report(path: &str, e: &api::Entries) -> Report {
    let mut text = String::new();
    for f in &e.entries {
        let kind = match f.kind {
            api::FileType::Dir => "dir",
            api::FileType::Symlink => "link",
            api::FileType::File => "file",
            api::FileType::Other => "other",
        };
        text.push_str(&format!("{kind:<5} {:>10} {:04o} {}", f.size, f.mode & 0o7777, f.path));
        if let Some(t) = &f.target {
            text.push_str(&format!(" -> {t}"));
        }
        text.push('\n');
    }
    let n = e.entries.len();
    let mut rep =
        Report::says(format!("list_files: {n} {} in {}.", if n == 1 { "entry" } else { "entries" }, quoted(path)));
    let total = text.len() as u64;
    rep.block("entries (type, size, mode, path)", text, total, false);
    rep
}
