//! Property-based fuzzing of everything that parses untrusted bytes: the agent channel's
//! frame codec, the agent protocol's JSON messages (both directions: the agent shares its box
//! with hostile code, the daemon's requests come from API callers), the HTTP API's request
//! bodies and the network policy parser.
//!
//! Properties: nothing panics on arbitrary input; whatever parses survives a
//! serialize/parse round trip unchanged; the codec never yields a frame above its limit.
//!
//! 512 cases per property by default, so this runs in seconds in CI. Run longer with
//! `PROPTEST_CASES=100000 cargo test -p glovebox-proto --test fuzz` (failures are saved
//! under `proptest-regressions/` and replayed first on the next run).

use std::net::Ipv4Addr;

use glovebox_proto::agent::{Event, Reply, Request};
use glovebox_proto::api::{
    CreateContext, CreateSandbox, ExecRequest, NetworkPolicy, RunCode, SetTimeout, SignalRequest, TimeBudget,
};
use glovebox_proto::frame::{self, Kind, MAX_FRAME};
use glovebox_proto::policy;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------

/// Every field name the wire types use, so random objects often hit real fields.
const FIELDS: &[&str] = &[
    "op",
    "cmd",
    "cwd",
    "env",
    "stdin",
    "timeout_ms",
    "max_output_bytes",
    "uid",
    "gid",
    "background",
    "raw",
    "id",
    "signal",
    "path",
    "mode",
    "parents",
    "depth",
    "recursive",
    "from",
    "to",
    "reply",
    "event",
    "version",
    "code",
    "message",
    "commands",
    "entries",
    "pid",
    "exit_code",
    "timed_out",
    "oom_killed",
    "stdout_truncated",
    "stderr_truncated",
    "stdout_bytes",
    "stderr_bytes",
    "duration_ms",
    "running",
    "exit",
    "name",
    "type",
    "size",
    "mtime",
    "target",
    "disk_used_bytes",
    "disk_total_bytes",
    "processes",
    "template",
    "timeout_s",
    "resources",
    "cpus",
    "memory_mb",
    "disk_mb",
    "pids",
    "metadata",
    "network",
    "allow",
    "deny",
    "stdin_base64",
    "encoding",
    "language",
    "context_id",
    "timeout_s",
];

/// Tag values and other strings with meaning somewhere in the protocol.
const WORDS: &[&str] = &[
    "exec",
    "ping",
    "attach",
    "session",
    "signal",
    "stdin",
    "close_stdin",
    "end_stdin",
    "list",
    "release",
    "read_file",
    "write_file",
    "end_data",
    "list_dir",
    "stat",
    "make_dir",
    "remove",
    "rename",
    "usage",
    "pong",
    "ok",
    "error",
    "commands",
    "file_info",
    "entries",
    "started",
    "exited",
    "utf8",
    "base64",
    "deny-all",
    "allow-list",
    "allow-all",
    "python",
    "javascript",
    "js",
    "node",
    "bash",
    "sh",
    "not_found",
    "no_space",
    "protocol",
    "file",
    "dir",
    "symlink",
    "other",
    "/",
    "..",
    "../../etc/passwd",
    "/proc/1/root",
    "/home/user",
    "",
    "\u{0}",
    "echo",
    "198.51.100.0/24",
    "198.51.100.7:443",
    "10.0.0.0/8",
    "*.pkg.test",
    "pkg.test:443,8443",
    "0.0.0.0/0",
    "::1",
    "256.1.1.1",
    "1.2.3.4/33",
    "a..b",
    "*.",
    "x:0",
    "x:65536",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![select(WORDS).prop_map(String::from), ".{0,12}", "[ -~]{0,24}"]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..70_000).prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(|f| json!(f)),
        Just(json!(u32::MAX)),
        Just(json!(-1)),
    ]
}

