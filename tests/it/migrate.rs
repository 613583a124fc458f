//! Upgrades: a database written by an earlier server reads back exactly as it did there.

use serde_json::{json, Value};

use crate::support::{event_type, test_config, TestServer};

/// A database written by main at a71d55f (transcripts stored as Kestrel `ChatMessage` JSON),
/// with what that server answered for each session: text, reasoning, an image, tool calls and
/// results (one failed), and `meta`.
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/main-a71d55f");

#[test]
fn a_database_from_before_blocks_reads_back_exactly_as_its_server_answered() {
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::copy(format!("{FIXTURE}/kestrel.db"), data.path().join("kestrel.db")).unwrap();
    let expected: serde_json::Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURE}/sessions.json")).unwrap()).unwrap();
    let server = TestServer::from_config(test_config(data.path(), workspace.path()));
    for (id, answer) in &expected {
        let got = server.get(&format!("/api/sessions/{id}"));
        assert_eq!(got.status, 200);
        assert_eq!(&got.json, answer, "session {id} reads back unchanged");
    }
    // The migrated transcript carries on.
    let (id, answer) = expected.iter().next().unwrap();
    let before = answer["session"]["messageCount"].as_u64().unwrap();
    let run = server.run_to_end(id, "after the upgrade");
    assert_eq!(event_type(run.last().unwrap()), "run.finished");
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["messageCount"], json!(before + 2));
    assert_eq!(session["messages"].as_array().unwrap().last().unwrap()["content"], "Echo: after the upgrade");
}
