//! The console in a real headless Chromium against a real server: create a session, stream a
//! reply, a hostile message shown as text, an approval given in the page and the file then in
//! the workspace browser, a long run cancelled, a reload mid-stream, the token prompt. And the
//! static files themselves over HTTP.

use serde_json::{json, Value};

use crate::browser::browser;
use crate::support::{is_run_end, TestServer};

const ENTER: &str = "\u{E007}";

#[test]
fn the_console_is_served_with_fingerprinted_cacheable_assets_and_no_token() {
    let server = TestServer::start_with(|config| config.auth.token = Some("sekret".into()));
    let page = ureq::get(&format!("{}/", server.base)).call().unwrap();
    assert_eq!(page.header("Content-Type"), Some("text/html; charset=utf-8"));
    assert_eq!(page.header("Cache-Control"), Some("no-cache"));
    let html = page.into_string().unwrap();
    let start = html.find("/assets/").unwrap();
    let script = &html[start..html[start..].find("\"").map(|end| start + end).unwrap()];
    let prefix = &script[..script.rfind('/').unwrap()];
    for (name, kind) in [("app.js", "text/javascript; charset=utf-8"), ("style.css", "text/css; charset=utf-8")] {
        let asset = ureq::get(&format!("{}{prefix}/{name}", server.base)).call().unwrap();
        assert_eq!(asset.header("Content-Type"), Some(kind));
        assert_eq!(asset.header("Cache-Control"), Some("public, max-age=31536000, immutable"));
    }
    let stale = ureq::get(&format!("{}/assets/0123456789abcdef/app.js", server.base)).call();
    assert!(matches!(stale, Err(ureq::Error::Status(404, _))), "an old fingerprint is not served");
    let posted = ureq::post(&format!("{}/", server.base)).call();
    assert!(matches!(posted, Err(ureq::Error::Status(405, _))));
    let api = ureq::get(&format!("{}/api/sessions", server.base)).call();
    assert!(matches!(api, Err(ureq::Error::Status(401, _))), "the API behind it still wants the token");
}

