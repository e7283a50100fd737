//! The shape of the code, checked: no room (top-level module, with every file under it) of any
//! workspace crate imports (through `crate::` paths, `use` groups included) a room that imports
//! it back, directly or round a loop — a room's files may use each other, rooms may not; no
//! source file of any workspace crate is over 1,000 lines outside its tests, and none of the
//! daemon's manager's over 500. Test code (a trailing `#[cfg(test)]` module, `tests.rs`, `*_tests.rs`) is not counted:
//! tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The `.rs` files under `src`, test files (`tests.rs`, `*_tests.rs`) left out.
fn source_files(src: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && !is_test_file(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// A crate's modules: name (`a::b`, `""` for the root) → source without tests and comments.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for p in source_files(src) {
        let rel = p.strip_prefix(src).unwrap().with_extension("");
        let name = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .filter(|c| !matches!(c.as_str(), "mod" | "lib" | "main"))
            .collect::<Vec<_>>()
            .join("::");
        out.insert(name, code_only(&std::fs::read_to_string(&p).unwrap()));
    }
    out
}

fn is_test_file(p: &Path) -> bool {
    let stem = p.file_stem().unwrap().to_string_lossy();
    stem == "tests" || stem.ends_with("_tests")
}

/// Where a file's inline test module (`#[cfg(test)]` then `mod name {`) starts, if it has one.
fn tests_start(text: &str) -> Option<usize> {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let l = line.trim_end();
        if l == "#[cfg(test)]" || l.starts_with("#[cfg(all(test,") {
            // The attribute opens the test module if, past any further attributes, the next
            // item is `mod NAME {`.
            let mut rest = text[at + line.len()..].lines().skip_while(|n| n.starts_with("#["));
            if rest.next().is_some_and(|n| n.starts_with("mod ") && n.ends_with(" {")) {
                return Some(at);
            }
        }
        at += line.len();
    }
    None
}

/// The text before a file's inline test module, without `//` comments.
fn code_only(text: &str) -> String {
    let body = &text[..tests_start(text).unwrap_or(text.len())];
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path named after `crate::`, `use` groups expanded: `crate::{a::B, c::{d, e}}` gives
/// `a::B`, `c::d`, `c::e`.
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `glovebox_crate::` — not this crate
        }
        expand("", rest, &mut out);
    }
    out
}

/// Reads one path or group at the start of `s` under `prefix`; returns the bytes consumed.
fn expand(prefix: &str, s: &str, out: &mut Vec<String>) -> usize {
    let s_trim = s.trim_start();
    let skipped = s.len() - s_trim.len();
    if let Some(inner) = s_trim.strip_prefix('{') {
        let mut used = 1;
        let mut body = inner;
        loop {
            let b = body.trim_start();
            used += body.len() - b.len();
            body = b;
            if body.starts_with('}') {
                return skipped + used + 1;
            }
            if let Some(after) = body.strip_prefix(',') {
                used += 1;
                body = after;
                continue;
            }
            if body.is_empty() {
                return skipped + used;
            }
            let n = expand(prefix, body, out);
            if n == 0 {
                return skipped + used;
            }
            used += n;
            body = &body[n..];
        }
    }
    let seg_len = s_trim.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s_trim.len());
    if seg_len == 0 {
        if !prefix.is_empty() {
            out.push(prefix.to_string());
        }
        return skipped;
    }
    let seg = &s_trim[..seg_len];
    let path = match (seg, prefix.is_empty()) {
        ("self", _) => prefix.to_string(),
        (_, true) => seg.to_string(),
        (_, false) => format!("{prefix}::{seg}"),
    };
    let after = &s_trim[seg_len..];
    if let Some(next) = after.strip_prefix("::") {
        return skipped + seg_len + 2 + expand(&path, next, out);
    }
    out.push(path);
    skipped + seg_len
}

/// The module a path lands in: its longest prefix that is a module.
fn target<'a>(mods: &'a BTreeMap<String, String>, path: &str) -> Option<&'a str> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len()).rev().find_map(|i| mods.get_key_value(&segs[..i].join("::")).map(|(k, _)| k.as_str()))
}

/// The room a module belongs to: its first segment (`manager::create` is in `manager`).
fn room(m: &str) -> &str {
    m.split("::").next().unwrap_or(m)
}

