//! ARCHITECTURE.md's invariants that the source itself can show: which module may name which
//! dependency, which way the modules depend on each other, where global state lives, and that
//! a tool runs only after its start mark. Comments are not code: a line that is a comment is
//! not looked at.

use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Every `.rs` file under `src/`, with its path relative to `src/`.
fn sources() -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::from(SRC)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(SRC).unwrap().to_string_lossy().replace('\\', "/");
                found.push((relative, code_of(&path)));
            }
        }
    }
    found.sort();
    found
}

/// A file's lines that are not comments.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The files whose code mentions `needle`, other than under `allowed` prefixes.
fn offenders(needle: &str, allowed: &[&str]) -> Vec<String> {
    sources()
        .into_iter()
        .filter(|(path, code)| code.contains(needle) && !allowed.iter().any(|prefix| path.starts_with(prefix)))
        .map(|(path, _)| path)
        .collect()
}

#[test]
fn rusqlite_is_named_only_in_the_store() {
    assert_eq!(offenders("rusqlite", &["store/"]), Vec::<String>::new());
}

#[test]
fn tiny_http_is_named_only_in_the_http_layer() {
    assert_eq!(offenders("tiny_http", &["http/"]), Vec::<String>::new());
}

#[test]
fn ureq_is_named_only_where_the_server_calls_out() {
    // Model providers, remote MCP servers, webhook endpoints, other nodes of a cluster, and
    // the CLI (a client of the server).
    let allowed = ["providers/", "mcp/", "webhooks/", "cluster/", "cli/"];
    assert_eq!(offenders("ureq", &allowed), Vec::<String>::new());
}

/// Whether `code` names the crate `name` as a path's root (`name::…`, not `store::name::…`).
fn names_crate(code: &str, name: &str) -> bool {
    let needle = format!("{name}::");
    code.match_indices(&needle).any(|(at, _)| {
        !code[..at].chars().next_back().is_some_and(|before| before == ':' || before == '_' || before.is_alphanumeric())
    })
}

#[test]
fn postgres_is_named_only_in_its_store() {
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|(path, code)| names_crate(code, "postgres") && !path.starts_with("store/postgres/"))
        .map(|(path, _)| path)
        .collect();
    assert_eq!(offenders, Vec::<String>::new());
    assert!(names_crate("use postgres::Client;", "postgres") && !names_crate("crate::store::postgres::x", "postgres"));
}

#[test]
fn the_engine_imports_no_door_and_no_transport() {
    let generic = |path: &String| {
        let layer = ["engine/", "store/", "providers/"].iter().any(|prefix| path.starts_with(prefix));
        // The engine's own tests drive its turns through a door's plan.
        layer && !path.ends_with("/tests.rs")
    };
    for needle in ["crate::api", "crate::http", "crate::console", "crate::cli"] {
        let importers: Vec<String> = offenders(needle, &[]).into_iter().filter(generic).collect();
        assert_eq!(importers, Vec::<String>::new(), "{needle}");
    }
}

#[test]
fn global_state_lives_only_where_architecture_md_says() {
    // The thread pools, the metrics registry, the log's masks and patterns, a request's id on
    // its own thread, and the console's asset fingerprint.
    let allowed = ["workers.rs", "metrics.rs", "logging.rs", "http/request_id.rs", "console/mod.rs"];
    let statics: Vec<String> = sources()
        .into_iter()
        .filter(|(path, code)| {
            let declares = code.lines().any(|line| {
                let line = line.trim_start();
                line.starts_with("static ") || line.starts_with("pub static ") || line.starts_with("thread_local!")
            });
            declares && !allowed.contains(&path.as_str())
        })
        .map(|(path, _)| path)
        .collect();
    assert_eq!(statics, Vec::<String>::new());
}

#[test]
fn a_server_run_tool_executes_only_after_its_start_mark() {
    // The one place a tool of the registry runs is the run's call step, after its mark.
    let runners: Vec<String> = offenders(".tools.execute(", &[]);
    assert_eq!(runners, ["engine/calls.rs"], "the registry's tools run from one place");
    let calls = code_of(&Path::new(SRC).join("engine/calls.rs"));
    let run_call = &calls[calls.find("fn run_call(").unwrap()..];
    let run_call = &run_call[..run_call.find("\n    }\n").unwrap()];
    let marked = run_call.find("self.mark_started(call)?").expect("run_call marks the call");
    let executed = run_call.find("self.execute_tool(").expect("run_call executes the tool");
    assert!(marked < executed, "the mark is committed before the tool runs");
}
