//! Permission rules over HTTP (docs/permissions.md): bypass attempts driven through real runs,
//! remembered and edited approvals across a restart, the rules API per tenant, and the audit
//! log of every decision.

use serde_json::{json, Value};

use crate::support::{event_type, is_run_end, TestServer};
use kestrel::config::TokenConfig;
use kestrel::policy::{Outcome, RuleSpec};

pub(crate) fn spec(tool: &str, pattern: Option<&str>, outcome: Outcome) -> RuleSpec {
    RuleSpec { tool: tool.into(), pattern: pattern.map(str::to_string), outcome }
}

/// The server's rules for the bypass table: `rm` and `curl` denied, a few commands allowed,
/// `.env` and `secrets/` unreadable, writes allowed under `src/` only.
fn server_rules() -> Vec<RuleSpec> {
    use Outcome::*;
    vec![
        spec("run_command", Some("ls *"), Allow),
        spec("run_command", Some("cat *"), Allow),
        spec("run_command", Some("echo *"), Allow),
        spec("run_command", Some("touch *"), Allow),
        spec("run_command", Some("rm *"), Deny),
        spec("run_command", Some("curl *"), Deny),
        spec("read_file", Some("**/.env"), Deny),
        spec("read_file", Some("secrets/**"), Deny),
        spec("write_file", Some("src/**"), Allow),
    ]
}

/// What became of one call.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Ran without a person.
    Ran,
    /// Waited for a person (who said no).
    Asked,
    /// Refused by the rules.
    Denied,
}

/// Has the builtin model make one call in `session`; a person says no to any approval.
pub(crate) fn attempt(server: &TestServer, session: &str, tool: &str, arguments: &Value) -> (Fate, Value) {
    let mut stream = server.events(&format!("/api/sessions/{session}/events"));
    let content = format!("/tool {tool} {arguments}");
    let sent = server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": content }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    let first = stream.collect_until(|e| event_type(e) == "approval.requested" || is_run_end(e));
    let started = first.iter().find(|e| event_type(e) == "tool.started").cloned().unwrap_or_default();
    let permission = started["event"]["permission"].clone();
    if let Some(asked) = first.iter().find(|e| event_type(e) == "approval.requested") {
        let approval = asked["event"]["approval"]["id"].as_str().unwrap();
        let path = format!("/api/sessions/{session}/approvals/{approval}");
        assert_eq!(server.post(&path, json!({ "approved": false })).status, 200);
        stream.collect_until(is_run_end);
        return (Fate::Asked, permission);
    }
    let finished = first.iter().find(|e| event_type(e) == "tool.finished").expect("the call finished");
    let result = &finished["event"]["result"];
    match (result["ok"].as_bool(), result["error"].as_str()) {
        (Some(true), _) => (Fate::Ran, permission),
        (_, Some("denied")) => (Fate::Denied, permission),
        _ => (Fate::Ran, permission), // it ran and failed: still unapproved execution
    }
}

