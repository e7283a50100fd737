//! What a Glovebox-backed `SandboxTemplate` asks of a sandbox, read once from the template
//! (pure): whether it is Glovebox's at all (its pod template's `runtimeClassName` is
//! `glovebox`), the Glovebox template, lifetime and network policy from its annotations,
//! limits from its first container's `resources.limits`, that container's literal `env`,
//! and whether claims may add environment variables.

use std::collections::BTreeMap;

use glovebox_proto::api::{NetworkPolicy, Resources};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use thiserror::Error;

use crate::crd::{SandboxTemplate, RUNTIME_CLASS, TEMPLATE_ANNOTATION, TIMEOUT_ANNOTATION};

/// On the template: the sandbox's network policy as Glovebox's JSON (`{"mode": "deny-all"}`,
/// the default, or an allow-list; docs/network.md).
pub const NETWORK_ANNOTATION: &str = "glovebox.dev/network";

/// `envVarsInjectionPolicy` of the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EnvPolicy {
    #[default]
    Disallowed,
    Allowed,
    Overrides,
}

/// A Glovebox-backed template's settings for every sandbox made from it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Settings {
    pub template: Option<String>,
    pub timeout_s: Option<u64>,
    pub resources: Resources,
    pub network: NetworkPolicy,
    pub env: BTreeMap<String, String>,
    pub env_policy: EnvPolicy,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error("annotation {key}: {detail}")]
    Annotation { key: &'static str, detail: String },
    #[error("resources.limits.{name}: cannot read quantity {value:?}")]
    Quantity { name: &'static str, value: String },
    #[error("envVarsInjectionPolicy {0:?} is not Disallowed, Allowed or Overrides")]
    EnvPolicy(String),
}

/// The template's settings, or `None` when it is not Glovebox's.
pub fn of_template(t: &SandboxTemplate) -> Result<Option<Settings>, SettingsError> {
    let pod = &t.spec.pod_template.spec;
    if pod.runtime_class_name.as_deref() != Some(RUNTIME_CLASS) {
        return Ok(None);
    }
    let ann = t.metadata.annotations.clone().unwrap_or_default();
    let mut s = Settings { template: ann.get(TEMPLATE_ANNOTATION).cloned(), ..Settings::default() };
    if let Some(v) = ann.get(TIMEOUT_ANNOTATION) {
        let n = v.trim().parse::<u64>().map_err(|_| SettingsError::Annotation {
            key: TIMEOUT_ANNOTATION,
            detail: format!("{v:?} is not a whole number of seconds"),
        })?;
        s.timeout_s = Some(n);
    }
    if let Some(v) = ann.get(NETWORK_ANNOTATION) {
        s.network = serde_json::from_str(v)
            .map_err(|e| SettingsError::Annotation { key: NETWORK_ANNOTATION, detail: e.to_string() })?;
    }
    if let Some(c) = pod.containers.first() {
        let limits = c.resources.as_ref().and_then(|r| r.limits.clone()).unwrap_or_default();
        if let Some(q) = limits.get("cpu") {
            s.resources.cpus = Some(cores(q).ok_or_else(|| quantity("cpu", q))?);
        }
        if let Some(q) = limits.get("memory") {
            s.resources.memory_mb = Some(mebibytes(q).ok_or_else(|| quantity("memory", q))?);
        }
        if let Some(q) = limits.get("ephemeral-storage") {
            s.resources.disk_mb = Some(mebibytes(q).ok_or_else(|| quantity("ephemeral-storage", q))?);
        }
        // Only literal values: a `valueFrom` (Secret, ConfigMap, field) is the kubelet's to
        // resolve, and there is no kubelet between a claim and a Glovebox sandbox.
        for e in c.env.iter().flatten() {
            if let Some(v) = &e.value {
                s.env.insert(e.name.clone(), v.clone());
            }
        }
    }
    s.env_policy = match t.spec.env_vars_injection_policy.as_deref() {
        None | Some("Disallowed") => EnvPolicy::Disallowed,
        Some("Allowed") => EnvPolicy::Allowed,
        Some("Overrides") => EnvPolicy::Overrides,
        Some(other) => return Err(SettingsError::EnvPolicy(other.to_string())),
    };
    Ok(Some(s))
}

fn quantity(name: &'static str, q: &Quantity) -> SettingsError {
    SettingsError::Quantity { name, value: q.0.clone() }
}

/// A CPU quantity (`2`, `1.5`, `500m`) in cores.
pub fn cores(q: &Quantity) -> Option<f64> {
    let s = q.0.trim();
    let v = match s.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().ok()? / 1000.0,
        None => s.parse::<f64>().ok()?,
    };
    (v.is_finite() && v > 0.0).then_some(v)
}

/// A byte quantity (`1Gi`, `512Mi`, `1G`, `1500000`) in whole MiB, rounded up.
pub fn mebibytes(q: &Quantity) -> Option<u64> {
    const SUFFIXES: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("Pi", 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("Ei", 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let s = q.0.trim();
    let (num, mult) = SUFFIXES.iter().find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m))).unwrap_or((s, 1.0));
    let bytes = num.parse::<f64>().ok()? * mult;
    if !bytes.is_finite() || bytes <= 0.0 {
        return None;
    }
    Some((bytes / (1024.0 * 1024.0)).ceil() as u64)
}

