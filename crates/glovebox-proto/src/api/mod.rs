//! Bodies of the native HTTP API (`/v1`). Requests reject unknown fields so a typo is a
//! clear 400, not a silently ignored setting.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::agent::{Command, FileInfo, FileType};

/// Sandbox lifetime when the request gives none.
pub const DEFAULT_TIMEOUT_S: u64 = 300;
/// Longest lifetime one request may ask for (a day); `set_timeout` may extend in steps.
pub const MAX_TIMEOUT_S: u64 = 24 * 3600;

/// The time budget of one command or one code cell: `timeout_ms` on the wire.
///
/// One meaning everywhere (commands, code cells, the CLI, the SDKs, the E2B front-end):
/// - absent: [`TimeBudget::DEFAULT`], 60 s (published as the field's default in the spec);
/// - `0`: no budget of its own; the sandbox's lifetime alone bounds it. That is what E2B's
///   SDKs mean by `timeout=0` ("no limit"), so that front-end passes it through; and it
///   needs no second clock, since nothing in a sandbox outlives the sandbox's own deadline;
/// - otherwise milliseconds, at most [`TimeBudget::MAX_MS`] (no sandbox lives longer); a
///   longer budget is refused when the request is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(extend("default" = TimeBudget::DEFAULT.as_ms(), "minimum" = 0, "maximum" = TimeBudget::MAX_MS)))]
#[serde(transparent)]
pub struct TimeBudget(u64);

impl TimeBudget {
    /// The budget of a command or cell whose request gives none.
    pub const DEFAULT: TimeBudget = TimeBudget(60_000);
    /// No budget of its own (`0`): the sandbox's lifetime bounds it.
    pub const UNBOUNDED: TimeBudget = TimeBudget(0);
    /// The longest budget: a sandbox's longest lifetime.
    pub const MAX_MS: u64 = MAX_TIMEOUT_S * 1000;

    /// A budget of `ms` milliseconds (`0`: unbounded); refused beyond [`TimeBudget::MAX_MS`].
    pub fn from_ms(ms: u64) -> Result<TimeBudget, BudgetTooLong> {
        if ms > Self::MAX_MS {
            return Err(BudgetTooLong(ms));
        }
        Ok(TimeBudget(ms))
    }

    /// The budget as sent on the wire (`0`: unbounded).
    pub const fn as_ms(self) -> u64 {
        self.0
    }

    /// How long the command or cell may run; `None`: until the sandbox ends.
    pub fn limit(self) -> Option<std::time::Duration> {
        (self.0 > 0).then(|| std::time::Duration::from_millis(self.0))
    }
}

impl Default for TimeBudget {
    fn default() -> Self {
        TimeBudget::DEFAULT
    }
}

impl<'de> Deserialize<'de> for TimeBudget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        TimeBudget::from_ms(u64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A time budget longer than any sandbox can live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetTooLong(pub u64);

impl std::fmt::Display for BudgetTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "timeout_ms {} is longer than any sandbox can live (at most {}; 0 means no limit of its own)",
            self.0,
            TimeBudget::MAX_MS
        )
    }
}

impl std::error::Error for BudgetTooLong {}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU quota in cores (fractions allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Cap on what the sandbox may write to its root filesystem (and /tmp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
}

/// The limits a sandbox actually runs with (defaults filled in).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Limits {
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub pids: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { cpus: 1.0, memory_mb: 512, disk_mb: 1024, pids: 256 }
    }
}

/// Bounds a request's limits must fall in.
pub const MAX_CPUS: f64 = 64.0;
pub const MAX_MEMORY_MB: u64 = 256 * 1024;
pub const MIN_MEMORY_MB: u64 = 16;
pub const MAX_DISK_MB: u64 = 1024 * 1024;
pub const MIN_DISK_MB: u64 = 1;
pub const MAX_PIDS: u64 = 65_536;
pub const MIN_PIDS: u64 = 8;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// Loopback only: no route, no DNS, nothing leaves the sandbox.
    #[default]
    DenyAll,
    /// Only what `allow` names (minus `deny`).
    AllowList,
    /// Anything public (explicit opt-in), minus `deny` and the always-denied ranges.
    AllowAll,
}

