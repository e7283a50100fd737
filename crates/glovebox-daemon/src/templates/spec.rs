//! The template spec: a Dockerfile subset (`FROM`, `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`,
//! `ARG`, `CMD`). Pure parsing, no I/O: the result is a list of steps, each remembering the
//! line it started on so the builder can say which step failed.
//!
//! Invariants: every instruction outside the subset is an error naming its line; `ARG` and
//! `ENV` values are substituted (`$X`, `${X}`, `${X:-default}`) in every instruction but
//! `RUN`, whose shell sees them as environment variables instead (as Docker does).

use std::collections::BTreeMap;

/// A parse error, with the 1-based line of the instruction it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct SpecError {
    pub line: usize,
    pub message: String,
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError { line, message: message.into() })
}

/// A command: exec form (`["a", "b"]`) or shell form (`/bin/sh -c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cmd {
    Exec(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instr {
    Run(Cmd),
    /// Context paths (relative to the context dir) copied to `dest` (absolute after WORKDIR
    /// resolution is the builder's job).
    Copy {
        srcs: Vec<String>,
        dest: String,
        chown: Option<(u32, u32)>,
        chmod: Option<u32>,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    /// The start command of sandboxes created from the template.
    Cmd(Cmd),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// 1-based line where the instruction starts.
    pub line: usize,
    pub instr: Instr,
    /// The build arguments in force at this step (the environment of a `RUN`).
    pub args: BTreeMap<String, String>,
}

/// A parsed spec: its base and its steps in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// `FROM`'s image after substitution; `host` when the spec has no `FROM`.
    pub from: String,
    pub steps: Vec<Step>,
}

/// One logical instruction: continuation lines joined, comments dropped.
struct Logical {
    line: usize,
    text: String,
}

/// Joins `\`-continued lines, drops comments and blank lines.
fn logical_lines(text: &str) -> Vec<Logical> {
    let mut out = Vec::new();
    let mut cur: Option<Logical> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim_start();
        // Comment lines are dropped, also in the middle of a continued instruction.
        if trimmed.starts_with('#') {
            continue;
        }
        if cur.is_none() && trimmed.trim_end().is_empty() {
            continue;
        }
        let (body, cont) = match raw.trim_end().strip_suffix('\\') {
            Some(b) => (b, true),
            None => (raw.trim_end(), false),
        };
        match &mut cur {
            Some(l) => {
                l.text.push(' ');
                l.text.push_str(body.trim_start());
            }
            None => cur = Some(Logical { line: i + 1, text: body.trim_start().to_string() }),
        }
        if !cont {
            if let Some(l) = cur.take() {
                if !l.text.trim().is_empty() {
                    out.push(l);
                }
            }
        }
    }
    if let Some(l) = cur {
        if !l.text.trim().is_empty() {
            out.push(l);
        }
    }
    out
}

/// Substitutes `$X`, `${X}`, `${X:-default}` and `${X:+alt}` from `vars`; `\$` is a literal
/// `$`. Unknown variables become empty (as in Docker).
pub fn substitute(s: &str, vars: &BTreeMap<String, String>, line: usize) -> Result<String, SpecError> {
    let mut out = String::with_capacity(s.len());
    let cs: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c == '\\' && cs.get(i + 1) == Some(&'$') {
            out.push('$');
            i += 2;
            continue;
        }
        if c != '$' {
            out.push(c);
            i += 1;
            continue;
        }
        if cs.get(i + 1) == Some(&'{') {
            let Some(end) = cs[i + 2..].iter().position(|&c| c == '}') else {
                return err(line, "unterminated ${ in variable reference");
            };
            let inner: String = cs[i + 2..i + 2 + end].iter().collect();
            let (name, op) = match inner.find(":-").or_else(|| inner.find(":+")) {
                Some(p) => (&inner[..p], Some((&inner[p..p + 2], &inner[p + 2..]))),
                None => (inner.as_str(), None),
            };
            if !valid_name(name) {
                return err(line, format!("bad variable name in ${{{inner}}}"));
            }
            let val = vars.get(name).filter(|v| !v.is_empty());
            match (op, val) {
                (None, v) => out.push_str(v.map(String::as_str).unwrap_or("")),
                (Some((":-", d)), None) => out.push_str(d),
                (Some((":-", _)), Some(v)) => out.push_str(v),
                (Some((_, alt)), Some(_)) => out.push_str(alt),
                (Some(_), None) => {}
            }
            i += 3 + end;
            continue;
        }
        let start = i + 1;
        let mut j = start;
        while j < cs.len() && (cs[j].is_ascii_alphanumeric() || cs[j] == '_') {
            j += 1;
        }
        if j == start {
            out.push('$');
            i += 1;
            continue;
        }
        let name: String = cs[start..j].iter().collect();
        out.push_str(vars.get(&name).map(String::as_str).unwrap_or(""));
        i = j;
    }
    Ok(out)
}

