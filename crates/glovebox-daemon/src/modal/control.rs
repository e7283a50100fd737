//! The `ModalClient` service: each method hands its request to the module that maps it.

use tonic::{Request, Response, Status};

use super::pb::api;
use super::pb::api::modal_client_server::ModalClient;
use super::{apps, images, sandboxes, Modal, Stream};

pub struct Control(pub Modal);

type R<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl ModalClient for Control {
    async fn client_hello(&self, req: Request<()>) -> R<api::ClientHelloResponse> {
        apps::client_hello(&self.0, req)
    }
    async fn auth_token_get(&self, req: Request<api::AuthTokenGetRequest>) -> R<api::AuthTokenGetResponse> {
        apps::auth_token_get(&self.0, req)
    }
    async fn environment_get_or_create(
        &self,
        req: Request<api::EnvironmentGetOrCreateRequest>,
    ) -> R<api::EnvironmentGetOrCreateResponse> {
        apps::environment_get_or_create(&self.0, req)
    }
    async fn app_get_or_create(&self, req: Request<api::AppGetOrCreateRequest>) -> R<api::AppGetOrCreateResponse> {
        apps::app_get_or_create(&self.0, req)
    }
    async fn app_create(&self, req: Request<api::AppCreateRequest>) -> R<api::AppCreateResponse> {
        apps::app_create(&self.0, req)
    }
    async fn app_get_layout(&self, req: Request<api::AppGetLayoutRequest>) -> R<api::AppGetLayoutResponse> {
        apps::app_get_layout(&self.0, req)
    }
    async fn app_publish(&self, req: Request<api::AppPublishRequest>) -> R<api::AppPublishResponse> {
        apps::app_publish(&self.0, req)
    }
    async fn app_heartbeat(&self, req: Request<api::AppHeartbeatRequest>) -> R<()> {
        apps::app_heartbeat(&self.0, req)
    }
    async fn app_client_disconnect(&self, req: Request<api::AppClientDisconnectRequest>) -> R<()> {
        apps::app_client_disconnect(&self.0, req).await
    }
    type AppGetLogsStream = Stream<api::TaskLogsBatch>;
    async fn app_get_logs(&self, req: Request<api::AppGetLogsRequest>) -> R<Self::AppGetLogsStream> {
        apps::app_get_logs(&self.0, req)
    }
    async fn secret_get_or_create(
        &self,
        req: Request<api::SecretGetOrCreateRequest>,
    ) -> R<api::SecretGetOrCreateResponse> {
        apps::secret_get_or_create(&self.0, req)
    }

    async fn image_get_or_create(
        &self,
        req: Request<api::ImageGetOrCreateRequest>,
    ) -> R<api::ImageGetOrCreateResponse> {
        images::get_or_create(&self.0, req).await
    }
    type ImageJoinStreamingStream = Stream<api::ImageJoinStreamingResponse>;
    async fn image_join_streaming(
        &self,
        req: Request<api::ImageJoinStreamingRequest>,
    ) -> R<Self::ImageJoinStreamingStream> {
        images::join_streaming(&self.0, req)
    }
    async fn image_from_id(&self, req: Request<api::ImageFromIdRequest>) -> R<api::ImageFromIdResponse> {
        images::from_id(&self.0, req)
    }

    async fn sandbox_create(&self, req: Request<api::SandboxCreateRequest>) -> R<api::SandboxCreateResponse> {
        sandboxes::create_v1(&self.0, req).await
    }
    async fn sandbox_create_v2(&self, req: Request<api::SandboxCreateV2Request>) -> R<api::SandboxCreateV2Response> {
        sandboxes::create_v2(&self.0, req).await
    }
    async fn sandbox_get_task_id(
        &self,
        req: Request<api::SandboxGetTaskIdRequest>,
    ) -> R<api::SandboxGetTaskIdResponse> {
        sandboxes::get_task_id(&self.0, req)
    }
    async fn sandbox_get_task_id_v2(
        &self,
        req: Request<api::SandboxGetTaskIdRequest>,
    ) -> R<api::SandboxGetTaskIdResponse> {
        sandboxes::get_task_id(&self.0, req)
    }
    async fn sandbox_wait(&self, req: Request<api::SandboxWaitRequest>) -> R<api::SandboxWaitResponse> {
        sandboxes::wait(&self.0, req).await
    }
    async fn sandbox_wait_v2(&self, req: Request<api::SandboxWaitRequest>) -> R<api::SandboxWaitResponse> {
        sandboxes::wait(&self.0, req).await
    }
    async fn sandbox_terminate(&self, req: Request<api::SandboxTerminateRequest>) -> R<api::SandboxTerminateResponse> {
        sandboxes::terminate(&self.0, req).await
    }
    async fn sandbox_terminate_v2(
        &self,
        req: Request<api::SandboxTerminateRequest>,
    ) -> R<api::SandboxTerminateResponse> {
        sandboxes::terminate(&self.0, req).await
    }
    async fn sandbox_list(&self, req: Request<api::SandboxListRequest>) -> R<api::SandboxListResponse> {
        sandboxes::list(&self.0, req)
    }
    async fn sandbox_list_v2(&self, req: Request<api::SandboxListRequest>) -> R<api::SandboxListResponse> {
        sandboxes::list(&self.0, req)
    }
    async fn sandbox_tags_get(&self, req: Request<api::SandboxTagsGetRequest>) -> R<api::SandboxTagsGetResponse> {
        sandboxes::tags_get(&self.0, req)
    }
    async fn sandbox_tags_get_v2(&self, req: Request<api::SandboxTagsGetRequest>) -> R<api::SandboxTagsGetResponse> {
        sandboxes::tags_get(&self.0, req)
    }
    async fn sandbox_tags_set(&self, req: Request<api::SandboxTagsSetRequest>) -> R<()> {
        sandboxes::tags_set(&self.0, req)
    }
    async fn sandbox_tags_set_v2(&self, req: Request<api::SandboxTagsSetRequest>) -> R<()> {
        sandboxes::tags_set(&self.0, req)
    }
    async fn sandbox_get_command_router_access(
        &self,
        req: Request<api::SandboxGetCommandRouterAccessRequest>,
    ) -> R<api::SandboxGetCommandRouterAccessResponse> {
        sandboxes::router_access_v2(&self.0, req)
    }
    async fn task_get_command_router_access(
        &self,
        req: Request<api::TaskGetCommandRouterAccessRequest>,
    ) -> R<api::TaskGetCommandRouterAccessResponse> {
        sandboxes::router_access_v1(&self.0, req)
    }
}