/// A sandbox's network policy. Rules are CIDRs or IPs (`198.51.100.0/24`, `198.51.100.7`),
/// optionally with ports (`198.51.100.0/24:443,8443`). `deny` wins over `allow`; the host,
/// other sandboxes, loopback, link-local (incl. metadata), private and multicast ranges are
/// denied unless an `allow` rule names them. See docs/network.md.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub mode: NetworkMode,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<AllowRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// One allow rule: a string (`198.51.100.0/24:443`, `api.example.com`, `*.example.com:8443`),
/// or a domain rule object that may carry headers the proxy injects into every HTTPS request
/// to that domain (credential brokering; see docs/network.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum AllowRule {
    Rule(String),
    Domain(DomainAllow),
}

impl From<&str> for AllowRule {
    fn from(s: &str) -> AllowRule {
        AllowRule::Rule(s.to_string())
    }
}

impl From<String> for AllowRule {
    fn from(s: String) -> AllowRule {
        AllowRule::Rule(s)
    }
}

/// A domain allow rule with brokered headers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DomainAllow {
    /// An exact name, optionally with ports (`api.example.com:443,8443`; default 80 and 443).
    pub domain: String,
    /// Headers set (replacing any the client sent) on every request to the domain. A value may
    /// reference host-side secrets as `${secret:NAME}` (`"Bearer ${secret:openai}"`); values are
    /// never returned by the API (a value without a reference is shown as `<redacted>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inject_headers: BTreeMap<String, String>,
}

/// What the API shows for a header value that holds no secret reference.
pub const REDACTED: &str = "<redacted>";

impl NetworkPolicy {
    /// The policy as the API may show it: literal header values (which can be credentials)
    /// replaced by `<redacted>`; `${secret:NAME}` references shown as written.
    pub fn redacted(&self) -> NetworkPolicy {
        let mut p = self.clone();
        for r in &mut p.allow {
            if let AllowRule::Domain(d) = r {
                for v in d.inject_headers.values_mut() {
                    if !v.contains("${secret:") {
                        *v = REDACTED.to_string();
                    }
                }
            }
        }
        p
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Template name; `base` (the host's own /usr, read-only) when absent.
    #[serde(default)]
    pub template: Option<String>,
    /// Lifetime in seconds; the sandbox is destroyed at its deadline whatever is running.
    #[serde(default)]
    pub timeout_s: Option<u64>,
    #[serde(default)]
    pub resources: Resources,
    /// Environment every command in the sandbox starts with.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, returned as given and usable as list filters.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub network: NetworkPolicy,
    /// Stop the sandbox (reason `idle`) after this many seconds without activity: API calls,
    /// running commands (foreground or background), open exec/code streams, code cells.
    /// Absent: no idle stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u64>,
    /// What the idle clock does at `idle_timeout_s`: `kill` (the default) or `pause`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_idle: Option<OnIdle>,
    /// Volumes of the caller's (`/v1/volumes`) mounted into the sandbox, each at its path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// Whether a request that reaches a paused sandbox's processes (a command, a file, a code
    /// cell, a port) resumes it first. Default `true`; with `false` such requests answer 409
    /// `sandbox_paused` until `POST …/resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<bool>,
    /// Start from a snapshot of the caller's (`/v1/snapshots`): its files are there at once
    /// (the snapshot is a read-only layer under the sandbox's own writes, nothing is copied).
    /// The sandbox's template is the snapshot's; `template`, if given, must name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Which kernel its processes run on: `process` (the jail, the default) or `gvisor`.
    /// Absent: the template's default, else `process`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
}

/// `POST /v1/sandboxes/{id}/snapshots`: capture the sandbox's files (its writable layer).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit; unique per tenant.
    pub name: String,
}

/// A snapshot: a sandbox's files at one moment, as a read-only layer above its template's.
/// Processes and memory are not part of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SnapshotInfo {
    pub name: String,
    /// The template its sandbox ran (sandboxes started from the snapshot run it too).
    pub template: String,
    /// The sandbox it was taken of.
    pub source_sandbox: String,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// The snapshot's own layer (content-addressed id).
    pub layer: String,
    /// Bytes of the files in its own layer.
    pub size_bytes: u64,
    /// Special files (fifos, sockets, device nodes other than overlay whiteouts) left out.
    #[serde(default)]
    pub skipped: u64,
    /// Live sandboxes started from it.
    pub sandboxes: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotInfo>,
}

