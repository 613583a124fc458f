//! Checkpoints over HTTP: snapshots, restores compared byte for byte, the safety checkpoint,
//! the automatic one before a run's changes, dedup on disk, limits, and the refusals.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use kestrel::engine::tools::Permission;
use serde_json::{json, Value};

use crate::support::{event_type, TestServer};

/// A server whose tools all run without asking.
fn server(adjust: impl FnOnce(&mut kestrel::Config)) -> TestServer {
    TestServer::start_with(|config| {
        for tool in ["write_file", "edit_file", "run_command"] {
            config.agent.permissions.insert(tool.into(), Permission::Auto);
        }
        adjust(config);
    })
}

/// Every file (its bytes and mode) and every directory (`None`) under `root`, by path.
fn tree(root: &Path) -> BTreeMap<String, Option<(Vec<u8>, u32)>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let metadata = fs::symlink_metadata(&path).unwrap();
            if metadata.is_dir() {
                found.insert(relative, None);
                pending.push(path);
            } else {
                found.insert(relative, Some((fs::read(&path).unwrap(), metadata.permissions().mode() & 0o777)));
            }
        }
    }
    found
}

fn seed(workspace: &Path) {
    fs::create_dir_all(workspace.join("src/deep")).unwrap();
    fs::create_dir_all(workspace.join("empty")).unwrap();
    fs::create_dir_all(workspace.join("node_modules/pkg")).unwrap();
    fs::write(workspace.join(".gitignore"), "node_modules/\n*.log\n").unwrap();
    fs::write(workspace.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(workspace.join("src/deep/notes.txt"), "keep me\n").unwrap();
    fs::write(workspace.join("doomed.txt"), "to be deleted\n").unwrap();
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    fs::write(workspace.join("logo.bin"), binary).unwrap();
    fs::set_permissions(workspace.join("logo.bin"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(workspace.join("node_modules/pkg/index.js"), "ignored\n").unwrap();
    fs::write(workspace.join("build.log"), "ignored too\n").unwrap();
}

fn tool_line(name: &str, arguments: Value) -> String {
    format!("/tool {name} {arguments}")
}

#[test]
fn a_restore_puts_the_tree_back_byte_for_byte_and_its_safety_checkpoint_undoes_it() {
    let server = server(|_| {});
    seed(&server.workspace);
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/checkpoints");
    let listed = server.get(&path);
    assert_eq!(listed.json, json!({ "enabled": true, "checkpoints": [] }), "{}", listed.text);

    let created = server.post(&path, json!({ "label": "  before the agent  " }));
    assert_eq!(created.status, 201, "{}", created.text);
    let manual = created.json["checkpoint"].clone();
    assert_eq!((manual["kind"].as_str(), manual["label"].as_str()), (Some("manual"), Some("before the agent")));
    // main.rs, notes.txt, doomed.txt, logo.bin, .gitignore; node_modules and *.log left out.
    assert_eq!(manual["fileCount"], 5, "{manual}");
    let before = tree(&server.workspace);

    // The agent changes files: an edit, a new file, a deletion, an empty directory removed.
    let changes = [
        tool_line("write_file", json!({ "path": "src/main.rs", "content": "fn main() { changed(); }\n" })),
        tool_line("write_file", json!({ "path": "src/new/made.txt", "content": "new\n" })),
        tool_line("run_command", json!({ "command": "rm doomed.txt && rmdir empty && chmod 600 logo.bin" })),
    ];
    let events = server.run_to_end(&id, &changes.join("\n"));
    assert_eq!(events.iter().filter(|e| event_type(e) == "tool.finished").count(), 3, "{events:#?}");
    fs::write(server.workspace.join("node_modules/pkg/added.js"), "ignored, never touched\n").unwrap();
    let changed = tree(&server.workspace);
    assert_ne!(changed, before);

    // The run took its automatic checkpoint before its first change.
    let checkpoints = server.get(&path).json["checkpoints"].as_array().unwrap().clone();
    let auto = checkpoints.iter().find(|c| c["kind"] == "auto").expect("an automatic checkpoint");
    assert!(auto["runId"].as_str().is_some_and(|r| r.starts_with("run_")), "{auto}");

    let restored = server.post(&format!("{path}/{}/restore", manual["id"].as_str().unwrap()), json!({}));
    assert_eq!(restored.status, 200, "{}", restored.text);
    assert_eq!(restored.json["restored"]["id"], manual["id"]);
    assert_eq!(restored.json["safety"]["kind"], "safety");
    assert!(restored.json.get("warning").is_none(), "{}", restored.text);
    let mut expected = before.clone();
    expected.insert("node_modules/pkg/added.js".into(), Some((b"ignored, never touched\n".to_vec(), 0o644)));
    assert_eq!(tree(&server.workspace), expected, "the tree is back, ignored files untouched");

    // The safety checkpoint undoes the restore.
    let safety = restored.json["safety"]["id"].as_str().unwrap().to_string();
    let undone = server.post(&format!("{path}/{safety}/restore"), json!({}));
    assert_eq!(undone.status, 200, "{}", undone.text);
    assert_eq!(tree(&server.workspace), changed);
}

#[test]
fn a_second_checkpoint_of_an_unchanged_tree_adds_almost_nothing_on_disk() {
    let server = server(|_| {});
    // 50 MB: fifty files of a megabyte each, no two alike.
    for index in 0..50u32 {
        let content: Vec<u8> =
            (0..1_048_576u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ index as u8).collect();
        fs::write(server.workspace.join(format!("blob{index:02}.bin")), content).unwrap();
    }
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/checkpoints");
    let disk = || -> u64 {
        let mut total = 0;
        let mut pending = vec![server.data_dir.clone()];
        while let Some(dir) = pending.pop() {
            for entry in fs::read_dir(&dir).unwrap().flatten() {
                let metadata = entry.metadata().unwrap();
                if metadata.is_dir() {
                    pending.push(entry.path());
                } else {
                    total += metadata.len();
                }
            }
        }
        // On PostgreSQL the contents are the `blobs` table's, with its TOAST.
        match crate::support::on_postgres() {
            true => {
                total
                    + crate::support::Db::open(&server.data_dir).integer("SELECT pg_total_relation_size('blobs')", &[])
                        as u64
            }
            false => total,
        }
    };
    let first = server.post(&path, json!({}));
    assert_eq!(first.status, 201, "{}", first.text);
    assert_eq!(first.json["checkpoint"]["totalBytes"], 50 * 1_048_576);
    let after_first = disk();
    let entries = || -> i64 {
        crate::support::Db::open(&server.data_dir).integer("SELECT count(*) FROM checkpoint_entries", &[])
    };
    let listed_first = entries();
    assert_eq!(listed_first, 50, "one entry per file");
    let second = server.post(&path, json!({}));
    assert_eq!(second.status, 201);
    let added = disk().saturating_sub(after_first);
    assert!(added < 256 * 1024, "the second checkpoint added {added} bytes");
    assert_eq!(entries(), listed_first, "the second shares the first's manifest instead of copying it");

    // The shared manifest restores as its own would.
    let before = tree(&server.workspace);
    fs::write(server.workspace.join("blob07.bin"), "overwritten").unwrap();
    fs::remove_file(server.workspace.join("blob08.bin")).unwrap();
    let restore = format!("{path}/{}/restore", second.json["checkpoint"]["id"].as_str().unwrap());
    let restored = server.post(&restore, json!({}));
    assert_eq!(restored.status, 200, "{}", restored.text);
    assert_eq!(tree(&server.workspace), before);
    assert_eq!(entries(), listed_first + 49, "the safety checkpoint (49 files) has a manifest of its own");
}

#[test]
fn limits_and_the_switch_turn_checkpoints_off_with_a_reason() {
    let limited = server(|config| config.checkpoints.max_files = 2);
    for name in ["a", "b", "c"] {
        fs::write(limited.workspace.join(name), name).unwrap();
    }
    let id = limited.create_session(json!({}));
    let path = format!("/api/sessions/{id}/checkpoints");
    let listed = limited.get(&path).json;
    assert_eq!(listed["enabled"], false);
    assert!(listed["reason"].as_str().unwrap().contains("more than 2 files"), "{listed}");
    let refused = limited.post(&path, json!({}));
    refused.assert_error(409, "checkpoints_disabled");
    assert!(refused.json["error"]["message"].as_str().unwrap().contains("more than 2 files"), "{}", refused.text);
    // The run goes on without its automatic checkpoint.
    let events = limited.run_to_end(&id, &tool_line("write_file", json!({ "path": "d", "content": "d" })));
    assert_eq!(events.last().unwrap()["event"]["type"], "run.finished", "{events:#?}");

    let off = server(|config| config.checkpoints.enabled = false);
    let id = off.create_session(json!({}));
    let listed = off.get(&format!("/api/sessions/{id}/checkpoints")).json;
    assert_eq!(listed["enabled"], false);
    assert!(listed["reason"].as_str().unwrap().contains("checkpoints.enabled"), "{listed}");
}

#[test]
fn unknown_checkpoints_other_tenants_bad_labels_and_busy_sessions_are_refused() {
    let server = server(|config| config.builtin.delay_ms = 50);
    fs::write(server.workspace.join("a.txt"), "a").unwrap();
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/checkpoints");
    server.post(&format!("{path}/chk_nope/restore"), json!({})).assert_error(404, "checkpoint_not_found");
    server.post(&path, json!({ "label": 5 })).assert_error(400, "invalid_body");
    server.post(&path, json!({ "label": "x".repeat(201) })).assert_error(400, "invalid_body");
    server.get("/api/sessions/ses_nope/checkpoints").assert_error(404, "session_not_found");
    let checkpoint = server.post(&path, json!({})).json["checkpoint"]["id"].as_str().unwrap().to_string();

    // While a run streams its answer, a restore is refused and nothing changes.
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let long = "word ".repeat(400);
    assert_eq!(server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": long })).status, 202);
    stream.collect_until(|e| event_type(e) == "message.delta");
    server.post(&format!("{path}/{checkpoint}/restore"), json!({})).assert_error(409, "session_busy");
    let running = server.get(&format!("/api/sessions/{id}")).json["session"]["messages"][0]["id"].clone();
    server
        .post(&format!("/api/sessions/{id}/rewind"), json!({ "messageId": running }))
        .assert_error(409, "session_busy");
    server.post(&format!("/api/sessions/{id}/cancel"), json!({}));
    stream.collect_until(crate::support::is_run_end);
    let kinds: Vec<Value> =
        server.get(&path).json["checkpoints"].as_array().unwrap().iter().map(|c| c["kind"].clone()).collect();
    assert_eq!(kinds, [json!("manual")], "the refused restore took no safety checkpoint");
}

#[test]
fn rewind_drops_a_user_message_and_its_successors_and_puts_the_files_back() {
    let server = server(|_| {});
    let id = server.create_session(json!({}));
    let write = |path: &str, content: &str| tool_line("write_file", json!({ "path": path, "content": content }));
    server.run_to_end(&id, &write("a.txt", "one\n"));
    let session = |server: &TestServer| server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    let kept = session(&server)["messages"].as_array().unwrap().len();
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let events = server.run_to_end(&id, &[write("a.txt", "two\n"), write("b/new.txt", "new\n")].join("\n"));
    let second_run = events.iter().find(|e| event_type(e) == "run.started").unwrap()["event"]["runId"].clone();
    let messages = session(&server)["messages"].as_array().unwrap().clone();
    let target = messages[kept]["id"].as_str().unwrap().to_string();
    assert_eq!(messages[kept]["role"], "user");
    assert_eq!(fs::read_to_string(server.workspace.join("a.txt")).unwrap(), "two\n");
    stream.drain_events();

    // Refusals first: nothing changes.
    let rewind = format!("/api/sessions/{id}/rewind");
    server.post(&rewind, json!({ "messageId": "msg_nope" })).assert_error(404, "message_not_found");
    let answer_id = messages[kept + 1]["id"].as_str().unwrap();
    server.post(&rewind, json!({ "messageId": answer_id })).assert_error(400, "invalid_rewind_target");
    server.post(&rewind, json!({})).assert_error(400, "invalid_body");
    server.post(&rewind, json!({ "messageId": target, "restoreFiles": "yes" })).assert_error(400, "invalid_body");
    server.post("/api/sessions/ses_nope/rewind", json!({ "messageId": target })).assert_error(404, "session_not_found");

    let rewound = server.post(&rewind, json!({ "messageId": target }));
    assert_eq!(rewound.status, 200, "{}", rewound.text);
    assert_eq!(rewound.json["messageId"], target.as_str());
    assert_eq!(rewound.json["removed"], messages.len() - kept);
    assert_eq!(rewound.json["messages"].as_array().unwrap().len(), kept);
    assert_eq!(
        (rewound.json["restored"]["kind"].as_str(), &rewound.json["restored"]["runId"]),
        (Some("auto"), &second_run)
    );
    assert_eq!(rewound.json["safety"]["kind"], "safety");
    // The files are as they were before the second run; the transcript ends before it.
    assert_eq!(fs::read_to_string(server.workspace.join("a.txt")).unwrap(), "one\n");
    assert!(!server.workspace.join("b").exists(), "a directory the run made is gone with its file");
    let now = session(&server);
    assert_eq!(now["messages"], rewound.json["messages"]);
    assert_eq!(now["messageCount"], kept);
    let rewound_event = stream.collect_until(|e| event_type(e) == "session.rewound").pop().unwrap();
    assert_eq!(rewound_event["event"]["messages"], rewound.json["messages"]);

    // Without files: only the transcript goes back.
    let first = now["messages"][0]["id"].as_str().unwrap().to_string();
    let only_transcript = server.post(&rewind, json!({ "messageId": first, "restoreFiles": false }));
    assert_eq!(only_transcript.status, 200, "{}", only_transcript.text);
    assert_eq!((&only_transcript.json["restored"], &only_transcript.json["safety"]), (&Value::Null, &Value::Null));
    assert_eq!(only_transcript.json["messages"], json!([]));
    assert_eq!(fs::read_to_string(server.workspace.join("a.txt")).unwrap(), "one\n");
}

#[test]
fn a_deleted_sessions_blobs_are_collected_after_the_next_start() {
    let mut server = server(|_| {});
    fs::write(server.workspace.join("shared.txt"), "in both sessions' checkpoints").unwrap();
    let (kept, dropped) = (server.create_session(json!({})), server.create_session(json!({})));
    assert_eq!(server.post(&format!("/api/sessions/{kept}/checkpoints"), json!({})).status, 201);
    fs::write(server.workspace.join("only-later.txt"), "only in the dropped session's checkpoint").unwrap();
    assert_eq!(server.post(&format!("/api/sessions/{dropped}/checkpoints"), json!({})).status, 201);
    let blobs =
        |server: &TestServer| -> usize { crate::support::Db::open(&server.data_dir).blob_count(&server.data_dir) };
    assert_eq!(blobs(&server), 2);
    assert_eq!(server.delete(&format!("/api/sessions/{dropped}")).status, 204);
    server.restart(|config| {
        config.agent.permissions.insert("write_file".into(), Permission::Auto);
    });
    // Collected in the background, after the start.
    crate::support::wait_until("the blob only the deleted session's checkpoint held to go", || blobs(&server) == 1);
    let listed = server.get(&format!("/api/sessions/{kept}/checkpoints")).json;
    assert_eq!(listed["checkpoints"].as_array().unwrap().len(), 1);
}

#[test]
fn a_restore_never_writes_through_a_link_and_other_tenants_sessions_are_hidden() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("victim.txt"), "untouched").unwrap();
    let server = TestServer::start_with(|config| {
        config.auth.tokens.push(kestrel::config::TokenConfig::new("a", "token-a"));
        config.auth.tokens.push(kestrel::config::TokenConfig::new("b", "token-b"));
    });
    let (a, b) = (server.client().with_token(Some("token-a")), server.client().with_token(Some("token-b")));
    fs::create_dir_all(server.workspace.join("src")).unwrap();
    fs::write(server.workspace.join("src/victim.txt"), "the checkpoint's").unwrap();
    let id = a.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let path = format!("/api/sessions/{id}/checkpoints");
    let checkpoint = a.post(&path, json!({})).json["checkpoint"]["id"].as_str().unwrap().to_string();

    // Another tenant sees none of it, and cannot restore or rewind it.
    b.get(&path).assert_error(404, "session_not_found");
    b.post(&path, json!({})).assert_error(404, "session_not_found");
    b.post(&format!("{path}/{checkpoint}/restore"), json!({})).assert_error(404, "session_not_found");
    b.post(&format!("/api/sessions/{id}/rewind"), json!({ "messageId": "msg_x" }))
        .assert_error(404, "session_not_found");

    // `src` becomes a link to a directory outside the workspace: the restore replaces the
    // link with the directory and writes nothing outside.
    fs::remove_dir_all(server.workspace.join("src")).unwrap();
    std::os::unix::fs::symlink(outside.path(), server.workspace.join("src")).unwrap();
    let restored = a.post(&format!("{path}/{checkpoint}/restore"), json!({}));
    assert_eq!(restored.status, 200, "{}", restored.text);
    assert_eq!(fs::read_to_string(outside.path().join("victim.txt")).unwrap(), "untouched");
    assert!(!fs::symlink_metadata(server.workspace.join("src")).unwrap().file_type().is_symlink());
    assert_eq!(fs::read_to_string(server.workspace.join("src/victim.txt")).unwrap(), "the checkpoint's");
}

#[test]
fn what_cannot_be_put_back_is_a_warning_and_the_rest_is_restored() {
    let server = server(|_| {});
    fs::write(server.workspace.join("lost.txt"), "its blob will be gone").unwrap();
    fs::write(server.workspace.join("kept.txt"), "fine").unwrap();
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/checkpoints");
    let checkpoint = server.post(&path, json!({})).json["checkpoint"]["id"].as_str().unwrap().to_string();
    fs::write(server.workspace.join("lost.txt"), "changed").unwrap();
    fs::write(server.workspace.join("kept.txt"), "changed too").unwrap();
    // The blob of lost.txt's old content disappears from the data dir.
    let digest: String = {
        use sha2::Digest;
        sha2::Sha256::digest(b"its blob will be gone").iter().map(|b| format!("{b:02x}")).collect()
    };
    crate::support::Db::open(&server.data_dir).remove_blob(&server.data_dir, &digest);

    let restored = server.post(&format!("{path}/{checkpoint}/restore"), json!({}));
    assert_eq!(restored.status, 200, "{}", restored.text);
    let warning = restored.json["warning"].as_str().expect("a warning");
    assert!(warning.contains("lost.txt: not restored"), "{warning}");
    assert_eq!(fs::read_to_string(server.workspace.join("kept.txt")).unwrap(), "fine");
    assert_eq!(fs::read_to_string(server.workspace.join("lost.txt")).unwrap(), "changed", "left as it was");
}

#[test]
fn while_a_checkpoint_walks_a_large_tree_approvals_and_cancel_answer_at_once() {
    let server = TestServer::start_with(|config| {
        config.agent.permissions.insert("run_command".into(), Permission::Ask);
        config.checkpoints.max_files = 100_000;
    });
    // Every file a blob of its own, each synced: a walk of seconds.
    fs::create_dir_all(server.workspace.join("many")).unwrap();
    for n in 0..3000 {
        fs::write(server.workspace.join(format!("many/f{n:05}")), format!("content {n}\n")).unwrap();
    }
    let session = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{session}/events"));
    let line = tool_line("run_command", json!({ "command": "true" }));
    assert_eq!(server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": line })).status, 202);
    let asked = stream.collect_until(|e| event_type(e) == "approval.requested");
    let approval = asked.last().unwrap()["event"]["approval"]["id"].as_str().unwrap().to_string();

    let (client, path) = (server.client(), format!("/api/sessions/{session}/checkpoints"));
    let checkpoint = std::thread::spawn(move || client.post(&path, json!({ "label": "large" })));
    let mut db = crate::support::Db::open(&server.data_dir);
    crate::support::wait_until("the walk to store blobs", || db.blob_count(&server.data_dir) > 0);
    let limit = std::time::Duration::from_millis(100);
    let started = std::time::Instant::now();
    let decided = server.post(&format!("/api/sessions/{session}/approvals/{approval}"), json!({ "approved": true }));
    assert!(started.elapsed() < limit && decided.status == 200, "approval: {:?} {}", started.elapsed(), decided.text);
    let started = std::time::Instant::now();
    let cancelled = server.post(&format!("/api/sessions/{session}/cancel"), json!({}));
    assert!(started.elapsed() < limit && cancelled.status == 200, "cancel: {:?} {}", started.elapsed(), cancelled.text);
    assert!(!checkpoint.is_finished(), "the walk was still under way");
    let taken = checkpoint.join().unwrap();
    assert_eq!(taken.status, 201, "{}", taken.text);
    assert!(taken.json["checkpoint"]["fileCount"].as_u64().unwrap() >= 3000, "{}", taken.text);
}
