//! A web page against a token-less server (issue 35, finding 2; the class of opencode's
//! CVE-2026-22812): by DNS rebinding (a foreign `Host`, its own `Origin`), by CSRF (a
//! cross-origin `Origin`, bodies a form or `fetch` may send without asking: `text/plain`,
//! forms, Blobs), on both ports and every door. Each request is sent the way a browser would
//! send it, over a real socket, and every refusal is checked against the OpenAPI document.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use serde_json::{json, Value};

use crate::support::{event_type, host_of, raw, RawAnswer, TestServer, WAIT};

/// A header as sent: its name and value.
type Header<'a> = (&'a str, &'a str);

/// One request on a connection of its own, with exactly these headers.
fn ask(base: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> RawAnswer {
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let answer = answer_within(base, request.as_bytes());
    if !answer.json.is_null() {
        crate::openapi::check(base, method, path, answer.status, Some("application/json"), &answer.json.to_string());
    }
    answer
}

/// The answer to `request`, read until the server closes or `WAIT` has passed in all (an event
/// stream served where a refusal was due never closes: its head is answer enough).
fn answer_within(base: &str, request: &[u8]) -> RawAnswer {
    let mut socket = TcpStream::connect(host_of(base)).unwrap();
    socket.write_all(request).unwrap();
    let deadline = Instant::now() + WAIT;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 8192];
    let closed = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break false;
        }
        socket.set_read_timeout(Some(left)).unwrap();
        match socket.read(&mut chunk) {
            Ok(0) => break true,
            Ok(read) => bytes.extend_from_slice(&chunk[..read]),
            Err(error) => break error.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    RawAnswer { status, head: head.to_string(), json: serde_json::from_str(body).unwrap_or(Value::Null), closed }
}

fn port_of(base: &str) -> u16 {
    base.rsplit(':').next().unwrap().parse().unwrap()
}

/// Whether a path is answered by a BAE door (RFC 7807 problems) rather than Kestrel's.
fn bae_door(path: &str) -> bool {
    path == "/healthz" || path.starts_with("/api/v1/") || path.starts_with("/admin/")
}

/// Asserts a refusal in its door's shape: Kestrel's `{error: {code}}` or BAE's problem `type`.
fn assert_refused(answer: &RawAnswer, path: &str, status: u16, code: &str) {
    let shown = if bae_door(path) { &answer.json["type"] } else { &answer.json["error"]["code"] };
    assert_eq!((answer.status, shown.as_str()), (status, Some(code)), "{path}: {} {}", answer.head, answer.json);
}

fn admin_key(server: &TestServer) -> String {
    std::fs::read_to_string(server.data_dir.join("admin-key")).unwrap().trim().to_string()
}

fn session_count(server: &TestServer) -> usize {
    server.get("/api/sessions").json["sessions"].as_array().unwrap().len()
}