/// The page and its files allow scripts, styles and requests from this origin only (no inline
/// script, no `eval`), are never framed, and a plugin's file opened on its own is sandboxed
/// with no script, so it cannot reach the console's token or script its page.
#[test]
fn the_console_and_plugin_files_carry_a_strict_content_security_policy() {
    let plugins = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(plugins.path().join("x/web")).unwrap();
    let manifest = json!({ "id": "x", "name": "X", "version": "1", "web": { "entry": "index.js" } });
    std::fs::write(plugins.path().join("x/plugin.json"), manifest.to_string()).unwrap();
    std::fs::write(plugins.path().join("x/web/index.js"), "export function mount() {}\n").unwrap();
    std::fs::write(plugins.path().join("x/web/page.html"), "<script>localStorage.token</script>").unwrap();
    let dir = plugins.path().to_path_buf();
    let server = TestServer::start_with(move |config| config.plugins.dir = Some(dir));
    let page = ureq::get(&format!("{}/", server.base)).call().unwrap();
    let policy = page.header("Content-Security-Policy").unwrap().to_string();
    for directive in
        ["default-src 'self'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "object-src 'none'"]
    {
        assert!(policy.contains(directive), "{directive} missing: {policy}");
    }
    assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"), "{policy}");
    assert_eq!(page.header("X-Frame-Options"), Some("DENY"));
    assert_eq!(page.header("X-Content-Type-Options"), Some("nosniff"));
    let html = page.into_string().unwrap();
    assert!(!html.contains("<script>") && !html.contains(" style="), "nothing inline for the policy to refuse");
    let start = html.find("/assets/").unwrap();
    let app = &html[start..html[start..].find('"').map(|end| start + end).unwrap()];
    let asset = ureq::get(&format!("{}{app}", server.base)).call().unwrap();
    assert_eq!(asset.header("Content-Security-Policy").map(str::to_string), Some(policy));
    for file in ["index.js", "page.html"] {
        let served = ureq::get(&format!("{}/plugins/x/web/{file}", server.base)).call().unwrap();
        let sandboxed = served.header("Content-Security-Policy").unwrap();
        assert!(sandboxed.starts_with("sandbox;") && sandboxed.contains("default-src 'none'"), "{sandboxed}");
        assert_eq!(served.header("X-Content-Type-Options"), Some("nosniff"));
    }
}

/// A session created in the page: its id.
pub(crate) fn create_session_in_page(browser: &crate::browser::Browser, title: &str) -> String {
    browser.click("#new-session");
    browser.wait_for("the new-session dialog", "document.querySelector('.dialog input[name=title]')");
    browser.type_into(".dialog input[name=title]", title);
    browser.click(".dialog button[type=submit]");
    browser
        .wait_for("the session view", "location.hash.startsWith('#/s/') && document.querySelector('.session-title')");
    let hash = browser.eval("return location.hash;", json!([]));
    hash.as_str().unwrap().trim_start_matches("#/s/").to_string()
}

pub(crate) fn send_in_page(browser: &crate::browser::Browser, text: &str) {
    browser.type_into("textarea.input", text);
    browser.type_into("textarea.input", ENTER);
}

#[test]
fn a_session_streams_a_reply_shows_hostile_text_as_text_and_an_approval_writes_a_file() {
    let Some(browser) = browser() else { return };
    let server = TestServer::start_with(|config| config.builtin.delay_ms = 5);
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    let id = create_session_in_page(&browser, "From the browser");
    browser.wait_for("the listed session", &format!("document.querySelector('.session-link[data-id=\"{id}\"]')"));

    // A hostile message: markup in it is text, nothing runs.
    let hostile = "look <img src=x onerror=\"window.pwned=1\"> **bold** [x](javascript:window.pwned=2)";
    send_in_page(&browser, hostile);
    browser.wait_for(
        "the echoed reply",
        "[...document.querySelectorAll('.message.assistant .content')].some(e => e.textContent.includes('Echo: look'))",
    );
    let checked = browser.eval(
        "return { pwned: window.pwned || null, images: document.querySelectorAll('.transcript img').length, \
         links: document.querySelectorAll('.transcript a').length, bold: document.querySelectorAll('.transcript strong').length, \
         text: document.querySelector('.message.user .content').textContent };",
        json!([]),
    );
    assert_eq!(checked["pwned"], Value::Null, "{checked}");
    assert_eq!(checked["images"], 0, "{checked}");
    assert_eq!(checked["links"], 0, "a javascript: link stays text: {checked}");
    assert!(checked["bold"].as_u64().unwrap() >= 1, "markdown still renders: {checked}");
    assert!(checked["text"].as_str().unwrap().contains("<img src=x onerror="), "{checked}");
    browser.wait_for("the run's end", "document.querySelector('.run-end.completed')");

    // CommonMark's flanking rules: underscores inside words are text, not emphasis.
    send_in_page(&browser, "window.__pwned=1 then window.__pwned=2");
    let shown = "[...document.querySelectorAll('.message.assistant .content')]\
        .some(e => e.textContent.includes('Echo: window.__pwned=1 then window.__pwned=2'))";
    browser.wait_for("the underscores kept as text", shown);
    browser.wait_for("the second run's end", "document.querySelectorAll('.run-end.completed').length >= 2");

    // An approval, given in the page; the file is then in the workspace browser.
    send_in_page(&browser, "/tool write_file {\"path\":\"hello.txt\",\"content\":\"line one\\nline two\\n\"}");
    browser.wait_for("the approval card", "document.querySelector('.approval button.approve')");
    browser.type_into(".approval input.note", "fine by me");
    browser.click(".approval button.approve");
    browser.wait_for("the tool's result", "document.querySelector('.tool[data-tool=write_file] .tool-output pre')");
    browser.wait_for("the approval resolved", "document.querySelector('.approval .approved')");
    assert_eq!(std::fs::read_to_string(server.workspace.join("hello.txt")).unwrap(), "line one\nline two\n");
    browser.wait_for("the run's end", "document.querySelectorAll('.run-end.completed').length >= 2");
    let screenshot = browser.screenshot();
    browser.click(".tab[data-tab=files]");
    browser.wait_for("the file in the list", "document.querySelector('.tree button[data-path=\"hello.txt\"]')");
    browser.click(".tree button[data-path=\"hello.txt\"]");
    browser.wait_for("the file's lines", "document.querySelectorAll('table.numbered tr').length === 2");
    assert_eq!(browser.text("table.numbered tr:nth-child(2) td.text"), "line two");
    keep_screenshot(&screenshot);

    // The transcript survives a reload, and the session can be renamed.
    browser.refresh();
    browser.wait_for("the transcript after a reload", "document.querySelectorAll('.message').length >= 4");
    let stored = server.get(&format!("/api/sessions/{id}"));
    assert_eq!(stored.json["session"]["title"], "From the browser");
}

/// The console's screenshot: always under target/, and into docs/ when asked
/// (`KESTREL_UPDATE_SCREENSHOT=1`), so a test run does not rewrite a committed file.
fn keep_screenshot(png: &[u8]) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::write(root.join("target/console.png"), png).unwrap();
    if std::env::var("KESTREL_UPDATE_SCREENSHOT").is_ok_and(|v| v == "1") {
        std::fs::write(root.join("docs/console.png"), png).unwrap();
    }
}

