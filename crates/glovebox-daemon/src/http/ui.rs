//! The web dashboard at `/ui`: three static files (HTML, one script, one stylesheet)
//! compiled into the binary and served without a key. The page asks for a key and then
//! calls the same public API as any client, so a tenant sees only its own sandboxes.
//!
//! Invariant: the page runs no inline script and loads nothing from elsewhere; every
//! response carries a Content-Security-Policy that says so (`default-src 'self'`), so a
//! string from a sandbox that slipped into the DOM as markup still could not run.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/style.css");
const ICON: &str = include_str!("../../ui/icon.svg");

/// The dashboard's routes (no key: the page itself asks for one).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|h: HeaderMap| async move { page(&h, INDEX, "text/html; charset=utf-8") }))
        .route("/ui/", get(|h: HeaderMap| async move { page(&h, INDEX, "text/html; charset=utf-8") }))
        .route("/ui/app.js", get(|h: HeaderMap| async move { page(&h, SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/ui/style.css", get(|h: HeaderMap| async move { page(&h, STYLE, "text/css; charset=utf-8") }))
        .route("/ui/icon.svg", get(|h: HeaderMap| async move { page(&h, ICON, "image/svg+xml") }))
}

/// The policy for a page served to `host`: only this origin, over HTTP(S) and WebSocket.
/// `'self'` covers same-origin WebSockets in current browsers; the explicit `ws:`/`wss:`
/// sources are for older ones, and are left out when the Host header is anything but a
/// plain host and port (it is the client's to set, and must not write the policy).
pub fn content_security_policy(host: Option<&str>) -> String {
    let plain = |h: &str| {
        !h.is_empty()
            && h.len() <= 255
            && h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
    };
    let ws = match host {
        Some(h) if plain(h) => format!(" ws://{h} wss://{h}"),
        _ => String::new(),
    };
    format!(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
         connect-src 'self'{ws}; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
}

fn page(h: &HeaderMap, body: &'static str, content_type: &'static str) -> Response {
    let host = h.get(header::HOST).and_then(|v| v.to_str().ok());
    let csp = HeaderValue::from_str(&content_security_policy(host))
        .unwrap_or_else(|_| HeaderValue::from_static("default-src 'self'"));
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CONTENT_SECURITY_POLICY, csp),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_only_this_origin() {
        let p = content_security_policy(Some("127.0.0.1:7171"));
        assert!(p.starts_with("default-src 'self'; script-src 'self';"), "{p}");
        assert!(p.contains("connect-src 'self' ws://127.0.0.1:7171 wss://127.0.0.1:7171;"), "{p}");
        assert!(!p.contains("unsafe"), "{p}");
        // A Host header that tries to add sources is left out.
        for h in ["evil.test; script-src *", "a b", "", "x\"y"] {
            let p = content_security_policy(Some(h));
            assert!(p.contains("connect-src 'self'; "), "{h:?}: {p}");
        }
        assert!(content_security_policy(None).contains("connect-src 'self'; "));
    }

    #[test]
    fn the_page_runs_no_inline_script() {
        // Every <script> names a file of ours; no handler attributes.
        for (i, part) in INDEX.split("<script").enumerate().skip(1) {
            let tag = part.split('>').next().unwrap_or_default();
            assert!(tag.contains("src=\"/ui/app.js\""), "script {i} is inline: {tag}");
        }
        let lower = INDEX.to_lowercase();
        for (at, _) in lower.match_indices(" on") {
            let name: String = lower[at + 3..].chars().take_while(|c| c.is_ascii_alphabetic()).collect();
            let after = lower[at + 3 + name.len()..].trim_start();
            assert!(name.is_empty() || !after.starts_with('='), "an inline handler `on{name}=` in index.html");
        }
        assert!(!INDEX.contains("style=\""), "an inline style in index.html");
        assert!(!SCRIPT.contains("innerHTML") && !SCRIPT.contains("outerHTML"), "app.js writes markup");
        assert!(!SCRIPT.contains("eval(") && !SCRIPT.contains("new Function"), "app.js evaluates strings");
        // An image's source is only ever a data: URL the script builds (a code cell's PNG).
        for (at, _) in SCRIPT.match_indices(".src =") {
            assert!(
                SCRIPT[at..].starts_with(".src = `data:${"),
                "app.js sets an image source: {}",
                SCRIPT[at..].chars().take(40).collect::<String>()
            );
        }
        assert!(!SCRIPT.contains("setAttribute('src'") && !SCRIPT.contains("srcdoc"), "app.js sets a source");
        assert!(!INDEX.contains("http://") && !INDEX.contains("https://"), "the page loads something from elsewhere");
    }
}