/// Over sixty ways around the rules, each run for real: none runs without a person, the
/// marker file survives, and the audit log has an entry for every decision.
#[test]
fn bypass_attempts_never_run_unapproved_and_every_decision_is_audited() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = server_rules();
    });
    let root = &server.workspace;
    std::fs::write(root.join("marker"), "still here").unwrap();
    std::fs::write(root.join(".env"), "TOKEN=secret").unwrap();
    std::fs::create_dir_all(root.join("secrets")).unwrap();
    std::fs::write(root.join("secrets/key"), "k").unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::os::unix::fs::symlink(".env", root.join("link")).unwrap();
    std::os::unix::fs::symlink("../secrets", root.join("src/s")).unwrap();
    std::os::unix::fs::symlink("../.env", root.join("src/env")).unwrap();
    let session = server.create_session(json!({}));

    use Fate::*;
    let command = |line: &str| ("run_command", json!({ "command": line }));
    let read = |path: &str| ("read_file", json!({ "path": path }));
    let write = |path: &str| ("write_file", json!({ "path": path, "content": "pwned" }));
    let table: Vec<((&str, Value), Fate)> = vec![
        (command("ls; rm -rf marker"), Denied),
        (command("ls && rm -rf marker"), Denied),
        (command("ls || rm -rf marker"), Denied),
        (command("ls | rm -rf marker"), Denied),
        (command("ls & rm -rf marker"), Denied),
        (command("ls\nrm -rf marker"), Denied),
        (command("ls\r\nrm -rf marker"), Denied),
        (command("ls #; rm -rf marker"), Denied),
        (command("find . -name marker -exec rm {} ;"), Denied),
        (command("ls `rm -rf marker`"), Denied),
        (command("ls $(rm -rf marker)"), Denied),
        (command("echo \"$(rm -rf marker)\""), Denied),
        (command("cat <(rm -rf marker)"), Denied),
        (command("ls > marker"), Asked),
        (command("cat < marker"), Asked),
        (command("echo x >> marker"), Asked),
        (command("touch marker2 &"), Asked),
        (command("'rm' -rf marker"), Denied),
        (command("\"rm\" -rf marker"), Denied),
        (command("r\\m -rf marker"), Denied),
        (command("r''m -rf marker"), Denied),
        (command("/bin/rm -rf marker"), Denied),
        (command("/usr/bin/env rm -rf marker"), Denied),
        (command("env -i rm -rf marker"), Denied),
        (command("command rm -rf marker"), Denied),
        (command("exec rm -rf marker"), Denied),
        (command("nohup rm -rf marker"), Denied),
        (command("timeout 5 rm -rf marker"), Denied),
        (command("eval rm -rf marker"), Denied),
        (command("bash -c 'rm -rf marker'"), Denied),
        (command("sh -c \"rm -rf marker\""), Denied),
        (command("xargs rm -rf < marker"), Denied),
        (command("curl${IFS}http://127.0.0.1:9"), Asked),
        (command("ls $HOME"), Asked),
        (command("cat $'\\x2eenv'"), Asked),
        (command("cat .e?v"), Asked),
        (command("cat .en[v]"), Asked),
        (command("cat ~/.bashrc"), Asked),
        (command("echo {a,b}"), Asked),
        (command("c''url http://127.0.0.1:9"), Denied),
        (command("A=1 ls"), Asked),
        (command("LD_PRELOAD=/tmp/x.so ls"), Asked),
        (command("LS -la"), Asked),
        (command("ｌｓ -la"), Asked),
        (command("lѕ -la"), Asked),
        (command("ls\u{200b} -la"), Asked),
        (command("ls\u{00a0}-la"), Asked),
        (command("ls 'a b'"), Asked),
        (command("echo 'unterminated"), Asked),
        (read(".env"), Denied),
        (read("./.env"), Denied),
        (read("a/../.env"), Denied),
        (read("src/../.env"), Denied),
        (read(".//.env"), Denied),
        (read("link"), Denied),
        (read("src/env"), Denied),
        (read("src/s/key"), Denied),
        (read("secrets/key"), Denied),
        (read("secrets/../secrets/key"), Denied),
        (read("../outside"), Denied),
        (read("/etc/passwd"), Denied),
        (write("src/../.env"), Asked),
        (write("src/env"), Asked),
        (write("src/s/key"), Asked),
        (write("src/../../x"), Asked),
        (write("marker"), Asked),
    ];
    assert!(table.len() >= 60, "{} attempts", table.len());
    let mut decisions = 0;
    for ((tool, arguments), expected) in &table {
        let (fate, permission) = attempt(&server, &session, tool, arguments);
        assert_eq!(&fate, expected, "{tool} {arguments}: {permission}");
        // An asked call is two decisions (the rules', then the person's).
        decisions += if fate == Asked { 2 } else { 1 };
        if fate == Denied {
            assert_eq!(permission["outcome"], "deny", "{tool} {arguments}");
        }
    }
    assert_eq!(std::fs::read_to_string(root.join("marker")).unwrap(), "still here");
    assert!(!root.join("marker2").exists());
    assert_eq!(std::fs::read_to_string(root.join(".env")).unwrap(), "TOKEN=secret");

    let audit = audit_of(&server, &session);
    assert_eq!(audit.len(), decisions, "an entry per decision");
    let denied = audit.iter().filter(|e| e["decision"] == "denied").count();
    assert_eq!(denied, table.iter().filter(|(_, f)| *f == Denied).count());
    for entry in audit.iter().filter(|e| e["decision"] == "denied") {
        assert_eq!(entry["decidedBy"], "rule", "{entry}");
        assert!(entry["ruleId"].as_str().is_some_and(|id| id.starts_with("config:server:")), "{entry}");
    }
    assert!(audit.iter().all(|e| !e["arguments"].as_str().unwrap().contains("TOKEN=secret")));
}