#[test]
fn a_rebinding_page_reaches_no_door_of_either_port() {
    let server = TestServer::start();
    let port = port_of(&server.base);
    // After rebinding, the page's own origin is the attacker's name: its Origin matches the
    // Host it sends, so only the Host gives it away.
    let host = format!("rebind.evil.example:{port}");
    let origin = format!("http://{host}");
    let json = ("Content-Type", "application/json");
    let requests = [
        ("GET", "/", ""),
        ("GET", "/api/health", ""),
        ("GET", "/api/bootstrap", ""),
        ("GET", "/api/config", ""),
        ("GET", "/api/sessions", ""),
        ("POST", "/api/sessions", r#"{"title":"rebound"}"#),
        ("GET", "/api/events", ""),
        ("GET", "/metrics", ""),
        ("GET", "/healthz", ""),
        ("POST", "/api/v1/sessions", "{}"),
    ];
    for (method, path, body) in requests {
        let answer = ask(&server.base, method, path, &[("Host", &host), ("Origin", &origin), json], body);
        assert_refused(&answer, path, 403, "forbidden");
        // Without an Origin (a GET of the page's own origin carries none), the same.
        let answer = ask(&server.base, method, path, &[("Host", &host), json], body);
        assert_refused(&answer, path, 403, "forbidden");
    }
    // The admin port, even with its key (a page does not have it, but the Host alone decides).
    let admin = format!("http://{}", server.admin_addr().unwrap());
    let admin_host = format!("rebind.evil.example:{}", port_of(&admin));
    let bearer = format!("Bearer {}", admin_key(&server));
    for path in ["/admin/v1/profiles", "/metrics"] {
        let answer = ask(&admin, "GET", path, &[("Host", &admin_host), ("Authorization", &bearer)], "");
        assert_eq!((answer.status, answer.json["type"].as_str()), (403, Some("forbidden")), "{path}: {answer:?}");
    }
    let body = r#"{"name":"rebound","primary_provider":"builtin/echo"}"#;
    let answer =
        ask(&admin, "POST", "/admin/v1/profiles", &[("Host", &admin_host), ("Authorization", &bearer), json], body);
    assert_eq!((answer.status, answer.json["type"].as_str()), (403, Some("forbidden")), "{answer:?}");
    assert_eq!(session_count(&server), 0, "no session was created");
}

#[test]
fn a_page_of_another_origin_is_refused_and_the_consoles_own_origin_is_served() {
    let server = TestServer::start();
    let port = port_of(&server.base);
    let host = format!("127.0.0.1:{port}");
    let other_port = format!("http://127.0.0.1:{}", port.wrapping_add(1).max(1));
    let by_name = format!("http://localhost:{port}");
    let cross = ["http://evil.example", "null", other_port.as_str(), by_name.as_str(), "https://evil.example:443"];
    let requests = [
        ("POST", "/api/sessions", "application/json", r#"{"title":"csrf"}"#),
        ("POST", "/api/sessions", "text/plain", r#"{"title":"csrf"}"#),
        ("GET", "/api/sessions", "", ""),
        ("GET", "/api/health", "", ""),
        ("POST", "/api/v1/sessions", "application/json", "{}"),
        ("GET", "/healthz", "", ""),
    ];
    for origin in cross {
        for (method, path, kind, body) in requests {
            let mut headers = vec![("Host", host.as_str()), ("Origin", origin)];
            if !kind.is_empty() {
                headers.push(("Content-Type", kind));
            }
            let answer = ask(&server.base, method, path, &headers, body);
            assert_refused(&answer, path, 403, "forbidden");
        }
    }
    // A request the browser makes without an Origin (an image, a link) still says where it
    // comes from when the browser sends Fetch Metadata.
    for site in ["cross-site", "same-site"] {
        let answer = ask(&server.base, "GET", "/api/sessions", &[("Host", &host), ("Sec-Fetch-Site", site)], "");
        assert_refused(&answer, "/api/sessions", 403, "forbidden");
    }
    assert_eq!(session_count(&server), 0, "no session was created");

    // The console's own origin, and requests with no browser in them, are served.
    let own = format!("http://{host}");
    let json = ("Content-Type", "application/json");
    let created = ask(&server.base, "POST", "/api/sessions", &[("Host", &host), ("Origin", &own), json], "{}");
    assert_eq!(created.status, 201, "{created:?}");
    for site in ["same-origin", "none"] {
        let listed = ask(&server.base, "GET", "/api/sessions", &[("Host", &host), ("Sec-Fetch-Site", site)], "");
        assert_eq!(listed.status, 200, "{site}: {listed:?}");
    }
    // The console's page and files are public: any origin may load them.
    let page = ask(&server.base, "GET", "/", &[("Host", &host), ("Origin", "http://evil.example")], "");
    assert_eq!(page.status, 200, "{page:?}");
}

#[test]
fn loopback_names_and_addresses_are_the_servers_own() {
    let server = TestServer::start();
    let port = port_of(&server.base);
    let json = ("Content-Type", "application/json");
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("LocalHost:{port}"),
        format!("console.localhost:{port}"),
        format!("[::1]:{port}"),
        format!("10.1.2.3:{port}"),
    ] {
        let origin = format!("http://{host}");
        let answer = ask(&server.base, "POST", "/api/sessions", &[("Host", &host), ("Origin", &origin), json], "{}");
        assert_eq!(answer.status, 201, "{host}: {answer:?}");
    }
    // HTTP/1.0 with no Host at all: no browser sends that.
    let answer = raw(&server.base, b"GET /api/health HTTP/1.0\r\n\r\n");
    assert_eq!(answer.status, 200, "{answer:?}");
    for host in ["localhost.evil.example", "127.0.0.1.evil.example", "evil-localhost", "xn--localhost"] {
        let answer = ask(&server.base, "GET", "/api/health", &[("Host", host)], "");
        assert_refused(&answer, "/api/health", 403, "forbidden");
    }
}

#[test]
fn a_body_a_page_may_send_without_asking_is_refused_on_every_door() {
    let server = TestServer::start();
    let admin = format!("http://{}", server.admin_addr().unwrap());
    let bearer = format!("Bearer {}", admin_key(&server));
    let host = format!("127.0.0.1:{}", port_of(&server.base));
    let admin_host = format!("127.0.0.1:{}", port_of(&admin));
    let kinds = [
        None,
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/octet-stream"),
        Some("text/json"),
        Some("application/jsonp"),
        Some(""),
    ];
    for kind in kinds {
        for (base, path, host, auth) in [
            (&server.base, "/api/sessions", &host, None),
            (&server.base, "/api/v1/sessions", &host, None),
            (&server.base, "/api/v1/sessions/ses_x/rpc", &host, None),
            (&admin, "/admin/v1/profiles", &admin_host, Some(bearer.as_str())),
        ] {
            let mut headers = vec![("Host", host.as_str())];
            if let Some(kind) = kind {
                headers.push(("Content-Type", kind));
            }
            if let Some(auth) = auth {
                headers.push(("Authorization", auth));
            }
            let body = r#"{"title":"csrf","name":"csrf","primary_provider":"builtin/echo"}"#;
            let answer = ask(base, "POST", path, &headers, body);
            assert_refused(&answer, path, 415, "unsupported_media_type");
        }
    }
    // A chunked body is a body too.
    let chunked = format!(
        "POST /api/sessions HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
    );
    raw(&server.base, chunked.as_bytes()).assert_error(415, "unsupported_media_type");
    assert_eq!(session_count(&server), 0, "no session was created");
    // JSON with its parameters, in any case, is fine; BAE's `/rpc` also takes NDJSON.
    for kind in ["application/json", "application/json; charset=utf-8", "Application/JSON"] {
        let answer = ask(&server.base, "POST", "/api/sessions", &[("Host", &host), ("Content-Type", kind)], "{}");
        assert_eq!(answer.status, 201, "{kind}: {answer:?}");
    }
    let rpc = r#"{"jsonrpc":"2.0","id":1,"method":"session.subscribe"}"#;
    for kind in ["application/json", "application/x-ndjson"] {
        let headers = [("Host", host.as_str()), ("Content-Type", kind), ("Authorization", "Bearer bae_ses_nope")];
        let answer = ask(&server.base, "POST", "/api/v1/sessions/ses_x/rpc", &headers, rpc);
        assert_eq!((answer.status, answer.json["type"].as_str()), (401, Some("unauthorized")), "{kind}: {answer:?}");
    }
}

#[test]
fn a_page_cannot_read_the_approval_nor_approve_the_command_it_asked_for() {
    let server = TestServer::start();
    let port = port_of(&server.base);
    let id = server.create_session(json!({}));
    let marker = server.workspace.join("pwned");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let line = format!("/tool run_command {}", json!({ "command": format!("touch {}", marker.display()) }));
    assert_eq!(server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line })).status, 202);
    let events = stream.collect_until(|e| event_type(e) == "approval.requested");
    let approval = events.last().unwrap()["event"]["approval"]["id"].as_str().unwrap().to_string();

    let rebound = format!("rebind.evil.example:{port}");
    let rebound_origin = format!("http://{rebound}");
    let own = format!("127.0.0.1:{port}");
    let approve = format!("/api/sessions/{id}/approvals/{approval}");
    let yes = r#"{"approved":true}"#;
    // Reading the stream for the approval's id, and the session itself.
    for path in [format!("/api/sessions/{id}/events"), format!("/api/sessions/{id}"), "/api/events".to_string()] {
        let answer = ask(&server.base, "GET", &path, &[("Host", &rebound), ("Accept", "text/event-stream")], "");
        assert_refused(&answer, &path, 403, "forbidden");
    }
    let attempts: [(&[Header], u16, &str); 6] = [
        (&[("Host", &rebound), ("Origin", &rebound_origin), ("Content-Type", "application/json")], 403, "forbidden"),
        (&[("Host", &own), ("Origin", "http://evil.example"), ("Content-Type", "text/plain")], 403, "forbidden"),
        (
            &[("Host", &own), ("Origin", "null"), ("Content-Type", "application/x-www-form-urlencoded")],
            403,
            "forbidden",
        ),
        (&[("Host", &own), ("Content-Type", "text/plain")], 415, "unsupported_media_type"),
        (&[("Host", &own), ("Content-Type", "application/x-www-form-urlencoded")], 415, "unsupported_media_type"),
        (&[("Host", &own)], 415, "unsupported_media_type"),
    ];
    for (headers, status, code) in attempts {
        let answer = ask(&server.base, "POST", &approve, headers, yes);
        assert_refused(&answer, &approve, status, code);
    }
    // Still pending: the operator's own answer is the one that counts (an approval already
    // answered would be 404 `approval_not_found` here).
    let denied = server.post(&approve, json!({ "approved": false }));
    assert_eq!((denied.status, &denied.json), (200, &json!({ "resolved": true })), "{}", denied.text);
    stream.collect_until(crate::support::is_run_end);
    assert!(!marker.exists(), "the command never ran");
}

