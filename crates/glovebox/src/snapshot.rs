//! `glovebox snapshot …`: list and delete snapshots (take one with `glovebox sandbox snapshot
//! ID NAME`, start from one with `glovebox sandbox create --snapshot NAME`).

use anyhow::Result;
use clap::Subcommand;
use glovebox_proto::api::SnapshotList;
use reqwest::Method;

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// List your snapshots.
    Ls,
    /// Delete a snapshot (sandboxes started from it keep running; its files go with the last).
    Rm { name: String },
}

pub async fn run(c: SnapshotCmd) -> Result<i32> {
    let client = crate::remote()?;
    match c {
        SnapshotCmd::Ls => {
            let l: SnapshotList = client.json(client.req(Method::GET, "/v1/snapshots")).await?;
            println!("{:<32} {:<20} {:>12} {:>9} CREATED", "NAME", "TEMPLATE", "BYTES", "SANDBOXES");
            for s in l.snapshots {
                println!("{:<32} {:<20} {:>12} {:>9} {}", s.name, s.template, s.size_bytes, s.sandboxes, s.created_at);
            }
        }
        SnapshotCmd::Rm { name } => {
            client.send(client.req(Method::DELETE, &format!("/v1/snapshots/{}", crate::admin::urlenc(&name)))).await?;
            eprintln!("deleted {name}");
        }
    }
    Ok(0)
}
