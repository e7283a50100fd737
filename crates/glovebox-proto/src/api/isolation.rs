//! The isolation tiers a sandbox can run in.

use serde::{Deserialize, Serialize};

/// Which kernel a sandbox's processes run on (see docs/threat-model.md for what each stops).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// The process jail: the host kernel, behind namespaces, a private uid range, seccomp,
    /// Landlock and cgroups.
    #[default]
    Process,
    /// gVisor: the processes run on gVisor's sentry (`runsc`), a kernel in user space; the
    /// host kernel sees only the sentry's own narrow system calls. Slower to start and to
    /// make system calls; answered `unavailable` where the host has no `runsc`.
    Gvisor,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Process => "process",
            Isolation::Gvisor => "gvisor",
        }
    }
}

/// By its API name (`process`, `gvisor`): for flags and config files.
impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(s: &str) -> Result<Isolation, String> {
        [Isolation::Process, Isolation::Gvisor]
            .into_iter()
            .find(|i| i.as_str() == s)
            .ok_or_else(|| format!("unknown isolation {s:?} (process or gvisor)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_parses_from_its_api_name_only() {
        for i in [Isolation::Process, Isolation::Gvisor] {
            assert_eq!(i.as_str().parse::<Isolation>(), Ok(i));
            assert_eq!(serde_json::to_value(i).unwrap(), i.as_str());
        }
        assert_eq!("vm".parse::<Isolation>(), Err("unknown isolation \"vm\" (process or gvisor)".to_string()));
        assert!("Gvisor".parse::<Isolation>().is_err());
    }
}
