//! Rules over what a walking tool reaches (issue 35, finding 3): `search_text`, `find_files`
//! and `list_directory` judge every file they would open or return, and every directory they
//! would enter, against the tool's deny and ask rules (docs/permissions.md, "Walking tools").

use serde_json::{json, Value};

use crate::permissions::{audit_of, spec};
use crate::support::{event_type, is_run_end, TestServer};
use kestrel::policy::Outcome::{Ask, Deny};

/// A workspace with a file anyone may read, an `.env`, a secret under `sub/`, a private tree,
/// and a link in `sub/` to the `.env`.
fn populate(root: &std::path::Path) {
    std::fs::write(root.join("readme.md"), "hello visible words\n").unwrap();
    std::fs::write(root.join(".env"), "TOKEN=hunter2\n").unwrap();
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/secret.txt"), "s3cret-value words\n").unwrap();
    std::fs::write(root.join("sub/plain.txt"), "plain words\n").unwrap();
    std::fs::create_dir_all(root.join("private/deep")).unwrap();
    std::fs::write(root.join("private/notes.md"), "private-words\n").unwrap();
    std::fs::write(root.join("private/deep/x.txt"), "deeper-words\n").unwrap();
    std::os::unix::fs::symlink("../.env", root.join("sub/alias")).unwrap();
}

/// Runs one `/tool` call that needs no approval; its `tool.finished` result.
fn run_tool(server: &TestServer, session: &str, tool: &str, arguments: &Value) -> Value {
    let events = server.run_to_end(session, &format!("/tool {tool} {arguments}"));
    assert!(events.iter().all(|e| event_type(e) != "approval.requested"), "{tool} {arguments} asked: {events:#?}");
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").expect("the call finished");
    finished["event"]["result"].clone()
}

#[test]
fn walking_tools_skip_and_count_what_deny_rules_cover() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = vec![
            spec("*", Some("**/.env"), Deny),
            spec("*", Some("**/secret*"), Deny),
            spec("*", Some("private/**"), Deny),
        ];
    });
    populate(&server.workspace);
    let session = server.create_session(json!({}));
    // What must never reach the model, whatever the call.
    let hidden = ["hunter2", "TOKEN", ".env", "secret", "notes.md", "deeper", "deep/", "alias"];
    let table = [
        // .env, sub/secret.txt and private/ (not entered).
        ("search_text", json!({ "pattern": ".", "path": "." }), 3, "readme.md:1: hello visible words"),
        ("search_text", json!({ "pattern": "words" }), 3, "sub/plain.txt:1: plain words"),
        ("search_text", json!({ "pattern": "words", "path": "sub" }), 1, "sub/plain.txt"),
        ("find_files", json!({ "pattern": "**/*" }), 3, "sub/plain.txt"),
        // Only what the glob would return is judged, and private/ is not entered.
        ("find_files", json!({ "pattern": "*secret*" }), 2, "No files match."),
        ("list_directory", json!({}), 2, "readme.md"),
        ("list_directory", json!({ "path": "sub" }), 2, "plain.txt"),
        // The start itself: everything in it is denied, so it is not listed at all.
        ("list_directory", json!({ "path": "private" }), 1, "withheld"),
        ("search_text", json!({ "pattern": ".", "path": "private" }), 1, "withheld"),
    ];
    for (tool, arguments, withheld, shown) in table {
        let result = run_tool(&server, &session, tool, &arguments);
        let content = result["content"].as_str().unwrap();
        assert_eq!(result["ok"], true, "{tool} {arguments}: {result}");
        for word in hidden {
            assert!(!content.contains(word), "{tool} {arguments} shows {word:?}: {content}");
        }
        assert!(content.contains(shown), "{tool} {arguments}: {content}");
        assert_eq!(result["data"]["withheld"]["denied"], withheld, "{tool} {arguments}: {result}");
        assert!(content.contains(&format!("{withheld} withheld")), "{tool} {arguments} says so: {content}");
    }
    // Nothing was asked, and nothing to ask about: every call was allowed.
    let audit = audit_of(&server, &session);
    assert!(audit.iter().all(|e| e["decision"] == "allowed"), "{audit:#?}");

    // A session's own rule withholds as the server's do: plain.txt, secret.txt and private/.
    let rule = json!({ "tool": "find_files", "match": "**/plain.txt", "outcome": "deny" });
    assert_eq!(server.post(&format!("/api/sessions/{session}/rules"), rule).status, 201);
    let result = run_tool(&server, &session, "find_files", &json!({ "pattern": "**/*.txt" }));
    assert_eq!(
        result["content"].as_str().unwrap(),
        "No files match.\n[3 withheld: a permission rule denies them; not opened or shown]"
    );
}

