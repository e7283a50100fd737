//! Schema mirrors of the three agent-protocol types the HTTP API re-exports
//! (`glovebox_proto::api::{Command, FileInfo, FileType}` live in `glovebox_proto::agent`,
//! which carries no `JsonSchema` derives).
//!
//! Invariant: each mirror has exactly the serde shape of its original. The tests below
//! round-trip real values through the mirrors and compare the JSON, so adding, removing or
//! renaming a field of the original fails them (or stops them compiling).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What to run: an argv array (no shell), or a string run with `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Command {
    Argv(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileInfo {
    /// Absolute path inside the sandbox.
    pub path: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FileType,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Where a symlink points (not followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A regular file's extended attributes in the `user.` namespace (full names).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub xattrs: std::collections::BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use glovebox_proto::agent;
    use serde::de::DeserializeOwned;

    /// `original` → JSON → mirror → JSON → original must be lossless.
    fn round_trip<O, M>(original: &O)
    where
        O: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
        M: Serialize + DeserializeOwned,
    {
        let json = serde_json::to_value(original).unwrap();
        let mirror: M = serde_json::from_value(json.clone())
            .unwrap_or_else(|e| panic!("the mirror in foreign.rs no longer matches {json}: {e}"));
        let back = serde_json::to_value(&mirror).unwrap();
        assert_eq!(back, json, "the mirror in foreign.rs serializes differently");
        let again: O = serde_json::from_value(back).unwrap();
        assert_eq!(&again, original);
    }

    #[test]
    fn command_mirror_matches() {
        round_trip::<agent::Command, Command>(&agent::Command::Argv(vec!["echo".into(), "hi".into()]));
        round_trip::<agent::Command, Command>(&agent::Command::Shell("echo hi".into()));
    }

    #[test]
    fn file_info_mirror_matches() {
        for (kind, target) in [
            (agent::FileType::File, None),
            (agent::FileType::Dir, None),
            (agent::FileType::Symlink, Some("/etc".to_string())),
            (agent::FileType::Other, None),
        ] {
            round_trip::<agent::FileInfo, FileInfo>(&agent::FileInfo {
                path: "/home/user/x".into(),
                name: "x".into(),
                kind,
                size: 3,
                mode: 0o644,
                uid: 1000,
                gid: 1000,
                mtime: 1_700_000_000,
                target,
                xattrs: [("user.e2b.tag".to_string(), "x".to_string())].into(),
            });
        }
    }
}
