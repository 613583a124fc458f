//! Command rules through allowed programs (issue 35, finding 4): a deny holds through a
//! program's global options (`git -C . push` meets `git push*`), and an allow never holds for
//! a command carrying an option that loads code or config (docs/permissions.md).

use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::permissions::{ask_for, attempt, spec, Fate};
use crate::support::{is_run_end, TestServer};
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