#[test]
fn a_long_run_is_cancelled_and_a_reload_mid_stream_still_shows_the_whole_reply() {
    let Some(browser) = browser() else { return };
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 40;
        config.agent.permissions.insert("run_command".into(), kestrel::engine::tools::Permission::Auto);
    });
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    create_session_in_page(&browser, "Long runs");

    // Esc in the composer cancels a run, and so does the button.
    for (nth, escape) in [(1, true), (2, false)] {
        send_in_page(&browser, "/tool run_command {\"command\":\"sleep 30\"}");
        let running = format!(
            "document.querySelectorAll('.tool[data-tool=run_command]').length === {nth} && !document.querySelector('button.cancel').hidden"
        );
        browser.wait_for("the command running", &running);
        match escape {
            true => browser.type_into("textarea.input", "\u{E00C}"),
            false => browser.click("button.cancel"),
        }
        browser.wait_for(
            "the cancelled run",
            &format!("document.querySelectorAll('.run-end.cancelled').length === {nth}"),
        );
        browser.wait_for("the buttons follow the status", "document.querySelector('button.cancel').hidden");
    }

    // A reply of 80 words at 40 ms a word: reload while it streams.
    let words: Vec<String> = (1..=80).map(|n| format!("w{n}")).collect();
    send_in_page(&browser, &words.join(" "));
    browser.wait_for("the reply streaming", "document.querySelector('.content.streaming') && document.querySelector('.content.streaming').textContent.includes('w3')");
    browser.refresh();
    let last = "Echo: ".to_string() + &words.join(" ");
    browser.wait_for(
        "the whole reply after the reload",
        &format!(
            "[...document.querySelectorAll('.message.assistant .content')].some(e => e.textContent.trim() === {})",
            json!(last)
        ),
    );
    browser.wait_for("no half message left", "!document.querySelector('.content.streaming')");
}

