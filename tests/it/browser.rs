//! A real headless Chromium for the console tests, driven over W3C WebDriver (Debian's
//! `chromium` and `chromium-driver`; `.ci/run` installs both). The client is a few JSON calls
//! with ureq. Waiting is done in the page: a script resolves when a condition holds, woken by
//! a MutationObserver, within a deadline.
//!
//! Without chromedriver the tests say they were skipped, unless `KESTREL_REQUIRE_BROWSER=1`
//! (CI sets it), which makes a missing browser a failure.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long a page may take to reach a condition.
pub const PAGE_WAIT: Duration = Duration::from_secs(15);

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

/// A browser, or `None` (with a note) where none is installed and none is required.
pub fn browser() -> Option<Browser> {
    let found = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists());
    let required = std::env::var("KESTREL_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    match found {
        Some(path) => Some(Browser::start(path)),
        None if required => panic!("KESTREL_REQUIRE_BROWSER=1 but chromedriver is not installed"),
        None => {
            eprintln!("SKIPPED: the console browser test needs chromium and chromium-driver (`.ci/run` installs them)");
            None
        }
    }
}

impl Browser {
    fn start(driver_path: &str) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut driver = Command::new(driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        // Its own word that it listens.
        let mut out = BufReader::new(driver.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("started successfully") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "chromedriver exited");
        }
        std::thread::spawn(move || for _ in out.lines() {});
        let base = format!("http://127.0.0.1:{port}");
        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,860",
        ];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": "/usr/bin/chromium", "args": args }
        } } });
        let created = call(&base, "POST", "/session", Some(capabilities));
        let session = created["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {created}")).to_string();
        let browser = Browser { driver, base, session, _profile: profile };
        browser.command("POST", "/timeouts", json!({ "script": PAGE_WAIT.as_millis() as u64, "pageLoad": 30000 }));
        browser
    }

    fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let body = if method == "GET" { None } else { Some(body) };
        call(&self.base, method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn open(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url }));
    }

    pub fn refresh(&self) {
        self.command("POST", "/refresh", json!({}));
    }

    /// Runs `script` (a function body) with `args`; its return value.
    pub fn eval(&self, script: &str, args: Value) -> Value {
        self.command("POST", "/execute/sync", json!({ "script": script, "args": args }))
    }

    /// Waits until the JavaScript expression `condition` is truthy, checking again whenever
    /// the page changes or something in it loads; fails the test with `what` after `PAGE_WAIT`.
    pub fn wait_for(&self, what: &str, condition: &str) {
        let script = r#"
            const done = arguments[arguments.length - 1];
            const check = new Function("try { return !!(" + arguments[0] + "); } catch (e) { return false; }");
            if (check()) return done(true);
            // DOM changes, and loads (an image's size changes without one).
            const again = () => { if (check()) { observer.disconnect(); document.removeEventListener("load", again, true); done(true); } };
            const observer = new MutationObserver(again);
            observer.observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
            document.addEventListener("load", again, true);
        "#;
        let answer = call_raw(
            &self.base,
            "POST",
            &format!("/session/{}/execute/async", self.session),
            Some(json!({ "script": script, "args": [condition] })),
        );
        if answer.get("error").is_some() {
            let text = self.eval("return document.body.innerText.slice(0, 3000);", json!([]));
            panic!("waited {PAGE_WAIT:?} for {what} ({condition}): {}\npage: {text}", answer["error"]);
        }
    }

    fn find(&self, css: &str) -> String {
        let found = self.command("POST", "/element", json!({ "using": "css selector", "value": css }));
        found[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}: {found}")).to_string()
    }

    pub fn click(&self, css: &str) {
        let element = self.find(css);
        self.command("POST", &format!("/element/{element}/click"), json!({}));
    }

    /// Types `text` into the element (WebDriver's key codes: "\u{E007}" is Enter).
    pub fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css);
        self.command("POST", &format!("/element/{element}/value"), json!({ "text": text }));
    }

    pub fn text(&self, css: &str) -> String {
        let element = self.find(css);
        self.command("GET", &format!("/element/{element}/text"), json!({})).as_str().unwrap_or("").to_string()
    }

    /// A Chrome DevTools command (window size, emulated media).
    pub fn devtools(&self, command: &str, params: Value) -> Value {
        self.command("POST", "/goog/cdp/execute", json!({ "cmd": command, "params": params }))
    }

    /// A PNG of the window.
    pub fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let shot = self.command("GET", "/screenshot", json!({}));
        base64::engine::general_purpose::STANDARD.decode(shot.as_str().unwrap()).unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = ureq::delete(&format!("{}/session/{}", self.base, self.session)).call();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A WebDriver call's `value`; an error fails the test.
fn call(base: &str, method: &str, path: &str, body: Option<Value>) -> Value {
    let value = call_raw(base, method, path, body);
    if let Some(error) = value.get("error") {
        panic!("WebDriver {method} {path}: {error}: {}", value["message"]);
    }
    value
}

fn call_raw(base: &str, method: &str, path: &str, body: Option<Value>) -> Value {
    let request = ureq::request(method, &format!("{base}{path}")).timeout(Duration::from_secs(60));
    let response = match body {
        Some(body) => request.send_json(body),
        None => request.call(),
    };
    let response = match response {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(error) => panic!("WebDriver {method} {path}: {error}"),
    };
    let answer: Value = response.into_json().unwrap_or(Value::Null);
    answer["value"].clone()
}
