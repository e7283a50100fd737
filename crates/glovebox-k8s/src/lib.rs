//! Glovebox as an agent-sandbox runtime on Kubernetes: a controller that serves
//! `SandboxClaim`s (kubernetes-sigs/agent-sandbox, `extensions.agents.x-k8s.io/v1beta1`)
//! whose template is Glovebox's with sandboxes on Glovebox nodes (one daemon per node, the
//! DaemonSet in deploy/kubernetes). docs/scale-out.md has the design end to end.
//!
//! Layers, each using only those above it:
//! - `crd`, `load`, `placement`, `settings`, `lease`: the objects, a node's load from its
//!   `/metrics`, the choice of node, a template's settings, who leads (pure);
//! - `cluster`: what is known of the nodes and their health (pure);
//! - `daemon`: the daemon's HTTP API, behind a trait;
//! - `reconcile`: the decisions for one claim (pure, with the failure reasons it reports);
//! - `driver`: one pass over a claim, the node refresh and the orphan sweep, over a
//!   `ClaimStore`;
//! - `controller` (Kubernetes: watch, patches, the router's Service) and `sim` (the same
//!   passes against real daemons, claims in memory).

pub mod cluster;
pub mod controller;
pub mod crd;
pub mod daemon;
pub mod driver;
pub mod lease;
pub mod load;
pub mod placement;
pub mod reconcile;
pub mod settings;
pub mod sim;