/// Every audit entry of `session`, page by page.
pub(crate) fn audit_of(server: &TestServer, session: &str) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut after = 0;
    loop {
        let page = server.get(&format!("/api/audit?after={after}"));
        assert_eq!(page.status, 200, "{}", page.text);
        entries.extend(page.json["entries"].as_array().unwrap().iter().filter(|e| e["sessionId"] == session).cloned());
        match page.json["nextAfter"].as_u64() {
            Some(next) => after = next,
            None => return entries,
        }
    }
}

/// Waits for the approval of a `/tool` call; its id.
pub(crate) fn ask_for(
    server: &TestServer,
    session: &str,
    tool: &str,
    arguments: &Value,
) -> (crate::support::SseClient, String) {
    let mut stream = server.events(&format!("/api/sessions/{session}/events"));
    let content = format!("/tool {tool} {arguments}");
    assert_eq!(server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": content })).status, 202);
    let events = stream.collect_until(|e| event_type(e) == "approval.requested" || is_run_end(e));
    let asked = events.last().filter(|e| event_type(e) == "approval.requested").expect("the call asks");
    (stream, asked["event"]["approval"]["id"].as_str().unwrap().to_string())
}

#[test]
fn a_remembered_approval_survives_a_restart_is_revocable_and_never_beats_a_deny() {
    let mut server = TestServer::start_with(|config| config.builtin.delay_ms = 0);
    let session = server.create_session(json!({}));
    let call = json!({ "command": "echo remembered" });
    let (mut stream, approval) = ask_for(&server, &session, "run_command", &call);
    let decision = json!({ "approved": true, "remember": "session" });
    let answer = server.post(&format!("/api/sessions/{session}/approvals/{approval}"), decision);
    assert_eq!(answer.status, 200, "{}", answer.text);
    let events = stream.collect_until(is_run_end);
    let resolved = events.iter().find(|e| event_type(e) == "approval.resolved").unwrap();
    let rule_id = resolved["event"]["remembered"].as_str().expect("the rule it became").to_string();

    server.restart(|config| config.builtin.delay_ms = 0);
    let rules = server.get(&format!("/api/sessions/{session}/rules"));
    assert_eq!(rules.json["rules"][0]["id"], rule_id.as_str(), "{}", rules.text);
    assert_eq!(rules.json["rules"][0]["source"], "remembered");
    assert_eq!(rules.json["rules"][0]["match"], "echo remembered");
    assert_eq!(attempt(&server, &session, "run_command", &call).0, Fate::Ran, "remembered across the restart");
    assert_eq!(
        attempt(&server, &session, "run_command", &json!({ "command": "echo other" })).0,
        Fate::Asked,
        "this exact call only"
    );

    // A tenant deny added later wins over the remembered allow.
    let deny = server.post("/api/rules", json!({ "tool": "run_command", "match": "echo *", "outcome": "deny" }));
    assert_eq!(deny.status, 201, "{}", deny.text);
    let (fate, permission) = attempt(&server, &session, "run_command", &call);
    assert_eq!(fate, Fate::Denied);
    assert_eq!(permission["rule"]["id"], deny.json["rule"]["id"]);
    let deny_id = deny.json["rule"]["id"].as_str().unwrap();
    assert_eq!(server.delete(&format!("/api/rules/{deny_id}")).status, 200);
    assert_eq!(attempt(&server, &session, "run_command", &call).0, Fate::Ran);

    // Revoked, it asks again.
    assert_eq!(server.delete(&format!("/api/sessions/{session}/rules/{rule_id}")).status, 200);
    server.delete(&format!("/api/sessions/{session}/rules/{rule_id}")).assert_error(404, "rule_not_found");
    assert_eq!(attempt(&server, &session, "run_command", &call).0, Fate::Asked);

    let audit = audit_of(&server, &session);
    let approved = audit.iter().find(|e| e["decision"] == "approved").unwrap();
    assert_eq!(approved["ruleId"], rule_id.as_str(), "{approved}");
    assert_eq!(approved["decidedBy"], "person");
    assert!(audit.iter().any(|e| e["decision"] == "allowed" && e["ruleId"] == rule_id.as_str()));
}

#[test]
fn an_edited_approval_is_checked_then_runs_the_edit_and_both_calls_are_kept() {
    let mut server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = vec![spec("run_command", Some("rm *"), Outcome::Deny)];
    });
    std::fs::write(server.workspace.join("marker"), "still here").unwrap();
    let session = server.create_session(json!({}));
    let (mut stream, approval) = ask_for(&server, &session, "run_command", &json!({ "command": "echo original" }));
    let path = format!("/api/sessions/{session}/approvals/{approval}");

    // Into a denied command: refused, and the approval stays pending.
    let denied = server.post(&path, json!({ "approved": true, "arguments": { "command": "rm -rf marker" } }));
    denied.assert_error(403, "forbidden");
    // Not what the tool takes.
    let wrong = server.post(&path, json!({ "approved": true, "arguments": { "command": 5 } }));
    wrong.assert_error(400, "invalid_decision");
    server.post(&path, json!({ "approved": true, "arguments": "echo" })).assert_error(400, "invalid_decision");

    let edited = server.post(&path, json!({ "approved": true, "arguments": { "command": "echo edited-call" } }));
    assert_eq!(edited.status, 200, "{}", edited.text);
    let events = stream.collect_until(is_run_end);
    let resolved = events.iter().find(|e| event_type(e) == "approval.resolved").unwrap();
    assert_eq!(resolved["event"]["arguments"]["command"], "echo edited-call");
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").unwrap();
    assert!(finished["event"]["result"]["content"].as_str().unwrap().contains("edited-call"), "{finished}");
    assert_eq!(std::fs::read_to_string(server.workspace.join("marker")).unwrap(), "still here");

    server.restart(|config| config.builtin.delay_ms = 0);
    let messages = server.get(&format!("/api/sessions/{session}")).json["session"]["messages"].clone();
    let messages = messages.as_array().unwrap();
    let asked = messages.iter().find(|m| m["toolCalls"].as_array().is_some_and(|c| !c.is_empty())).unwrap();
    assert_eq!(asked["toolCalls"][0]["arguments"]["command"], "echo original", "the model's call is kept");
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["meta"]["editedArguments"]["command"], "echo edited-call", "{result}");

    let audit = audit_of(&server, &session);
    let kinds: Vec<&str> = audit.iter().map(|e| e["decision"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["asked", "denied", "edited"], "{audit:#?}");
    assert!(audit[1]["edited"].as_str().unwrap().contains("rm -rf marker"));
    assert!(audit[2]["edited"].as_str().unwrap().contains("echo edited-call"));
    assert!(audit[2]["arguments"].as_str().unwrap().contains("echo original"));
}