/// Sends `/tool search_text …` and waits for its approval of withheld files.
fn withheld_approval(server: &TestServer, session: &str, arguments: &Value) -> (crate::support::SseClient, Value) {
    let mut stream = server.events(&format!("/api/sessions/{session}/events"));
    let content = format!("/tool search_text {arguments}");
    assert_eq!(server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": content })).status, 202);
    let events = stream.collect_until(|e| event_type(e) == "approval.requested" || is_run_end(e));
    let asked = events.last().filter(|e| event_type(e) == "approval.requested").expect("the withheld files ask");
    assert!(events.iter().all(|e| event_type(e) != "tool.finished"), "no result before the decision: {events:#?}");
    (stream, asked["event"]["approval"].clone())
}

#[test]
fn an_ask_rule_withholds_files_until_a_person_allows_exactly_those() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = vec![
            spec("*", Some("**/.env"), Deny),
            spec("search_text", Some("**/secret*"), Ask),
            spec("search_text", Some("private/**"), Ask),
        ];
    });
    populate(&server.workspace);
    let session = server.create_session(json!({}));
    let arguments = json!({ "pattern": "words|value|hunter" });

    // Allowed: the call runs again with exactly those paths, the denied .env still withheld.
    let (mut stream, approval) = withheld_approval(&server, &session, &arguments);
    assert_eq!(approval["withheld"], json!(["private/", "sub/secret.txt"]), "{approval}");
    assert_eq!(approval["toolName"], "search_text");
    let path = format!("/api/sessions/{session}/approvals/{}", approval["id"].as_str().unwrap());
    // Neither a remembered rule nor an edit can stand for a decision on files.
    server.post(&path, json!({ "approved": true, "remember": "session" })).assert_error(400, "invalid_decision");
    server
        .post(&path, json!({ "approved": true, "arguments": { "pattern": "x" } }))
        .assert_error(400, "invalid_decision");
    assert_eq!(server.post(&path, json!({ "approved": true })).status, 200);
    let events = stream.collect_until(is_run_end);
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").expect("the call finished");
    let content = finished["event"]["result"]["content"].as_str().unwrap();
    for shown in ["sub/secret.txt:1: s3cret-value", "private/notes.md:1: private-words", "private/deep/x.txt:1: deeper"]
    {
        assert!(content.contains(shown), "{shown}: {content}");
    }
    assert!(!content.contains("hunter2"), "{content}");
    assert_eq!(finished["event"]["result"]["data"]["withheld"], json!({ "denied": 1 }), "{finished}");

    // Refused: the result says a person withheld them, and shows nothing of them.
    let (mut stream, approval) = withheld_approval(&server, &session, &arguments);
    let path = format!("/api/sessions/{session}/approvals/{}", approval["id"].as_str().unwrap());
    assert_eq!(server.post(&path, json!({ "approved": false })).status, 200);
    let events = stream.collect_until(is_run_end);
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").expect("the call finished");
    let result = &finished["event"]["result"];
    let content = result["content"].as_str().unwrap();
    for hidden in ["s3cret", "private-words", "deeper", "hunter2"] {
        assert!(!content.contains(hidden), "{hidden}: {content}");
    }
    assert!(content.contains("sub/plain.txt:1: plain words"), "{content}");
    assert!(content.contains("a person's decision"), "{content}");
    assert_eq!(result["data"]["withheld"], json!({ "denied": 1, "refused": 2 }), "{result}");

    // Both decisions are audited, with the files they were about.
    let audit = audit_of(&server, &session);
    let kinds: Vec<&str> = audit.iter().map(|e| e["decision"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["allowed", "asked", "approved", "allowed", "asked", "rejected"], "{audit:#?}");
    for asked in audit.iter().filter(|e| e["decision"] == "asked") {
        assert_eq!(asked["decidedBy"], "rule", "{asked}");
        assert_eq!(asked["ruleId"], "config:server:2", "the first rule that withheld: {asked}");
        let note = asked["note"].as_str().unwrap();
        assert!(note.contains("private/") && note.contains("sub/secret.txt"), "{note}");
    }
}

