//! Who may read the admin listener (issue 30, item 2). With an admin token
//! (`server.admin_token_env`) everything but `/healthz` and `/readyz` needs it, as a bearer
//! token (Prometheus) or as the password of HTTP Basic (a browser's prompt); the status page
//! opened with Basic credentials in headless Chromium loads its figures. Without a token the
//! listener stays open but `/admin/usage`. Any method but GET and HEAD gets 405, token or not.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::harness::client::request;
use crate::harness::{basic_config, get, Mock, Response, Sluice};
use crate::status_page::{chromium, dump_dom, text_of};

const TOKEN: &str = "test-admin-token-0123456789";

/// Every path the admin listener serves, and one it does not.
const GUARDED: [&str; 6] = [
    "/",
    "/index.html",
    "/status.json",
    "/metrics",
    "/admin/usage",
    "/no-such-page",
];

fn with_token(mock: &Mock) -> Sluice {
    Sluice::start_with_env(
        &basic_config(
            &mock.base_url(),
            "  admin_token_env: SLUICE_TEST_ADMIN_TOKEN\n",
        ),
        &[("SLUICE_TEST_ADMIN_TOKEN", TOKEN)],
    )
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn status_of(r: &Response, what: &str) -> u16 {
    eprintln!("{what}: {}", r.status);
    r.status
}

#[test]
fn with_an_admin_token_everything_but_health_and_readiness_needs_it() {
    let mock = Mock::start("{}");
    let s = with_token(&mock);
    assert_eq!(
        s.chat(&crate::cancellation::chat_body(false, "{}")).status,
        200
    );
    let bearer = format!("Bearer {TOKEN}");
    let wrong_bearer = "Bearer test-admin-token-0123456780".to_owned();
    let basic_ok = basic("prometheus", TOKEN);
    let basic_wrong = basic("admin", "not-the-token-0123456789");
    // The token as the Basic user name is not the password.
    let basic_as_user = basic(TOKEN, "x");
    for path in GUARDED {
        for (auth, what) in [
            (None, "no credentials"),
            (Some(wrong_bearer.as_str()), "a wrong bearer token"),
            (Some(basic_wrong.as_str()), "a wrong Basic password"),
            (Some(basic_as_user.as_str()), "the token as the Basic user"),
            (Some(TOKEN), "the bare token (no scheme)"),
        ] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("authorization", a)).into_iter().collect();
            let r = get(s.admin, path, &headers);
            assert_eq!(
                status_of(&r, &format!("GET {path} with {what}")),
                401,
                "{}",
                r.text()
            );
            assert_eq!(
                r.header("www-authenticate"),
                Some(r#"Basic realm="sluice admin", charset="UTF-8""#),
                "GET {path} with {what}"
            );
            assert_eq!(r.json()["error"]["code"], "invalid_admin_token");
            // Nothing of what the page shows leaks in a refusal.
            assert!(!r.text().contains("acme/chat"), "{}", r.text());
        }
        let expect = if path == "/no-such-page" { 404 } else { 200 };
        for auth in [&bearer, &basic_ok] {
            let r = get(s.admin, path, &[("authorization", auth)]);
            assert_eq!(r.status, expect, "GET {path} with {auth}: {}", r.text());
        }
    }
    // What each authenticated path serves.
    let r = get(s.admin, "/metrics", &[("authorization", &bearer)]);
    assert!(r.text().contains("sluice_requests_total"), "{}", r.text());
    let r = get(s.admin, "/status.json", &[("authorization", &basic_ok)]);
    assert_eq!(r.json()["requests"]["total"], 1.0, "{}", r.text());
    let r = get(s.admin, "/admin/usage", &[("authorization", &basic_ok)]);
    assert!(r.json().is_array(), "{}", r.text());
    // Liveness and readiness stay open (probes carry no token).
    for path in ["/healthz", "/readyz"] {
        assert_eq!(get(s.admin, path, &[]).status, 200, "{path}");
    }
}

#[test]
fn without_an_admin_token_the_listener_is_open_but_usage_data() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    for path in ["/", "/status.json", "/metrics", "/healthz", "/readyz"] {
        assert_eq!(get(s.admin, path, &[]).status, 200, "{path}");
    }
    let r = get(s.admin, "/admin/usage", &[]);
    assert_eq!(r.status, 403, "{}", r.text());
}

/// `HEAD path` with `auth` on a connection closed after it: the head, and every byte that
/// came after it (none: a HEAD answer has no body).
fn head(admin: SocketAddr, path: &str, auth: &str) -> (String, Vec<u8>) {
    let mut c = TcpStream::connect(admin).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(5))).ok();
    write!(
        c,
        "HEAD {path} HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\nconnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).expect("read");
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    (
        String::from_utf8_lossy(&raw[..at]).into_owned(),
        raw[at..].to_vec(),
    )
}

#[test]
fn only_get_and_head_are_answered() {
    let mock = Mock::start("{}");
    let s = with_token(&mock);
    let bearer = format!("Bearer {TOKEN}");
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        for path in ["/metrics", "/healthz", "/readyz", "/admin/usage", "/"] {
            for auth in [None, Some(bearer.as_str())] {
                let headers: Vec<(&str, &str)> =
                    auth.map(|a| ("authorization", a)).into_iter().collect();
                let r = request(s.admin, method, path, &headers, b"{}");
                assert_eq!(r.status, 405, "{method} {path}: {}", r.text());
                assert_eq!(r.header("allow"), Some("GET, HEAD"), "{method} {path}");
            }
        }
    }
    let (h, body) = head(s.admin, "/metrics", &bearer);
    assert!(h.starts_with("HTTP/1.1 200"), "{h}");
    assert!(body.is_empty(), "HEAD sent {} body bytes", body.len());
    let (h, body) = head(s.admin, "/metrics", "Bearer wrong-token-0123456789");
    assert!(h.starts_with("HTTP/1.1 401"), "{h}");
    assert!(body.is_empty(), "HEAD sent {} body bytes", body.len());

    // Without a token the methods are refused the same way.
    let open = Sluice::start(&basic_config(&mock.base_url(), ""));
    let r = request(open.admin, "POST", "/metrics", &[], b"{}");
    assert_eq!(r.status, 405, "{}", r.text());
}

#[test]
fn the_status_page_opened_with_basic_credentials_loads_its_figures_in_chromium() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chromium is not installed (scripts/install-deps.sh installs Debian's `chromium`)"
        );
        eprintln!("SKIPPED: no chromium on PATH");
        return;
    };
    let mock = Mock::start("{}");
    let s = with_token(&mock);
    assert_eq!(
        s.chat(&crate::cancellation::chat_body(false, "{}")).status,
        200
    );
    // As a user would after the browser's prompt: the credentials go with the page and,
    // held by the browser for the origin, with its fetch of /status.json.
    let dom = dump_dom(&browser, &format!("http://admin:{TOKEN}@{}/", s.admin));
    assert_eq!(text_of(&dom, "error").as_deref(), Some(""), "{dom}");
    assert_ne!(text_of(&dom, "updated").as_deref(), Some("never"), "{dom}");
    assert_eq!(
        text_of(&dom, "requests-total").as_deref(),
        Some("1"),
        "{dom}"
    );
    // Without credentials (headless Chromium cancels the prompt): none of the page.
    let dom = dump_dom(&browser, &format!("http://{}/", s.admin));
    assert!(!dom.contains("requests-total"), "{dom}");
}
