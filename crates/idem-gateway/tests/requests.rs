//! Requests written to dodge the route policy or confuse the gateway, sent byte for byte on a
//! raw connection (a client library would normalise them), and what reaches the upstream.

mod support;

use std::sync::atomic::Ordering;

use support::*;

const INVALID: &str = "urn:idem:problem:request-invalid";

fn request(method: &str, target: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {target} HTTP/1.1\r\nHost: gw.test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{headers}connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `post` is not `POST` to the route table, but Werkzeug, among others, upper-cases methods:
/// a spelling the routes did not match must not reach the upstream unprotected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_spelled_in_lower_case_is_refused_not_forwarded() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    for method in ["post", "Post", "pOST", "get", "purge"] {
        let r = raw(g.addr, &request(method, "/v1/charges", "", BODY)).await;
        assert_eq!(
            (r.status(), r.problem_type().as_str()),
            (400, INVALID),
            "{method}: {}",
            r.text
        );
    }
    assert_eq!(up.seen(), Vec::<String>::new());
    // The canonical spellings still work: POST is protected, an extension method passes.
    let r = raw(g.addr, &request("POST", "/v1/charges", "", BODY)).await;
    assert_eq!(
        r.problem_type(),
        "urn:idem:problem:key-missing",
        "{}",
        r.text
    );
    let r = raw(g.addr, &request("PURGE", "/v1/charges", "", "")).await;
    assert_eq!(r.status(), 405, "axum's answer to PURGE: {}", r.text);
    assert_eq!(up.seen(), vec!["PURGE /v1/charges".to_owned()]);
    assert_eq!(up.0.load(Ordering::SeqCst), 0);
}

/// With an upstream prefix, dot segments in any spelling must not leave it: the routes saw
/// the resolved path, so the upstream must never get the raw one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_and_backslashes_are_refused_not_forwarded() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}/api")).await;
    for target in [
        "/../admin/delete",
        "/%2e%2e/admin/delete",
        "/%2E%2E/admin/delete",
        "/.%2e/admin/delete",
        "/v1/../../admin",
        "/v1/..;x/../admin",
        "/v1/./read",
        "/v1/..%2F..%2Fadmin",
        "/v1\\..\\..\\admin",
        "/v1/%5C..%5C..%5Cadmin",
    ] {
        for method in ["GET", "POST", "DELETE"] {
            let r = raw(g.addr, &request(method, target, "", "")).await;
            assert_eq!(
                (r.status(), r.problem_type().as_str()),
                (400, INVALID),
                "{method} {target}: {}",
                r.text
            );
        }
    }
    assert_eq!(up.seen(), Vec::<String>::new());
    // Ordinary paths keep the prefix, and encoded slashes are passed as they are.
    for target in ["/v1/read?x=1", "/v1/a%2Fb", "/v1/a..b/.well-known"] {
        raw(g.addr, &request("GET", target, "", "")).await;
    }
    assert_eq!(
        up.seen(),
        vec![
            "GET /api/v1/read?x=1".to_owned(),
            "GET /api/v1/a%2Fb".to_owned(),
            "GET /api/v1/a..b/.well-known".to_owned(),
        ]
    );
}

/// A client that asks before sending a body learns at once that it is over the route's
/// bound: 413, not `100 Continue` followed by a refusal of the body it was told to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_over_the_body_bound_gets_413_without_100() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    let head = "POST /v1/charges HTTP/1.1\r\nHost: gw.test\r\ncontent-type: application/json\r\ncontent-length: 5000\r\nidempotency-key: big\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n";
    let r = raw(g.addr, head.as_bytes()).await;
    assert_eq!(
        (r.status(), r.problem_type().as_str()),
        (413, "urn:idem:problem:body-too-large"),
        "{}",
        r.text
    );
    assert!(!r.text.contains("100 Continue"), "{}", r.text);
    // Within the bound, the client is told to go on, and the charge executes.
    let head = format!(
        "POST /v1/charges HTTP/1.1\r\nHost: gw.test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nidempotency-key: small\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let r = raw(g.addr, head.as_bytes()).await;
    assert!(r.text.contains("201 Created"), "{}", r.text);
    assert_eq!(up.0.load(Ordering::SeqCst), 1);
}

