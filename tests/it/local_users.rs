//! Another account of the machine against a server with no token: the loopback port reaches
//! every local user, and a token-less server serves only the user it runs as (and root), told
//! from the kernel's socket table (`src/http/peer.rs`). A token, or
//! `server.allow_unauthenticated`, is how a server serves others.
//!
//! The other account is `nobody`, through `setpriv` (util-linux) and `curl`: only root can take
//! another user's id, so a run that is not root goes through `sudo -n` when it may, and
//! otherwise checks the server's own user only, unless `KESTREL_REQUIRE_OTHER_USER=1` (set by
//! `.ci/run`) makes that a failure.

use std::process::Command;

use serde_json::json;

use crate::support::TestServer;

/// `nobody`'s ids on Debian.
const NOBODY: &str = "65534";

/// How this run takes another user's id: as root, `setpriv` itself; otherwise through
/// `sudo -n`, when sudo lets it without a password. `None`: it cannot.
fn switch_user() -> Option<Vec<&'static str>> {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(2) == Some("0"));
    if root {
        return Some(vec!["setpriv"]);
    }
    let sudo = Command::new("sudo").args(["-n", "true"]).output().is_ok_and(|ran| ran.status.success());
    if sudo {
        return Some(vec!["sudo", "-n", "setpriv"]);
    }
    let required = std::env::var("KESTREL_REQUIRE_OTHER_USER").is_ok_and(|v| v == "1");
    assert!(!required, "KESTREL_REQUIRE_OTHER_USER=1, but this run can take no other user's id (not root, no sudo -n)");
    eprintln!("no other user's id can be taken here (not root, no sudo -n): another user's requests are not made");
    None
}

/// `curl` run as `nobody`: the status and body of one request.
fn as_nobody(switch: &[&str], method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let mut command = Command::new(switch[0]);
    command.args(&switch[1..]);
    command.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--", "curl", "-s", "-X", method]);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    if let Some(body) = body {
        command.args(["-H", "Content-Type: application/json", "--data-binary", body]);
    }
    command.args(["-w", "\n%{http_code}", url]);
    let output = command.output().expect("setpriv and curl run");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').expect("curl wrote the status");
    (status.trim().parse().expect("a status"), body.to_string())
}

#[test]
fn a_server_with_no_token_serves_only_the_user_it_runs_as() {
    let server = TestServer::start();
    // Its own user is served, as before.
    let mine = server.post("/api/sessions", json!({ "title": "mine" }));
    assert_eq!(mine.status, 201, "{:?}", mine.json);
    let Some(switch) = switch_user() else { return };
    let id = mine.json["session"]["id"].as_str().unwrap().to_string();
    let attempts = [
        ("GET", "/api/sessions".to_string(), None),
        ("POST", "/api/sessions".to_string(), Some(r#"{"title":"theirs"}"#)),
        ("GET", format!("/api/sessions/{id}"), None),
        (
            "POST",
            format!("/api/sessions/{id}/messages"),
            Some(r#"{"content":"/tool run_command {\"command\":\"id\"}"}"#),
        ),
        ("GET", format!("/api/sessions/{id}/file?path=x"), None),
        ("POST", format!("/api/sessions/{id}/approvals/apr_x"), Some(r#"{"approved":true}"#)),
        ("GET", "/api/config".to_string(), None),
        ("GET", "/api/events".to_string(), None),
    ];
    for (method, path, body) in attempts {
        let (status, answer) = as_nobody(&switch, method, &format!("{}{path}", server.base), None, body);
        assert_eq!(status, 403, "{method} {path} by another user: {answer}");
        let error: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(error["error"]["code"], "forbidden", "{answer}");
    }
    // What is public stays public: the health check and the console.
    assert_eq!(as_nobody(&switch, "GET", &format!("{}/api/health", server.base), None, None).0, 200);
    assert_eq!(as_nobody(&switch, "GET", &format!("{}/", server.base), None, None).0, 200);
    // Nothing the other user sent was done.
    let list = server.get("/api/sessions");
    assert_eq!(list.json["sessions"].as_array().unwrap().len(), 1, "{:?}", list.json);
}

#[test]
fn a_token_or_allow_unauthenticated_is_how_a_server_serves_other_users() {
    let Some(switch) = switch_user() else { return };
    let with_token = TestServer::start_with(|config| config.auth.token = Some("shared-token".into()));
    let url = format!("{}/api/sessions", with_token.base);
    assert_eq!(
        as_nobody(&switch, "GET", &url, Some("shared-token"), None).0,
        200,
        "the token's holder, whoever they are"
    );
    assert_eq!(as_nobody(&switch, "GET", &url, None, None).0, 401);

    let open = TestServer::start_with(|config| config.server.allow_unauthenticated = true);
    let (status, answer) = as_nobody(&switch, "POST", &format!("{}/api/sessions", open.base), None, Some("{}"));
    assert_eq!(status, 201, "allow_unauthenticated serves anyone: {answer}");
}