/// Most children one fork makes.
pub const MAX_FORK: u32 = 20;

/// `POST /v1/sandboxes/{id}/fork`: new sandboxes starting from the sandbox's current files.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ForkSandbox {
    /// How many children (1..=`MAX_FORK`); 1 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

/// The answer to a fork: the children, each with a copy of the parent's files (an anonymous
/// snapshot they share, kept while any of them lives), network policy, limits, environment and
/// labels. Processes are not copied: each child starts with a fresh agent and nothing running.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Forked {
    pub sandboxes: Vec<Sandbox>,
    /// The anonymous snapshot the children start from (not listed under `/v1/snapshots`).
    pub snapshot: String,
    /// Always false: processes, memory and code contexts stay with the parent.
    pub processes_copied: bool,
}

/// A volume mounted into a sandbox at create.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's name.
    pub name: String,
    /// Where it appears inside the sandbox: an absolute path without `.` or `..`, outside
    /// the system directories (`/proc`, `/sys`, `/dev`, `/usr`, `/etc`, …); made if missing.
    pub path: String,
    /// Mounted read-only: writes fail with EROFS.
    #[serde(default)]
    pub read_only: bool,
}

/// `POST /v1/volumes`: a disk-backed volume with a hard size cap.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// 1-63 characters of `a-z 0-9 . _ -`, starting with a letter or digit.
    pub name: String,
    /// Its size cap in MiB (`MIN_VOLUME_MB`..=`MAX_VOLUME_MB`); writes beyond it fail with
    /// ENOSPC.
    pub size_mb: u64,
}

/// Smallest volume (ext4 needs room for its journal and metadata).
pub const MIN_VOLUME_MB: u64 = 16;
/// Largest volume (1 TiB).
pub const MAX_VOLUME_MB: u64 = 1 << 20;

/// What the API tells about a volume.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VolumeInfo {
    pub name: String,
    pub size_mb: u64,
    pub created_at: String,
    /// Live sandboxes that have it mounted.
    pub mounted_by: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VolumeList {
    pub volumes: Vec<VolumeInfo>,
}

/// What `POST /v1/volumes/gc` removed: `tenant/name (why)` per host mount nobody used or
/// volume whose create was interrupted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VolumesSwept {
    pub swept: Vec<String>,
}

/// What the idle clock does to an idle sandbox.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnIdle {
    /// Stop it (reason `idle`).
    #[default]
    Kill,
    /// Pause it (its processes frozen, its memory kept); any request resumes it.
    Pause,
    /// Write its memory to disk and free it; answered `hibernate_unavailable` where the host
    /// cannot checkpoint processes.
    Hibernate,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Starting,
    Running,
    /// Its processes are frozen and its clocks stopped; any request on it resumes it.
    Paused,
    /// Ended on request or by one of its clocks (`killed`, `timeout`, `idle`).
    Stopped,
    /// Ended by a failure (`oom`, `error`, `daemon_restart`).
    Killed,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Starting => "starting",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Stopped => "stopped",
            SandboxState::Killed => "killed",
        }
    }
}

/// What happened to a sandbox.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Created (state `running`).
    Created,
    /// Taken over intact by a restarted daemon (same id, clocks and commands).
    Adopted,
    /// Ended; `reason` says why, `state` is `stopped` or `killed`.
    Ended,
}

