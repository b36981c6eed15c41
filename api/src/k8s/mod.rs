//! The Kubernetes side of the contract: label and annotation names shared by the
//! controller, the router and the hub's kubernetes backend.

pub mod names;
