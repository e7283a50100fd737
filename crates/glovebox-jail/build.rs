//! Builds the gVisor sandboxes' compatibility shim (`gvisor/compat.c`, see its header) into
//! `$OUT_DIR/gvisor-compat.so`, which `gvisor` embeds. x86_64 only; elsewhere the file is
//! empty and no shim is installed.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "gvisor/compat.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("gvisor-compat.so");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        std::fs::write(&out, b"").expect("write empty shim");
        return;
    }
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-O2",
            "-fPIC",
            "-shared",
            "-nostdlib",
            "-fno-stack-protector",
            "-Wl,-z,now",
            "-Wl,--hash-style=both",
            "-o",
        ])
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("run {cc:?} for {src}: {e}"));
    assert!(status.success(), "{cc:?} failed to build {src}");
}
