//! The generated protocol: sandboxd's `process.v1` messages and the `ProcessService` server
//! trait (build.rs, from `proto/sandboxd`).

#![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]

tonic::include_proto!("process.v1");
