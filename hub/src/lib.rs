//! The Sandhub hub: one model of sandboxes behind REST, MCP and Gym, on the
//! embedded local backend or on Kubernetes.

pub mod local;