#[test]
fn rules_are_per_tenant_config_rules_stay_and_the_audit_log_is_for_admins() {
    let server = TestServer::start_with(|config| {
        config.agent.rules = vec![spec("run_command", Some("rm *"), Outcome::Deny)];
        let mut a = TokenConfig::new("a", "token-a");
        a.rules = vec![spec("write_file", Some("vendor/**"), Outcome::Deny)];
        a.name = Some("a-ci".into());
        let mut admin = TokenConfig::new("ops", "token-ops");
        admin.admin = true;
        config.auth.tokens = vec![a, TokenConfig::new("b", "token-b"), admin];
    });
    let (a, b, ops) = (
        server.client().with_token(Some("token-a")),
        server.client().with_token(Some("token-b")),
        server.client().with_token(Some("token-ops")),
    );
    let listed = a.get("/api/rules");
    let ids: Vec<&str> = listed.json["rules"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["config:server:0", "config:a:0"], "{}", listed.text);
    assert_eq!(b.get("/api/rules").json["rules"].as_array().unwrap().len(), 1, "b sees the server's only");

    let added = a.post("/api/rules", json!({ "tool": "mcp__*", "outcome": "ask" }));
    assert_eq!(added.status, 201, "{}", added.text);
    assert_eq!(added.json["rule"]["scope"], "tenant");
    assert_eq!(added.json["rule"]["createdBy"], "a-ci");
    let id = added.json["rule"]["id"].as_str().unwrap();
    assert!(!b.get("/api/rules").text.contains(id), "another tenant's rule is not listed");
    b.send("DELETE", &format!("/api/rules/{id}"), None).assert_error(404, "rule_not_found");
    a.send("DELETE", "/api/rules/config:server:0", None).assert_error(403, "forbidden");

    for bad in [
        json!({ "tool": "run_command", "outcome": "maybe" }),
        json!({ "tool": "", "outcome": "deny" }),
        json!({ "tool": "run_command", "match": "[unclosed", "outcome": "deny" }),
        json!({ "tool": 5, "outcome": "deny" }),
    ] {
        let answer = a.post("/api/rules", bad.clone());
        assert!(
            matches!(answer.json["error"]["code"].as_str(), Some("invalid_rule" | "invalid_body")),
            "{bad}: {}",
            answer.text
        );
        assert_eq!(answer.status, 400);
    }
    let session_b = {
        let created = b.post("/api/sessions", json!({}));
        created.json["session"]["id"].as_str().unwrap().to_string()
    };
    a.post(&format!("/api/sessions/{session_b}/rules"), json!({ "tool": "x", "outcome": "deny" }))
        .assert_error(404, "session_not_found");
    a.get(&format!("/api/sessions/{session_b}/rules")).assert_error(404, "session_not_found");

    // At most 1,000 stored rules hold for one call: every call compiles them.
    for n in 1..1_000 {
        let added = a.post("/api/rules", json!({ "tool": format!("tool_{n}"), "outcome": "deny" }));
        assert_eq!(added.status, 201, "rule {n}: {}", added.text);
    }
    let refused = a.post("/api/rules", json!({ "tool": "one_too_many", "outcome": "deny" }));
    refused.assert_error(400, "invalid_rule");
    assert!(refused.json["error"]["message"].as_str().unwrap().contains("1000"), "{}", refused.text);
    a.get("/api/audit").assert_error(403, "forbidden");
    assert_eq!(ops.get("/api/audit").status, 200);
    assert_eq!(ops.get("/api/audit?after=x").status, 400);
}