#[test]
fn a_token_prompt_guards_the_console_and_the_token_reaches_the_streams() {
    let Some(browser) = browser() else { return };
    let server = TestServer::start_with(|config| config.auth.token = Some("sekret".into()));
    let id = server.client().with_token(Some("sekret")).post("/api/sessions", json!({ "title": "guarded" })).json
        ["session"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the token prompt", "document.querySelector('form.login input[name=token]')");
    browser.type_into("form.login input[name=token]", "wrong");
    browser.click("form.login button[type=submit]");
    browser.wait_for("the refusal", "document.querySelector('form.login .error')");
    browser.eval("document.querySelector('form.login input[name=token]').value = '';", json!([]));
    browser.type_into("form.login input[name=token]", "sekret");
    browser.click("form.login button[type=submit]");
    browser.wait_for("the sessions", &format!("document.querySelector('.session-link[data-id=\"{id}\"]')"));
    // Live over the token-carrying stream: a session made elsewhere appears.
    let other = server.client().with_token(Some("sekret")).post("/api/sessions", json!({ "title": "made elsewhere" }));
    let other = other.json["session"]["id"].as_str().unwrap().to_string();
    browser.wait_for("the new session, live", &format!("document.querySelector('.session-link[data-id=\"{other}\"]')"));
}

#[test]
fn checkpoints_restore_in_the_page_and_a_rewind_drops_the_turn_and_its_files() {
    let Some(browser) = browser() else { return };
    let server = TestServer::start_with(|config| {
        config.agent.permissions.insert("write_file".into(), kestrel::engine::tools::Permission::Auto);
    });
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    create_session_in_page(&browser, "Undo");
    let file = server.workspace.join("draft.txt");

    send_in_page(&browser, "/tool write_file {\"path\":\"draft.txt\",\"content\":\"first\"}");
    browser.wait_for("the first run's end", "document.querySelectorAll('.run-end.completed').length === 1");
    browser.click(".tab[data-tab=checkpoints]");
    browser.wait_for("the automatic checkpoint", "document.querySelector('.checkpoints-list .badge.auto')");
    browser.type_into(".panel.checkpoints input", "after first");
    browser.click(".panel.checkpoints button[type=submit]");
    browser.wait_for(
        "the manual checkpoint",
        "[...document.querySelectorAll('.checkpoints-list li')].some(li => li.textContent.includes('after first'))",
    );
    std::fs::write(&file, "changed by hand").unwrap();
    browser.eval(
        "[...document.querySelectorAll('.checkpoints-list li')].find(li => li.textContent.includes('after first')).querySelector('button').click();",
        json!([]),
    );
    browser.wait_for("the confirmation", "document.querySelector('.overlay button.danger')");
    browser.click(".overlay button.danger");
    browser.wait_for("the restore's report", "document.querySelector('.restore-status .notice') && document.querySelector('.restore-status').textContent.includes('safety checkpoint')");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "first");
    browser.wait_for("the safety checkpoint listed", "document.querySelector('.checkpoints-list .badge.safety')");

    // A second turn changes the file; rewinding to it drops the turn and puts the file back.
    browser.click(".tab[data-tab=chat]");
    send_in_page(&browser, "/tool write_file {\"path\":\"draft.txt\",\"content\":\"second\"}");
    browser.wait_for("the second run's end", "document.querySelectorAll('.run-end.completed').length === 2");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "second");
    browser.eval("const users = document.querySelectorAll('.message.user'); users[users.length - 1].querySelector('.rewind').click();", json!([]));
    browser.wait_for("the rewind dialog", "document.querySelector('.overlay input[type=checkbox]')");
    browser.click(".overlay button.danger");
    browser.wait_for("one user message left", "document.querySelectorAll('.message.user').length === 1");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "first", "the rewind put the file back");
    let composer = browser.eval("return document.querySelector('textarea.input').value;", json!([]));
    assert!(composer.as_str().unwrap().contains("second"), "the dropped message is back in the composer: {composer}");
}

#[test]
fn a_plugin_module_mounts_and_reloads_in_place_when_its_files_change() {
    let Some(browser) = browser() else { return };
    let plugins = tempfile::tempdir().unwrap();
    let root = plugins.path().join("greeter");
    std::fs::create_dir_all(root.join("web")).unwrap();
    let manifest = json!({ "id": "greeter", "name": "Greeter", "version": "1.0.0", "web": { "entry": "main.js", "stylesheet": "style.css" } });
    std::fs::write(root.join("plugin.json"), manifest.to_string()).unwrap();
    let module = |greeting: &str| {
        format!(
            "export function mount(root, kestrel) {{\n  const p = document.createElement('p');\n  p.className = 'greeting';\n  \
             p.textContent = '{greeting} from ' + kestrel.plugin.name;\n  root.append(p);\n  \
             kestrel.api.get('/api/health').then((h) => {{ p.dataset.health = h.status; }});\n  \
             kestrel.onSession((id) => {{ p.dataset.session = id || ''; }});\n  \
             return () => {{ window.greeterCleanups = (window.greeterCleanups || 0) + 1; }};\n}}\n"
        )
    };
    std::fs::write(root.join("web/main.js"), module("Hello")).unwrap();
    std::fs::write(root.join("web/style.css"), ".greeting { color: rgb(1, 2, 3); }\n").unwrap();
    let dir = plugins.path().to_path_buf();
    let server = TestServer::start_with(move |config| {
        config.plugins.dir = Some(dir);
        config.plugins.hot_reload = true;
    });
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the plugin mounted", "document.querySelector('.plugin[data-plugin=greeter] .greeting')");
    browser.wait_for("its API call", "document.querySelector('.greeting').dataset.health === 'ok'");
    let styled = browser.eval("return getComputedStyle(document.querySelector('.greeting')).color;", json!([]));
    assert_eq!(styled, "rgb(1, 2, 3)", "the plugin's stylesheet applies");
    assert_eq!(browser.text(".greeting"), "Hello from Greeter");
    let id = create_session_in_page(&browser, "with a plugin");
    browser.wait_for(
        "the session told to the plugin",
        &format!("document.querySelector('.greeting').dataset.session === '{id}'"),
    );

    // A save: the module is unmounted and loaded again at its new revision, no page reload.
    browser.eval("window.notReloaded = true;", json!([]));
    std::fs::write(root.join("web/main.js"), module("Welcome")).unwrap();
    std::fs::write(root.join("web/style.css"), ".greeting { color: rgb(4, 5, 6); }\n").unwrap();
    browser.wait_for(
        "the new revision mounted",
        "document.querySelector('.greeting') && document.querySelector('.greeting').textContent.startsWith('Welcome')",
    );
    browser.wait_for(
        "the new stylesheet",
        "getComputedStyle(document.querySelector('.greeting')).color === 'rgb(4, 5, 6)'",
    );
    let after = browser.eval(
        "return { same: window.notReloaded === true, cleanups: window.greeterCleanups, mounted: document.querySelectorAll('.greeting').length };",
        json!([]),
    );
    assert_eq!(after, json!({ "same": true, "cleanups": 1, "mounted": 1 }), "{after}");
}

