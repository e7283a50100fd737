//! The daemon's own routes: tenants, templates, snapshots, volumes, health and metrics.

use super::*;

pub(super) const OPS: &[Op] = &[
    // --- tenants -----------------------------------------------------------------------
    Op {
        method: "get",
        path: "/v1/usage",
        id: "getUsage",
        tag: "tenants",
        summary: "Usage totals per tenant",
        description: "A tenant key sees its own tenant; the admin key sees every tenant, or one with `tenant`.",
        params: &[query("tenant", Ty::Str, "One tenant (admin key only).")],
        replies: &[reply(200, "Totals over running and ended sandboxes.", Body::Json("UsageReport"))],
        errors: &[401, 403],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/keys",
        id: "createKey",
        tag: "tenants",
        summary: "Create an API key for a tenant (admin key)",
        description: "The plain key is in this answer only; the daemon keeps its SHA-256 digest.",
        body: Body::Json("CreateKey"),
        replies: &[reply(201, "The new key.", Body::Json("CreatedKey"))],
        errors: &[400, 401, 403, 415],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/keys",
        id: "listKeys",
        tag: "tenants",
        summary: "List API keys (admin key)",
        replies: &[reply(200, "Every key, revoked ones included; never the keys themselves.", Body::Json("KeyList"))],
        errors: &[401, 403],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/keys/{kid}",
        id: "revokeKey",
        tag: "tenants",
        summary: "Revoke an API key (admin key)",
        description: "The key stops authenticating at once.",
        params: &[path("kid", Ty::Str, "Key id (`id` of `ApiKeyInfo`).")],
        replies: &[reply(200, "The revoked key.", Body::Json("ApiKeyInfo"))],
        errors: &[401, 403, 404],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/tenants/{tenant}/quota",
        id: "getQuota",
        tag: "tenants",
        summary: "A tenant's quotas",
        description: "The admin key reads any tenant's; a tenant key its own.",
        params: &[path("tenant", Ty::Str, "Tenant name.")],
        replies: &[reply(200, "The quotas; absent fields are unlimited.", Body::Json("TenantQuota"))],
        errors: &[401, 403],
        ..OP
    },
    Op {
        method: "put",
        path: "/v1/tenants/{tenant}/quota",
        id: "setQuota",
        tag: "tenants",
        summary: "Set a tenant's quotas (admin key)",
        description: "Replaces all of the tenant's quotas. Creates beyond a quota fail with 429 `quota_exceeded`.",
        params: &[path("tenant", Ty::Str, "Tenant name.")],
        body: Body::Json("TenantQuota"),
        replies: &[reply(200, "The quotas now in force.", Body::Json("TenantQuota"))],
        errors: &[400, 401, 403, 415],
        ..OP
    },
    // --- templates ---------------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/templates",
        id: "buildTemplate",
        tag: "templates",
        summary: "Build a template from a spec",
        description: "Each `RUN`/`COPY`/`WORKDIR` step runs in a build sandbox (`RUN` with network \
                      `allow-all`) and becomes a cached, content-addressed layer; an unchanged prefix of \
                      steps is reused (`no_cache` rebuilds). With `Accept: application/x-ndjson` the \
                      build log streams one `BuildLine` per line (`base`, `step`, `output`, then `done` \
                      or `error`); otherwise the answer is 201 with the template, or 422 \
                      `build_failed` naming the step, its exit code and output tail. A failed build \
                      saves no template. A malformed spec is a 400 naming the line. Admin key only \
                      (templates are shared by every tenant).",
        body: Body::Json("BuildTemplate"),
        replies: &[reply(201, "The template (or the build log).", Body::JsonOrNdjson("TemplateInfo", "BuildLine"))],
        errors: &[400, 401, 403, 413, 415, 422, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/templates",
        id: "listTemplates",
        tag: "templates",
        summary: "List built templates",
        replies: &[reply(200, "The templates.", Body::Json("TemplateList"))],
        errors: &[401, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/templates/{name}",
        id: "getTemplate",
        tag: "templates",
        summary: "Get a template",
        params: &[TPL],
        replies: &[reply(200, "The template.", Body::Json("TemplateInfo"))],
        errors: &[400, 401, 404, 500],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/templates/{name}",
        id: "deleteTemplate",
        tag: "templates",
        summary: "Delete a template",
        description: "Refused with 409 `conflict` while a live sandbox runs from it. Its layers that no \
                      other template uses are removed.",
        params: &[TPL],
        replies: &[reply(200, "Deleted.", Body::Json("LayersFreed"))],
        errors: &[400, 401, 403, 404, 409, 500],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/templates/gc",
        id: "gcTemplates",
        tag: "templates",
        summary: "Remove unused layers",
        description: "Removes every layer that no template and no live or warm sandbox uses (Debian base \
                      layers are kept).",
        replies: &[reply(200, "Collected.", Body::Json("LayersFreed"))],
        errors: &[401, 403, 500],
        ..OP
    },
    // --- snapshots and forks ------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/snapshots",
        id: "snapshotSandbox",
        tag: "snapshots",
        summary: "Snapshot a sandbox's files",
        description: "Captures the sandbox's writable layer (its files; not its processes or memory) as a new \
                      content-addressed layer, freezing the sandbox for the copy (thawed after, unless it was \
                      paused). Owners, modes, symlinks (as links, never followed), `user.*` xattrs, deletions \
                      and replaced directories are kept; fifos, sockets and device nodes are left out \
                      (`skipped`). Bounded by the sandbox's disk cap and 128 directory levels: beyond either, \
                      422 `snapshot_failed`. `name`: 1–63 of `a-z 0-9 . _ -`, starting with a letter or \
                      digit, unique per tenant (409 `conflict` when taken).",
        params: &[ID],
        body: Body::Json("CreateSnapshot"),
        replies: &[reply(201, "The snapshot.", Body::Json("SnapshotInfo"))],
        errors: &[400, 401, 404, 409, 410, 413, 415, 422, 500],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/sandboxes/{id}/fork",
        id: "forkSandbox",
        tag: "snapshots",
        summary: "Fork a sandbox into new ones",
        description: "Snapshots the sandbox's files (anonymously: the children share it, it is removed with the \
                      last of them) and starts `count` (1–20, default 1) sandboxes on it, each with a copy of \
                      the parent's network policy, limits, environment, labels, idle settings and remaining \
                      lifetime, and its lineage (`parent_id`, `ancestors`). Processes, memory and code \
                      contexts are NOT copied (no checkpointing on this host): each child starts with nothing \
                      running; `processes_copied` is always false. Volumes are not mounted in the children. \
                      All or nothing: if one child cannot start, the others are destroyed. A policy with \
                      literal header values (not `${secret:NAME}` references) cannot be copied (400). \
                      The body may be empty.",
        params: &[ID],
        body: Body::Json("ForkSandbox"),
        replies: &[reply(201, "The children.", Body::Json("Forked"))],
        errors: &[400, 401, 404, 409, 410, 422, 429, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/snapshots",
        id: "listSnapshots",
        tag: "snapshots",
        summary: "List the caller's snapshots",
        description: "Named snapshots only (a fork's anonymous snapshot is not listed).",
        replies: &[reply(200, "The snapshots, by name.", Body::Json("SnapshotList"))],
        errors: &[401, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/snapshots/{name}",
        id: "getSnapshot",
        tag: "snapshots",
        summary: "A snapshot: its template, layer, size and how many live sandboxes run on it",
        params: &[SNAPSHOT],
        replies: &[reply(200, "The snapshot.", Body::Json("SnapshotInfo"))],
        errors: &[401, 404, 500],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/snapshots/{name}",
        id: "deleteSnapshot",
        tag: "snapshots",
        summary: "Delete a snapshot",
        description: "Never refused for being in use: the name goes at once (and may be taken again), while \
                      sandboxes started from it keep running on its layer, which is collected when the last of \
                      them ends (deferred deletion).",
        params: &[SNAPSHOT],
        replies: &[reply(204, "Deleted.", Body::None)],
        errors: &[401, 404, 500],
        ..OP
    },
    // --- volumes -----------------------------------------------------------------------
    Op {
        method: "post",
        path: "/v1/volumes",
        id: "createVolume",
        tag: "volumes",
        summary: "Create a volume",
        description: "An ext4 filesystem in a disk image of `size_mb` MiB (16 to 1048576): writes beyond it \
                      fail with ENOSPC in the writing sandbox only. `name`: 1–63 of `a-z 0-9 . _ -`, \
                      starting with a letter or digit; a tenant's names are its own. Mount it with the \
                      create body's `volumes: [{name, path, read_only}]`; many sandboxes may mount one \
                      volume at once, readers and writers alike (one filesystem, shared).",
        body: Body::Json("CreateVolume"),
        replies: &[reply(201, "Created.", Body::Json("VolumeInfo"))],
        errors: &[400, 401, 409, 413, 415, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/volumes",
        id: "listVolumes",
        tag: "volumes",
        summary: "List the caller's volumes",
        replies: &[reply(200, "The volumes, by name.", Body::Json("VolumeList"))],
        errors: &[401, 500],
        ..OP
    },
    Op {
        method: "get",
        path: "/v1/volumes/{name}",
        id: "getVolume",
        tag: "volumes",
        summary: "A volume: its size and how many live sandboxes mount it",
        params: &[VOLUME],
        replies: &[reply(200, "The volume.", Body::Json("VolumeInfo"))],
        errors: &[400, 401, 404, 500],
        ..OP
    },
    Op {
        method: "delete",
        path: "/v1/volumes/{name}",
        id: "deleteVolume",
        tag: "volumes",
        summary: "Delete a volume and its data",
        description: "Refused with 409 `volume_in_use` while a live sandbox mounts it.",
        params: &[VOLUME],
        replies: &[reply(204, "Deleted.", Body::None)],
        errors: &[400, 401, 404, 409, 500],
        ..OP
    },
    Op {
        method: "post",
        path: "/v1/volumes/gc",
        id: "gcVolumes",
        tag: "volumes",
        summary: "Sweep volume leftovers (admin)",
        description: "Unmounts host mounts of volumes no live sandbox uses and removes volumes whose create \
                      was interrupted (the daemon also does this at start).",
        replies: &[reply(200, "What was removed.", Body::Json("VolumesSwept"))],
        errors: &[401, 403, 500],
        ..OP
    },
    // --- the daemon --------------------------------------------------------------------
    Op {
        method: "get",
        path: "/metrics",
        id: "prometheusMetrics",
        tag: "daemon",
        summary: "Prometheus metrics of the daemon",
        description: "Text exposition format 0.0.4 (`text/plain; version=0.0.4`).",
        replies: &[reply(200, "The metrics.", Body::Text)],
        errors: &[401],
        ..OP
    },
    Op {
        method: "get",
        path: "/healthz",
        id: "healthz",
        tag: "daemon",
        summary: "Liveness check (no API key needed)",
        replies: &[reply(200, "`ok`", Body::Text)],
        public: true,
        ..OP
    },
];
