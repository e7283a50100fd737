//! Short-lived tokens in the JWT shape the client reads (it decodes the payload's `exp` to
//! know when to refresh, and never checks the signature): the auth token (`AuthTokenGet`),
//! and the command router's token, which alone authenticates `TaskCommandRouter` calls and
//! names the one sandbox they may reach. Signed with HMAC-SHA256 under a key made at start
//! and kept in memory: a restarted daemon's tokens are refused (UNAUTHENTICATED), and the
//! client fetches fresh ones.

use base64::Engine;
use serde::{Deserialize, Serialize};
use tonic::Status;

use crate::tenants::Caller;

/// How long a token is good for (the client refreshes it halfway).
pub const LIFETIME_S: u64 = 3600;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Claims {
    /// `auth` or `router`.
    kind: String,
    tenant: String,
    admin: bool,
    /// The sandbox a router token reaches.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    sandbox: String,
    exp: u64,
}

/// What a valid router token grants: one sandbox, for one caller.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterGrant {
    pub sandbox: String,
    pub caller: Caller,
}

pub struct Signer {
    key: ring::hmac::Key,
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Signer {
    pub fn new() -> Signer {
        let mut k = [0u8; 32];
        // Without OS randomness no token could be trusted: fail loudly, as ids do.
        if getrandom::fill(&mut k).is_err() {
            panic!("no OS randomness available");
        }
        Signer { key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &k) }
    }

    fn sign(&self, c: &Claims) -> String {
        let head = B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let body = B64.encode(serde_json::to_vec(c).unwrap_or_default());
        let msg = format!("{head}.{body}");
        let tag = ring::hmac::sign(&self.key, msg.as_bytes());
        format!("{msg}.{}", B64.encode(tag.as_ref()))
    }

    fn check(&self, token: &str) -> Option<Claims> {
        let (msg, tag) = token.rsplit_once('.')?;
        let tag = B64.decode(tag).ok()?;
        ring::hmac::verify(&self.key, msg.as_bytes(), &tag).ok()?;
        let (_, body) = msg.split_once('.')?;
        let c: Claims = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
        (c.exp > now()).then_some(c)
    }

    /// The token `AuthTokenGet` answers.
    pub fn auth_token(&self, caller: &Caller) -> String {
        self.sign(&Claims {
            kind: "auth".into(),
            tenant: caller.tenant.clone(),
            admin: caller.admin,
            sandbox: String::new(),
            exp: now() + LIFETIME_S,
        })
    }

    /// A token for the command router of `sandbox`.
    pub fn router_token(&self, caller: &Caller, sandbox: &str) -> String {
        self.sign(&Claims {
            kind: "router".into(),
            tenant: caller.tenant.clone(),
            admin: caller.admin,
            sandbox: sandbox.to_string(),
            exp: now() + LIFETIME_S,
        })
    }

    /// The grant of a router call's `authorization: Bearer <token>`.
    pub fn verify_router(&self, h: &axum::http::HeaderMap) -> Result<RouterGrant, Status> {
        let token = h
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("missing command router token"))?;
        match self.check(token.trim()) {
            Some(c) if c.kind == "router" && !c.sandbox.is_empty() => {
                Ok(RouterGrant { sandbox: c.sandbox, caller: Caller { tenant: c.tenant, admin: c.admin } })
            }
            _ => Err(Status::unauthenticated("invalid or expired command router token")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(t: &str) -> axum::http::HeaderMap {
        let mut h = axum::http::HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, format!("Bearer {t}").parse().unwrap());
        h
    }

    #[test]
    fn router_tokens_name_their_sandbox_and_are_checked() {
        let s = Signer::new();
        let caller = Caller { tenant: "acme".into(), admin: false };
        let t = s.router_token(&caller, "sb1");
        let g = s.verify_router(&bearer(&t)).unwrap();
        assert_eq!(g, RouterGrant { sandbox: "sb1".into(), caller: caller.clone() });
        // Another daemon's (or a forged) token, an auth token, garbage: refused.
        assert!(Signer::new().verify_router(&bearer(&t)).is_err());
        assert!(s.verify_router(&bearer(&s.auth_token(&caller))).is_err());
        assert!(s.verify_router(&bearer("a.b.c")).is_err());
        assert!(s.verify_router(&axum::http::HeaderMap::new()).is_err());
        let (msg, _) = t.rsplit_once('.').unwrap();
        let (head, _) = msg.split_once('.').unwrap();
        let forged = Claims {
            kind: "router".into(),
            tenant: "other".into(),
            admin: true,
            sandbox: "sb1".into(),
            exp: now() + 60,
        };
        let body = B64.encode(serde_json::to_vec(&forged).unwrap());
        let sig = t.rsplit_once('.').unwrap().1;
        assert!(s.verify_router(&bearer(&format!("{head}.{body}.{sig}"))).is_err(), "a changed payload is refused");
    }

    #[test]
    fn the_client_can_read_the_expiry() {
        let s = Signer::new();
        let t = s.auth_token(&Caller::admin());
        let body = t.split('.').nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&B64.decode(body).unwrap()).unwrap();
        assert!(v["exp"].as_u64().unwrap() > now());
    }
}
