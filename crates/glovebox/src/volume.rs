//! `glovebox volume …`: disk-backed volumes with a size cap that outlive sandboxes (mount one
//! with `glovebox sandbox create --volume NAME:/path[:ro]`).

use anyhow::{bail, Result};
use clap::Subcommand;
use glovebox_proto::api::{CreateVolume, VolumeInfo, VolumeList, VolumeMount};
use reqwest::Method;

use crate::units;

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Create a volume; writes beyond its size fail with ENOSPC.
    Create {
        name: String,
        /// Size cap, e.g. 512M or 1G.
        #[arg(long)]
        size: String,
    },
    /// List your volumes.
    Ls,
    /// Delete a volume and its data (refused while a live sandbox mounts it).
    Rm { name: String },
}

pub async fn run(c: VolumeCmd) -> Result<i32> {
    let client = crate::remote()?;
    match c {
        VolumeCmd::Create { name, size } => {
            let req = CreateVolume { name, size_mb: units::size_mb(&size)? };
            let v: VolumeInfo = client.json(client.req(Method::POST, "/v1/volumes").json(&req)).await?;
            println!("{}", v.name);
        }
        VolumeCmd::Ls => {
            let l: VolumeList = client.json(client.req(Method::GET, "/v1/volumes")).await?;
            println!("{:<32} {:>10} {:>8} CREATED", "NAME", "SIZE_MB", "MOUNTED");
            for v in l.volumes {
                println!("{:<32} {:>10} {:>8} {}", v.name, v.size_mb, v.mounted_by, v.created_at);
            }
        }
        VolumeCmd::Rm { name } => {
            client.send(client.req(Method::DELETE, &format!("/v1/volumes/{}", crate::admin::urlenc(&name)))).await?;
            eprintln!("deleted {name}");
        }
    }
    Ok(0)
}

/// `NAME:/path` or `NAME:/path:ro` (the daemon checks the name and the path).
pub fn parse_mount(s: &str) -> Result<VolumeMount> {
    let (name, rest) = s.split_once(':').unwrap_or((s, ""));
    let (path, read_only) = match rest.strip_suffix(":ro") {
        Some(p) => (p, true),
        None => (rest.strip_suffix(":rw").unwrap_or(rest), false),
    };
    if name.is_empty() || path.is_empty() {
        bail!("--volume must be NAME:/path or NAME:/path:ro, got {s:?}");
    }
    Ok(VolumeMount { name: name.to_string(), path: path.to_string(), read_only })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_parse() {
        let m = parse_mount("data:/data:ro").unwrap();
        assert_eq!((m.name.as_str(), m.path.as_str(), m.read_only), ("data", "/data", true));
        let m = parse_mount("data:/home/user/w").unwrap();
        assert_eq!((m.path.as_str(), m.read_only), ("/home/user/w", false));
        assert!(!parse_mount("data:/x:rw").unwrap().read_only);
        assert!(parse_mount("data").is_err());
        assert!(parse_mount(":/data").is_err());
    }
}