/// Room → rooms its files import (the crate root, which declares every room, does not count).
fn edges(mods: &BTreeMap<String, String>) -> BTreeMap<&str, BTreeSet<&str>> {
    let mut g: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (m, text) in mods {
        if m.is_empty() {
            continue;
        }
        let from = room(m);
        g.entry(from).or_default();
        for p in crate_paths(text) {
            if let Some(t) = target(mods, &p).map(room) {
                if !t.is_empty() && t != from {
                    g.entry(from).or_default().insert(t);
                }
            }
        }
    }
    g
}

/// The groups of modules that reach each other (the strongly connected components of size > 1).
fn loops<'a>(g: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    let names: Vec<&str> = g.keys().copied().collect();
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(v) = todo.pop() {
            for &w in &g[v] {
                if seen.insert(w) {
                    todo.push(w);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = names.iter().map(|&n| (n, reach(n))).collect();
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for &a in &names {
        if placed.contains(a) || !reached[a].contains(a) {
            continue;
        }
        let group: Vec<&str> =
            names.iter().copied().filter(|&b| reached[a].contains(b) && reached[b].contains(a)).collect();
        placed.extend(group.iter().copied());
        out.push(group);
    }
    out
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[test]
fn no_crate_has_an_import_loop() {
    let mut found = Vec::new();
    for e in std::fs::read_dir(workspace()).unwrap() {
        let src = e.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mods = modules(&src);
        assert!(mods.len() > 1 || src.ends_with("glovebox-openapi/src"), "no modules read in {}", src.display());
        for l in loops(&edges(&mods)) {
            found.push(format!("{}: {}", src.display(), l.join(" ")));
        }
    }
    assert!(found.is_empty(), "modules that import each other round a loop:\n{}", found.join("\n"));
}

#[test]
fn source_files_stay_small() {
    let daemon = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (mut big, mut read) = (Vec::new(), 0);
    for e in std::fs::read_dir(workspace()).unwrap() {
        let src = e.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        for p in source_files(&src) {
            let text = std::fs::read_to_string(&p).unwrap();
            let lines = text[..tests_start(&text).unwrap_or(text.len())].lines().count();
            let rel = p.strip_prefix(&src).unwrap();
            let cap = if src == daemon && rel.starts_with("manager") { 500 } else { 1_000 };
            if lines > cap {
                big.push(format!("{} has {lines} lines outside its tests (cap {cap})", p.display()));
            }
            read += 1;
        }
    }
    assert!(read > 100, "only {read} source files read");
    assert!(big.is_empty(), "{}", big.join("\n"));
}

#[test]
fn the_loop_check_sees_loops_and_groups() {
    let mut mods = BTreeMap::new();
    mods.insert(
        "a".to_string(),
        code_only("#[cfg(test)]\nmod helpers;\nuse crate::{b::X, c::{self, Y}};\n// crate::d in a comment\n#[cfg(test)]\nmod tests {\n use crate::e;\n}\n"),
    );
    mods.insert("b".to_string(), "fn f() { crate::a::g(); }".to_string());
    mods.insert("c".to_string(), String::new());
    mods.insert("d".to_string(), "use crate::a;".to_string());
    mods.insert("e".to_string(), "use glovebox_crate::a;".to_string());
    let g = edges(&mods);
    assert_eq!(g["a"], BTreeSet::from(["b", "c"]));
    assert!(g["e"].is_empty(), "another crate's path is not ours");
    assert_eq!(loops(&g), vec![vec!["a", "b"]]);
    mods.insert("b".to_string(), String::new());
    assert!(loops(&edges(&mods)).is_empty());
    // A loop through a room's inner file is the room's loop.
    mods.insert("c::inner".to_string(), "use crate::d::Z;".to_string());
    assert_eq!(loops(&edges(&mods)), vec![vec!["a", "c", "d"]]);
}

#[test]
fn test_modules_are_found_behind_their_attributes() {
    let plain = "fn a() {}\n#[cfg(test)]\nmod tests {\n}\n";
    assert_eq!(tests_start(plain), Some(10));
    let gated = "fn a() {}\n#[cfg(all(test, target_arch = \"x86_64\"))]\n#[allow(x)]\nmod tests {\n}\n";
    assert_eq!(tests_start(gated), Some(10));
    assert_eq!(tests_start("#[cfg(test)]\nfn helper() {}\n"), None, "a gated function is code");
}
