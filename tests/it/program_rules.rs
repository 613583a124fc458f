//! Command rules through allowed programs (issue 35, finding 4): a deny holds through a
//! program's options, listed or not (`git -C . push` meets `git push*`, `kubectl --log-file x
//! delete` meets `kubectl delete*`), an allow never holds for a command carrying an option that
//! loads code or config, and a command too long to judge whole asks (docs/permissions.md).

use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::permissions::{ask_for, attempt, audit_of, spec, Fate};
use crate::support::{is_run_end, TestServer};
use kestrel::engine::tools::Permission;
use kestrel::policy::Outcome::{Allow, Deny};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn global_and_config_options_do_not_get_past_the_rules_on_git() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = vec![
            spec("run_command", Some("git *"), Allow),
            spec("run_command", Some("git push*"), Deny),
            spec("run_command", Some("rm *"), Deny),
        ];
    });
    let root = &server.workspace;
    // A repository with a commit and a remote that a push would reach.
    let remote = tempfile::tempdir().unwrap();
    git(remote.path(), &["init", "-q", "--bare", "."]);
    git(root, &["init", "-q", "."]);
    std::fs::write(root.join("file.txt"), "one\n").unwrap();
    git(root, &["add", "file.txt"]);
    git(root, &["commit", "-q", "-m", "one"]);
    git(root, &["remote", "add", "origin", remote.path().to_str().unwrap()]);
    // What core.fsmonitor would run: it leaves a mark.
    std::fs::write(root.join("evil.sh"), "#!/bin/sh\ntouch pwned\n").unwrap();
    std::fs::set_permissions(root.join("evil.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let session = server.create_session(json!({}));

    let command = |line: &str| json!({ "command": line });
    let table = [
        ("git status", Fate::Ran),
        ("git -C . push origin HEAD:main", Fate::Denied),
        ("git --no-pager push origin HEAD:main", Fate::Denied),
        ("git -c a.b=c push origin HEAD:main", Fate::Denied),
        ("git --git-dir=.git push origin HEAD:main", Fate::Denied),
        ("git --git-dir .git --work-tree . push origin HEAD:main", Fate::Denied),
        ("git -p -C . -c x.y=z push origin HEAD:main", Fate::Denied),
        ("sudo -u nobody git -C . push origin HEAD:main", Fate::Denied),
        ("git -C . rm file.txt", Fate::Denied),
        ("git -c core.fsmonitor=./evil.sh status", Fate::Asked),
        ("git --config-env=core.fsmonitor=HOME status", Fate::Asked),
        ("git -C . -c core.pager=./evil.sh log", Fate::Asked),
        ("git fetch --upload-pack=./evil.sh origin", Fate::Asked),
    ];
    for (line, expected) in table {
        let (fate, permission) = attempt(&server, &session, "run_command", &command(line));
        assert_eq!(fate, expected, "{line}: {permission}");
    }
    assert!(!root.join("pwned").exists(), "the workspace's script never ran");
    assert_eq!(git(remote.path(), &["for-each-ref"]), "", "nothing was pushed");

    // An edited approval is judged with the same reading.
    let (mut stream, approval) = ask_for(&server, &session, "run_command", &command("echo hello"));
    let path = format!("/api/sessions/{session}/approvals/{approval}");
    for edit in ["git -C . push origin HEAD:main", "git --no-pager push origin HEAD:main"] {
        server.post(&path, json!({ "approved": true, "arguments": command(edit) })).assert_error(403, "forbidden");
    }
    assert_eq!(server.post(&path, json!({ "approved": false })).status, 200);
    stream.collect_until(is_run_end);
    assert_eq!(git(remote.path(), &["for-each-ref"]), "", "nothing was pushed");
}

/// Options that no table lists, before the subcommand a deny names (the review of issue 35):
/// each program is allowed as a whole and one of its subcommands denied. None of these
/// programs needs to be installed: a call the rules deny never starts, and says so.
#[test]
fn a_deny_holds_through_options_no_table_lists() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.rules = [
            ("kubectl", "kubectl delete*"),
            ("npm", "npm publish*"),
            ("helm", "helm uninstall*"),
            ("systemctl", "systemctl stop*"),
            ("terraform", "terraform destroy*"),
            ("aws", "aws s3 rm*"),
            ("gh", "gh repo delete*"),
        ]
        .into_iter()
        .flat_map(|(program, denied)| {
            [spec("run_command", Some(&format!("{program} *")), Allow), spec("run_command", Some(denied), Deny)]
        })
        .collect();
    });
    let session = server.create_session(json!({}));
    let table = [
        ("kubectl --log-file x delete ns prod", Fate::Denied),
        ("npm --tag beta publish", Fate::Denied),
        ("helm --burst-limit 100 uninstall x", Fate::Denied),
        ("systemctl --job-mode fail stop x", Fate::Denied),
        ("terraform -chdir=infra destroy", Fate::Denied),
        ("aws --profile p s3 rm s3://bucket/key", Fate::Denied),
        ("gh --repo owner/r repo delete owner/r --yes", Fate::Denied),
        // The allow still holds for what no deny names (it runs, and fails: not installed).
        ("kubectl --log-file x get ns prod", Fate::Ran),
    ];
    for (line, expected) in table {
        let (fate, permission) = attempt(&server, &session, "run_command", &json!({ "command": line }));
        assert_eq!(fate, expected, "{line}: {permission}");
        if expected == Fate::Denied {
            assert_eq!(permission["outcome"], "deny", "{line}: {permission}");
        }
    }
    let audit = audit_of(&server, &session);
    let denied = audit.iter().filter(|e| e["decision"] == "denied" && e["decidedBy"] == "rule").count();
    assert_eq!(denied, 7, "{audit:#?}");
}

/// A command too long to judge whole (past the candidate caps, docs/permissions.md) is not
/// allowed by a pattern nor by its tool's own `auto`: a person decides, and the audit says why.
#[test]
fn a_command_past_the_candidate_caps_asks_a_person() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.agent.permissions.insert("run_command".into(), Permission::Auto);
        config.agent.rules = vec![spec("run_command", Some("echo *"), Allow)];
    });
    let session = server.create_session(json!({}));
    let long = format!("echo {}", vec!["word"; 2_000].join(" "));
    let (fate, permission) = attempt(&server, &session, "run_command", &json!({ "command": long }));
    assert_eq!(fate, Fate::Asked, "{permission}");
    let (fate, _) = attempt(&server, &session, "run_command", &json!({ "command": "echo word word" }));
    assert_eq!(fate, Fate::Ran, "a short line is judged whole, and allowed");
    let audit = audit_of(&server, &session);
    let asked = audit.iter().find(|e| e["decision"] == "asked").expect("the long line asked");
    assert!(asked["note"].as_str().is_some_and(|n| n.contains("too long")), "{asked}");
}
