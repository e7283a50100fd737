//! `glovebox-openapi [PATH]`: prints the OpenAPI document (or writes it to PATH).

use std::io::Write;

use anyhow::{Context, Result};

fn main() -> Result<()> {
    let yaml = glovebox_openapi::render()?;
    match std::env::args_os().nth(1) {
        Some(p) if p == "-h" || p == "--help" => {
            println!(
                "usage: glovebox-openapi [PATH]   (default: stdout)\nregenerate: {}",
                glovebox_openapi::REGENERATE
            );
        }
        Some(p) => std::fs::write(&p, yaml).with_context(|| format!("write {}", p.to_string_lossy()))?,
        None => std::io::stdout().lock().write_all(yaml.as_bytes()).context("write stdout")?,
    }
    Ok(())
}
