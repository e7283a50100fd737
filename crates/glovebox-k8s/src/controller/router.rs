//! The way agent-sandbox's router and SDK reach a claim's sandbox. They dial
//! `{status.sandbox.name}.{namespace}.svc.cluster.local:{port}`; for a Glovebox sandbox that
//! name is a headless Service without a selector, owned by the claim (garbage-collected with
//! it), whose one EndpointSlice holds the address of the node's Glovebox daemon — its
//! router-facing listener, which tells sandboxes apart by that Host name (the router forwards
//! no key, and its Python version no `X-Sandbox-*` header), with the metadata the controller
//! set on the sandbox.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};

use super::claims::MANAGER;
use super::Error;
use crate::crd::SandboxClaim;

/// The objects for `claim`'s sandbox `name` at `address` (the node's daemon pod IP).
pub fn objects(claim: &SandboxClaim, name: &str, address: &str, ports: &[(String, u16)]) -> (Service, EndpointSlice) {
    let owner = claim.controller_owner_ref(&()).into_iter().collect::<Vec<_>>();
    let labels = BTreeMap::from([
        ("app.kubernetes.io/managed-by".to_string(), MANAGER.to_string()),
        ("agents.x-k8s.io/sandbox-name".to_string(), name.to_string()),
    ]);
    let meta = |n: &str, extra: &[(&str, &str)]| ObjectMeta {
        name: Some(n.to_string()),
        namespace: claim.namespace(),
        owner_references: Some(owner.clone()),
        labels: Some({
            let mut l = labels.clone();
            l.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            l
        }),
        ..ObjectMeta::default()
    };
    let svc = Service {
        metadata: meta(name, &[]),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| ServicePort {
                        name: Some(n.clone()),
                        port: i32::from(*p),
                        protocol: Some("TCP".into()),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    let family = if address.contains(':') { "IPv6" } else { "IPv4" };
    let slice = EndpointSlice {
        metadata: meta(
            &format!("{name}-glovebox"),
            &[
                ("kubernetes.io/service-name", name),
                ("endpointslice.kubernetes.io/managed-by", "glovebox.dev/glovebox-controller"),
            ],
        ),
        address_type: family.into(),
        endpoints: vec![Endpoint {
            addresses: vec![address.to_string()],
            conditions: Some(EndpointConditions { ready: Some(true), ..EndpointConditions::default() }),
            ..Endpoint::default()
        }],
        ports: Some(
            ports
                .iter()
                .map(|(n, p)| EndpointPort {
                    name: Some(n.clone()),
                    port: Some(i32::from(*p)),
                    protocol: Some("TCP".into()),
                    ..EndpointPort::default()
                })
                .collect(),
        ),
    };
    (svc, slice)
}

/// Applies the Service and EndpointSlice (server-side apply: the same objects again change
/// nothing).
pub async fn publish(
    client: &Client,
    claim: &SandboxClaim,
    name: &str,
    address: &str,
    ports: &[(String, u16)],
) -> Result<(), Error> {
    let ns = claim.namespace().unwrap_or_default();
    let (svc, slice) = objects(claim, name, address, ports);
    let pp = PatchParams::apply(MANAGER).force();
    Api::<Service>::namespaced(client.clone(), &ns).patch(name, &pp, &Patch::Apply(&svc)).await?;
    let slice_name = slice.metadata.name.clone().unwrap_or_default();
    Api::<EndpointSlice>::namespaced(client.clone(), &ns).patch(&slice_name, &pp, &Patch::Apply(&slice)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_headless_service_and_its_slice_owned_by_the_claim() {
        let claim: SandboxClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c1", "namespace": "ns", "uid": "u1"},
            "spec": {"warmPoolRef": {"name": "p"}}
        }))
        .unwrap();
        let (svc, slice) = objects(&claim, "c1", "10.244.1.7", &[("http".into(), 8888)]);
        let svc = serde_json::to_value(&svc).unwrap();
        assert_eq!(svc["kind"], "Service", "apply needs apiVersion and kind: {svc}");
        assert_eq!(svc["spec"]["clusterIP"], "None");
        assert!(svc["spec"].get("selector").is_none(), "the slice is ours, not the endpoints controller's");
        assert_eq!(svc["metadata"]["ownerReferences"][0]["kind"], "SandboxClaim");
        assert_eq!(svc["metadata"]["ownerReferences"][0]["uid"], "u1");
        let slice = serde_json::to_value(&slice).unwrap();
        assert_eq!(slice["metadata"]["labels"]["kubernetes.io/service-name"], "c1");
        assert_eq!(slice["endpoints"][0]["addresses"][0], "10.244.1.7");
        assert_eq!(slice["addressType"], "IPv4");
        assert_eq!(slice["ports"][0]["port"], 8888);
        let (_, v6) = objects(&claim, "c1", "fd00::7", &[]);
        assert_eq!(v6.address_type, "IPv6");
    }
}
