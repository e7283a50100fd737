//! The committed `docs/api/openapi.yaml` must be what the Rust types generate today: change
//! an API type without regenerating and this fails, saying how to regenerate.

use std::path::PathBuf;
use std::process::Command;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/api/openapi.yaml")
}

/// The first line where `a` and `b` differ, as "line N: -old / +new".
fn first_difference(committed: &str, fresh: &str) -> String {
    let (mut a, mut b) = (committed.lines(), fresh.lines());
    for n in 1.. {
        match (a.next(), b.next()) {
            (None, None) => break,
            (x, y) if x == y => continue,
            (x, y) => {
                return format!(
                    "line {n}:\n  committed: {}\n  generated: {}",
                    x.unwrap_or("<end>"),
                    y.unwrap_or("<end>")
                )
            }
        }
    }
    "only in line endings".into()
}

#[test]
fn committed_spec_matches_the_rust_types() {
    let path = committed_path();
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {} ({e}); run `{}`", path.display(), glovebox_openapi::REGENERATE));
    let fresh = glovebox_openapi::render().expect("generate the spec");
    assert!(
        committed == fresh,
        "docs/api/openapi.yaml is out of date with the API types (first difference at {}).\n\
         Run `{}` from the repository root and commit the result.",
        first_difference(&committed, &fresh),
        glovebox_openapi::REGENERATE
    );
}

#[test]
fn the_binary_prints_and_writes_the_same_document() {
    let bin = env!("CARGO_BIN_EXE_glovebox-openapi");
    let out = Command::new(bin).output().expect("run glovebox-openapi");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let fresh = glovebox_openapi::render().expect("generate the spec");
    assert_eq!(String::from_utf8(out.stdout).expect("utf-8"), fresh);

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("openapi-drift-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("openapi.yaml");
    let st = Command::new(bin).arg(&file).status().expect("run glovebox-openapi PATH");
    assert!(st.success());
    let written = std::fs::read_to_string(&file).expect("written file");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(written, fresh);
}