/// A reverse proxy cannot open tunnels or serve a whole-server target: a clear refusal, not
/// an empty reply or an error blamed on the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_targets_that_cannot_be_forwarded_are_refused() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}/api")).await;
    let r = raw(
        g.addr,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(
        (r.status(), r.problem_type().as_str()),
        (405, "urn:idem:problem:method-not-allowed"),
        "{}",
        r.text
    );
    assert!(
        r.text.to_ascii_lowercase().contains("\r\nallow: "),
        "{}",
        r.text
    );
    // A key claimed for it is released: nothing was sent.
    let r = raw(
        g.addr,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nidempotency-key: tunnel\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), 405, "{}", r.text);
    let rec = record_of(g.admin, "tunnel").await;
    assert_eq!(rec.status, 404, "the key was not released: {}", rec.body);
    let r = raw(g.addr, &request("OPTIONS", "*", "", "")).await;
    assert_eq!(
        (r.status(), r.problem_type().as_str()),
        (400, INVALID),
        "{}",
        r.text
    );
    assert_eq!(up.seen(), Vec::<String>::new());
    // The absolute form names this gateway's resource by its path, like the origin form.
    let r = raw(
        g.addr,
        &request("GET", "http://elsewhere.test/v1/read", "", ""),
    )
    .await;
    assert!(r.problem_type().is_empty(), "{}", r.text);
    assert_eq!(up.seen(), vec!["GET /api/v1/read".to_owned()]);
}

/// RFC 9110 §11.1: the authentication scheme is case-insensitive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_is_accepted_with_the_scheme_in_any_case() {
    let (up_addr, _up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    for auth in [
        "Bearer s3cret-admin-token",
        "bearer s3cret-admin-token",
        "BEARER s3cret-admin-token",
        "Bearer  s3cret-admin-token",
    ] {
        let r = send(g.admin, "GET", "/metrics", &[("authorization", auth)], "").await;
        assert_eq!(r.status, 200, "{auth}: {}", r.body);
    }
    for auth in [
        "Bearer s3cre",
        "Basic s3cret-admin-token",
        "Bearers3cret-admin-token",
        "s3cret-admin-token",
        "Bearer s3cret-admin-token x",
    ] {
        let r = send(g.admin, "GET", "/metrics", &[("authorization", auth)], "").await;
        assert_eq!(r.status, 401, "{auth}: {}", r.body);
    }
}

/// Spellings of a keyed route that services route to it (Express and ASP.NET ignore case,
/// IIS trims trailing dots and spaces, Rails and Spring strip a format suffix, WSGI servers
/// decode an encoded slash) need its key too; a method-override header, which frameworks obey, and encoded control characters are
/// refused. None reaches the upstream without a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_services_route_to_a_keyed_endpoint_need_its_key() {
    let (up_addr, up) = start_upstream().await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    for target in [
        "/V1/CHARGES",
        "/v1/Charges",
        "/v1/charges.",
        "/v1/charges.json",
        "/v1/charges%20",
        "/v1%2Fcharges",
        "/%2Fv1/charges",
        "/v1%5Ccharges",
    ] {
        let r = raw(g.addr, &request("POST", target, "", BODY)).await;
        assert_eq!(
            r.problem_type(),
            "urn:idem:problem:key-missing",
            "{target}: {}",
            r.text
        );
    }
    for (target, headers) in [
        ("/v1/charges%00", ""),
        ("/v1/other", "x-http-method-override: POST\r\n"),
        ("/v1/other", "X-HTTP-Method: POST\r\n"),
        ("/v1/other", "x-method-override: POST\r\n"),
    ] {
        let r = raw(g.addr, &request("PUT", target, headers, BODY)).await;
        assert_eq!(
            (r.status(), r.problem_type().as_str()),
            (400, INVALID),
            "{target} {headers}: {}",
            r.text
        );
    }
    assert_eq!(up.seen(), Vec::<String>::new());
    assert_eq!(up.0.load(Ordering::SeqCst), 0);
}

