//! `glovebox keys …`, `glovebox quota …`, `glovebox usage`: tenants, their API keys and
//! quotas (admin key), and metered usage.

use anyhow::Result;
use clap::Subcommand;
use glovebox_proto::api::{CreateKey, CreatedKey, KeyList, TenantQuota, UsageReport};
use reqwest::Method;

use crate::units;

#[derive(Subcommand)]
pub enum KeysCmd {
    /// Make an API key for a tenant (printed once; only its digest is stored).
    Create {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        name: Option<String>,
    },
    /// List keys (never the keys themselves).
    Ls,
    /// Revoke a key by id: it stops working at once.
    Revoke { id: String },
}

#[derive(Subcommand)]
pub enum QuotaCmd {
    /// Set a tenant's quotas (flags not given mean no limit).
    Set {
        tenant: String,
        #[arg(long)]
        max_sandboxes: Option<u32>,
        /// Total memory of running sandboxes, e.g. `8G`.
        #[arg(long)]
        max_memory: Option<String>,
        #[arg(long)]
        max_cpus: Option<f64>,
        #[arg(long)]
        creates_per_minute: Option<u32>,
    },
    Get {
        tenant: String,
    },
}

pub async fn keys(c: KeysCmd) -> Result<i32> {
    let client = crate::remote()?;
    match c {
        KeysCmd::Create { tenant, name } => {
            let k: CreatedKey =
                client.json(client.req(Method::POST, "/v1/keys").json(&CreateKey { tenant, name })).await?;
            eprintln!("created key {} for tenant {} (shown once; store it now)", k.info.id, k.info.tenant);
            println!("{}", k.key);
        }
        KeysCmd::Ls => {
            let l: KeyList = client.json(client.req(Method::GET, "/v1/keys")).await?;
            println!("{:<18} {:<20} {:<12} {:<26} STATUS", "ID", "TENANT", "PREFIX", "CREATED");
            for k in l.keys {
                let status = match &k.revoked_at {
                    Some(t) => format!("revoked {t}"),
                    None => "active".into(),
                };
                println!("{:<18} {:<20} {:<12} {:<26} {status}", k.id, k.tenant, k.prefix, k.created_at);
            }
        }
        KeysCmd::Revoke { id } => {
            let _: serde_json::Value =
                client.json(client.req(Method::DELETE, &format!("/v1/keys/{}", urlenc(&id)))).await?;
            eprintln!("revoked {id}");
        }
    }
    Ok(0)
}

pub async fn quota(c: QuotaCmd) -> Result<i32> {
    let client = crate::remote()?;
    let q: TenantQuota = match c {
        QuotaCmd::Set { tenant, max_sandboxes, max_memory, max_cpus, creates_per_minute } => {
            let q = TenantQuota {
                max_sandboxes,
                max_memory_mb: max_memory.as_deref().map(units::size_mb).transpose()?,
                max_cpus,
                creates_per_minute,
            };
            client.json(client.req(Method::PUT, &format!("/v1/tenants/{}/quota", urlenc(&tenant))).json(&q)).await?
        }
        QuotaCmd::Get { tenant } => {
            client.json(client.req(Method::GET, &format!("/v1/tenants/{}/quota", urlenc(&tenant)))).await?
        }
    };
    println!("{}", serde_json::to_string_pretty(&q)?);
    Ok(0)
}

pub async fn usage(tenant: Option<String>) -> Result<i32> {
    let client = crate::remote()?;
    let mut rb = client.req(Method::GET, "/v1/usage");
    if let Some(t) = &tenant {
        rb = rb.query(&[("tenant", t)]);
    }
    let r: UsageReport = client.json(rb).await?;
    println!(
        "{:<20} {:>9} {:>12} {:>14} {:>12} {:>12} {:>12}",
        "TENANT", "SANDBOXES", "CPU-S", "MEM-GIB-S", "WALL-S", "EGRESS-UP", "EGRESS-DOWN"
    );
    for t in r.tenants {
        let u = &t.usage;
        println!(
            "{:<20} {:>9} {:>12.2} {:>14.3} {:>12.1} {:>12} {:>12}",
            t.tenant,
            t.sandboxes,
            u.cpu_seconds,
            u.memory_gib_seconds,
            u.wall_seconds,
            u.egress_bytes_up,
            u.egress_bytes_down
        );
    }
    Ok(0)
}

pub fn urlenc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
