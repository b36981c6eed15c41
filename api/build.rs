//! Compiles the protobuf contracts with protox, so that building needs no
//! system `protoc`. The encoded descriptor set is kept for gRPC reflection.
use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &[
    "process/v1/process.proto",
    "keep/v1/keep.proto",
    "watcher/v1/watcher.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let fds = protox::compile(PROTOS, ["proto"])?;
    fs::write(out.join("descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".")
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