#[test]
fn the_names_and_origins_an_operator_lists_are_answered() {
    let server = TestServer::start_with(|config| {
        config.server.allowed_hosts = vec!["kestrel.example.com".into(), ".corp.example".into()];
        config.server.allowed_origins = vec!["https://app.example.com".into()];
    });
    let port = port_of(&server.base);
    let json = ("Content-Type", "application/json");
    // Behind a proxy that passes the public name on: the console's own origin is that name.
    let public = [("Host", "kestrel.example.com"), ("Origin", "https://kestrel.example.com"), json];
    assert_eq!(ask(&server.base, "POST", "/api/sessions", &public, "{}").status, 201);
    for host in ["corp.example", "a.b.corp.example:8443"] {
        assert_eq!(ask(&server.base, "GET", "/api/health", &[("Host", host)], "").status, 200, "{host}");
    }
    for host in ["evil.example", "kestrel.example.com.evil.example", "xcorp.example"] {
        assert_refused(
            &ask(&server.base, "GET", "/api/health", &[("Host", host)], ""),
            "/api/health",
            403,
            "forbidden",
        );
    }
    // A web app of a listed origin; an unlisted one is still another origin.
    let own = format!("127.0.0.1:{port}");
    let app = [("Host", own.as_str()), ("Origin", "https://app.example.com"), json];
    assert_eq!(ask(&server.base, "POST", "/api/sessions", &app, "{}").status, 201);
    let other = [("Host", own.as_str()), ("Origin", "https://other.example.com"), json];
    assert_refused(&ask(&server.base, "POST", "/api/sessions", &other, "{}"), "/api/sessions", 403, "forbidden");
    // Behind a proxy that sends its upstream's address, the public origin must be listed.
    let rewritten = [("Host", own.as_str()), ("Origin", "https://kestrel.example.com"), json];
    assert_refused(&ask(&server.base, "POST", "/api/sessions", &rewritten, "{}"), "/api/sessions", 403, "forbidden");

    // `*` turns the Host check off; the Origin check stays.
    let any = TestServer::start_with(|config| config.server.allowed_hosts = vec!["*".into()]);
    assert_eq!(ask(&any.base, "GET", "/api/health", &[("Host", "anything.example")], "").status, 200);
    let cross = [("Host", "anything.example"), ("Origin", "http://evil.example")];
    assert_refused(&ask(&any.base, "GET", "/api/health", &cross, ""), "/api/health", 403, "forbidden");

    // The environment sets both lists; an entry that is no name stops the start.
    let env = |name: &str| match name {
        "KESTREL_ALLOWED_HOSTS" => Some("a.example, .b.example".to_string()),
        "KESTREL_ALLOWED_ORIGINS" => Some("https://c.example".to_string()),
        _ => None,
    };
    let config = kestrel::Config::load(None, &env).unwrap();
    assert_eq!(config.server.allowed_hosts, ["a.example", ".b.example"]);
    assert_eq!(config.server.allowed_origins, ["https://c.example"]);
    for (hosts, origins) in [(vec!["http://a.example".to_string()], vec![]), (vec![], vec!["c.example".to_string()])] {
        let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut config = crate::support::test_config(data.path(), workspace.path());
        config.server.allowed_hosts = hosts;
        config.server.allowed_origins = origins;
        let error = kestrel::Server::start(config).err().expect("a setting that is no name stops the start");
        assert!(error.to_string().contains("server.allowed_"), "{error}");
    }
}

