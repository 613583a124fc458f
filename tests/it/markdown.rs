//! The console's Markdown (`src/console/assets/commonmark.js`) against the CommonMark spec's
//! own examples, from npm's `commonmark-spec` (installed under `target/commonmark-spec` the
//! first time; `.ci/run` installs it first), run in Node by `commonmark/spec.mjs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The sections of what the console supports: emphasis, strong, code spans, fenced code,
/// links, lists, headings, block quotes.
const SUPPORTED: &[&str] = &[
    "Emphasis and strong emphasis",
    "Code spans",
    "Fenced code blocks",
    "Links",
    "List items",
    "Lists",
    "ATX headings",
    "Setext headings",
    "Block quotes",
    "Kestrel",
];

/// The examples of those sections whose expected HTML passes raw HTML through (`<!-- -->`,
/// `<a href="…">`, `<bar attr="…">`): the console shows raw HTML as text, on purpose.
const RAW_HTML: &[u64] = &[308, 309, 344, 475, 476, 477, 491, 494, 524, 536];

fn commonmark_spec() -> PathBuf {
    crate::support::npm_package("commonmark-spec", "commonmark-spec@0.31.2", "commonmark-spec/index.js")
}

#[test]
fn the_console_markdown_passes_the_commonmark_examples_of_every_section_it_supports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = std::process::Command::new("node")
        .arg(root.join("tests/it/commonmark/spec.mjs"))
        .arg(root.join("src/console/assets/commonmark.js"))
        .arg(commonmark_spec())
        .output()
        .expect("node runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let sections: BTreeMap<String, Value> = serde_json::from_slice(&output.stdout).unwrap();
    let (mut passed, mut total, mut failed) = (0, 0, Vec::new());
    for name in SUPPORTED {
        let section = &sections[*name];
        let numbers: Vec<u64> = section["failed"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
        let section_passed = section["passed"].as_u64().unwrap();
        eprintln!("{name}: {section_passed}/{}", section_passed + numbers.len() as u64);
        passed += section_passed;
        total += section_passed + numbers.len() as u64;
        failed.extend(numbers);
    }
    eprintln!("supported sections: {passed}/{total}");
    failed.sort_unstable();
    assert_eq!(failed, RAW_HTML, "only the examples that pass raw HTML through may differ");
    // The rest of the spec is not a promise, but a parser that went wrong shows there too.
    let all: u64 = sections.values().map(|s| s["passed"].as_u64().unwrap()).sum();
    assert!(all >= 580, "{all} of the spec's examples pass");
}
