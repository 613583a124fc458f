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

/// A data dir written by main at c59da00 (`scripts/fixtures/record.py`): Kestrel sessions
/// with tool calls, a failed call, checkpoints, a restore, a rewind and a compaction, and a
/// BAE session with a paused and resumed client tool, sandbox commands and a compaction;
/// with every read answer that server gave.
const C59: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/main-c59da00");

#[test]
fn a_database_of_c59da00_answers_byte_for_byte_as_its_server_did() {
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    for file in ["kestrel.db", "bae-key-secret", "admin-key"] {
        std::fs::copy(format!("{C59}/{file}"), data.path().join(file)).unwrap();
    }
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{C59}/answers.json")).unwrap()).unwrap();
    // Where the recorded sessions worked: a checkpoint listing reads it.
    std::fs::create_dir_all("/tmp/kestrel-fixture-workspace").unwrap();
    let server = TestServer::from_config(test_config(data.path(), workspace.path()));
    let admin = format!("http://{}", server.admin_addr().expect("an admin API"));
    let admin_key = std::fs::read_to_string(data.path().join("admin-key")).unwrap().trim().to_string();
    let session_key = fixture["session_key"].as_str().unwrap().to_string();
    let answers = fixture["answers"].as_object().unwrap();
    assert!(answers.len() >= 12, "the fixture asks enough");
    for (what, recorded) in answers {
        let (path, base) = match what.strip_suffix(" admin") {
            Some(path) => (path, admin.as_str()),
            None => (what.as_str(), server.base.as_str()),
        };
        let key = match recorded["key"].as_str() {
            Some("session") => Some(session_key.as_str()),
            Some("admin") => Some(admin_key.as_str()),
            _ => None,
        };
        let mut request = ureq::get(&format!("{base}{path}"));
        if let Some(key) = key {
            request = request.set("Authorization", &format!("Bearer {key}"));
        }
        let body = match request.call() {
            Ok(response) => response.into_string().unwrap(),
            Err(ureq::Error::Status(_, response)) => response.into_string().unwrap(),
            Err(error) => panic!("{what}: {error}"),
        };
        assert_eq!(body, recorded["body"].as_str().unwrap(), "{what} answers as c59da00 did");
    }
    // The streams replay the logged events as that server did after its restart.
    for (path, recorded) in fixture["replays"].as_object().unwrap() {
        let recorded: Vec<&str> = recorded.as_array().unwrap().iter().map(|line| line.as_str().unwrap()).collect();
        assert!(!recorded.is_empty());
        let replayed = data_lines(&server.base, path, recorded.len());
        assert_eq!(replayed, recorded, "{path} replays as c59da00 did");
    }
    // And the sessions carry on.
    let id = answers
        .keys()
        .find_map(|k| k.strip_prefix("/api/sessions/").filter(|rest| !rest.contains(['/', '?'])))
        .unwrap();
    let run = server.run_to_end(id, "after the upgrade");
    assert_eq!(event_type(run.last().unwrap()), "run.finished");
}

/// The first `count` `data:` lines an event stream sends, within `WAIT`.
fn data_lines(base: &str, path: &str, count: usize) -> Vec<String> {
    use std::io::BufRead;
    let response = ureq::get(&format!("{base}{path}")).call().unwrap();
    let deadline = std::time::Instant::now() + crate::support::WAIT;
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(response.into_reader()).lines() {
        assert!(std::time::Instant::now() < deadline, "{path}: {} of {count} lines within the deadline", lines.len());
        let line = line.unwrap();
        if let Some(data) = line.strip_prefix("data: ") {
            lines.push(data.to_string());
            if lines.len() == count {
                break;
            }
        }
    }
    lines
}
