//! A sandbox's network as the manager drives it: the link (veth, firewall, resolver, proxy)
//! when a policy needs one, the CA when one brokers credentials, and live policy updates.

use std::fs;
use std::sync::Arc;

use glovebox_proto::api::NetworkPolicy;
use glovebox_proto::policy::Policy;

use super::agent::write_file;
use super::{Manager, Sb};
use crate::error::{Error, Result};
use crate::util::lock;

/// The sandbox CA certificate alone (for `NODE_EXTRA_CA_CERTS`, which adds to Node's roots).
pub const SANDBOX_CA: &str = "/etc/glovebox/sandbox-ca.pem";

impl Manager {
    /// Has the packet audit tell `egress` of the slot's packets, from its first one on.
    fn watch_packets(&self, slot: u32, egress: &Arc<crate::egress::Egress>) {
        let egress = Arc::downgrade(egress);
        self.net.watch(
            slot,
            Arc::new(move |p: &crate::net::Logged| {
                if let Some(e) = egress.upgrade() {
                    e.packet(p);
                }
            }),
        );
    }

    /// Attaches `policy` to a sandbox just booted in a namespace linked ahead (its rules in
    /// one nf_tables commit). Blocking: runs on the boot's thread.
    pub(super) fn attach_ahead(
        &self,
        b: &super::pools::Booted,
        policy: &Policy,
        egress: &Arc<crate::egress::Egress>,
    ) -> Result<()> {
        let slot = b.host.slot();
        self.watch_packets(slot, egress);
        self.net.attach(slot, b.host.pid(), policy, true)
    }

    /// After [`Self::attach_ahead`]: the sandbox is linked; its resolver and proxy start.
    pub(crate) fn linked(&self, sb: &Arc<Sb>) -> Result<()> {
        lock(&sb.net.current).linked = true;
        crate::egress::spawn_services(sb.slot(), sb.egress.clone(), sb.net.services_stop.clone())
    }

    /// Gives a sandbox its network link, resolver and DNS forwarder (see `net`).
    pub(crate) async fn link(&self, sb: &Arc<Sb>, policy: &Policy) -> Result<()> {
        let (slot, pid, ahead) = (sb.slot(), sb.pid, sb.host.linked_ahead());
        let p = policy.clone();
        let net = self.net.clone();
        self.watch_packets(slot, &sb.egress);
        let attach = async move {
            tokio::task::spawn_blocking(move || net.attach(slot, pid, &p, ahead))
                .await
                .map_err(|e| Error::Internal(format!("network task: {e}")))?
        };
        // A sandbox linked ahead got its resolv.conf at boot. For another, the resolver's
        // address is known before the link exists: the agent writes it while the link is made.
        let written = async {
            if ahead {
                return Ok(());
            }
            write_file(sb, "/etc/resolv.conf", crate::net::resolv_conf(slot).as_bytes()).await
        };
        let (linked, written) = tokio::join!(attach, written);
        linked?;
        lock(&sb.net.current).linked = true;
        written?;
        crate::egress::spawn_services(slot, sb.egress.clone(), sb.net.services_stop.clone())
    }

    /// Gives the sandbox its CA (first brokering policy): the CA certificate goes into its
    /// system bundle (the host's bundle plus the CA) and `/etc/glovebox/sandbox-ca.pem`, and
    /// commands get the variables Python, Node and curl read. The CA key stays here.
    async fn install_ca(&self, sb: &Arc<Sb>) -> Result<()> {
        let (ca, new) = sb.egress.ensure_ca(&sb.id).map_err(|e| Error::Internal(format!("sandbox CA: {e}")))?;
        if !new {
            return Ok(());
        }
        let mut bundle = fs::read(crate::broker::SYSTEM_BUNDLE).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca.cert_pem().as_bytes());
        write_file(sb, crate::broker::SYSTEM_BUNDLE, &bundle).await?;
        write_file(sb, SANDBOX_CA, ca.cert_pem().as_bytes()).await?;
        let mut env = lock(&sb.net.trust_env);
        for k in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"] {
            env.insert(k.into(), crate::broker::SYSTEM_BUNDLE.into());
        }
        env.insert("NODE_EXTRA_CA_CERTS".into(), SANDBOX_CA.into());
        Ok(())
    }

    /// Sets up what a policy needs beyond the link (the CA for brokering).
    pub(crate) async fn prepare(&self, sb: &Arc<Sb>, policy: &Policy) -> Result<()> {
        if policy.brokers() {
            self.install_ca(sb).await?;
        }
        Ok(())
    }

    /// Replaces a sandbox's network policy, atomically; connections the new policy does not
    /// allow are reset.
    pub async fn set_network(&self, id: &str, np: NetworkPolicy) -> Result<Arc<Sb>> {
        let sb = self.get(id)?;
        let policy = glovebox_proto::policy::parse(&np).map_err(Error::Invalid)?;
        // One change at a time (the first link is made once; the rules, the proxy's policy
        // and the record end as one change left them).
        let one = sb.net.changing.lock().await;
        // A destroy that came meanwhile waited for any change under way, then released the
        // link as it found it: a change after it would link a dead sandbox.
        self.get(id)?;
        // A change that writes into the sandbox (its resolver's address with a first link,
        // its CA for brokering) needs its processes: a paused sandbox is resumed first, as
        // for any request that reaches them (and a pause waits for a change under way).
        if (policy.needs_link() && !sb.net.linked()) || policy.brokers() {
            self.wake_for_request(&sb)?;
        }
        crate::egress::Egress::check_secrets(&self.secrets, &sb.tenant, &policy).map_err(Error::Invalid)?;
        let applied = async {
            self.prepare(&sb, &policy).await?;
            if !sb.net.linked() {
                if policy.needs_link() {
                    self.link(&sb, &policy).await?;
                }
            } else {
                let (slot, p, net) = (sb.slot(), policy.clone(), self.net.clone());
                tokio::task::spawn_blocking(move || net.apply(slot, &p, false))
                    .await
                    .map_err(|e| Error::Internal(format!("network task: {e}")))??;
            }
            Ok::<_, Error>(())
        };
        // Destroyed meanwhile (its agent and namespace gone under the change): that is the
        // answer, not what the change tripped on.
        applied.await.map_err(|e| self.unless_gone(id, e))?;
        sb.egress.set_policy(policy);
        lock(&sb.net.current).policy = np.redacted();
        if let Err(e) = self.store.set_config(&sb.id, &sb.config()) {
            tracing::error!(sandbox = %sb.id, "store network: {e}");
        }
        drop(one);
        Ok(sb)
    }
}
