//! Claims as the API server keeps them: a `SandboxClaim` read into the core's
//! [`ClaimView`], and the writes of a pass as patches — the finalizer (a merge patch carrying
//! the resourceVersion it was decided on, so a concurrent change is refused rather than
//! overwritten), the binding annotations, and the `Ready` condition on the status
//! subresource (the other conditions kept as they are).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::router;
use super::Error;
use crate::crd::{
    SandboxClaim, ASSIGNED_NAME_ANNOTATION, BOUND_AT_ANNOTATION, FINALIZER, NODE_ANNOTATION, SANDBOX_ANNOTATION,
};
use crate::driver::ClaimStore;
use crate::reconcile::{Backing, Binding, ClaimView, ReadyState, Report};

/// The field manager of every write (server-side apply and patches).
pub const MANAGER: &str = "glovebox-controller";

/// The claim as the core sees it.
pub fn view_of(claim: &SandboxClaim, backing: Backing) -> Result<ClaimView, Error> {
    let m = &claim.metadata;
    let uid = m.uid.clone().ok_or_else(|| Error::Malformed(format!("claim {} has no uid", claim.name_any())))?;
    let ann = m.annotations.clone().unwrap_or_default();
    let binding = match (ann.get(NODE_ANNOTATION), ann.get(SANDBOX_ANNOTATION)) {
        (Some(node), Some(sandbox)) if !node.is_empty() && !sandbox.is_empty() => Some(Binding {
            node: node.clone(),
            sandbox: sandbox.clone(),
            bound_at: ann.get(BOUND_AT_ANNOTATION).and_then(|t| Timestamp::from_str(t).ok()).map(SystemTime::from),
        }),
        _ => None,
    };
    let ready = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| ReadyState { ready: c.status == "True", reason: c.reason.clone(), message: c.message.clone() });
    Ok(ClaimView {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        uid,
        deleting: m.deletion_timestamp.is_some(),
        finalized: claim.finalizers().iter().any(|f| f == FINALIZER),
        backing,
        env: claim.spec.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
        binding,
        ready,
    })
}

/// `conditions` with `Ready` set to `report` (its transition time kept when its status
/// does not change).
pub fn with_ready(
    conditions: &[Condition],
    report: &Report,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let status = if report.ready { "True" } else { "False" };
    let mut out: Vec<Condition> = conditions.iter().filter(|c| c.type_ != "Ready").cloned().collect();
    let since = conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    out.push(Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: report.reason.into(),
        message: report.message.clone(),
        observed_generation: generation,
        last_transition_time: since,
    });
    out
}

/// One claim's writes (the object as this pass read it).
pub struct KubeClaims {
    pub client: Client,
    pub claim: Arc<SandboxClaim>,
    /// The router's ports on every claim's Service.
    pub ports: Vec<(String, u16)>,
}

impl KubeClaims {
    fn api(&self) -> Api<SandboxClaim> {
        Api::namespaced(self.client.clone(), &self.claim.namespace().unwrap_or_default())
    }

    async fn set_finalizers(&self, finalizers: Vec<String>) -> Result<(), Error> {
        let patch = json!({ "metadata": {
            "finalizers": finalizers,
            "resourceVersion": self.claim.resource_version(),
        }});
        self.api().patch(&self.claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }
}

impl ClaimStore for KubeClaims {
    type Error = Error;

    async fn add_finalizer(&self, _: &ClaimView) -> Result<(), Error> {
        let mut f = self.claim.finalizers().to_vec();
        f.push(FINALIZER.to_string());
        self.set_finalizers(f).await
    }

    async fn remove_finalizer(&self, _: &ClaimView) -> Result<(), Error> {
        let f = self.claim.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
        self.set_finalizers(f).await
    }