/// One lifecycle event (`GET /v1/events`, `GET /v1/sandboxes/{id}/events`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LifecycleEvent {
    /// Increasing across the daemon; pass the last one seen as `after` to resume.
    pub seq: i64,
    /// RFC 3339 UTC.
    pub time: String,
    pub sandbox_id: String,
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// The sandbox's state after the event.
    pub state: SandboxState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<EndReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EventList {
    pub events: Vec<LifecycleEvent>,
}

/// Why a sandbox is gone.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// Its lifetime ran out.
    Timeout,
    /// Deleted through the API.
    Killed,
    /// Its agent was killed by the out-of-memory killer.
    Oom,
    /// The agent died or stopped answering.
    Error,
    /// Found orphaned after a daemon restart and cleaned up.
    DaemonRestart,
    /// Nothing ran in it for its `idle_timeout_s`.
    Idle,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Timeout => "timeout",
            EndReason::Killed => "killed",
            EndReason::Oom => "oom",
            EndReason::Error => "error",
            EndReason::DaemonRestart => "daemon_restart",
            EndReason::Idle => "idle",
        }
    }

    pub fn parse(s: &str) -> Option<EndReason> {
        Some(match s {
            "timeout" => EndReason::Timeout,
            "killed" => EndReason::Killed,
            "oom" => EndReason::Oom,
            "error" => EndReason::Error,
            "daemon_restart" => EndReason::DaemonRestart,
            "idle" => EndReason::Idle,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Sandbox {
    pub id: String,
    pub template: String,
    pub state: SandboxState,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// When the lifetime clock will destroy it (RFC 3339 UTC); while paused, when it would if
    /// resumed now (a paused sandbox's clock is stopped).
    pub expires_at: String,
    pub limits: Limits,
    pub metadata: BTreeMap<String, String>,
    pub network: NetworkPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<EndReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u64>,
    /// Present when the idle clock pauses rather than kills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_idle: Option<OnIdle>,
    /// The volumes it mounts (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// Present (`false`) when requests do not resume it while paused (see `CreateSandbox`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<bool>,
    /// The snapshot it started from (absent when none; a fork's children name the fork's
    /// anonymous snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The sandbox it was forked from (absent when not a fork's child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// Its lineage, parent first, then the parent's parent, and so on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ancestors: Vec<String>,
    /// Which kernel its processes run on.
    #[serde(default)]
    pub isolation: Isolation,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    pub timeout_s: u64,
}

/// A live change to a sandbox (`PATCH /v1/sandboxes/{id}`): each field given replaces the
/// current value, each left out stays.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdateSandbox {
    /// The new labels (the whole set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// The new idle timeout in seconds, used from the idle clock's next check; 0 turns the
    /// idle clock off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/ports/{port}`: expose a port (private unless `public`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ExposePort {
    /// Reachable without the key or the token (anyone who can reach the daemon).
    #[serde(default)]
    pub public: bool,
}

/// An exposed port of a sandbox and where it is reached from the host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExposedPort {
    pub port: u16,
    pub public: bool,
    /// The preview URL, routed on its host name (`http://P-<id>.<domain>:7171/`).
    pub url: String,
    /// The same port under the API (`…/v1/sandboxes/{id}/ports/{port}/`).
    pub path_url: String,
    /// Opens this port (and nothing else) without the API key: `?gb_token=` (a browser then
    /// keeps it in a cookie) or the `X-Glovebox-Port-Token` header.
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExposedPortList {
    pub ports: Vec<ExposedPort>,
}

/// How command output is put into JSON: lossy UTF-8 text, or base64 of the exact bytes.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// An argv array, or a string run with `/bin/sh -c`.
    #[cfg_attr(feature = "schema", schemars(with = "serde_json::Value"))]
    pub cmd: Command,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text given to the command's stdin (then closed).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Base64 bytes given to stdin (then closed); exclusive with `stdin`.
    #[serde(default)]
    pub stdin_base64: Option<String>,
    /// The command's time budget (see `TimeBudget`): default 60 s; 0: the sandbox's
    /// lifetime alone bounds it. On expiry the command and everything it started are killed.
    #[cfg_attr(feature = "schema", schemars(extend("default" = TimeBudget::DEFAULT.as_ms())))]
    #[serde(default)]
    pub timeout_ms: Option<TimeBudget>,
    /// Cap per stream; default 1 MiB. Past it, the output's first and last parts are kept
    /// with a marker between them, `\n[glovebox: N bytes dropped]\n`, all within the cap.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// How much of `max_output_bytes` goes to the output's end, the marker included (at
    /// most the cap); default half the cap; 0 keeps the head only, without a marker. Streamed
    /// output sends the head live and the marker and tail when the command ends.
    #[serde(default)]
    pub output_tail_bytes: Option<u64>,
    #[serde(default)]
    pub encoding: Encoding,
    /// Return at once with the command id; fetch the result later.
    #[serde(default)]
    pub background: bool,
}

/// `POST /v1/sandboxes/{id}/pty`: a command on a pseudo-terminal, in the background.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PtyRequest {
    /// An argv array, or a string run with `/bin/sh -c`; default a login shell
    /// (`/bin/bash -l` where the sandbox has bash, else `/bin/sh -l`).
    #[cfg_attr(feature = "schema", schemars(with = "Option<serde_json::Value>"))]
    #[serde(default)]
    pub cmd: Option<Command>,
    /// Terminal width in columns, 1 to 1000.
    pub cols: u32,
    /// Terminal height in rows, 1 to 1000.
    pub rows: u32,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Added to the environment; `TERM` defaults to `xterm-256color`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// `POST /v1/sandboxes/{id}/pty/{cid}/resize`, and the `resize` control message.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PtyResize {
    pub cols: u32,
    pub rows: u32,
}