#[test]
fn the_consoles_request_at_another_node_is_screened_there_and_served_by_the_holder() {
    let Some(database) = crate::pg_cluster::database() else { return };
    let a = crate::cluster::node_leasing(&database.url, "node-a", 10_000);
    let b = crate::cluster::node_leasing(&database.url, "node-b", 10_000);
    let user = crate::cluster::USER;
    let at_a = a.client().with_token(Some(user));
    let id = at_a.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let mut stream = crate::support::SseClient::open(&a.base, &format!("/api/sessions/{id}/events"), Some(user), None);
    assert_eq!(at_a.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "at A" })).status, 202);
    stream.collect_until(crate::support::is_run_end);

    // The console loaded from node B: its Origin is B's, which node A, the holder, never is.
    let host = format!("127.0.0.1:{}", port_of(&b.base));
    let (origin, bearer) = (format!("http://{host}"), format!("Bearer {user}"));
    let headers = [
        ("Host", host.as_str()),
        ("Origin", origin.as_str()),
        ("Content-Type", "application/json"),
        ("Authorization", &bearer),
    ];
    let sent = ask(&b.base, "POST", &format!("/api/sessions/{id}/messages"), &headers, r#"{"content":"at B"}"#);
    assert_eq!(sent.status, 202, "{sent:?}");
    stream.collect_until(crate::support::is_run_end);
    // And a page of another origin is refused at B, before anything is forwarded.
    let cross = [("Host", host.as_str()), ("Origin", "http://evil.example"), ("Content-Type", "application/json")];
    let refused = ask(&b.base, "POST", &format!("/api/sessions/{id}/messages"), &cross, r#"{"content":"csrf"}"#);
    assert_refused(&refused, "/api/sessions", 403, "forbidden");
}