#[test]
fn images_binaries_dark_mode_and_a_phone_width() {
    let Some(browser) = browser() else { return };
    let server = TestServer::start();
    // A 1x1 PNG, in a message and in the workspace; and a binary file.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    use base64::Engine;
    std::fs::write(server.workspace.join("dot.png"), base64::engine::general_purpose::STANDARD.decode(png).unwrap())
        .unwrap();
    std::fs::write(server.workspace.join("blob.bin"), [0u8, 159, 146, 150, 0, 1, 2]).unwrap();
    let id = server.create_session(json!({ "title": "pictures" }));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let sent = server.post(
        &format!("/api/sessions/{id}/messages"),
        json!({ "content": "see this", "images": [{ "mimeType": "image/png", "data": png, "name": "dot.png" }] }),
    );
    assert_eq!(sent.status, 202, "{}", sent.text);
    stream.collect_until(is_run_end);

    browser.devtools(
        "Emulation.setEmulatedMedia",
        json!({ "features": [{ "name": "prefers-color-scheme", "value": "dark" }] }),
    );
    browser.devtools(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": true }),
    );
    browser.open(&format!("{}/#/s/{id}", server.base));
    browser.wait_for("the attached image", "document.querySelector('.message.user img.attachment') && document.querySelector('.message.user img.attachment').naturalWidth === 1");
    let look = browser.eval(
        "const side = document.querySelector('.sidebar').getBoundingClientRect(); \
         const main = document.querySelector('main').getBoundingClientRect(); \
         return { background: getComputedStyle(document.body).backgroundColor, stacked: side.bottom <= main.top + 1, \
                  wide: document.documentElement.scrollWidth <= 390 };",
        json!([]),
    );
    assert_eq!(look["background"], "rgb(23, 21, 19)", "dark by the system setting: {look}");
    assert_eq!(look["stacked"], true, "the list stacks above the session on a phone: {look}");
    assert_eq!(look["wide"], true, "nothing wider than the phone: {look}");

    browser.click(".tab[data-tab=files]");
    browser.wait_for("the listing", "document.querySelector('.tree button[data-path=\"dot.png\"]')");
    browser.click(".tree button[data-path=\"dot.png\"]");
    browser.wait_for("the image preview", "document.querySelector('.viewer img.preview') && document.querySelector('.viewer img.preview').naturalWidth === 1");
    browser.click(".tree button[data-path=\"blob.bin\"]");
    browser.wait_for("the binary described", "document.querySelector('.viewer').textContent.includes('A binary file')");
}

