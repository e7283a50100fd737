//! One set of error codes: the Rust enum (`glovebox_proto::api::ErrorCode`), the spec's
//! `ErrorCode` schema and the code tables of the Python and TypeScript SDKs (read from their
//! source) name exactly the same codes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use glovebox_proto::api::ErrorCode;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn enum_codes() -> BTreeSet<String> {
    ErrorCode::ALL.iter().map(|c| c.as_str().to_string()).collect()
}

/// The keys of the table that starts at the line containing `start` and ends at the first
/// line (after it) that starts with `}`; `key` extracts a key from one line.
fn table_keys(file: &str, start: &str, key: impl Fn(&str) -> Option<String>) -> BTreeSet<String> {
    let path = repo().join(file);
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut lines = src.lines().skip_while(|l| !l.contains(start));
    assert!(lines.next().is_some(), "no `{start}` in {file}");
    let keys: BTreeSet<String> = lines.take_while(|l| !l.starts_with('}')).filter_map(key).collect();
    assert!(!keys.is_empty(), "no keys read from `{start}` in {file}");
    keys
}

fn word(s: &str) -> Option<String> {
    (!s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c == '_')).then(|| s.to_string())
}

#[test]
fn the_python_sdk_knows_every_code_and_no_other() {
    let py = table_keys("sdk/python/src/glovebox/errors.py", "_BY_CODE: Dict", |l| {
        word(l.trim().strip_prefix('"')?.split_once("\":")?.0)
    });
    assert_eq!(py, enum_codes(), "sdk/python/src/glovebox/errors.py _BY_CODE");
}

#[test]
fn the_typescript_sdk_knows_every_code_and_no_other() {
    let ts = table_keys("sdk/typescript/src/errors.ts", "const BY_CODE", |l| word(l.trim().split_once(':')?.0));
    assert_eq!(ts, enum_codes(), "sdk/typescript/src/errors.ts BY_CODE");
}

#[test]
fn the_spec_publishes_every_code() {
    let spec = glovebox_openapi::spec().expect("spec");
    let schema = &spec["components"]["schemas"]["ErrorCode"];
    let mut published = BTreeSet::new();
    for v in schema["oneOf"].as_array().map(Vec::as_slice).unwrap_or_default() {
        for c in v["enum"].as_array().map(Vec::as_slice).unwrap_or_default() {
            published.insert(c.as_str().expect("a string code").to_string());
        }
    }
    for c in schema["enum"].as_array().map(Vec::as_slice).unwrap_or_default() {
        published.insert(c.as_str().expect("a string code").to_string());
    }
    assert_eq!(published, enum_codes(), "components/schemas/ErrorCode: {schema}");
    let detail = &spec["components"]["schemas"]["ErrorDetail"]["properties"]["code"];
    assert!(detail.to_string().contains("#/components/schemas/ErrorCode"), "ErrorDetail.code: {detail}");
}

#[test]
fn the_api_reference_lists_every_code() {
    let path = repo().join("docs/api.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let missing: Vec<String> = enum_codes().into_iter().filter(|c| !doc.contains(&format!("`{c}`"))).collect();
    assert!(missing.is_empty(), "docs/api.md's error table lacks {missing:?}");
}
