//! The read-only workspace routes: listings, files, caps, and containment.

use std::fs;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::TestServer;

fn setup() -> (TestServer, String, tempfile::TempDir) {
    let server = TestServer::start();
    let ws = &server.workspace;
    fs::create_dir_all(ws.join("src/inner")).unwrap();
    fs::create_dir_all(ws.join("b-dir")).unwrap();
    fs::write(ws.join("src/main.rs"), "fn main() {}\n// é\n").unwrap();
    fs::write(ws.join("a-file.txt"), "hello").unwrap();
    fs::write(ws.join("pic.png"), [0x89, b'P', b'N', b'G', 0, 1, 2]).unwrap();
    fs::write(ws.join("data.bin"), [0u8, 1, 2, 3, 255]).unwrap();
    fs::write(ws.join("odd name ü (1).txt"), "odd").unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink("/etc", ws.join("etc-link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.join("outside-dir")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), ws.join("secret-link")).unwrap();
    std::os::unix::fs::symlink("src/main.rs", ws.join("inside-link.rs")).unwrap();
    let session = server.create_session(json!({}));
    (server, session, outside)
}

fn query(path: &str) -> String {
    path.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_./".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn a_listing_puts_directories_first_then_files_by_name() {
    let (server, session, _outside) = setup();
    let listing = server.get(&format!("/api/sessions/{session}/files"));
    assert_eq!(listing.status, 200, "{}", listing.text);
    assert_eq!(listing.json["path"], ".");
    let entries = listing.json["entries"].as_array().unwrap();
    let names: Vec<&str> = entries.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(&names[..4], ["b-dir", "etc-link", "outside-dir", "src"], "directories (links to them too) first");
    assert_eq!(&names[4..6], ["a-file.txt", "data.bin"]);
    let file = entries.iter().find(|e| e["name"] == "a-file.txt").unwrap();
    assert_eq!(file["type"], "file");
    assert_eq!(file["path"], "a-file.txt");
    assert_eq!(file["size"], 5);
    assert!(file["modifiedAt"].as_str().unwrap().ends_with('Z'));
    assert!(listing.json.get("truncated").is_none());

    let nested = server.get(&format!("/api/sessions/{session}/files?path=src"));
    assert_eq!(nested.json["path"], "src");
    let paths: Vec<&str> =
        nested.json["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["src/inner", "src/main.rs"]);
}

#[test]
fn files_are_text_with_lines_or_base64_with_a_mime_type() {
    let (server, session, _outside) = setup();
    let text = server.get(&format!("/api/sessions/{session}/file?path=src/main.rs"));
    assert_eq!(text.status, 200, "{}", text.text);
    assert_eq!(text.json["encoding"], "utf8");
    assert_eq!(text.json["content"], "fn main() {}\n// é\n");
    assert_eq!(text.json["lines"], 2);
    assert_eq!(text.json["binary"], false);
    assert_eq!(text.json["truncated"], false);
    assert_eq!(text.json["name"], "main.rs");
    assert_eq!(text.json["mimeType"], "text/x-rust");

    let image = server.get(&format!("/api/sessions/{session}/file?path=pic.png"));
    assert_eq!(image.json["encoding"], "base64");
    assert_eq!(image.json["mimeType"], "image/png");
    assert_eq!(image.json["binary"], true);
    let bytes = base64::engine::general_purpose::STANDARD.decode(image.json["content"].as_str().unwrap()).unwrap();
    assert_eq!(bytes, [0x89, b'P', b'N', b'G', 0, 1, 2]);
    assert!(image.json.get("lines").is_none());
    let binary = server.get(&format!("/api/sessions/{session}/file?path=data.bin"));
    assert_eq!(binary.json["mimeType"], "application/octet-stream");
    assert_eq!(binary.json["encoding"], "base64");

    let odd = server.get(&format!("/api/sessions/{session}/file?path={}", query("odd name ü (1).txt")));
    assert_eq!(odd.status, 200, "{}", odd.text);
    assert_eq!(odd.json["content"], "odd");
    let linked = server.get(&format!("/api/sessions/{session}/file?path=inside-link.rs"));
    assert_eq!(linked.status, 200, "a link that stays inside is fine");
}

#[test]
fn paths_that_escape_are_refused_and_missing_ones_are_404() {
    let (server, session, _outside) = setup();
    let base = format!("/api/sessions/{session}");
    server.get(&format!("{base}/file?path=/etc/passwd")).assert_error(400, "invalid_path");
    server.get(&format!("{base}/files?path=/etc")).assert_error(400, "invalid_path");
    server.get(&format!("{base}/file")).assert_error(400, "invalid_path");
    server.get(&format!("{base}/file?path=src")).assert_error(400, "invalid_path");
    server.get(&format!("{base}/file?path=../secret.txt")).assert_error(403, "outside_workspace");
    server.get(&format!("{base}/file?path=src/../../x")).assert_error(403, "outside_workspace");
    server.get(&format!("{base}/file?path=etc-link/passwd")).assert_error(403, "outside_workspace");
    server.get(&format!("{base}/file?path=secret-link")).assert_error(403, "outside_workspace");
    server.get(&format!("{base}/files?path=outside-dir")).assert_error(403, "outside_workspace");
    server.get(&format!("{base}/files?path=etc-link")).assert_error(403, "outside_workspace");
    server.get(&format!("{base}/file?path=src/..%2f..%2fx")).assert_error(403, "outside_workspace");
    server.get(&format!("{base}/file?path=missing.txt")).assert_error(404, "not_found");
    server.get(&format!("{base}/files?path=missing-dir")).assert_error(404, "not_found");
    // The routes are read-only.
    let refused = server.client().send("PUT", &format!("{base}/file?path=a-file.txt"), Some(b"x"));
    refused.assert_error(405, "method_not_allowed");
    assert_eq!(fs::read_to_string(server.workspace.join("a-file.txt")).unwrap(), "hello");
}

#[test]
fn listings_cap_at_500_entries_and_reads_at_the_limit() {
    let server = TestServer::start_with(|config| config.agent.file_read_limit_bytes = 2 * 1024 * 1024);
    let many = server.workspace.join("many");
    fs::create_dir_all(&many).unwrap();
    for i in 0..505 {
        fs::write(many.join(format!("f{i:03}.txt")), "x").unwrap();
    }
    let big = "0123456789abcdef".repeat(200_000); // 3.2 MB
    fs::write(server.workspace.join("big.txt"), &big).unwrap();
    let session = server.create_session(json!({}));

    let listing = server.get(&format!("/api/sessions/{session}/files?path=many"));
    assert_eq!(listing.json["truncated"], true);
    let entries: &Vec<Value> = listing.json["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 500);
    assert_eq!(entries[0]["name"], "f000.txt");

    let file = server.get(&format!("/api/sessions/{session}/file?path=big.txt"));
    assert_eq!(file.json["truncated"], true);
    assert_eq!(file.json["size"], 3_200_000);
    assert_eq!(file.json["content"].as_str().unwrap().len(), 2 * 1024 * 1024);
}

#[test]
fn another_tenants_workspace_is_a_404() {
    let server = TestServer::start_with(|config| {
        for (tenant, token) in [("a", "token-a"), ("b", "token-b")] {
            config.auth.tokens.push(kestrel::config::TokenConfig::new(tenant, token));
        }
    });
    let a = server.client().with_token(Some("token-a"));
    let b = server.client().with_token(Some("token-b"));
    let session = a.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    assert_eq!(a.get(&format!("/api/sessions/{session}/files")).status, 200);
    b.get(&format!("/api/sessions/{session}/files")).assert_error(404, "session_not_found");
    b.get(&format!("/api/sessions/{session}/file?path=x")).assert_error(404, "session_not_found");
}
