//! Bodies of the daemon's own routes: API keys and tenants, usage, templates.

use super::*;

/// `POST /v1/keys` (admin): a new API key for a tenant.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// Tenant the key belongs to (1–64 of `a-z0-9_-`); created on first use.
    pub tenant: String,
    /// A label for people (e.g. `ci`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An API key as listed: never the key itself, only its first characters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ApiKeyInfo {
    pub id: String,
    pub tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The key's first characters, to tell keys apart.
    pub prefix: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// Answer to `POST /v1/keys`: the only time the plain key is shown.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CreatedKey {
    pub key: String,
    #[serde(flatten)]
    pub info: ApiKeyInfo,
}

/// `GET /v1/keys`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct KeyList {
    pub keys: Vec<ApiKeyInfo>,
}

/// A tenant's quotas (`PUT /v1/tenants/{tenant}/quota`); an absent field means no limit.
/// Creates beyond a quota fail with 429 `quota_exceeded`, naming the limit.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TenantQuota {
    /// Sandboxes running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<u32>,
    /// Sum of the memory limits of its running sandboxes, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_mb: Option<u64>,
    /// Sum of the CPU limits of its running sandboxes, cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpus: Option<f64>,
    /// Sandbox creations (attempts) per rolling minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creates_per_minute: Option<u32>,
}

/// Metered use of one sandbox (`GET /v1/sandboxes/{id}/usage`), or the sum over a tenant's
/// sandboxes (`GET /v1/usage`): the numbers a pay-per-use bill needs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Usage {
    /// CPU time of everything in the sandbox(es), seconds.
    pub cpu_seconds: f64,
    /// Integral of memory in use over time, GiB·seconds.
    pub memory_gib_seconds: f64,
    /// Highest memory use seen (the largest of one sandbox for a sum), bytes.
    pub memory_peak_bytes: u64,
    /// Time from start to end (or now), seconds.
    pub wall_seconds: f64,
    pub egress_bytes_up: u64,
    pub egress_bytes_down: u64,
}

/// One sandbox's metered use.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxUsage {
    pub sandbox_id: String,
    pub tenant: String,
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    #[serde(flatten)]
    pub usage: Usage,
}

/// `GET /v1/usage`: per tenant totals (the caller's own tenant; all tenants for the admin).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UsageReport {
    pub tenants: Vec<TenantUsage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TenantUsage {
    pub tenant: String,
    /// Sandboxes metered (running and ended).
    pub sandboxes: u64,
    #[serde(flatten)]
    pub usage: Usage,
}

/// `POST /v1/templates`: build a template from a spec. The response is an NDJSON stream of
/// [`BuildLine`]s ending with `done` or `error`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BuildTemplate {
    /// Template name: 1–63 of `a-z 0-9 . _ -`, starting with a letter or digit.
    pub name: String,
    /// The spec (a Dockerfile subset: FROM, RUN, COPY, ENV, WORKDIR, USER, ARG, CMD).
    pub dockerfile: String,
    /// Values for the spec's `ARG`s.
    #[serde(default)]
    pub build_args: BTreeMap<String, String>,
    /// Rebuild every step instead of reusing cached layers.
    #[serde(default)]
    pub no_cache: bool,
    /// Defaults for sandboxes created from the template (requests may override).
    #[serde(default)]
    pub resources: Resources,
    /// The isolation its sandboxes get when their create names none (its build steps run
    /// in the process jail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// The build context (what `COPY` reads and `FROM oci-archive:` names): a tar archive,
    /// base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tar_base64: Option<String>,
}

/// A built template.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TemplateInfo {
    pub name: String,
    /// What it was built `FROM` (`host`, `debian:bookworm`, `oci-archive:…`, an image ref).
    pub base: String,
    /// Content-addressed layer ids, top-most first.
    pub layers: Vec<String>,
    /// Bytes on disk of its layers (shared layers counted in full).
    pub size_bytes: u64,
    pub created_at: String,
    /// Defaults applied to sandboxes created from it.
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub resources: Resources,
    /// Started in the background in every sandbox created from it (`CMD`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<Vec<String>>,
    /// The isolation its sandboxes get when their create names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// Live sandboxes created from it.
    pub sandboxes: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TemplateList {
    pub templates: Vec<TemplateInfo>,
}

/// Lines of the NDJSON build log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildLine {
    /// A step begins (`cached`: its layer is reused, nothing runs).
    Step {
        step: usize,
        total: usize,
        line: usize,
        instruction: String,
        cached: bool,
    },
    /// Output of the running step (stdout and stderr interleaved).
    Output {
        step: usize,
        data: String,
    },
    /// Progress of the base (`FROM`): debootstrap, image download.
    Base {
        message: String,
    },
    Done {
        template: TemplateInfo,
        seconds: f64,
    },
    /// The build failed; nothing was saved under the name.
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        line: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        message: String,
        /// The last lines of the failed step's output.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        output_tail: String,
    },
}

/// What `DELETE /v1/templates/{name}` and `POST /v1/templates/gc` freed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LayersFreed {
    /// Bytes of layers removed (no template and no live sandbox used them).
    pub freed_bytes: u64,
}
