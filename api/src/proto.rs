//! Generated protobuf code for the gRPC services sandboxd serves.

/// `process.v1`: wire-compatible with agent-sandbox's sandboxd.
pub mod process {
    pub mod v1 {
        tonic::include_proto!("process.v1");
    }
}

/// `keep.v1`: Sandhub's extension for processes that outlive their
/// `Start` stream (list, attach to a bounded tail).
pub mod keep {
    pub mod v1 {
        tonic::include_proto!("keep.v1");
    }
}

/// `watcher.v1`: directory watching.
pub mod watcher {
    pub mod v1 {
        tonic::include_proto!("watcher.v1");
    }
}

/// The encoded descriptor set of every service above, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));
