//! The process jail: everything that makes a sandbox, and the only crate with `unsafe`.
//!
//! Daemon side: [`cgroup`] (limits), [`launch`] (start a jailer), [`rootfs::build_host_skel`].
//! Jailer side (inside `glovebox-agent jail`): [`jailer`] composes the steps in order —
//! cgroups, namespaces, id-mapped overlay root, pivot_root, rlimits, fds — and hands the
//! agent a [`jailer::Booted`]. Agent side: the agent confines itself once, before it forks
//! anything ([`landlock::restrict_self`], then [`seccomp::compile_agent`]'s filter), and
//! [`child`] drops privileges and installs [`seccomp`]'s command filter in each user command
//! before exec.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cgroup;
pub mod child;
pub mod config;
pub mod error;
pub mod guest;
pub mod gvisor;
pub mod jailer;
pub mod kzygote;
pub mod landlock;
pub mod launch;
pub mod loopdev;
pub mod rootfs;
pub mod seccomp;
pub mod sys;
// helper modules below
