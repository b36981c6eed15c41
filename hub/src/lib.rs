//! The Sandhub hub: one model of sandboxes behind REST, MCP and Gym, on the
//! embedded local backend or on Kubernetes.

pub mod backend;
pub mod cli;
pub mod guard;
pub mod http;
pub mod kube;
pub mod local;
pub mod mcp;
pub mod policy;
pub mod serve;
