//! Bodies of the code interpreter (`run_code`, contexts), metrics, the egress audit and
//! secrets.

use super::*;

/// Languages of code contexts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Language {
    #[default]
    Python,
    #[serde(alias = "js", alias = "node")]
    Javascript,
    // Transpiled per cell to JavaScript and run by the Node kernel.
    #[serde(alias = "ts")]
    Typescript,
    #[serde(alias = "sh", alias = "shell")]
    Bash,
    R,
    Java,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Javascript => "javascript",
            Language::Typescript => "typescript",
            Language::Bash => "bash",
            Language::R => "r",
            Language::Java => "java",
        }
    }
}

/// `POST /v1/sandboxes/{id}/code`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    pub code: String,
    /// Ignored when `context_id` is given (the context has a language); default python.
    #[serde(default)]
    pub language: Option<Language>,
    /// A context made with `POST …/contexts`; default: the sandbox's default context of the
    /// language (created on first use).
    #[serde(default)]
    pub context_id: Option<String>,
    /// The cell's time budget (see `TimeBudget`): default 60 s; 0: the sandbox's lifetime
    /// alone bounds it. On expiry the cell is interrupted (KeyboardInterrupt) and the context kept.
    #[cfg_attr(feature = "schema", schemars(extend("default" = TimeBudget::DEFAULT.as_ms())))]
    #[serde(default)]
    pub timeout_ms: Option<TimeBudget>,
    /// Set in the context's environment for this cell only: when it ends, each variable gets
    /// back the value it had before (or is removed), as E2B's per-execution `envs`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// One rich result: a MIME bundle (`text/plain`, `text/html`, `image/png` (base64), …).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CodeResult {
    /// The value of the cell's last expression (as opposed to `display(…)` and figures).
    pub is_main_result: bool,
    pub data: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Logs {
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CodeError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// What a cell produced (the shape E2B users know).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Execution {
    pub results: Vec<CodeResult>,
    pub logs: Logs,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CodeError>,
    pub execution_count: u64,
    /// The context was restarted (its state lost) because the cell could not be interrupted
    /// or the kernel died.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub context_restarted: bool,
}

/// Lines of the NDJSON code stream (`Accept: application/x-ndjson`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeStreamLine {
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    Result(CodeResult),
    Error(CodeError),
    End {
        execution_count: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        context_restarted: bool,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    #[serde(default)]
    pub language: Language,
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Context {
    pub id: String,
    pub language: Language,
    pub cwd: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ContextList {
    pub contexts: Vec<Context>,
}

/// `GET /v1/sandboxes/{id}/metrics`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxMetrics {
    /// CPU use since the previous metrics call (or since creation), in percent of one core.
    pub cpu_percent: f64,
    pub cpu_usage_ms: u64,
    pub memory_used_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: u64,
    pub disk_used_bytes: u64,
    pub disk_limit_bytes: u64,
    pub pids: u64,
    pub pids_limit: u64,
    pub oom_kills: u64,
}

/// One egress attempt (`GET /v1/sandboxes/{id}/egress`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressEntry {
    pub time: String,
    /// `dns`, or the protocol: `tcp`, `udp`, `icmp`, `ip/<number>` (the packet filter logs
    /// each denied packet and the first of each connection an address rule allows).
    pub kind: String,
    /// The name asked for (DNS) or presented (TLS SNI / HTTP Host); empty if none.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    pub port: u16,
    pub allowed: bool,
    pub reason: String,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Brokered connections: the names (never the values) of the headers injected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injected_headers: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressLog {
    pub entries: Vec<EgressEntry>,
    /// Packets the firewall logged past the listing rate (50 a second per sandbox, bursts
    /// of 200): counted, not listed.
    #[serde(default)]
    pub unlisted: u64,
}

/// `POST /v1/secrets` (`name` + `value`) and `PUT /v1/secrets/{name}` (`value` only). The value
/// is write-only: no API returns it.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PutSecret {
    /// Required by `POST /v1/secrets`; in `PUT` it must match the path if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub value: String,
}

impl std::fmt::Debug for PutSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutSecret").field("name", &self.name).field("value", &REDACTED).finish()
    }
}

/// What the API tells about a secret: never its value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SecretInfo {
    pub name: String,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SecretList {
    pub secrets: Vec<SecretInfo>,
}
