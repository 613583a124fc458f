//! The console's side of permissions, in headless Chromium: the rule that decided each call,
//! "Allow for this session" and "Edit arguments" on an approval card, and remembered rules
//! listed and revoked in the Rules tab.

use serde_json::json;

use crate::browser::browser;
use crate::console::{create_session_in_page, send_in_page};
use crate::support::TestServer;
use kestrel::policy::{Outcome, RuleSpec};

/// The text of the newest tool card of `tool` whose command is `command`.
fn card(command: &str) -> String {
    format!(
        "[...document.querySelectorAll('.tool[data-tool=run_command]')].filter(c => c.textContent.includes({command:?})).pop()"
    )
}

#[test]
fn the_console_shows_which_rule_decided_remembers_edits_and_revokes() {
    let Some(browser) = browser() else { return };
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules =
            vec![RuleSpec { tool: "run_command".into(), pattern: Some("rm *".into()), outcome: Outcome::Deny }];
    });
    std::fs::write(server.workspace.join("marker"), "kept").unwrap();
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    let id = create_session_in_page(&browser, "Permissions");

    // Asked by the tool's own permission; allowed for the rest of the session.
    send_in_page(&browser, "/tool run_command {\"command\":\"echo first\"}");
    browser.wait_for("the approval card", "document.querySelector('.approval button.remember')");
    assert!(browser.text(".tool .tool-rule").contains("the tool's own permission"));
    browser.click(".approval button.remember");
    browser.wait_for("the run's end", "document.querySelectorAll('.run-end.completed').length >= 1");
    send_in_page(&browser, "/tool run_command {\"command\":\"echo first\"}");
    browser.wait_for("the second run's end", "document.querySelectorAll('.run-end.completed').length >= 2");
    let second = browser.eval(
        "const cards = document.querySelectorAll('.tool[data-tool=run_command]'); const c = cards[cards.length - 1]; \
         return { rule: c.querySelector('.tool-rule').textContent, asked: !!c.querySelector('.approval:not([hidden])') };",
        json!([]),
    );
    assert!(second["rule"].as_str().unwrap().starts_with("Allowed by rule"), "{second}");
    assert!(second["rule"].as_str().unwrap().contains("(remembered)"), "{second}");
    assert_eq!(second["asked"], false, "{second}");

    // Edited in the card: the edit runs, the card says so.
    send_in_page(&browser, "/tool run_command {\"command\":\"echo second\"}");
    browser.wait_for(
        "the approval card",
        &format!("{} && {}.querySelector('.approval button.edit')", card("echo second"), card("echo second")),
    );
    browser.eval(&format!("{}.querySelector('.approval button.edit').click();", card("echo second")), json!([]));
    browser.eval(
        &format!("const t = {}.querySelector('textarea.edit-arguments'); t.value = JSON.stringify({{command: 'echo edited-in-page'}});", card("echo second")),
        json!([]),
    );
    browser.eval(&format!("{}.querySelector('.approval button.approve').click();", card("echo second")), json!([]));
    browser.wait_for(
        "the edited call's output",
        &format!("{c} && {c}.querySelector('.tool-output pre') && {c}.querySelector('.tool-output pre').textContent.includes('edited-in-page')", c = card("echo second")),
    );
    assert!(browser
        .eval(&format!("return {}.textContent;", card("echo second")), json!([]))
        .as_str()
        .unwrap()
        .contains("Approved with edited arguments"));

    // Denied by a server rule: the card names it.
    send_in_page(&browser, "/tool run_command {\"command\":\"rm -rf marker\"}");
    browser.wait_for("the denied card", &format!("{c} && {c}.dataset.outcome === 'deny'", c = card("rm -rf marker")));
    let denied =
        browser.eval(&format!("return {}.querySelector('.tool-rule').textContent;", card("rm -rf marker")), json!([]));
    assert!(denied.as_str().unwrap().contains("deny run_command rm *"), "{denied}");
    assert_eq!(std::fs::read_to_string(server.workspace.join("marker")).unwrap(), "kept");

    // The remembered rule is listed for the session, and revoked from the page.
    browser.click(".tab[data-tab=rules]");
    browser.wait_for("the rules", "document.querySelector('.rules-list li[data-source=remembered] button.revoke')");
    assert!(browser.text(".rules-list").contains("echo first"));
    browser.click(".rules-list li[data-source=remembered] button.revoke");
    browser.wait_for("the confirmation", "document.querySelector('.dialog button.danger')");
    browser.click(".dialog button.danger");
    browser.wait_for("the rule gone", "!document.querySelector('.rules-list li[data-source=remembered]')");
    assert_eq!(server.get(&format!("/api/sessions/{id}/rules")).json["rules"], json!([]));
    assert!(browser.text(".panel.rules").contains("deny"), "the server's rule is listed for every session");
}
