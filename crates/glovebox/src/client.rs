//! A thin HTTP client of the native API (what `sandbox`, `files` and `run` use).

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use glovebox_proto::api::{CreateSandbox, ErrorBody, ExecRequest, ExecStreamLine, Sandbox};
use reqwest::{Method, RequestBuilder, Response, StatusCode};

/// The base URL of requests to the daemon embedded in this process (never connected to).
const LOCAL_BASE: &str = "http://embedded.glovebox.invalid";

/// How long a create waits for the daemon to build the template it asks for.
const BUILD_WAIT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

pub struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
    /// The daemon embedded in this process, called without a socket (see [`Client::local`]).
    local: Option<glovebox_daemon::server::Local>,
}

/// An API error, kept typed so callers can map it to exit codes.
#[derive(Debug)]
pub struct ApiFailure {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}, HTTP {})", self.message, self.code, self.status.as_u16())
    }
}
impl std::error::Error for ApiFailure {}

impl Client {
    pub fn new(base: &str, key: &str) -> Result<Client> {
        let http = reqwest::Client::builder().no_proxy().build().context("http client")?;
        Ok(Client { http, base: base.trim_end_matches('/').to_string(), key: key.to_string(), local: None })
    }

    /// A client of the daemon embedded in this process: the same requests, answered by its
    /// router directly instead of through a loopback connection (no connect, accept, or
    /// hand-off between the client's task and a connection's).
    pub fn local(local: glovebox_daemon::server::Local, key: &str) -> Result<Client> {
        let mut c = Client::new(LOCAL_BASE, key)?;
        c.local = Some(local);
        Ok(c)
    }

    /// A WebSocket request for `path` on the daemon, with the key.
    pub fn ws_request(&self, path: &str) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = match self.base.split_once("://") {
            Some(("http", rest)) => format!("ws://{rest}{path}"),
            Some(("https", _)) => {
                bail!("terminals need a plain http:// daemon URL (this build has no TLS WebSocket client)")
            }
            _ => bail!("GLOVEBOX_URL must start with http://, got {}", self.base),
        };
        let mut req = url.into_client_request().context("WebSocket request")?;
        let auth = format!("Bearer {}", self.key).parse().context("API key is not a valid header value")?;
        req.headers_mut().insert("authorization", auth);
        Ok(req)
    }

    pub fn req(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{}", self.base, path)).bearer_auth(&self.key)
    }

    pub async fn send(&self, rb: RequestBuilder) -> Result<Response> {
        let resp = match &self.local {
            None => rb.send().await.with_context(|| format!("cannot reach the glovebox daemon at {}", self.base))?,
            Some(local) => {
                let req: http::Request<reqwest::Body> = rb.build().context("request")?.try_into().context("request")?;
                Response::from(local.call(req).await.map(reqwest::Body::wrap_stream))
            }
        };
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => Err(ApiFailure { status, code: b.error.code.to_string(), message: b.error.message }.into()),
            Err(_) => {
                Err(ApiFailure { status, code: "http_error".into(), message: format!("HTTP {status}: {text}") }.into())
            }
        }
    }

    pub async fn json<T: serde::de::DeserializeOwned>(&self, rb: RequestBuilder) -> Result<T> {
        let resp = self.send(rb).await?;
        resp.json::<T>().await.context("bad response from the daemon")
    }

    /// Creates a sandbox. While the daemon builds the template it asks for (a shipped one
    /// not built yet), prints the build's progress on stderr and asks again.
    pub async fn create(&self, req: &CreateSandbox) -> Result<Sandbox> {
        let deadline = std::time::Instant::now() + BUILD_WAIT;
        let mut shown = String::new();
        loop {
            match self.json(self.req(Method::POST, "/v1/sandboxes").json(req)).await {
                Err(e) => match e.downcast_ref::<ApiFailure>() {
                    Some(f)
                        if f.code == "unavailable"
                            && f.message.starts_with("building template")
                            && std::time::Instant::now() < deadline =>
                    {
                        if f.message != shown {
                            eprintln!("{}", f.message.split(';').next().unwrap_or(&f.message));
                            shown = f.message.clone();
                        }
                        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                    }
                    _ => return Err(e),
                },
                ok => return ok,
            }
        }
    }

    pub async fn kill(&self, id: &str) -> Result<()> {
        self.send(self.req(Method::DELETE, &format!("/v1/sandboxes/{id}"))).await.map(drop)
    }

    /// Runs a command with NDJSON streaming, calling `on_line` for every line.
    pub async fn exec_stream(
        &self,
        id: &str,
        req: &ExecRequest,
        mut on_line: impl FnMut(ExecStreamLine) -> Result<()>,
    ) -> Result<()> {
        let resp = self
            .send(
                self.req(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .header("accept", "application/x-ndjson")
                    .json(req),
            )
            .await?;
        let mut body = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        let mut ended = false;
        while let Some(chunk) = body.next().await {
            buf.extend_from_slice(&chunk.context("reading the command's output")?);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let parsed: ExecStreamLine =
                    serde_json::from_slice(&line).map_err(|e| anyhow!("bad stream line from the daemon: {e}"))?;
                ended |= matches!(parsed, ExecStreamLine::Exited(_) | ExecStreamLine::Error { .. });
                on_line(parsed)?;
            }
        }
        if !ended {
            bail!("the daemon ended the stream before the command finished");
        }
        Ok(())
    }
}
