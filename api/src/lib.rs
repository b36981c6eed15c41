//! What two Sandhub programs must agree on, stated once: protobuf services,
//! JSON bodies, error code words and well-known names. Data only, no I/O.

pub mod code;
pub mod error;
pub mod gym;
pub mod hub;
pub mod k8s;
pub mod legacy;
pub mod limits;
pub mod network;
pub mod proc_net;
pub mod proto;
pub mod sandboxd;
#[cfg(feature = "sandboxd-token")]
pub mod sandboxd_token;
#[cfg(feature = "scoped-token")]
pub mod scoped_token;
pub mod secrets;
pub mod usage;
pub mod validate;
pub mod volumes;