/// A text frame a client sends on a terminal's WebSocket (binary frames are input bytes).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PtyControl {
    /// The terminal's new size.
    Resize(PtyResize),
    /// A signal for the terminal's foreground process group (as its own ^C would send).
    Signal(i32),
}

/// A text frame the daemon sends on a terminal's WebSocket (binary frames are output).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PtyEvent {
    /// The command ended (the last frame before the close).
    Exited(PtyExit),
    /// A control message was refused, or the attachment failed; the terminal goes on
    /// unless the socket closes.
    Error(ErrorDetail),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PtyExit {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecResult {
    pub id: u64,
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub stdout: String,
    pub stderr: String,
    pub encoding: Encoding,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub duration_ms: u64,
}

/// Lines of the NDJSON exec stream (`Accept: application/x-ndjson`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecStreamLine {
    Started { id: u64, pid: i32 },
    Stdout { data: String },
    Stderr { data: String },
    Exited(ExecResult),
    Error { error: ErrorDetail },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Started {
    pub id: u64,
    pub pid: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CommandSummary {
    pub id: u64,
    pub pid: i32,
    #[cfg_attr(feature = "schema", schemars(with = "serde_json::Value"))]
    pub cmd: Command,
    pub running: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CommandList {
    pub commands: Vec<CommandSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal number; default SIGKILL (9).
    #[serde(default)]
    pub signal: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MakeDir {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Rename {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Entries {
    #[cfg_attr(feature = "schema", schemars(with = "serde_json::Value"))]
    pub entries: Vec<FileInfo>,
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `sandbox_gone`, `invalid_request`.
    pub code: ErrorCode,
    pub message: String,
    /// For `sandbox_gone`: why it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<EndReason>,
}

/// The stable machine codes of error responses: every error the native API returns carries
/// one, and the SDKs map them to their exception classes (a test checks that both SDKs know
/// exactly this set). A code, once published, keeps its meaning; new ones may be added.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request was malformed or out of bounds (400; 413 too large; 415 not JSON).
    InvalidRequest,
    /// No or a wrong API key (401).
    Unauthorized,
    /// The key may not do this (403), e.g. an admin-only route.
    Forbidden,
    /// No such route, or no such object of a kind without a code of its own (404).
    NotFound,
    /// No such sandbox, or one another tenant owns (404).
    SandboxNotFound,
    /// The sandbox has ended (410); `reason` says why.
    SandboxGone,
    TemplateNotFound,
    ContextNotFound,
    CommandNotFound,
    SecretNotFound,
    VolumeNotFound,
    /// The volume is mounted by a live sandbox (409): delete it once they are gone.
    VolumeInUse,
    /// The state forbids it (409).
    Conflict,
    /// The sandbox is paused and was created with `auto_resume: false` (409): resume it first.
    SandboxPaused,
    /// The daemon cannot take it now, e.g. shutting down (503).
    Unavailable,
    /// A tenant quota would be exceeded (429).
    QuotaExceeded,
    /// The sandbox could not be started (500).
    StartFailed,
    /// A template build failed (422).
    BuildFailed,
    /// File API codes, from the agent inside the sandbox.
    FileNotFound,
    FileExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    PermissionDenied,
    InvalidPath,
    DiskFull,
    /// The command could not be started (bad executable, working directory …).
    SpawnFailed,
    /// The sandbox's agent broke protocol or vanished mid-request (502).
    AgentError,
    /// Nothing listens on the port asked for inside the sandbox (502).
    PortNotListening,
    /// Hibernation (checkpointing a sandbox's processes to disk) is not available on this
    /// host (501); the message says why.
    HibernateUnavailable,
    /// No such snapshot, or one another tenant owns (404).
    SnapshotNotFound,
    /// The sandbox's files cannot be captured (422): larger than its disk cap, too deep, or
    /// the sandbox ended meanwhile; the message says which.
    SnapshotFailed,
    /// A fault of the daemon; details are in its log (500).
    Internal,
}

impl ErrorCode {
    /// Every code, in the order of the enum.
    pub const ALL: [ErrorCode; 33] = [
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::SandboxNotFound,
        ErrorCode::SandboxGone,
        ErrorCode::TemplateNotFound,
        ErrorCode::ContextNotFound,
        ErrorCode::CommandNotFound,
        ErrorCode::SecretNotFound,
        ErrorCode::VolumeNotFound,
        ErrorCode::VolumeInUse,
        ErrorCode::Conflict,
        ErrorCode::SandboxPaused,
        ErrorCode::Unavailable,
        ErrorCode::QuotaExceeded,
        ErrorCode::StartFailed,
        ErrorCode::BuildFailed,
        ErrorCode::FileNotFound,
        ErrorCode::FileExists,
        ErrorCode::NotADirectory,
        ErrorCode::IsADirectory,
        ErrorCode::DirectoryNotEmpty,
        ErrorCode::PermissionDenied,
        ErrorCode::InvalidPath,
        ErrorCode::DiskFull,
        ErrorCode::SpawnFailed,
        ErrorCode::AgentError,
        ErrorCode::PortNotListening,
        ErrorCode::HibernateUnavailable,
        ErrorCode::SnapshotNotFound,
        ErrorCode::SnapshotFailed,
        ErrorCode::Internal,
    ];

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::SandboxNotFound => "sandbox_not_found",
            ErrorCode::SandboxGone => "sandbox_gone",
            ErrorCode::TemplateNotFound => "template_not_found",
            ErrorCode::ContextNotFound => "context_not_found",
            ErrorCode::CommandNotFound => "command_not_found",
            ErrorCode::SecretNotFound => "secret_not_found",
            ErrorCode::VolumeNotFound => "volume_not_found",
            ErrorCode::VolumeInUse => "volume_in_use",
            ErrorCode::Conflict => "conflict",
            ErrorCode::SandboxPaused => "sandbox_paused",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::StartFailed => "start_failed",
            ErrorCode::BuildFailed => "build_failed",
            ErrorCode::FileNotFound => "file_not_found",
            ErrorCode::FileExists => "file_exists",
            ErrorCode::NotADirectory => "not_a_directory",
            ErrorCode::IsADirectory => "is_a_directory",
            ErrorCode::DirectoryNotEmpty => "directory_not_empty",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::InvalidPath => "invalid_path",
            ErrorCode::DiskFull => "disk_full",
            ErrorCode::SpawnFailed => "spawn_failed",
            ErrorCode::AgentError => "agent_error",
            ErrorCode::PortNotListening => "port_not_listening",
            ErrorCode::HibernateUnavailable => "hibernate_unavailable",
            ErrorCode::SnapshotNotFound => "snapshot_not_found",
            ErrorCode::SnapshotFailed => "snapshot_failed",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

mod admin;
mod code;
mod isolation;

pub use admin::*;
pub use code::*;
pub use isolation::Isolation;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_budgets_have_one_meaning_of_zero_and_a_ceiling() {
        let read = |j: &str| serde_json::from_str::<TimeBudget>(j);
        assert_eq!(read("0").unwrap().limit(), None);
        assert_eq!(read("0").unwrap(), TimeBudget::UNBOUNDED);
        assert_eq!(read("1500").unwrap().limit(), Some(std::time::Duration::from_millis(1500)));
        assert_eq!(read("86400000").unwrap().as_ms(), TimeBudget::MAX_MS);
        let e = read("86400001").unwrap_err().to_string();
        assert!(e.contains("longer than any sandbox can live"), "{e}");
        assert!(read("-1").is_err() && read("\"5\"").is_err());
        assert_eq!(TimeBudget::default().limit(), Some(std::time::Duration::from_secs(60)));
        let r: ExecRequest = serde_json::from_str(r#"{"cmd":["true"],"timeout_ms":0}"#).unwrap();
        assert_eq!(serde_json::to_value(&r).unwrap()["timeout_ms"], 0, "the wire form is milliseconds");
    }

    #[test]
    fn error_codes_are_their_wire_strings_and_distinct() {
        let mut seen = std::collections::BTreeSet::new();
        for c in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), serde_json::Value::String(c.as_str().into()));
            assert_eq!(serde_json::from_value::<ErrorCode>(c.as_str().into()).unwrap(), c);
            assert!(seen.insert(c.as_str()), "{c} twice");
        }
    }

    #[test]
    fn create_rejects_unknown_fields() {
        assert!(serde_json::from_str::<CreateSandbox>(r#"{"timeout_s":5,"nope":1}"#).is_err());
        assert!(serde_json::from_str::<CreateSandbox>(r#"{"resources":{"memroy_mb":5}}"#).is_err());
        let c: CreateSandbox = serde_json::from_str(r#"{"resources":{"memory_mb":64}}"#).unwrap();
        assert_eq!(c.resources.memory_mb, Some(64));
        let n: CreateSandbox = serde_json::from_str(r#"{"network":{"mode":"deny-all"}}"#).unwrap();
        assert_eq!(n.network.mode, NetworkMode::DenyAll);
    }

    #[test]
    fn allow_rules_are_strings_or_domain_objects() {
        let p: NetworkPolicy = serde_json::from_str(
            r#"{"mode":"allow-list","allow":["203.0.113.0/24",{"domain":"api.good.test","inject_headers":{"Authorization":"Bearer ${secret:tok}","X-Key":"literal"}}]}"#,
        )
        .unwrap();
        assert_eq!(p.allow[0], AllowRule::from("203.0.113.0/24"));
        let AllowRule::Domain(d) = &p.allow[1] else { panic!("{p:?}") };
        assert_eq!(d.domain, "api.good.test");
        let shown = serde_json::to_string(&p.redacted()).unwrap();
        assert!(shown.contains("Bearer ${secret:tok}") && !shown.contains("literal"), "{shown}");
        assert!(serde_json::from_str::<NetworkPolicy>(r#"{"allow":[{"domain":"a.test","nope":1}]}"#).is_err());
        let s = PutSecret { name: None, value: "hunter2".into() };
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