/// A segment of `;params` alone in a `{param}` position is the parameter to Express
/// (`/v1/charges/;ch_1/capture` runs the capture of `;ch_1`), though servers that strip
/// parameters drop it: the keyed route matches it, so it needs the route's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_of_parameters_alone_needs_the_key_of_a_param_route() {
    let (up_addr, up) = start_upstream().await;
    let config = format!(
        "{CONFIG}\n[[routes]]\nmethod = \"POST\"\npath = \"/v1/charges/{{id}}/capture\"\nrequire_key = true\n"
    );
    let g = start_gateway_from(&format!("http://{up_addr}"), &config).await;
    for target in [
        "/v1/charges/;ch_1/capture",
        "/v1/charges/;/capture",
        "/v1/charges/;x=1/capture",
        "/V1/Charges/;/Capture",
    ] {
        let r = raw(g.addr, &request("POST", target, "", BODY)).await;
        assert_eq!(
            r.problem_type(),
            "urn:idem:problem:key-missing",
            "{target}: {}",
            r.text
        );
    }
    assert_eq!(up.seen(), Vec::<String>::new());
}

/// What the upstream is told about the hop: its own authority as `Host`, the client's in
/// `X-Forwarded-Host`, the client's address appended to `X-Forwarded-For`, `http` as
/// `X-Forwarded-Proto` and no `Forwarded` of the client's; hop-by-hop headers stop at the
/// gateway both ways, those `Connection` names included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_is_told_the_hop_and_hop_by_hop_headers_stop_at_the_gateway() {
    use axum::http::HeaderMap;
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::<HeaderMap>::new()));
    let app = axum::Router::new().fallback({
        let heard = heard.clone();
        move |headers: HeaderMap| async move {
            if let Ok(mut h) = heard.lock() {
                h.push(headers);
            }
            (
                [
                    ("connection", "keep-alive, x-upstream-hop"),
                    ("x-upstream-hop", "1"),
                    ("keep-alive", "timeout=5"),
                    ("x-kept", "1"),
                ],
                "ok",
            )
        }
    });
    let up_addr = serve_on_loopback(app).await;
    let g = start_gateway(&format!("http://{up_addr}")).await;
    let heard_one = |extra: &str| {
        let heard = heard.clone();
        let extra = extra.to_owned();
        let addr = g.addr;
        async move {
            let r = raw(addr, &request("POST", "/v1/unkeyed", &extra, BODY)).await;
            assert_eq!(r.status(), 200, "{}", r.text);
            let lower = r.text.to_ascii_lowercase();
            for hop in ["x-upstream-hop", "keep-alive: timeout"] {
                assert!(!lower.contains(hop), "{hop}: {}", r.text);
            }
            assert!(
                r.text.to_ascii_lowercase().contains("x-kept: 1"),
                "{}",
                r.text
            );
            heard
                .lock()
                .ok()
                .and_then(|mut h| h.pop())
                .unwrap_or_default()
        }
    };
    let value = |h: &HeaderMap, name: &str| {
        h.get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join("|")
    };

    let h = heard_one("").await;
    assert_eq!(value(&h, "host"), up_addr.to_string());
    assert_eq!(value(&h, "x-forwarded-host"), "gw.test");
    assert_eq!(value(&h, "x-forwarded-for"), "127.0.0.1");
    assert_eq!(value(&h, "x-forwarded-proto"), "http");
    // The client's `Connection: close` is its own hop's.
    assert_eq!(value(&h, "connection"), "");

    let h = heard_one(
        "x-forwarded-for: 203.0.113.7\r\nforwarded: for=198.51.100.1\r\nx-forwarded-host: evil.test\r\nte: trailers\r\nx-client-hop: 1\r\nx-end-to-end: 1\r\nconnection: x-client-hop\r\n",
    )
    .await;
    assert_eq!(value(&h, "x-forwarded-for"), "203.0.113.7, 127.0.0.1");
    assert_eq!(value(&h, "x-forwarded-host"), "gw.test");
    assert_eq!(value(&h, "forwarded"), "");
    assert_eq!(value(&h, "te"), "");
    assert_eq!(value(&h, "x-client-hop"), "");
    assert_eq!(value(&h, "x-end-to-end"), "1");
    assert_eq!(value(&h, "connection"), "");

    // A list split over several lines is kept whole, in order.
    let h = heard_one(
        "x-forwarded-for: 203.0.113.7\r\nx-forwarded-for: 198.51.100.2, 192.0.2.9\r\nconnection: KEEP-ALIVE , Te\r\nkeep-alive: timeout=5\r\n",
    )
    .await;
    assert_eq!(
        value(&h, "x-forwarded-for"),
        "203.0.113.7, 198.51.100.2, 192.0.2.9, 127.0.0.1"
    );
    assert_eq!(value(&h, "keep-alive"), "");
}
