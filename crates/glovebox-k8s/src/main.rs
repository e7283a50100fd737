//! `glovebox-controller`: serves agent-sandbox `SandboxClaim`s whose template is Glovebox's
//! (runtimeClassName `glovebox`) with sandboxes on the cluster's Glovebox nodes. It reads
//! the in-cluster service account (or `KUBECONFIG`) and `GLOVEBOX_API_KEY`, the key every
//! node's daemon takes. See docs/scale-out.md.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use glovebox_k8s::controller::leader::{run_elected, LeaseConfig};
use glovebox_k8s::controller::{self, Config};
use glovebox_k8s::daemon::HttpDaemons;

#[derive(Parser, Debug)]
#[command(name = "glovebox-controller", version, about)]
struct Args {
    /// Serve the claims of this namespace only (default: every namespace).
    #[arg(long, env = "GLOVEBOX_CLAIMS_NAMESPACE")]
    namespace: Option<String>,
    /// Namespace of the Glovebox DaemonSet's pods.
    #[arg(long, default_value = "glovebox-system")]
    daemon_namespace: String,
    /// Label selector of the daemon pods.
    #[arg(long, default_value = "app.kubernetes.io/name=glovebox")]
    daemon_selector: String,
    /// The daemon's API port on its pod.
    #[arg(long, default_value_t = 7171)]
    daemon_port: u16,
    /// Ports of each claim's Service, as name=port, comma separated: what the router dials
    /// (the SDK's server_port, 8888 by default: the python-runtime API of sandboxd).
    #[arg(long, default_value = "http=8888")]
    router_ports: String,
    /// Seconds between two looks at every node.
    #[arg(long, default_value_t = 5.0)]
    refresh_s: f64,
    /// Seconds a node may be silent before its claims are told it is lost.
    #[arg(long, default_value_t = 30.0)]
    node_grace_s: f64,
    /// Seconds a sandbox no claim holds is left alone before it is destroyed.
    #[arg(long, default_value_t = 60.0)]
    orphan_age_s: f64,
    /// Seconds a call to a daemon may take (a create may boot a sandbox).
    #[arg(long, default_value_t = 30.0)]
    daemon_timeout_s: f64,
    #[arg(long, env = "GLOVEBOX_API_KEY", hide_env_values = true)]
    api_key: String,
    /// This replica's name in the leader Lease (the pod's name, from the downward API).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Where the leader Lease is: namespace (the pod's own) and name.
    #[arg(long, env = "POD_NAMESPACE", default_value = "glovebox-system")]
    lease_namespace: String,
    #[arg(long, default_value = "glovebox-controller")]
    lease_name: String,
}

fn ports(s: &str) -> anyhow::Result<Vec<(String, u16)>> {
    let mut out = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, port) = p.split_once('=').with_context(|| format!("router port {p:?}: name=port"))?;
        out.push((name.to_string(), port.parse().with_context(|| format!("router port {p:?}"))?));
    }
    if out.is_empty() {
        bail!("--router-ports: at least one");
    }
    Ok(out)
}

fn seconds(v: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v).map_err(|_| anyhow::anyhow!("{what}: {v} is not a number of seconds"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GLOVEBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let a = Args::parse();
    let cfg = Config {
        namespace: a.namespace,
        daemon_namespace: a.daemon_namespace,
        daemon_selector: a.daemon_selector,
        daemon_port: a.daemon_port,
        router_ports: ports(&a.router_ports)?,
        refresh: seconds(a.refresh_s, "--refresh-s")?,
        grace: seconds(a.node_grace_s, "--node-grace-s")?,
        orphan_age: seconds(a.orphan_age_s, "--orphan-age-s")?,
    };
    let daemons = HttpDaemons::new(a.api_key, seconds(a.daemon_timeout_s, "--daemon-timeout-s")?)?;
    let client = kube::Client::try_default().await.context("kubernetes client (in-cluster or KUBECONFIG)")?;
    // Only the replica holding the Lease reconciles; the others wait to take over.
    let identity = match a.identity.filter(|i| !i.is_empty()) {
        Some(i) => i,
        None => std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).context("--identity (or POD_NAME)")?,
    };
    let lease = LeaseConfig::new(a.lease_namespace, a.lease_name, identity);
    run_elected(client.clone(), lease, || controller::run(client, daemons, cfg)).await?;
    Ok(())
}
