//! The agent-sandbox objects the controller reads and writes, as far as it uses them:
//! `SandboxClaim`, `SandboxWarmPool` and `SandboxTemplate` of
//! `extensions.agents.x-k8s.io/v1beta1` (kubernetes-sigs/agent-sandbox, checked at commit
//! 2fd412d5). Fields it does not use are not modelled; serde skips them on read, and the
//! controller never writes a whole object back (only merge patches of what it owns), so
//! nothing it does not know is lost.
//!
//! Also here: how a pool is marked as Glovebox's, and the annotations the controller keeps on
//! a claim it serves.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};

/// API group of claims, templates and warm pools (the core `Sandbox` is `agents.x-k8s.io`).
pub const GROUP: &str = "extensions.agents.x-k8s.io";
pub const VERSION: &str = "v1beta1";

/// The mark: a `SandboxTemplate` whose pod template names this RuntimeClass is served by
/// Glovebox, and so is every warm pool and claim that leads to it. A RuntimeClass rather
/// than an annotation because it fails closed: if another controller (agent-sandbox's own,
/// run with `--extensions`) makes a pod from the template anyway, no node has a `glovebox`
/// runtime handler, so the pod never runs the untrusted code in a plain container.
pub const RUNTIME_CLASS: &str = "glovebox";

/// On the template: the Glovebox template sandboxes start from (`base` when absent).
pub const TEMPLATE_ANNOTATION: &str = "glovebox.dev/template";
/// On the template: the sandbox lifetime in seconds (the daemon's default when absent).
pub const TIMEOUT_ANNOTATION: &str = "glovebox.dev/timeout-seconds";

/// On a claim: the finalizer that holds its deletion until its sandbox is destroyed.
pub const FINALIZER: &str = "glovebox.dev/sandbox";
/// On a claim: the Glovebox node holding its sandbox.
pub const NODE_ANNOTATION: &str = "glovebox.dev/node";
/// On a claim: the Glovebox sandbox id.
pub const SANDBOX_ANNOTATION: &str = "glovebox.dev/sandbox-id";
/// On a claim: when the sandbox was bound to it (RFC 3339), to tell a sandbox that ended
/// from one a node's listing has not caught up with yet.
pub const BOUND_AT_ANNOTATION: &str = "glovebox.dev/bound-at";
/// agent-sandbox's own annotation naming the sandbox a claim adopted (the router's id).
pub const ASSIGNED_NAME_ANNOTATION: &str = "agents.x-k8s.io/sandbox-name";

/// Metadata the controller puts on every Glovebox sandbox it creates: who made it, for which
/// claim, and the name the router reaches it by (the daemon's sandboxd front-end resolves
/// `{name}.{namespace}.svc…` Host headers with these).
pub const META_MANAGED_BY: &str = "glovebox.dev/managed-by";
pub const MANAGED_BY: &str = "glovebox-controller";
pub const META_CLAIM_UID: &str = "glovebox.dev/claim-uid";
pub const META_CLAIM: &str = "glovebox.dev/claim";
pub const META_SANDBOX_NAME: &str = "agents.x-k8s.io/sandbox-name";
pub const META_NAMESPACE: &str = "agents.x-k8s.io/namespace";

macro_rules! namespaced_resource {
    ($ty:ident, $kind:literal, $plural:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(GROUP)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(VERSION)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SandboxClaim {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: ClaimSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ClaimStatus>,
}
namespaced_resource!(SandboxClaim, "SandboxClaim", "sandboxclaims");

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSpec {
    pub warm_pool_ref: NameRef,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NameRef {
    pub name: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClaimStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<ClaimSandboxStatus>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSandboxStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Left empty for Glovebox sandboxes: a pod IP would send the router to the node without
    /// the sandbox's name (see docs/scale-out.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SandboxWarmPool {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: WarmPoolSpec,
}
namespaced_resource!(SandboxWarmPool, "SandboxWarmPool", "sandboxwarmpools");

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmPoolSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(rename = "sandboxTemplateRef")]
    pub template_ref: NameRef,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SandboxTemplate {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: TemplateSpec,
}
namespaced_resource!(SandboxTemplate, "SandboxTemplate", "sandboxtemplates");

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateSpec {
    pub pod_template: PodTemplate,
    /// `Disallowed` (the default), `Allowed` or `Overrides`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars_injection_policy: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PodTemplate {
    pub spec: PodSpec,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn paths_are_agent_sandboxs() {
        assert_eq!(
            SandboxClaim::url_path(&(), Some("team-a")),
            "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/team-a/sandboxclaims"
        );
        assert_eq!(SandboxWarmPool::plural(&()), "sandboxwarmpools");
        assert_eq!(SandboxTemplate::api_version(&()), "extensions.agents.x-k8s.io/v1beta1");
    }

    #[test]
    fn reads_a_claim_as_the_sdk_writes_it() {
        // The shape k8s-agent-sandbox's create_sandbox_claim sends, with fields we ignore.
        let claim: SandboxClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": "sandbox-claim-1a2b3c4d", "namespace": "default", "uid": "u-1",
                          "labels": {"agents.x-k8s.io/created-by": "python-sdk"}},
            "spec": {"warmPoolRef": {"name": "python"},
                     "lifecycle": {"shutdownTime": "2030-01-01T00:00:00Z", "shutdownPolicy": "Delete"},
                     "env": [{"name": "A", "value": "1", "containerName": "main"}]}
        }))
        .unwrap();
        assert_eq!(claim.spec.warm_pool_ref.name, "python");
        assert_eq!(claim.spec.env, vec![EnvVar { name: "A".into(), value: "1".into() }]);
        assert!(claim.status.is_none());
    }

    #[test]
    fn reads_a_template_and_its_runtime_class() {
        let t: SandboxTemplate = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "python", "annotations": {"glovebox.dev/template": "code-interpreter"}},
            "spec": {"podTemplate": {"metadata": {}, "spec": {"runtimeClassName": "glovebox",
                     "containers": [{"name": "main", "image": "unused",
                                     "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}]}},
                     "networkPolicyManagement": "Unmanaged"}
        }))
        .unwrap();
        assert_eq!(t.spec.pod_template.spec.runtime_class_name.as_deref(), Some(RUNTIME_CLASS));
        assert_eq!(t.spec.env_vars_injection_policy, None);
    }
}
