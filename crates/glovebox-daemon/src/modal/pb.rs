//! The generated protocol: messages and server traits for the RPCs served (build.rs).

#![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]

pub mod modal {
    pub mod client {
        tonic::include_proto!("modal.client");
    }
    pub mod task_command_router {
        tonic::include_proto!("modal.task_command_router");
    }
}

pub use modal::client as api;
pub use modal::task_command_router as router;