/// Values of the shapes fields take: scalars, string lists, string maps, and nesting.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        text().prop_map(Value::String),
        vec(text(), 0..4).prop_map(|v| json!(v)),
        btree_map(text(), text(), 0..3).prop_map(|m| json!(m)),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            vec((select(FIELDS).prop_map(String::from), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// An object of real field names (and the odd unknown one) with random values, optionally
/// tagged with `tag` = one of the protocol's words.
fn object(tag: Option<&'static str>) -> impl Strategy<Value = Value> {
    let fields = vec((prop_oneof![4 => select(FIELDS).prop_map(String::from), 1 => "[a-z_]{1,8}"], value()), 0..7);
    (fields, select(WORDS)).prop_map(move |(kv, word)| {
        let mut m: serde_json::Map<String, Value> = kv.into_iter().collect();
        if let Some(t) = tag {
            m.insert(t.to_string(), json!(word));
        }
        Value::Object(m)
    })
}

/// Arbitrary JSON-ish text: valid JSON, mutated JSON, or noise.
fn jsonish() -> impl Strategy<Value = String> {
    prop_oneof![
        object(Some("op")).prop_map(|v| v.to_string()),
        object(Some("reply")).prop_map(|v| v.to_string()),
        object(Some("event")).prop_map(|v| v.to_string()),
        object(None).prop_map(|v| v.to_string()),
        (object(Some("op")), any::<prop::sample::Index>(), "[\\[\\]{}\",:0-9a-z\\\\ ]{0,4}").prop_map(
            |(v, at, splice)| {
                let mut s = v.to_string();
                let i = at.index(s.len() + 1);
                let i = (0..=i).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
                s.insert_str(i, &splice);
                s
            }
        ),
        ".{0,64}",
    ]
}

/// Parses `s` as `T`; if that works, the value must survive a round trip unchanged.
fn round_trips<T>(s: &str) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = serde_json::from_str::<T>(s) {
        let wire = serde_json::to_string(&v).map_err(|e| TestCaseError::fail(format!("serialize {v:?}: {e}")))?;
        let back: T = serde_json::from_str(&wire)
            .map_err(|e| TestCaseError::fail(format!("{v:?} serialized as {wire} does not parse back: {e}")))?;
        prop_assert_eq!(&back, &v, "round trip through {}", wire);
        prop_assert_eq!(serde_json::to_string(&back).unwrap(), wire);
    }
    Ok(())
}

fn every_type(s: &str) -> Result<(), TestCaseError> {
    round_trips::<Request>(s)?;
    round_trips::<Reply>(s)?;
    round_trips::<Event>(s)?;
    round_trips::<CreateSandbox>(s)?;
    round_trips::<ExecRequest>(s)?;
    round_trips::<RunCode>(s)?;
    round_trips::<CreateContext>(s)?;
    round_trips::<SetTimeout>(s)?;
    round_trips::<SignalRequest>(s)?;
    round_trips::<NetworkPolicy>(s)?;
    Ok(())
}

fn kind() -> impl Strategy<Value = Kind> {
    select(vec![Kind::Json, Kind::Stdout, Kind::Stderr, Kind::Stdin, Kind::Data])
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// Random bytes: decode_all never panics, never returns a frame over the limit, and never
    /// claims to have used more bytes than it was given.
    #[test]
    fn frame_decode_never_panics(bytes in vec(any::<u8>(), 0..4096)) {
        if let Ok((frames, used)) = frame::decode_all(&bytes) {
            prop_assert!(used <= bytes.len());
            prop_assert!(frames.iter().all(|(_, p)| p.len() <= MAX_FRAME));
            prop_assert_eq!(frames.iter().map(|(_, p)| p.len() + 5).sum::<usize>(), used);
        }
    }

    /// Every 5-byte header either parses to a payload within the limit or is an error.
    #[test]
    fn frame_header_is_bounded(h in any::<[u8; 5]>()) {
        if let Ok((_, n)) = frame::parse_header(h) {
            prop_assert!(n <= MAX_FRAME);
        }
    }

    /// Encoded frames decode to exactly what was encoded, whatever follows them; a cut stream
    /// yields only the whole frames before the cut.
    #[test]
    fn frame_round_trip(
        frames in vec((kind(), vec(any::<u8>(), 0..2048)), 0..8),
        tail in vec(any::<u8>(), 0..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut wire = Vec::new();
        let mut ends = Vec::new();
        for (k, p) in &frames {
            wire.extend(frame::encode(*k, p).unwrap());
            ends.push(wire.len());
        }
        let (got, used) = frame::decode_all(&wire).unwrap();
        prop_assert_eq!(&got, &frames);
        prop_assert_eq!(used, wire.len());
        let c = cut.index(wire.len() + 1);
        let (got, used) = frame::decode_all(&wire[..c]).unwrap();
        let whole = ends.iter().filter(|e| **e <= c).count();
        prop_assert_eq!(got.len(), whole);
        prop_assert_eq!(used, if whole == 0 { 0 } else { ends[whole - 1] });
        // Trailing bytes that are not a whole header do not change what decodes.
        let mut more = wire.clone();
        more.extend(&tail);
        if let Ok((got, used)) = frame::decode_all(&more) {
            prop_assert!(got.len() >= frames.len());
            prop_assert!(used >= wire.len());
        }
    }

    /// Oversized payloads are refused when encoding, never silently truncated.
    #[test]
    fn frame_encode_refuses_oversized(extra in 1usize..4096) {
        prop_assert!(frame::header(Kind::Data, MAX_FRAME + extra).is_err());
        prop_assert!(frame::header(Kind::Data, MAX_FRAME).is_ok());
    }

    /// The agent protocol and the API bodies: arbitrary JSON-ish text never panics a parser,
    /// and whatever parses round-trips.
    #[test]
    fn messages_never_panic_and_round_trip(s in jsonish()) {
        every_type(&s)?;
    }

    /// Arbitrary bytes (not even UTF-8) through the byte-slice parsers the agent and daemon use.
    #[test]
    fn messages_from_raw_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        let _ = serde_json::from_slice::<Request>(&bytes);
        let _ = serde_json::from_slice::<Reply>(&bytes);
        let _ = serde_json::from_slice::<Event>(&bytes);
        let _ = serde_json::from_slice::<CreateSandbox>(&bytes);
        let _ = serde_json::from_slice::<ExecRequest>(&bytes);
        let _ = serde_json::from_slice::<RunCode>(&bytes);
    }

    /// Typed requests built from real field values round-trip (a denser search of the valid
    /// space than random objects).
    #[test]
    fn exec_requests_round_trip(
        cmd in prop_oneof![vec(text(), 1..4).prop_map(|v| json!(v)), text().prop_map(|s| json!(s))],
        env in btree_map("[A-Z_]{1,6}", text(), 0..3),
        timeout in proptest::option::of(0..=TimeBudget::MAX_MS),
        too_long in TimeBudget::MAX_MS + 1..,
        cap in proptest::option::of(any::<u64>()),
        background in any::<bool>(),
        enc in select(vec!["utf8", "base64"]),
    ) {
        let mut v = json!({ "cmd": cmd, "env": env, "background": background, "encoding": enc });
        if let Some(t) = timeout { v["timeout_ms"] = json!(t); }
        if let Some(c) = cap { v["max_output_bytes"] = json!(c); }
        let s = v.to_string();
        prop_assert!(serde_json::from_str::<ExecRequest>(&s).is_ok(), "valid exec request refused: {}", s);
        round_trips::<ExecRequest>(&s)?;
        let mut agent = v.clone();
        agent["op"] = json!("exec");
        agent.as_object_mut().unwrap().remove("encoding");
        agent.as_object_mut().unwrap().remove("max_output_bytes");
        round_trips::<Request>(&agent.to_string())?;
        // A budget beyond the longest a sandbox lives is refused when the request is read.
        v["timeout_ms"] = json!(too_long);
        prop_assert!(serde_json::from_str::<ExecRequest>(&v.to_string()).is_err(), "budget {} accepted", too_long);
    }

    /// Network policy rules: any strings parse or fail with a message; a parsed policy
    /// answers any verdict without panicking.
    #[test]
    fn network_policies_never_panic(
        mode in select(vec!["deny-all", "allow-list", "allow-all"]),
        allow in vec(text(), 0..6),
        deny in vec(text(), 0..4),
        ips in vec((any::<u32>(), any::<u16>()), 0..8),
        names in vec(text(), 0..4),
    ) {
        let p: NetworkPolicy = serde_json::from_value(json!({ "mode": mode, "allow": allow, "deny": deny })).unwrap();
        if let Ok(pol) = policy::parse(&p) {
            for (ip, port) in ips {
                let _ = pol.verdict(Ipv4Addr::from(ip), port);
            }
            for n in names {
                let _ = pol.allows_name(&n);
                let _ = pol.allows_name_port(&n, 443);
            }
            let _ = pol.proxied_ports();
            let _ = pol.needs_link();
        }
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    for depth in [100, 1_000, 100_000] {
        let s = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(serde_json::from_str::<Request>(&s).is_err());
        assert!(serde_json::from_str::<CreateSandbox>(&s).is_err());
        let obj = format!("{{\"op\":\"exec\",\"cmd\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        assert!(serde_json::from_str::<Request>(&obj).is_err());
    }
}
