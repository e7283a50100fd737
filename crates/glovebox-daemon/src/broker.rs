//! Credential brokering: for a domain whose rule injects headers, the egress proxy terminates
//! the sandbox's TLS with a leaf certificate signed by the sandbox's own CA, sets the headers
//! on every HTTP/1.1 request of the connection, and forwards the requests over a TLS
//! connection to the real upstream that it verifies fully (system roots plus the daemon's
//! extra CA bundle, `GLOVEBOX_UPSTREAM_CA`).
//!
//! Invariants:
//! - the CA's private key lives only in this process (the sandbox gets the certificate);
//! - the upstream is verified before the sandbox's handshake is accepted: a sandbox never
//!   gets a brokered connection to a server that could not prove the name;
//! - requests whose Host (or absolute URI) names another host are refused (421), so a
//!   credential is only ever sent to the name the rule gives;
//! - ALPN offers http/1.1 only (both sides): HTTP/2 clients fall back.

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The system bundle (Debian's path), read for upstream roots and copied into sandboxes.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum BrokerError {
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("tls config: {0}")]
    Tls(#[from] rustls::Error),
    #[error("upstream unreachable: {0}")]
    Connect(String),
    #[error("upstream TLS: {0}")]
    UpstreamTls(String),
    #[error("sandbox TLS handshake: {0}")]
    ClientTls(String),
    #[error("{0:?} is not a valid server name")]
    Name(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A sandbox's CA: its certificate (what the sandbox trusts) and a cache of leaf configs.
pub struct Ca {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    leaf_key: rcgen::KeyPair,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

fn validity() -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    (now - time::Duration::days(1), now + time::Duration::days(398))
}

impl Ca {
    /// A fresh CA (ECDSA P-256) named after `label` (the sandbox id).
    pub fn new(label: &str) -> Result<Ca, BrokerError> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, format!("Glovebox sandbox CA {label}"));
        p.distinguished_name.push(rcgen::DnType::OrganizationName, "Glovebox");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        (p.not_before, p.not_after) = validity();
        let cert = p.self_signed(&key)?;
        let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: rcgen::Issuer::new(p, key),
            leaf_key,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (PEM), for the sandbox's trust store.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A server config presenting a leaf for `name` (made on first use, then cached).
    fn server_config(&self, name: &str) -> Result<Arc<rustls::ServerConfig>, BrokerError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = leaves.get(name) {
            return Ok(c.clone());
        }
        let mut p = rcgen::CertificateParams::new(vec![name.to_string()])?;
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = rcgen::IsCa::NoCa;
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        p.use_authority_key_identifier_extension = true;
        (p.not_before, p.not_after) = validity();
        let leaf = p.signed_by(&self.leaf_key, &self.issuer)?;
        let chain = vec![leaf.der().clone(), self.cert_der.clone()];
        let key = PrivateKeyDer::Pkcs8(self.leaf_key.serialize_der().into());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        leaves.insert(name.to_string(), cfg.clone());
        Ok(cfg)
    }
}

/// Where the daemon finds extra upstream roots (tests point it at their own CA).
pub fn upstream_ca_file() -> Option<std::path::PathBuf> {
    std::env::var_os("GLOVEBOX_UPSTREAM_CA").map(Into::into)
}

/// The upstream TLS client: system roots plus the extra bundle, built once.
fn client_config() -> Result<Arc<rustls::ClientConfig>, BrokerError> {
    static CFG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CFG.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        let mut files = vec![std::path::PathBuf::from(SYSTEM_BUNDLE)];
        files.extend(upstream_ca_file());
        for f in files {
            match CertificateDer::pem_file_iter(&f) {
                Ok(it) => {
                    let (ok, bad) = roots.add_parsable_certificates(it.filter_map(|c| c.ok()));
                    tracing::info!(file = %f.display(), ok, bad, "upstream roots");
                }
                Err(e) => tracing::warn!(file = %f.display(), "upstream roots: {e}"),
            }
        }
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    })
    .clone()
    .map_err(BrokerError::UpstreamTls)
}