/// `/admin/v1/audit` on the admin port: the admin key, pages, and the retention (an entry
/// older than `audit_retention_days` goes when the next one is written).
#[test]
fn the_admin_port_pages_the_audit_log_and_old_entries_go_past_the_retention() {
    let mut server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = vec![spec("run_command", None, Outcome::Deny)];
    });
    let session = server.create_session(json!({}));
    for i in 0..3 {
        let (fate, _) = attempt(&server, &session, "run_command", &json!({ "command": format!("echo {i}") }));
        assert_eq!(fate, Fate::Denied);
    }
    let admin = format!("http://{}", server.admin_addr().unwrap());
    let key = std::fs::read_to_string(server.data_dir.join("admin-key")).unwrap().trim().to_string();
    let admin_client = crate::support::Client { base: admin.clone(), token: Some(key.clone()) };
    assert_eq!(admin_client.with_token(None).get("/admin/v1/audit").status, 401);
    let first = admin_client.get("/admin/v1/audit?limit=2");
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["items"].as_array().unwrap().len(), 2);
    let cursor = first.json["next_cursor"].as_str().unwrap();
    let second = admin_client.get(&format!("/admin/v1/audit?limit=2&cursor={cursor}"));
    assert_eq!(second.json["items"].as_array().unwrap().len(), 1);
    assert!(second.json["next_cursor"].is_null());
    for entry in first.json["items"].as_array().unwrap() {
        assert_eq!((entry["decision"].as_str(), entry["ruleId"].as_str()), (Some("denied"), Some("config:server:0")));
    }
    assert_eq!(admin_client.get("/admin/v1/audit?tenant=nobody").json["items"], json!([]));

    // An entry from long ago, written through the store while the server is down.
    server.stop();
    {
        let (store, writer) = crate::support::open_store(&server.data_dir);
        use kestrel::policy::{AuditDecision, AuditEntry, DecidedBy};
        let old = AuditEntry {
            at: "2020-01-01T00:00:00.000Z".into(),
            session_id: Some(session.clone()),
            ..AuditEntry::now("default", "run_command", AuditDecision::Denied, DecidedBy::Rule)
        };
        let write = kestrel::store::PolicyWrite::Audit(vec![old]);
        store.write(vec![kestrel::store::WriteOp::Policy(write)]).unwrap();
        writer.shutdown();
    }
    server.restart(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = vec![spec("run_command", None, Outcome::Deny)];
    });
    assert_eq!(audit_of(&server, &session).len(), 4, "the old entry is there until the next one");
    attempt(&server, &session, "run_command", &json!({ "command": "echo again" }));
    let audit = audit_of(&server, &session);
    assert_eq!(audit.len(), 4, "one in, the old one out");
    assert!(audit.iter().all(|e| e["at"].as_str().unwrap() > "2020-01-02"));
}