#[test]
fn the_list_is_live_a_dropped_stream_catches_up_and_sessions_are_renamed_and_deleted() {
    let Some(browser) = browser() else { return };
    let mut server = TestServer::start();
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");

    // A session made elsewhere appears in the list without a reload.
    let id = server.create_session(json!({ "title": "Made by curl" }));
    let link = format!("document.querySelector('.session-link[data-id=\"{id}\"]')");
    browser.wait_for("the session in the list", &link);
    browser.click(&format!(".session-link[data-id=\"{id}\"]"));
    browser.wait_for(
        "the session view",
        "document.querySelector('.session-title') && document.querySelector('.connection:not(.down)')",
    );
    send_in_page(&browser, "before the drop");
    browser.wait_for("the first run's end", "document.querySelectorAll('.run-end.completed').length === 1");

    // The server goes away: the page says so, and once it is back on the same address the
    // page catches up with what happened while it was away (replay and a refetch).
    let addr = server.base.trim_start_matches("http://").to_string();
    server.stop();
    browser.wait_for("the stream marked down", "document.querySelector('.connection.down')");
    server.restart(|config| config.server.addr = addr.clone());
    server.run_to_end(&id, "while the page was away");
    let renamed = server.patch(&format!("/api/sessions/{id}"), json!({ "title": "Renamed by curl" }));
    assert_eq!(renamed.status, 200, "{}", renamed.text);
    browser.wait_for("the stream live again", "document.querySelector('.connection:not(.down)')");
    browser.wait_for(
        "the reply made during the drop",
        "[...document.querySelectorAll('.message.assistant .content')].some(e => e.textContent.includes('Echo: while the page was away'))",
    );
    browser.wait_for("the new title", "document.querySelector('.session-title').textContent === 'Renamed by curl'");

    // Rename in the page: click the title, type, Enter.
    browser.click(".session-title");
    browser.eval(
        "const input = document.querySelector('input.rename'); input.value = 'Renamed in the page'; \
         input.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true }));",
        json!([]),
    );
    browser
        .wait_for("the page's title", "document.querySelector('.session-title').textContent === 'Renamed in the page'");
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["title"], "Renamed in the page");

    // Delete asks first: Cancel keeps it, Delete removes it from the server and the list.
    browser.click(".session-header button.danger");
    browser.wait_for("the confirmation", "document.querySelector('.dialog button.danger')");
    browser.click(".dialog button:not(.danger)");
    browser.wait_for("the dialog gone", "!document.querySelector('.overlay')");
    assert_eq!(server.get(&format!("/api/sessions/{id}")).status, 200);
    browser.click(".session-header button.danger");
    browser.wait_for("the confirmation", "document.querySelector('.dialog button.danger')");
    browser.click(".dialog button.danger");
    browser.wait_for("the session gone from the list", &format!("!{link}"));
    assert_eq!(server.get(&format!("/api/sessions/{id}")).status, 404);
}

#[test]
fn the_sidebar_loads_sessions_a_page_at_a_time() {
    let Some(browser) = browser() else { return };
    let server = TestServer::start();
    let ids: Vec<String> = (0..230).map(|i| server.create_session(json!({ "title": format!("s{i}") }))).collect();
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the first page", "document.querySelectorAll('.session-link').length === 100");
    // The newest first; the oldest is on no page yet.
    let newest = format!("document.querySelector('.session-link').dataset.id === '{}'", ids[229]);
    browser.wait_for("the newest on top", &newest);
    browser.click("#more-sessions");
    browser.wait_for("the second page", "document.querySelectorAll('.session-link').length === 200");
    // A session an event brings in while paging is not listed twice by the next page.
    assert_eq!(server.patch(&format!("/api/sessions/{}", ids[5]), json!({ "title": "moved" })).status, 200);
    browser.wait_for("the moved one on top", "document.querySelector('.session-link .title').textContent === 'moved'");
    browser.click("#more-sessions");
    browser.wait_for(
        "every session once",
        "document.querySelectorAll('.session-link').length === 230 && !document.querySelector('#more-sessions')",
    );
    let listed =
        browser.eval("return [...document.querySelectorAll('.session-link')].map(e => e.dataset.id)", json!([]));
    let mut listed: Vec<String> = serde_json::from_value(listed).unwrap();
    listed.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(listed, expected);
}
