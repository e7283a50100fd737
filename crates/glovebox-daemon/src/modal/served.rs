// The RPCs the Modal front-end serves, per gRPC service. Read by build.rs (only these get
// generated code) and by `modal::route` (every other method is answered UNIMPLEMENTED with
// the feature it belongs to). One list, so the two cannot drift.

pub const SERVED: &[(&str, &[&str])] = &[
    (
        "modal.client.ModalClient",
        &[
            "AppClientDisconnect",
            "AppCreate",
            "AppGetLayout",
            "AppGetOrCreate",
            "AppHeartbeat",
            "AppPublish",
            "AuthTokenGet",
            "ClientHello",
            "EnvironmentGetOrCreate",
            "ImageFromId",
            "ImageGetOrCreate",
            "ImageJoinStreaming",
            "SandboxCreate",
            "SandboxCreateV2",
            "SandboxGetCommandRouterAccess",
            "SandboxGetTaskId",
            "SandboxGetTaskIdV2",
            "SandboxList",
            "SandboxListV2",
            "SandboxTagsGet",
            "SandboxTagsGetV2",
            "SandboxTagsSet",
            "SandboxTagsSetV2",
            "SandboxTerminate",
            "SandboxTerminateV2",
            "SandboxWait",
            "SandboxWaitV2",
            "SecretGetOrCreate",
            "TaskGetCommandRouterAccess",
        ],
    ),
    (
        "modal.task_command_router.TaskCommandRouter",
        &[
            "SandboxStdinWriteV2",
            "SandboxStdioReadV2",
            "SandboxWaitUntilReady",
            "TaskExecPoll",
            "TaskExecStart",
            "TaskExecStdinStatus",
            "TaskExecStdinWrite",
            "TaskExecStdioRead",
            "TaskExecWait",
        ],
    ),
];
