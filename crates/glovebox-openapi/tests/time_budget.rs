//! One time budget: the spec publishes `TimeBudget`'s default and ceiling, on the type and on
//! both fields that take one, and an SDK that needs the default (the Python SDK sizes its
//! socket timeout by it) has the published one.

use std::path::PathBuf;

use glovebox_proto::api::TimeBudget;
use serde_json::Value;

fn spec() -> Value {
    glovebox_openapi::spec().expect("spec")
}

#[test]
fn the_spec_publishes_the_default_and_the_ceiling() {
    let s = spec();
    let t = &s["components"]["schemas"]["TimeBudget"];
    assert_eq!(t["default"], TimeBudget::DEFAULT.as_ms(), "{t}");
    assert_eq!(t["maximum"], TimeBudget::MAX_MS, "{t}");
    assert_eq!(t["minimum"], 0, "0 is a budget (no limit of its own): {t}");
    for body in ["ExecRequest", "RunCode"] {
        let f = &s["components"]["schemas"][body]["properties"]["timeout_ms"];
        assert_eq!(f["default"], TimeBudget::DEFAULT.as_ms(), "{body}.timeout_ms: {f}");
        assert!(f.to_string().contains("#/components/schemas/TimeBudget"), "{body}.timeout_ms: {f}");
    }
}

#[test]
fn the_python_sdk_sizes_calls_by_the_published_default() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../sdk/python/src/glovebox/sandbox.py");
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let line = src
        .lines()
        .find_map(|l| l.strip_prefix("DEFAULT_COMMAND_TIMEOUT = "))
        .expect("DEFAULT_COMMAND_TIMEOUT in sandbox.py");
    let secs: f64 = line.trim().parse().expect("a number of seconds");
    assert_eq!((secs * 1000.0) as u64, TimeBudget::DEFAULT.as_ms(), "sdk/python DEFAULT_COMMAND_TIMEOUT");
    assert!(!src.contains("60.0, _CELL_MARGIN"), "the cell calls use DEFAULT_COMMAND_TIMEOUT, not a literal");
}
