//! The HTTP core for host middleware ([`idem_embed::http::HttpFront`]), driven as a
//! middleware drives it: admit, begin, the handler, finish, on threads of the host's own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use idem_embed::http::{Admitted, Begun, HttpFront, Keyed, Reply, config_of};

const CONFIG: &str = r#"
anonymous = "allow"
[[routes]]
method = "POST"
path = "/v1/charges"
wait = "5s"
"#;

fn front(text: &str) -> HttpFront {
    let (config, _) = config_of(Some(text), None).unwrap_or_else(|e| panic!("{e}"));
    HttpFront::new(config, "memory:").unwrap_or_else(|e| panic!("{e}"))
}

fn headers(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    pairs
        .iter()
        .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
        .collect()
}

fn keyed(front: &HttpFront, key: &str, extra: &[(&str, &str)]) -> Keyed {
    let mut h = vec![
        ("idempotency-key", key),
        ("content-type", "application/json"),
    ];
    h.extend_from_slice(extra);
    match front.admit("POST", "/v1/charges?x=1", &headers(&h)) {
        Admitted::Keyed(k) => k,
        other => panic!("{other:?}"),
    }
}

fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a [u8]> {
    r.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
}

/// One request through the front, the handler counting its runs.
fn request(front: &HttpFront, key: &str, body: &str, runs: &AtomicU32) -> Reply {
    match front.begin(keyed(front, key, &[]), body.as_bytes()) {
        Begun::Execute(exe) => {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::sleep(std::time::Duration::from_millis(20));
            exe.finish(
                201,
                &headers(&[("content-type", "application/json")]),
                format!(r#"{{"id":"ch_{n}"}}"#).into_bytes(),
            )
        }
        Begun::Reply(r) => r,
    }
}

#[test]
fn a_request_executes_once_and_its_retries_replay_it() {
    let front = front(CONFIG);
    let runs = AtomicU32::new(0);
    let first = request(&front, "k-1", r#"{"a":1}"#, &runs);
    assert_eq!(
        (first.status, first.body.as_slice()),
        (201, &br#"{"id":"ch_1"}"#[..])
    );
    assert_eq!(header(&first, "idempotent-replayed"), None);
    let again = request(&front, "k-1", r#"{ "a" : 1 }"#, &runs);
    assert_eq!(again.body, first.body);
    assert_eq!(header(&again, "idempotent-replayed"), Some(&b"true"[..]));
    let other = request(&front, "k-1", r#"{"a":2}"#, &runs);
    assert_eq!(other.status, 422);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn sixteen_threads_with_one_key_run_the_handler_once() {
    let front = Arc::new(front(CONFIG));
    let runs = Arc::new(AtomicU32::new(0));
    let replies: Vec<Reply> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let (front, runs) = (front.clone(), runs.clone());
                s.spawn(move || request(&front, "race", "{}", &runs))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a thread panicked")))
            .collect()
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        replies
            .iter()
            .all(|r| r.status == 201 && r.body == br#"{"id":"ch_1"}"#),
        "{replies:?}"
    );
}

#[test]
fn refusals_come_before_anything_is_claimed() {
    let front = front("[[routes]]\nmethod = \"POST\"\npath = \"/v1/charges\"");
    let refused = |method: &str, target: &str, h: &[(&str, &str)]| match front.admit(
        method,
        target,
        &headers(h),
    ) {
        Admitted::Reply(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(refused("POST", "/v1/charges", &[]).status, 400);
    let missing = refused("POST", "/v1/charges", &[]);
    assert!(String::from_utf8_lossy(&missing.body).contains("key-missing"));
    let anonymous = refused("POST", "/v1/charges", &[("idempotency-key", "k")]);
    assert!(String::from_utf8_lossy(&anonymous.body).contains("principal-missing"));
    assert_eq!(refused("post", "/v1/charges", &[]).status, 400);
    assert_eq!(refused("POST", "/v1/../charges", &[]).status, 400);
    assert_eq!(refused("P O", "/v1/charges", &[]).status, 400);
    assert!(matches!(
        front.admit("GET", "/v1/charges", &[]),
        Admitted::Pass
    ));
    assert!(matches!(
        front.admit("POST", "/v1/other", &[]),
        Admitted::Pass
    ));
}

#[test]
fn an_unknown_outcome_is_never_released_and_cookies_stay_with_their_caller() {
    let front = front(CONFIG);
    let Begun::Execute(exe) = front.begin(keyed(&front, "crash", &[]), b"{}") else {
        panic!("first")
    };
    exe.unknown();
    let Begun::Reply(r) = front.begin(keyed(&front, "crash", &[]), b"{}") else {
        panic!("the retry ran again")
    };
    assert_eq!(r.status, 409);
    assert!(String::from_utf8_lossy(&r.body).contains("outcome-unknown"));

    // In the shared anonymous scope the executing caller gets its cookie; a replay does not.
    let Begun::Execute(exe) = front.begin(keyed(&front, "login", &[]), b"{}") else {
        panic!("login")
    };
    let sent = exe.finish(
        200,
        &headers(&[("set-cookie", "session=s3cret")]),
        b"ok".to_vec(),
    );
    assert_eq!(header(&sent, "set-cookie"), Some(&b"session=s3cret"[..]));
    let Begun::Reply(replay) = front.begin(keyed(&front, "login", &[]), b"{}") else {
        panic!("replay")
    };
    assert_eq!(header(&replay, "set-cookie"), None);
    assert_eq!(header(&replay, "idempotent-replayed"), Some(&b"true"[..]));
}

#[test]
fn not_processed_statuses_release_the_key() {
    let front = front(CONFIG);
    let Begun::Execute(exe) = front.begin(keyed(&front, "busy", &[]), b"{}") else {
        panic!("first")
    };
    assert_eq!(exe.finish(429, &[], b"slow down".to_vec()).status, 429);
    assert!(matches!(
        front.begin(keyed(&front, "busy", &[]), b"{}"),
        Begun::Execute(_)
    ));
}

#[test]
fn settings_given_in_code_override_the_file_and_are_checked_alike() {
    let (config, store) = config_of(
        Some("store = \"memory:\"\nanonymous = \"refuse\""),
        Some(r#"{"anonymous": "allow", "routes": [{"method": "POST", "path": "/v1/charges", "wait": "3s"}], "problems": {"format": "stripe"}, "limits": null}"#),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(store.as_deref(), Some("memory:"));
    assert_eq!(config.anonymous, idem_core::Anonymous::Allow);
    assert_eq!(config.problems, idem_http::ProblemFormat::Stripe);
    let p = config.routes.policy_for(&http::Method::POST, "/v1/charges");
    assert_eq!(p.engine.wait, Some(std::time::Duration::from_secs(3)));
    let e = config_of(
        None,
        Some(r#"{"routes": [{"path": "/x", "wait": "soon"}]}"#),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("wait"), "{e}");
    let e = config_of(None, Some(r#"{"anonymus": "allow"}"#))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("unknown field `anonymus`"), "{e}");
}

#[test]
fn the_completed_record_cache_answers_replays_without_a_claim() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("sqlite:{}", dir.path().join("idem.db").display());
    let open = |extra: &str| {
        let (config, _) =
            config_of(Some(&format!("{CONFIG}\n{extra}")), None).unwrap_or_else(|e| panic!("{e}"));
        HttpFront::new(config, &url).unwrap_or_else(|e| panic!("{e}"))
    };
    let front = open("");
    let body = br#"{"a":1}"#;
    // Before this process's first claim there is no engine, so no cache, to ask.
    assert!(front.replay(&keyed(&front, "k-c", &[]), body).is_none());
    let runs = AtomicU32::new(0);
    let first = request(&front, "k-c", r#"{"a":1}"#, &runs);
    assert!(
        front
            .replay(&keyed(&front, "k-unseen", &[]), body)
            .is_none()
    );
    let replayed = front
        .replay(&keyed(&front, "k-c", &[]), br#"{ "a": 1 }"#)
        .unwrap_or_else(|| panic!("the completed record is cached"));
    assert_eq!(replayed.body, first.body);
    assert_eq!(header(&replayed, "idempotent-replayed"), Some(&b"true"[..]));
    let other = front.replay(&keyed(&front, "k-c", &[]), br#"{"a":2}"#);
    assert_eq!(other.map(|r| r.status), Some(422));
    // Another caller's identical key is not this record.
    let bob = keyed(&front, "k-c", &[("authorization", "Bearer bob")]);
    assert!(front.replay(&bob, body).is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // With the cache off, every request asks the store.
    let uncached = open("[limits]\ncache_bytes = 0");
    request(&uncached, "k-d", r#"{"a":1}"#, &runs);
    assert!(
        uncached
            .replay(&keyed(&uncached, "k-d", &[]), body)
            .is_none()
    );
    let again = request(&uncached, "k-d", r#"{"a":1}"#, &runs);
    assert_eq!(header(&again, "idempotent-replayed"), Some(&b"true"[..]));
}

/// Issue 59, items 1, 2 and 4: what the routes match is the path the framework routes,
/// whatever the client wrote; under a mount, the path below it; and the fingerprint covers
/// the whole target, so one intent written two ways is one request and two mounts are two.
#[test]
fn routes_match_the_path_the_framework_routes() {
    let front = front(
        r#"
[[routes]]
method = "POST"
path = "/v1/charges"
require_key = true
"#,
    );
    let caller = headers(&[("authorization", "Bearer a")]);
    let status = |a: Admitted| match a {
        Admitted::Reply(r) => r.status,
        Admitted::Pass => 0,
        Admitted::Keyed(_) => 1,
    };
    for target in [
        "/v1/charges",
        "http://127.0.0.1/v1/charges",
        "HTTP://x:80/v1/charges",
        "x://y/v1/charges",
        "http://u:p@x/v1/charges",
        "http://x//v1/charges",
        "/v1/charges#x",
        "/v1/charges#?",
        "/v1/charges/#x",
    ] {
        assert_eq!(
            status(front.admit("POST", target, &caller)),
            400,
            "{target}"
        );
    }
    // What names no path is refused on a keyed method, passed on a safe one.
    for target in ["*", "example.com:443", "x:/v1/charges"] {
        assert_eq!(
            status(front.admit("POST", target, &caller)),
            400,
            "{target}"
        );
        assert_eq!(
            status(front.admit("OPTIONS", target, &caller)),
            0,
            "{target}"
        );
    }
    // Under a mount at /api, /api/v1/charges is the route's.
    assert_eq!(
        status(front.admit_routed("POST", "/api/v1/charges", Some("/v1/charges"), &caller)),
        400
    );

    // A route written as the whole path protects it under a mount too.
    let whole = self::front(
        r#"
[[routes]]
method = "POST"
path = "/api/v1/charges"
require_key = true
"#,
    );
    assert_eq!(
        status(whole.admit_routed("POST", "/api/v1/charges", Some("/v1/charges"), &caller)),
        400
    );
    // A target the framework would route verbatim as no path of its own (uvicorn's h11
    // parser hands the absolute form and a fragment on as the ASGI path): refused on an
    // unsafe method, passed on a safe one.
    for verbatim in ["http://x/v1/charges", "/v1/charges#x"] {
        assert_eq!(
            status(front.admit_routed("POST", verbatim, Some(verbatim), &caller)),
            400,
            "{verbatim}"
        );
        assert_eq!(
            status(front.admit_routed("GET", verbatim, Some(verbatim), &caller)),
            0,
            "{verbatim}"
        );
    }

    // One intent written two ways: one request (a replay); two mounts: two requests.
    let front = self::front(CONFIG);
    let runs = AtomicU32::new(0);
    let keyed_at = |target: &str, routed: Option<&str>| {
        let h = headers(&[
            ("idempotency-key", "k-forms"),
            ("content-type", "application/json"),
        ]);
        match front.admit_routed("POST", target, routed, &h) {
            Admitted::Keyed(k) => k,
            other => panic!("{target}: {other:?}"),
        }
    };
    let run = |k: Keyed| match front.begin(k, b"{}") {
        Begun::Execute(exe) => {
            runs.fetch_add(1, Ordering::SeqCst);
            exe.finish(201, &[], b"ok".to_vec())
        }
        Begun::Reply(r) => r,
    };
    let first = run(keyed_at("/v1/charges", None));
    assert_eq!(first.status, 201);
    let again = run(keyed_at("http://h:8080/v1/charges#frag", None));
    assert_eq!(
        header(&again, "idempotent-replayed"),
        Some(b"true".as_slice())
    );
    let mounted = run(keyed_at("/admin/v1/charges", Some("/v1/charges")));
    assert_eq!(
        mounted.status, 422,
        "another mount's path is another request"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
