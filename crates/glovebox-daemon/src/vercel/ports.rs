//! Exposed ports in Vercel's shape: `ports` at create and update, and the `routes` every
//! sandbox answer carries — over the daemon's exposed ports (`crate::ports`), nothing more.
//!
//! The SDK makes a port's URL as `https://${route.subdomain}.vercel.run` (`domain(port)`,
//! fixed in the SDK). A route's `subdomain` here is the port's preview host and its token as
//! the first path segment, `P-<id>.<preview domain>:<daemon port>/<token>`, so `domain(p)` is
//! `https://P-<id>.localhost:7171/<token>.vercel.run`: the daemon takes that segment as the
//! port's token and passes `${domain(p)}/api/x` on as `/api/x`. The URL is the capability,
//! as a Vercel sandbox URL is; the port itself stays private. The scheme is the SDK's: a
//! plain daemon is reached with `http:` (docs/vercel.md).

use axum::http::HeaderMap;
use serde_json::{json, Value};

use super::{ApiError, Vercel};

/// Most ports one sandbox exposes, as on Vercel.
pub const MAX_PORTS: usize = 15;

/// The `ports` of a request: integers 1–65535, at most [`MAX_PORTS`] (repeats count once).
pub fn parse(v: &Value) -> Result<Vec<u16>, ApiError> {
    let bad = |m: String| ApiError::bad(format!("ports: {m}"));
    let list = v.as_array().ok_or_else(|| bad("must be a list of port numbers".into()))?;
    let mut out: Vec<u16> = Vec::new();
    for p in list {
        let port = p
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n != 0)
            .ok_or_else(|| bad(format!("{p} is not a port number (1-65535)")))?;
        if !out.contains(&port) {
            out.push(port);
        }
    }
    if out.len() > MAX_PORTS {
        return Err(bad(format!("at most {MAX_PORTS} ports can be exposed, {} were given", out.len())));
    }
    Ok(out)
}

/// Makes `want` the sandbox's exposed ports (Vercel's `ports` is the whole list): the others
/// are taken off, new ones are exposed private, ports already exposed keep what they were.
pub fn set(st: &Vercel, id: &str, want: &[u16]) -> Result<(), ApiError> {
    let ports = &st.app.manager.ports;
    let have = ports.of(id);
    for (p, _) in &have {
        if !want.contains(p) {
            ports.unexpose(id, *p);
        }
    }
    for p in want {
        if !have.iter().any(|(h, _)| h == p) {
            crate::http::expose_live(&st.app, id, *p, false)?;
        }
    }
    Ok(())
}

/// The sandbox's `routes`: one per exposed port, written with the address the caller reached
/// the daemon at (`h`'s `Host`).
pub fn routes(st: &Vercel, h: &HeaderMap, id: &str) -> Value {
    let ports = &st.app.manager.ports;
    let daemon = crate::http::api_host(h);
    let routes: Vec<Value> = ports
        .of(id)
        .into_iter()
        .map(|(port, _)| {
            let subdomain = format!("{}/{}", ports.host_via(id, port, daemon), ports.token(id, port));
            json!({ "port": port, "subdomain": subdomain, "url": format!("http://{subdomain}.vercel.run") })
        })
        .collect();
    json!(routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_checked_as_vercel_checks_them() {
        assert_eq!(parse(&json!([3000, 8080, 3000])).unwrap(), vec![3000, 8080]);
        assert_eq!(parse(&json!([])).unwrap(), Vec::<u16>::new());
        for bad in [json!([0]), json!([65536]), json!([-1]), json!(["80"]), json!([80.5]), json!(80)] {
            let e = parse(&bad).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (400, "bad_request"), "{bad}");
        }
        let too_many: Vec<u16> = (1..=16).collect();
        let e = parse(&json!(too_many)).unwrap_err();
        assert!(e.message.contains("at most 15"), "{}", e.message);
        assert!(parse(&json!((1..=15).collect::<Vec<u16>>())).is_ok());
    }
}