/// Acknowledged is durable: an approval remembered and answered 200, then kill -9 at once, is
/// still a rule after the restart, its decision is in the audit log, and the same call then
/// runs without asking.
#[test]
fn a_remembered_approval_answered_before_a_kill_9_survives_it() {
    use crate::support::{spawn_binary, test_config, Client, SseClient};
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let (mut child, base, _) = spawn_binary(data.path(), workspace.path(), "[builtin]\ndelay_ms = 0\n");
    let client = Client { base: base.clone(), token: None };
    let id = client.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let mut stream = SseClient::open(&base, &format!("/api/sessions/{id}/events"), None, None);
    let call = json!({ "command": "echo kept" });
    let line = format!("/tool run_command {call}");
    assert_eq!(client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line })).status, 202);
    let asked = stream.collect_until(|e| event_type(e) == "approval.requested");
    let approval = asked.last().unwrap()["event"]["approval"]["id"].as_str().unwrap().to_string();
    let decision = json!({ "approved": true, "remember": "session", "note": "keep it" });
    assert_eq!(client.post(&format!("/api/sessions/{id}/approvals/{approval}"), decision).status, 200);
    child.kill().unwrap();
    child.wait().unwrap();

    let server = TestServer::from_config(test_config(data.path(), workspace.path()));
    let rules = server.get(&format!("/api/sessions/{id}/rules"));
    assert_eq!(rules.json["rules"][0]["match"], "echo kept", "{}", rules.text);
    let audit = audit_of(&server, &id);
    let approved = audit.iter().find(|e| e["decision"] == "approved").expect("the decision survived");
    assert_eq!(approved["note"], "keep it");
    assert_eq!(approved["ruleId"], rules.json["rules"][0]["id"]);
    assert_eq!(attempt(&server, &id, "run_command", &call).0, Fate::Ran, "remembered: not asked again");
}
