//! Which Glovebox nodes there are: one per daemon pod of the DaemonSet (pure, from the pods
//! and the nodes as listed). A node takes new sandboxes while its pod is ready and not
//! terminating and the node is not cordoned; a pod being replaced (an upgrade) or on a
//! drained node keeps its sandboxes but gets no new ones.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::cluster::NodeTarget;

/// The targets for the daemon pods `pods`, their API on `port`; `nodes`: the cluster's
/// nodes (to see which are cordoned).
pub fn targets(pods: &[Pod], nodes: &[Node], port: u16) -> Vec<NodeTarget> {
    let cordoned: BTreeSet<&str> = nodes
        .iter()
        .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    let mut out: Vec<NodeTarget> = pods
        .iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let status = p.status.as_ref()?;
            let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty())?;
            let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
            let host = if ip.contains(':') { format!("[{ip}]") } else { ip.clone() };
            Some(NodeTarget {
                url: format!("http://{host}:{port}"),
                address: ip,
                schedulable: ready && p.metadata.deletion_timestamp.is_none() && !cordoned.contains(node.as_str()),
                name: node,
            })
        })
        .collect();
    // Two pods on one node (the old one terminating in an update): keep the one that takes
    // sandboxes, as the node's daemon is that one from now on.
    out.sort_by(|a, b| a.name.cmp(&b.name).then(b.schedulable.cmp(&a.schedulable)));
    out.dedup_by(|later, first| later.name == first.name);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, ip: &str, ready: bool, terminating: bool) -> Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": format!("glovebox-{node}"), "namespace": "glovebox-system"},
            "spec": {"nodeName": node, "containers": []},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        });
        if terminating {
            v["metadata"]["deletionTimestamp"] = "2026-12-02T07:31:00Z".into();
        }
        serde_json::from_value(v).unwrap()
    }

    fn node(name: &str, cordoned: bool) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": {"unschedulable": cordoned}}))
            .unwrap()
    }

    #[test]
    fn one_target_per_node_with_its_state() {
        let pods = [
            pod("n1", "10.244.1.7", true, false),
            pod("n2", "10.244.2.3", false, false),
            pod("n3", "fd00::3", true, false),
            pod("n4", "10.244.4.2", true, false),
            // Pending: no IP yet.
            pod("n5", "", false, false),
        ];
        let t = targets(&pods, &[node("n4", true)], 7171);
        let names: Vec<_> = t.iter().map(|t| (t.name.as_str(), t.schedulable)).collect();
        assert_eq!(names, [("n1", true), ("n2", false), ("n3", true), ("n4", false)]);
        assert_eq!(t[0].url, "http://10.244.1.7:7171");
        assert_eq!(t[2].url, "http://[fd00::3]:7171");
        assert_eq!(t[2].address, "fd00::3");
    }

    #[test]
    fn during_an_update_the_new_pod_is_the_nodes() {
        let pods = [pod("n1", "10.244.1.7", true, true), pod("n1", "10.244.1.9", true, false)];
        let t = targets(&pods, &[], 7171);
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].address.as_str(), t[0].schedulable), ("10.244.1.9", true));
        let old_only = targets(&[pod("n1", "10.244.1.7", true, true)], &[], 7171);
        assert!(!old_only[0].schedulable, "a terminating daemon takes no new sandboxes");
    }
}