    async fn bind(&self, claim: &ClaimView, b: &Binding, address: &str) -> Result<(), Error> {
        // The router's way in first: a crash before the annotations leaves a sandbox the next
        // pass adopts, and binding it again applies the same objects.
        router::publish(&self.client, &self.claim, &claim.sandbox_name(), address, &self.ports).await?;
        let at = b.bound_at.and_then(|t| Timestamp::try_from(t).ok()).unwrap_or_else(Timestamp::now);
        let ann: BTreeMap<&str, String> = BTreeMap::from([
            (NODE_ANNOTATION, b.node.clone()),
            (SANDBOX_ANNOTATION, b.sandbox.clone()),
            (BOUND_AT_ANNOTATION, at.to_string()),
            (ASSIGNED_NAME_ANNOTATION, claim.sandbox_name()),
        ]);
        let patch = json!({ "metadata": { "annotations": ann } });
        self.api().patch(&claim.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }

    async fn report(&self, claim: &ClaimView, report: &Report) -> Result<(), Error> {
        let existing = self.claim.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let conditions = with_ready(existing, report, self.claim.metadata.generation, Timestamp::now());
        let mut status = json!({ "conditions": conditions });
        // The router's id for the sandbox, once there is one; no pod IPs (see crd.rs).
        if claim.binding.is_some() || report.ready {
            status["sandbox"] = json!({ "name": claim.sandbox_name() });
        }
        let patch = json!({ "status": status });
        self.api().patch_status(&claim.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        tracing::info!(claim = %claim.name, namespace = %claim.namespace, ready = report.ready,
            reason = report.reason, "{}", report.message);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(v: serde_json::Value) -> SandboxClaim {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_bound_claim_reads_back() {
        let c = claim(json!({
            "metadata": {"name": "c1", "namespace": "ns", "uid": "u1", "generation": 1,
                "finalizers": ["glovebox.dev/sandbox"],
                "annotations": {"glovebox.dev/node": "n2", "glovebox.dev/sandbox-id": "k3v9x",
                                "glovebox.dev/bound-at": "2026-12-02T07:31:00Z"}},
            "spec": {"warmPoolRef": {"name": "p"}, "env": [{"name": "A", "value": "1"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "SandboxReady",
                "message": "m", "lastTransitionTime": "2026-12-02T07:31:01Z"}]}
        }));
        let v = view_of(&c, Backing::NotGlovebox).unwrap();
        assert!(v.finalized && !v.deleting);
        let b = v.binding.unwrap();
        assert_eq!((b.node.as_str(), b.sandbox.as_str()), ("n2", "k3v9x"));
        assert!(b.bound_at.is_some());
        assert_eq!(v.ready.unwrap().reason, "SandboxReady");
        assert_eq!(v.env, vec![("A".to_string(), "1".to_string())]);
        let no_uid = claim(json!({"metadata": {"name": "c"}, "spec": {"warmPoolRef": {"name": "p"}}}));
        assert!(view_of(&no_uid, Backing::NotGlovebox).is_err());
    }

    #[test]
    fn ready_replaces_only_ready_and_keeps_its_transition_time() {
        let t0: Timestamp = "2026-12-02T07:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-12-02T08:00:00Z".parse().unwrap();
        let other = Condition {
            type_: "Finished".into(),
            status: "False".into(),
            reason: "x".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(t0),
        };
        let yes = Report { ready: true, reason: "SandboxReady", message: "on n1".into() };
        let first = with_ready(std::slice::from_ref(&other), &yes, Some(3), t0);
        assert_eq!(first.len(), 2);
        let again = with_ready(&first, &Report { message: "on n1, again".into(), ..yes.clone() }, Some(3), t1);
        let ready = again.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.last_transition_time, Time(t0), "status unchanged: same transition time");
        assert_eq!(ready.observed_generation, Some(3));
        let lost = Report { ready: false, reason: "NodeLost", message: "gone".into() };
        let flipped = with_ready(&again, &lost, Some(3), t1);
        let ready = flipped.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!((ready.status.as_str(), ready.last_transition_time.clone()), ("False", Time(t1)));
        assert!(flipped.iter().any(|c| c.type_ == "Finished"), "others kept");
    }
}