/// The console's card of a withheld-paths approval: the paths listed, no remember or edit,
/// and "Allow these paths" runs the search again with them.
#[test]
fn the_console_lists_withheld_paths_and_allows_them() {
    use crate::browser::browser;
    use crate::console::{create_session_in_page, send_in_page};
    let Some(browser) = browser() else { return };
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = vec![spec("search_text", Some("**/secret*"), Ask)];
    });
    populate(&server.workspace);
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    create_session_in_page(&browser, "Withheld");
    send_in_page(&browser, "/tool search_text {\"pattern\":\"value\"}");
    browser.wait_for("the approval card", "document.querySelector('.approval ul.withheld')");
    assert_eq!(browser.text(".approval ul.withheld"), "sub/secret.txt");
    let buttons = browser.eval(
        "return [...document.querySelectorAll('.approval:not([hidden]) button')].map(b => b.className);",
        json!([]),
    );
    assert_eq!(buttons, json!(["primary approve", "danger deny"]), "no remember, no edit");
    browser.click(".approval button.approve");
    browser.wait_for("the run's end", "document.querySelectorAll('.run-end.completed').length >= 1");
    assert!(browser.text(".tool .tool-output").contains("sub/secret.txt:1: s3cret-value"));
}

/// `kestrel chat` shows the withheld paths; `[a]lways` is refused for them (said, and asked
/// again), and `y` runs the search again with them.
#[test]
fn the_chat_shows_withheld_paths_and_allows_them_once() {
    use crate::terminal::{chat, stderr, stdout};
    let server = TestServer::start_with(|config| {
        config.agent.rules = vec![spec("search_text", Some("**/secret*"), Ask)];
    });
    populate(&server.workspace);
    let workspace = server.workspace.to_string_lossy().into_owned();
    let input = "/tool search_text {\"pattern\":\"value\"}\na\n\ny\n\n";
    let output = chat(&server, &["--workspace", &workspace], input);
    let (printed, errors) = (stdout(&output), stderr(&output));
    assert_eq!(output.status.code(), Some(0), "{printed}\n{errors}");
    assert!(
        printed.contains("? search_text withheld paths a rule asks about; run it again with sub/secret.txt"),
        "{printed}"
    );
    assert!(errors.contains("`approved` and `note` only"), "{errors}");
    assert!(printed.contains("✓ search_text: sub/secret.txt:1: s3cret-value words"), "{printed}");
}

/// Allowing a directory withheld by name allows it for the rule that withheld it only (the
/// review of issue 35): a file another ask rule covers inside it, which the person never saw
/// listed, stays withheld.
#[test]
fn an_allowed_directory_does_not_answer_another_rules_ask_inside_it() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules =
            vec![spec("search_text", Some("secrets/**"), Ask), spec("search_text", Some("**/*.key"), Ask)];
    });
    let root = &server.workspace;
    std::fs::create_dir_all(root.join("secrets")).unwrap();
    std::fs::write(root.join("secrets/notes.txt"), "words of the notes\n").unwrap();
    std::fs::write(root.join("secrets/api.key"), "words of the key\n").unwrap();
    std::fs::write(root.join("readme.md"), "words for all\n").unwrap();
    let session = server.create_session(json!({}));

    let (mut stream, approval) = withheld_approval(&server, &session, &json!({ "pattern": "words" }));
    assert_eq!(approval["withheld"], json!(["secrets/"]), "the directory, by name: {approval}");
    let path = format!("/api/sessions/{session}/approvals/{}", approval["id"].as_str().unwrap());
    assert_eq!(server.post(&path, json!({ "approved": true })).status, 200);
    let events = stream.collect_until(is_run_end);
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").expect("the call finished");
    let result = &finished["event"]["result"];
    let content = result["content"].as_str().unwrap();
    assert!(content.contains("secrets/notes.txt:1: words of the notes"), "{content}");
    assert!(!content.contains("words of the key"), "the key was never shown to the person: {content}");
    assert_eq!(result["data"]["withheld"], json!({ "unasked": 1 }), "{result}");
}
