//! The audit log keeps what a call was, never what it wrote (issue 35, finding 13): a tool's
//! content arguments (`write_file`'s `content`, `edit_file`'s strings) are stored as their size
//! and SHA-256, in entries, edits and remembered rules alike (docs/permissions.md).

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::permissions::{ask_for, audit_of};
use crate::support::{event_type, is_run_end, TestServer};

/// Approves the call waiting in `session` with `decision`; the run's events.
fn approve(server: &TestServer, session: &str, tool: &str, arguments: &Value, decision: Value) -> Vec<Value> {
    let (mut stream, approval) = ask_for(server, session, tool, arguments);
    let answer = server.post(&format!("/api/sessions/{session}/approvals/{approval}"), decision);
    assert_eq!(answer.status, 200, "{}", answer.text);
    stream.collect_until(is_run_end)
}

fn digest(text: &str) -> Value {
    json!({ "bytes": text.len(), "sha256": format!("{:x}", Sha256::digest(text.as_bytes())) })
}

#[test]
fn the_audit_log_keeps_sizes_and_hashes_of_content_never_the_text() {
    let server = TestServer::start_with(|config| config.builtin.delay_ms = 0);
    let session = server.create_session(json!({}));
    let written = "api_key = sk-live-WRITTEN-4f9a8b7c6d5e\n";
    let write = json!({ "path": "notes.txt", "content": written });
    approve(&server, &session, "write_file", &write, json!({ "approved": true }));
    assert_eq!(std::fs::read_to_string(server.workspace.join("notes.txt")).unwrap(), written);

    // An edit, whose arguments a person edits in turn.
    let edit =
        json!({ "path": "notes.txt", "oldString": "sk-live-WRITTEN-4f9a8b7c6d5e", "newString": "sk-live-MODEL-77" });
    let edited =
        json!({ "path": "notes.txt", "oldString": "sk-live-WRITTEN-4f9a8b7c6d5e", "newString": "sk-live-PERSON-99" });
    let events = approve(&server, &session, "edit_file", &edit, json!({ "approved": true, "arguments": edited }));
    assert!(events.iter().any(|e| event_type(e) == "tool.finished" && e["event"]["result"]["ok"] == true));
    assert!(std::fs::read_to_string(server.workspace.join("notes.txt")).unwrap().contains("sk-live-PERSON-99"));

    // A call with no exact path to remember: the remembered rule holds its arguments.
    let outside = json!({ "path": "../outside.txt", "content": "sk-live-REMEMBERED-31" });
    approve(&server, &session, "write_file", &outside, json!({ "approved": false, "remember": "session" }));

    let audit = audit_of(&server, &session);
    let everything = serde_json::to_string(&audit).unwrap();
    let rules = server.get(&format!("/api/sessions/{session}/rules"));
    assert_eq!(rules.status, 200, "{}", rules.text);
    for secret in ["sk-live", "WRITTEN", "MODEL-77", "PERSON-99", "REMEMBERED"] {
        assert!(!everything.contains(secret), "{secret} is in the audit log: {everything}");
        assert!(!rules.text.contains(secret), "{secret} is in a rule: {}", rules.text);
    }

    let arguments =
        |entry: &Value, field: &str| -> Value { serde_json::from_str(entry[field].as_str().unwrap()).unwrap() };
    let wrote = audit.iter().find(|e| e["tool"] == "write_file" && e["decision"] == "approved").unwrap();
    assert_eq!(arguments(wrote, "arguments"), json!({ "path": "notes.txt", "content": digest(written) }));
    let edit_entry = audit.iter().find(|e| e["tool"] == "edit_file" && e["decision"] == "edited").unwrap();
    assert_eq!(
        arguments(edit_entry, "arguments"),
        json!({ "path": "notes.txt", "oldString": digest("sk-live-WRITTEN-4f9a8b7c6d5e"), "newString": digest("sk-live-MODEL-77") })
    );
    assert_eq!(arguments(edit_entry, "edited")["newString"], digest("sk-live-PERSON-99"));
    let remembered = &rules.json["rules"][0];
    assert_eq!(remembered["outcome"], "deny", "{remembered}");
    let held: Value = serde_json::from_str(remembered["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(held["content"], digest("sk-live-REMEMBERED-31"), "{remembered}");

    // The remembered rule still holds for that exact call, and only it.
    let (fate, _) = crate::permissions::attempt(&server, &session, "write_file", &outside);
    assert_eq!(fate, crate::permissions::Fate::Denied, "remembered by its digest");
    let other = json!({ "path": "../outside.txt", "content": "different" });
    assert_eq!(crate::permissions::attempt(&server, &session, "write_file", &other).0, crate::permissions::Fate::Asked);
}
