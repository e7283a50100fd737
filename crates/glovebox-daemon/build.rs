//! Compiles the vendored Modal protocol (`proto/modal`, see its README) with `protox` (no
//! `protoc` binary) and generates Rust code with `tonic-prost-build` for the RPCs the daemon
//! serves only, and the messages and enums those reach: the client's service has ~300 RPCs
//! and ~650 messages, most of them for things Glovebox does not do. Every other RPC is
//! answered UNIMPLEMENTED by `src/modal/` before it reaches generated code.
//!
//! Also compiles the vendored sandboxd process protocol (`proto/sandboxd`, five RPCs, all
//! served by `src/sandboxd/`).

use std::collections::{BTreeSet, HashMap};

use prost_types::{DescriptorProto, FileDescriptorSet};

// `SERVED`: the RPCs served, per service (shared with `src/modal/`).
include!("src/modal/served.rs");

fn main() {
    let dir = "proto/modal";
    println!("cargo:rerun-if-changed={dir}");
    println!("cargo:rerun-if-changed=src/modal/served.rs");
    let mut fds = match protox::compile(["api.proto", "task_command_router.proto"], [dir]) {
        Ok(f) => f,
        Err(e) => panic!("compiling {dir}: {e:?}"),
    };
    prune(&mut fds);
    if let Err(e) = tonic_prost_build::configure().build_client(false).build_server(true).compile_fds(fds) {
        panic!("generating code for {dir}: {e}");
    }
    sandboxd();
}

fn sandboxd() {
    let dir = "proto/sandboxd";
    println!("cargo:rerun-if-changed={dir}");
    let fds = match protox::compile(["process/v1/process.proto"], [dir]) {
        Ok(f) => f,
        Err(e) => panic!("compiling {dir}: {e:?}"),
    };
    if let Err(e) = tonic_prost_build::configure().build_client(false).build_server(true).compile_fds(fds) {
        panic!("generating code for {dir}: {e}");
    }
}

/// Keeps the served methods, and the top-level messages and enums they reach (transitively,
/// through every field of a kept message and of its nested messages).
fn prune(fds: &mut FileDescriptorSet) {
    let mut messages: HashMap<String, DescriptorProto> = HashMap::new();
    for f in &fds.file {
        let pkg = f.package();
        for m in &f.message_type {
            messages.insert(format!(".{pkg}.{}", m.name()), m.clone());
        }
    }
    let mut want: Vec<String> = Vec::new();
    for f in &mut fds.file {
        let pkg = f.package().to_string();
        for s in &mut f.service {
            let full = format!("{pkg}.{}", s.name());
            let served: &[&str] = SERVED.iter().find(|(n, _)| *n == full).map_or(&[], |(_, m)| m);
            s.method.retain(|m| served.contains(&m.name()));
            for m in &s.method {
                want.push(m.input_type().to_string());
                want.push(m.output_type().to_string());
            }
            let kept: BTreeSet<&str> = s.method.iter().map(|m| m.name()).collect();
            for m in served {
                assert!(kept.contains(m), "{full}/{m} is not in the vendored protocol");
            }
        }
    }
    // Names are fully qualified (".pkg.Top.Nested"); a top-level type is kept whole.
    let top_of = |name: &str| -> String {
        for (k, _) in messages.iter() {
            if name == k || name.starts_with(&format!("{k}.")) {
                return k.clone();
            }
        }
        name.to_string()
    };
    let mut keep: BTreeSet<String> = BTreeSet::new();
    while let Some(n) = want.pop() {
        let top = top_of(&n);
        if !keep.insert(top.clone()) {
            continue;
        }
        if let Some(m) = messages.get(&top) {
            let mut stack = vec![m];
            while let Some(m) = stack.pop() {
                for f in &m.field {
                    if !f.type_name().is_empty() {
                        want.push(f.type_name().to_string());
                    }
                }
                stack.extend(m.nested_type.iter());
            }
        }
    }
    for f in &mut fds.file {
        // Source locations index the unpruned file (and the vendored files have no comments).
        f.source_code_info = None;
        if f.package().starts_with("google.") {
            continue;
        }
        let pkg = f.package().to_string();
        f.message_type.retain(|m| keep.contains(&format!(".{pkg}.{}", m.name())));
        f.enum_type.retain(|e| keep.contains(&format!(".{pkg}.{}", e.name())));
    }
}