/// A stream that first yields bytes already read from it (the peeked ClientHello).
struct Prefixed<S> {
    head: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.pos < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.head[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Counts the bytes the sandbox sent (`up`) and received (`down`) on a stream.
struct Counted<S> {
    inner: S,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.up.fetch_add((buf.filled().len() - before) as u64, Ordering::Relaxed);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, b);
        if let Poll::Ready(Ok(n)) = &r {
            self.down.fetch_add(*n as u64, Ordering::Relaxed);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

type Sender = hyper::client::conn::http1::SendRequest<hyper::body::Incoming>;
type Body = BoxBody<Bytes, hyper::Error>;

/// A verified TLS connection to `dst` for `name`, with an HTTP/1.1 client on it.
async fn connect_upstream(dst: SocketAddrV4, name: &str) -> Result<Sender, BrokerError> {
    let server_name = ServerName::try_from(name.to_string()).map_err(|_| BrokerError::Name(name.to_string()))?;
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst))
        .await
        .map_err(|_| BrokerError::Connect("timed out".into()))?
        .map_err(|e| BrokerError::Connect(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let tls = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsConnector::from(client_config()?).connect(server_name, tcp),
    )
    .await
    .map_err(|_| BrokerError::UpstreamTls("handshake timed out".into()))?
    .map_err(|e| BrokerError::UpstreamTls(e.to_string()))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| BrokerError::UpstreamTls(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn plain(status: StatusCode, msg: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(msg.as_bytes())).map_err(|n| match n {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// What a brokered connection did.
#[derive(Debug, Default)]
pub struct Served {
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub requests: u64,
    pub refused: u64,
}

/// Serves one brokered connection: `conn` from the sandbox (whose first bytes, `head`, were
/// already read), to `dst`, for `name`, setting `headers` on every request.
pub async fn serve(
    conn: TcpStream,
    head: Vec<u8>,
    dst: SocketAddrV4,
    name: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    ca: Arc<Ca>,
) -> Result<Served, BrokerError> {
    let sender = connect_upstream(dst, &name).await?;
    let cfg = ca.server_config(&name)?;
    let tls = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsAcceptor::from(cfg).accept(Prefixed { head, pos: 0, inner: conn }),
    )
    .await
    .map_err(|_| BrokerError::ClientTls("timed out".into()))?
    .map_err(|e| BrokerError::ClientTls(e.to_string()))?;
    let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let io = Counted { inner: tls, up: up.clone(), down: down.clone() };
    let requests = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let state = Arc::new(tokio::sync::Mutex::new(Some(sender)));
    let headers = Arc::new(headers);
    let svc = {
        let (requests, refused, name) = (requests.clone(), refused.clone(), name.clone());
        hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            let (state, headers, requests, refused, name) =
                (state.clone(), headers.clone(), requests.clone(), refused.clone(), name.clone());
            async move {
                let host_ok = |h: &str| {
                    let h = h.rsplit_once(':').map_or(h, |(a, p)| if p.parse::<u16>().is_ok() { a } else { h });
                    h.eq_ignore_ascii_case(&name)
                };
                let host = req.headers().get(hyper::header::HOST).and_then(|v| v.to_str().ok());
                let misdirected = host.is_some_and(|h| !host_ok(h))
                    || req.uri().authority().is_some_and(|a| !host_ok(a.as_str()))
                    || req.headers().get_all(hyper::header::HOST).iter().count() > 1;
                if misdirected {
                    refused.fetch_add(1, Ordering::Relaxed);
                    return Ok::<_, hyper::Error>(plain(
                        StatusCode::MISDIRECTED_REQUEST,
                        "glovebox: this connection only carries requests for the name it was opened for\n",
                    ));
                }
                for (k, v) in headers.iter() {
                    req.headers_mut().remove(k);
                    req.headers_mut().insert(k.clone(), v.clone());
                }
                requests.fetch_add(1, Ordering::Relaxed);
                let mut guard = state.lock().await;
                // The upstream may close an idle keep-alive connection: open a new one.
                let alive = match guard.as_mut() {
                    Some(s) => s.ready().await.is_ok(),
                    None => false,
                };
                if !alive {
                    match connect_upstream(dst, &name).await {
                        Ok(s) => *guard = Some(s),
                        Err(e) => {
                            tracing::debug!("broker reconnect {name}: {e}");
                            *guard = None;
                            return Ok(plain(StatusCode::BAD_GATEWAY, "glovebox: upstream unreachable\n"));
                        }
                    }
                }
                let Some(s) = guard.as_mut() else {
                    return Ok(plain(StatusCode::BAD_GATEWAY, "glovebox: upstream unreachable\n"));
                };
                match s.send_request(req).await {
                    Ok(resp) => Ok(resp.map(|b| b.boxed())),
                    Err(e) => {
                        tracing::debug!("broker request {name}: {e}");
                        *guard = None;
                        Ok(plain(StatusCode::BAD_GATEWAY, "glovebox: upstream request failed\n"))
                    }
                }
            }
        })
    };
    let r = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(300))
        .serve_connection(TokioIo::new(io), svc)
        .await;
    if let Err(e) = r {
        tracing::debug!("brokered connection {name}: {e}");
    }
    Ok(Served {
        bytes_up: up.load(Ordering::Relaxed),
        bytes_down: down.load(Ordering::Relaxed),
        requests: requests.load(Ordering::Relaxed),
        refused: refused.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_signs_leaves_that_verify_against_it() {
        use rustls::client::danger::ServerCertVerifier;
        let ca = Ca::new("test").unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let cfg = ca.server_config("api.good.test").unwrap();
        assert!(Arc::ptr_eq(&cfg, &ca.server_config("api.good.test").unwrap()), "cached");
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);
        // Verify a leaf against a root store holding only this CA.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der.clone()).unwrap();
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider()).build().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["api.good.test".to_string()]).unwrap();
        (p.not_before, p.not_after) = validity();
        let leaf = p.signed_by(&ca.leaf_key, &ca.issuer).unwrap();
        let now = rustls::pki_types::UnixTime::now();
        let name = ServerName::try_from("api.good.test").unwrap();
        assert!(verifier.verify_server_cert(leaf.der(), &[], &name, &[], now).is_ok());
        let other = ServerName::try_from("evil.test").unwrap();
        assert!(verifier.verify_server_cert(leaf.der(), &[], &other, &[], now).is_err());
    }
}