/// The environment a claim's sandbox starts with: the template's, plus the claim's as the
/// template's policy allows. `Err` says why a claim's variables are refused.
pub fn merge_env(s: &Settings, claim: &[(String, String)]) -> Result<BTreeMap<String, String>, String> {
    let mut env = s.env.clone();
    if claim.is_empty() {
        return Ok(env);
    }
    match s.env_policy {
        EnvPolicy::Disallowed => {
            return Err("the template's envVarsInjectionPolicy is Disallowed: a claim may not set env".to_string())
        }
        EnvPolicy::Allowed => {
            if let Some((k, _)) = claim.iter().find(|(k, _)| env.contains_key(k)) {
                return Err(format!(
                    "the template defines {k} and its envVarsInjectionPolicy is Allowed (add, not override)"
                ));
            }
        }
        EnvPolicy::Overrides => {}
    }
    env.extend(claim.iter().cloned());
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(v: serde_json::Value) -> SandboxTemplate {
        serde_json::from_value(v).unwrap()
    }

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn only_the_glovebox_runtime_class_is_ours() {
        let plain = template(serde_json::json!({"metadata": {"name": "t"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "python"}]}}}}));
        assert_eq!(of_template(&plain), Ok(None));
        let gvisor = template(serde_json::json!({"metadata": {"name": "t"},
            "spec": {"podTemplate": {"spec": {"runtimeClassName": "gvisor", "containers": []}}}}));
        assert_eq!(of_template(&gvisor), Ok(None));
    }

    #[test]
    fn reads_the_settings() {
        let t = template(serde_json::json!({
            "metadata": {"name": "py", "annotations": {
                "glovebox.dev/template": "code-interpreter",
                "glovebox.dev/timeout-seconds": "600",
                "glovebox.dev/network": "{\"mode\":\"allow-list\",\"allow\":[\"pypi.org\"]}"}},
            "spec": {"envVarsInjectionPolicy": "Allowed", "podTemplate": {"spec": {
                "runtimeClassName": "glovebox",
                "containers": [{"name": "main", "image": "ignored",
                    "env": [{"name": "LANG", "value": "C.UTF-8"},
                            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                    "resources": {"limits": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "2G"}}}]}}}
        }));
        let s = of_template(&t).unwrap().unwrap();
        assert_eq!(s.template.as_deref(), Some("code-interpreter"));
        assert_eq!(s.timeout_s, Some(600));
        assert_eq!(s.resources.cpus, Some(0.5));
        assert_eq!(s.resources.memory_mb, Some(1024));
        assert_eq!(s.resources.disk_mb, Some(1908));
        assert_eq!(s.env, BTreeMap::from([("LANG".to_string(), "C.UTF-8".to_string())]));
        assert_eq!(s.env_policy, EnvPolicy::Allowed);
        assert_eq!(serde_json::to_value(&s.network).unwrap()["allow"][0], "pypi.org");
    }

    #[test]
    fn bad_annotations_and_quantities_are_named() {
        let t = template(serde_json::json!({
            "metadata": {"name": "py", "annotations": {"glovebox.dev/timeout-seconds": "ten"}},
            "spec": {"podTemplate": {"spec": {"runtimeClassName": "glovebox", "containers": []}}}}));
        let e = of_template(&t).unwrap_err();
        assert_eq!(e.to_string(), "annotation glovebox.dev/timeout-seconds: \"ten\" is not a whole number of seconds");
        let t = template(serde_json::json!({"metadata": {"name": "py"},
            "spec": {"podTemplate": {"spec": {"runtimeClassName": "glovebox",
                "containers": [{"name": "c", "resources": {"limits": {"memory": "lots"}}}]}}}}));
        assert_eq!(of_template(&t).unwrap_err(), SettingsError::Quantity { name: "memory", value: "lots".into() });
    }

    #[test]
    fn quantities() {
        assert_eq!(cores(&q("2")), Some(2.0));
        assert_eq!(cores(&q("250m")), Some(0.25));
        assert_eq!(cores(&q("0")), None);
        assert_eq!(mebibytes(&q("512Mi")), Some(512));
        assert_eq!(mebibytes(&q("1Gi")), Some(1024));
        assert_eq!(mebibytes(&q("1048576")), Some(1));
        assert_eq!(mebibytes(&q("1k")), Some(1), "rounded up");
        assert_eq!(mebibytes(&q("-1Mi")), None);
        assert_eq!(mebibytes(&q("1Xi")), None);
    }

    #[test]
    fn claim_env_follows_the_policy() {
        let mut s = Settings::default();
        s.env.insert("A".into(), "t".into());
        let claim = vec![("B".to_string(), "c".to_string())];
        assert!(merge_env(&s, &[]).is_ok(), "no env, no question");
        assert!(merge_env(&s, &claim).unwrap_err().contains("Disallowed"));
        s.env_policy = EnvPolicy::Allowed;
        assert_eq!(merge_env(&s, &claim).unwrap().len(), 2);
        let over = vec![("A".to_string(), "c".to_string())];
        assert!(merge_env(&s, &over).unwrap_err().contains("defines A"));
        s.env_policy = EnvPolicy::Overrides;
        assert_eq!(merge_env(&s, &over).unwrap()["A"], "c");
    }
}