/// Variables visible to substitution: ENV wins over ARG (Docker's rule).
fn merged(args: &BTreeMap<String, String>, env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut v = args.clone();
    v.extend(env.clone());
    v
}

fn valid_name(n: &str) -> bool {
    let mut cs = n.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Splits into words: whitespace separates, `"…"` and `'…'` quote, `\` escapes one char
/// (outside single quotes).
fn words(s: &str, line: usize) -> Result<Vec<String>, SpecError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut cs = s.chars().peekable();
    while let Some(c) = cs.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = cs.next() {
                    cur.push(n);
                }
            }
            '"' | '\'' => {
                in_word = true;
                let q = c;
                let mut closed = false;
                while let Some(n) = cs.next() {
                    if n == q {
                        closed = true;
                        break;
                    }
                    if n == '\\' && q == '"' {
                        if let Some(e) = cs.next() {
                            cur.push(e);
                        }
                        continue;
                    }
                    cur.push(n);
                }
                if !closed {
                    return err(line, format!("unterminated {q} quote"));
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// `["a", "b"]` if the text is a JSON array of strings.
fn exec_form(s: &str) -> Option<Vec<String>> {
    let t = s.trim();
    if !t.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(t).ok()
}

fn parse_cmd(rest: &str, line: usize, what: &str) -> Result<Cmd, SpecError> {
    if rest.trim().is_empty() {
        return err(line, format!("{what} needs a command"));
    }
    if let Some(v) = exec_form(rest) {
        if v.is_empty() {
            return err(line, format!("{what} needs a command"));
        }
        return Ok(Cmd::Exec(v));
    }
    if rest.trim_start().starts_with('[') {
        return err(line, format!("{what}: bad exec form (expected a JSON array of strings)"));
    }
    Ok(Cmd::Shell(rest.trim().to_string()))
}

fn parse_ids(s: &str, line: usize) -> Result<(u32, u32), SpecError> {
    let (u, g) = s.split_once(':').unwrap_or((s, s));
    match (u.parse::<u32>(), g.parse::<u32>()) {
        (Ok(u), Ok(g)) => Ok((u, g)),
        _ => err(line, format!("--chown takes numeric ids (uid[:gid]), got {s:?}")),
    }
}

/// Parses a spec. `build_args` override `ARG` defaults (`--build-arg K=V`); an argument
/// given but never declared is an error (a typo would otherwise pass silently).
pub fn parse(text: &str, build_args: &BTreeMap<String, String>) -> Result<Spec, SpecError> {
    let mut from: Option<String> = None;
    let mut steps = Vec::new();
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut declared: Vec<String> = Vec::new();
    for l in logical_lines(text) {
        let line = l.line;
        let t = l.text.trim();
        let (kw, rest) = match t.find(char::is_whitespace) {
            Some(p) => (&t[..p], t[p..].trim()),
            None => (t, ""),
        };
        let kw = kw.to_ascii_uppercase();
        // Variables visible to substitution: ENV wins over ARG (Docker's rule).
        let vars = || merged(&args, &env);
        let instr = match kw.as_str() {
            "FROM" => {
                if from.is_some() {
                    return err(line, "only one FROM is supported (no multi-stage builds)");
                }
                if !steps.is_empty() {
                    return err(line, "FROM must come before every other instruction but ARG");
                }
                let w = words(&substitute(rest, &vars(), line)?, line)?;
                match w.as_slice() {
                    [img] => from = Some(img.clone()),
                    [_, kw2, ..] if kw2.eq_ignore_ascii_case("as") => {
                        return err(line, "FROM … AS (multi-stage builds) is not supported")
                    }
                    [] => return err(line, "FROM needs an image"),
                    _ => return err(line, "FROM takes one image (flags such as --platform are not supported)"),
                }
                continue;
            }
            "ARG" => {
                let w = words(rest, line)?;
                if w.is_empty() {
                    return err(line, "ARG needs a name");
                }
                for a in w {
                    let (name, default) = match a.split_once('=') {
                        Some((n, d)) => (n.to_string(), Some(substitute(d, &merged(&args, &env), line)?)),
                        None => (a.clone(), None),
                    };
                    if !valid_name(&name) {
                        return err(line, format!("bad ARG name {name:?}"));
                    }
                    let val = build_args.get(&name).cloned().or(default).unwrap_or_default();
                    args.insert(name.clone(), val);
                    declared.push(name);
                }
                continue;
            }
            "RUN" => Instr::Run(parse_cmd(rest, line, "RUN")?),
            "CMD" => Instr::Cmd(parse_cmd(rest, line, "CMD")?),
            "ENV" => {
                let w = words(&substitute(rest, &vars(), line)?, line)?;
                let mut kvs = Vec::new();
                if w.is_empty() {
                    return err(line, "ENV needs NAME=value");
                }
                if !w[0].contains('=') {
                    // Legacy form: `ENV NAME the rest is the value`.
                    let value = rest.trim()[w[0].len()..].trim();
                    if value.is_empty() {
                        return err(line, "ENV needs a value");
                    }
                    kvs.push((w[0].clone(), substitute(value, &vars(), line)?));
                } else {
                    for kv in &w {
                        let Some((k, v)) = kv.split_once('=') else {
                            return err(line, format!("ENV expects NAME=value, got {kv:?}"));
                        };
                        kvs.push((k.to_string(), v.to_string()));
                    }
                }
                for (k, v) in &kvs {
                    if !valid_name(k) {
                        return err(line, format!("bad ENV name {k:?}"));
                    }
                    if v.contains('\0') {
                        return err(line, "ENV value contains a NUL byte");
                    }
                    env.insert(k.clone(), v.clone());
                }
                Instr::Env(kvs)
            }
            "WORKDIR" => {
                let w = words(&substitute(rest, &vars(), line)?, line)?;
                match w.as_slice() {
                    [d] => Instr::Workdir(d.clone()),
                    _ => return err(line, "WORKDIR takes one path"),
                }
            }
            "USER" => {
                let w = words(&substitute(rest, &vars(), line)?, line)?;
                match w.as_slice() {
                    [u] if !u.is_empty() && !u.contains(['/', '\0']) => Instr::User(u.clone()),
                    _ => return err(line, "USER takes one user name or uid[:gid]"),
                }
            }
            "COPY" | "ADD" => {
                if kw == "ADD" {
                    return err(line, "ADD is not supported (use COPY; fetch URLs with RUN)");
                }
                let sub = substitute(rest, &vars(), line)?;
                let mut w = match exec_form(&sub) {
                    Some(v) => v,
                    None => words(&sub, line)?,
                };
                let (mut chown, mut chmod) = (None, None);
                while w.first().is_some_and(|a| a.starts_with("--")) {
                    let flag = w.remove(0);
                    if let Some(v) = flag.strip_prefix("--chown=") {
                        chown = Some(parse_ids(v, line)?);
                    } else if let Some(v) = flag.strip_prefix("--chmod=") {
                        chmod = match u32::from_str_radix(v, 8) {
                            Ok(m) if m <= 0o7777 => Some(m),
                            _ => return err(line, format!("--chmod takes an octal mode, got {v:?}")),
                        };
                    } else {
                        return err(line, format!("COPY flag {flag} is not supported (only --chown and --chmod)"));
                    }
                }
                if w.len() < 2 {
                    return err(line, "COPY needs at least one source and a destination");
                }
                let dest = w.pop().unwrap_or_default();
                for s in &w {
                    if s.contains(['*', '?', '[']) {
                        return err(line, format!("COPY wildcards are not supported ({s:?})"));
                    }
                    if s.split('/').any(|c| c == "..") {
                        return err(line, format!("COPY source {s:?} leaves the build context"));
                    }
                }
                Instr::Copy { srcs: w, dest, chown, chmod }
            }
            "" => continue,
            other => {
                return err(
                    line,
                    format!(
                        "unsupported instruction {other} (supported: FROM, RUN, COPY, ENV, WORKDIR, USER, ARG, CMD)"
                    ),
                )
            }
        };
        steps.push(Step { line, instr, args: args.clone() });
    }
    for k in build_args.keys() {
        if !declared.contains(k) {
            return err(0, format!("build argument {k:?} is not declared by any ARG"));
        }
    }
    Ok(Spec { from: from.unwrap_or_else(|| "host".to_string()), steps })
}

impl Step {
    /// A canonical text of the step for the cache key: the instruction as parsed (so
    /// formatting and comments do not bust the cache) plus the build arguments it sees.
    pub fn key_text(&self) -> String {
        format!("{:?} args={:?}", self.instr, self.args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> Result<Spec, SpecError> {
        parse(s, &BTreeMap::new())
    }

    #[test]
    fn full_subset() {
        let s = p(r#"
# a comment
ARG VER=3
FROM debian:bookworm-slim
RUN apt-get update && \
    # comment inside a continuation
    apt-get install -y python3
RUN ["python3", "-c", "print(1)"]
ENV A=1 B="two words" C=$A
ENV LEGACY some value
WORKDIR /app
USER 1000:1000
COPY --chown=1000:100 --chmod=755 a.sh b/ /app/
CMD ["sleep", "1"]
"#)
        .unwrap();
        assert_eq!(s.from, "debian:bookworm-slim");
        assert_eq!(s.steps.len(), 8);
        assert_eq!(s.steps[0].line, 5);
        assert_eq!(s.steps[0].instr, Instr::Run(Cmd::Shell("apt-get update &&  apt-get install -y python3".into())));
        assert_eq!(s.steps[1].instr, Instr::Run(Cmd::Exec(vec!["python3".into(), "-c".into(), "print(1)".into()])));
        assert_eq!(
            s.steps[2].instr,
            Instr::Env(vec![("A".into(), "1".into()), ("B".into(), "two words".into()), ("C".into(), "".into())])
        );
        assert_eq!(s.steps[3].instr, Instr::Env(vec![("LEGACY".into(), "some value".into())]));
        assert_eq!(s.steps[4].instr, Instr::Workdir("/app".into()));
        assert_eq!(s.steps[5].instr, Instr::User("1000:1000".into()));
        assert_eq!(
            s.steps[6].instr,
            Instr::Copy {
                srcs: vec!["a.sh".into(), "b/".into()],
                dest: "/app/".into(),
                chown: Some((1000, 100)),
                chmod: Some(0o755)
            }
        );
        assert_eq!(s.steps[0].args.get("VER").map(String::as_str), Some("3"));
    }

    #[test]
    fn substitution_and_build_args() {
        let mut ba = BTreeMap::new();
        ba.insert("DIR".to_string(), "/opt/x".to_string());
        let s = parse("ARG DIR=/default\nENV HOME2=${DIR}/h\nWORKDIR $DIR\nCOPY f ${NOPE:-/d}/\n", &ba).unwrap();
        assert_eq!(s.from, "host");
        assert_eq!(s.steps[0].instr, Instr::Env(vec![("HOME2".into(), "/opt/x/h".into())]));
        assert_eq!(s.steps[1].instr, Instr::Workdir("/opt/x".into()));
        assert!(matches!(&s.steps[2].instr, Instr::Copy { dest, .. } if dest == "/d/"));
        // RUN text is left to the shell.
        let s = parse("ARG DIR\nRUN echo $DIR\n", &ba).unwrap();
        assert_eq!(s.steps[0].instr, Instr::Run(Cmd::Shell("echo $DIR".into())));
        let e = parse("RUN true\n", &ba).unwrap_err();
        assert!(e.message.contains("not declared"), "{e}");
    }

    #[test]
    fn errors_name_the_line() {
        let e = p("FROM host\nRUN true\n\nEXPOSE 80\n").unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.to_string().starts_with("line 4: unsupported instruction EXPOSE"), "{e}");
        assert_eq!(p("RUN a \\\n  b\nFROM x\n").unwrap_err().line, 3);
        assert_eq!(p("FROM a AS b\n").unwrap_err().line, 1);
        assert_eq!(p("\n\nCOPY --from=x a b\n").unwrap_err().line, 3);
        assert_eq!(p("COPY ../etc/passwd /x\n").unwrap_err().line, 1);
        assert_eq!(p("COPY onlyone\n").unwrap_err().line, 1);
        assert_eq!(p("RUN\n").unwrap_err().line, 1);
        assert_eq!(p("RUN [\"unterminated\n").unwrap_err().line, 1);
        assert_eq!(p("ENV A=\"x\n").unwrap_err().line, 1);
        assert_eq!(p("ADD x y\n").unwrap_err().line, 1);
        assert_eq!(p("USER a b\n").unwrap_err().line, 1);
        assert_eq!(p("FROM a\nFROM b\n").unwrap_err().line, 2);
    }

    #[test]
    fn key_text_ignores_formatting() {
        let a = p("RUN [\"a\",  \"b\"]\n").unwrap();
        let b = p("# x\nrun [\"a\", \"b\"]\n").unwrap();
        assert_eq!(a.steps[0].key_text(), b.steps[0].key_text());
        let c = p("RUN [\"a\", \"c\"]\n").unwrap();
        assert_ne!(a.steps[0].key_text(), c.steps[0].key_text());
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,200}") {
            let _ = p(&s);
        }

        #[test]
        fn lines_are_real(lines in proptest::collection::vec("[A-Za-z]{0,8}( [a-z$\\\\\"'{}=\\[\\]]{0,12})?", 0..12)) {
            let text = lines.join("\n");
            let n = text.lines().count();
            if let Err(e) = p(&text) {
                prop_assert!(e.line <= n.max(1), "line {} of {}", e.line, n);
            }
        }

        #[test]
        fn shell_run_round_trips(cmd in "[a-z0-9 _./=-]{1,40}") {
            prop_assume!(!cmd.trim().is_empty());
            let s = p(&format!("RUN {cmd}\n")).unwrap();
            prop_assert_eq!(&s.steps[0].instr, &Instr::Run(Cmd::Shell(cmd.trim().to_string())));
        }

        #[test]
        fn env_values_round_trip(v in "[a-zA-Z0-9 _./-]{0,30}") {
            let s = p(&format!("ENV K=\"{v}\"\n")).unwrap();
            prop_assert_eq!(&s.steps[0].instr, &Instr::Env(vec![("K".into(), v.clone())]));
        }
    }
}
