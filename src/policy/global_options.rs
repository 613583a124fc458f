//! Programs whose subcommand comes after options of the program's own (`git -C . push`,
//! `kubectl -n prod delete`), and the command read with those options removed, so that a deny
//! or ask rule on `git push*` meets `git -C . push` (`command.rs` adds the form to the
//! candidates; docs/permissions.md, "Global options").
//!
//! Pure. Removing too much can only make a deny meet more; the risk is removing too little,
//! so every word before the subcommand that starts with `-` (or `+`, cargo's toolchain) goes,
//! and each option of the table below takes the next word with it unless written `--opt=value`.

/// One program: its name (a base name; `command::is_program` also accepts a version suffix)
/// and its global options that take their value as the next word.
pub(super) struct Program {
    pub name: &'static str,
    pub takes_value: &'static [&'static str],
}

/// Every program whose global options are removed for deny and ask rules.
pub(super) const PROGRAMS: &[Program] = &[
    Program {
        name: "git",
        takes_value: &[
            "-C",
            "-c",
            "--git-dir",
            "--work-tree",
            "--namespace",
            "--super-prefix",
            "--config-env",
            "--list-cmds",
            "--attr-source",
        ],
    },
    Program {
        name: "docker",
        takes_value: &[
            "--config",
            "-c",
            "--context",
            "-H",
            "--host",
            "-l",
            "--log-level",
            "--tlscacert",
            "--tlscert",
            "--tlskey",
        ],
    },
    Program {
        name: "podman",
        takes_value: &[
            "--connection",
            "-c",
            "--url",
            "--root",
            "--runroot",
            "--storage-driver",
            "--cgroup-manager",
            "--log-level",
            "--identity",
            "--module",
        ],
    },
    Program {
        name: "kubectl",
        takes_value: &[
            "-n",
            "--namespace",
            "--context",
            "--cluster",
            "--user",
            "--kubeconfig",
            "-s",
            "--server",
            "--token",
            "--as",
            "--as-group",
            "--as-uid",
            "--certificate-authority",
            "--client-certificate",
            "--client-key",
            "--request-timeout",
            "--cache-dir",
            "-v",
        ],
    },
    Program {
        name: "helm",
        takes_value: &[
            "-n",
            "--namespace",
            "--kube-context",
            "--kubeconfig",
            "--kube-apiserver",
            "--kube-as-user",
            "--kube-as-group",
            "--kube-token",
            "--registry-config",
            "--repository-cache",
            "--repository-config",
        ],
    },
    Program {
        name: "npm",
        takes_value: &[
            "--prefix",
            "-C",
            "-w",
            "--workspace",
            "--userconfig",
            "--globalconfig",
            "--registry",
            "--cache",
            "--loglevel",
        ],
    },
    Program { name: "pnpm", takes_value: &["-C", "--dir", "--filter", "-F", "--loglevel"] },
    Program { name: "yarn", takes_value: &["--cwd"] },
    Program { name: "cargo", takes_value: &["-C", "--config", "-Z", "--color"] },
    Program {
        name: "systemctl",
        takes_value: &[
            "-H",
            "--host",
            "-M",
            "--machine",
            "-t",
            "--type",
            "-p",
            "--property",
            "-s",
            "--signal",
            "--root",
            "-n",
            "--lines",
            "-o",
            "--output",
        ],
    },
];

/// The program of `words` (its first word) when it is one of `PROGRAMS`.
pub(super) fn program_of(words: &[String]) -> Option<&'static Program> {
    let first = words.first()?;
    PROGRAMS.iter().find(|program| super::command::is_program(first, program.name))
}

/// How many words after the program are its global options (with their values); the
/// subcommand, if any, is the word after them.
pub(super) fn global_span(program: &Program, arguments: &[String]) -> usize {
    let mut index = 0;
    while let Some(word) = arguments.get(index) {
        if word == "--" {
            return index + 1;
        }
        if !(word.starts_with('-') || word.starts_with('+')) {
            break;
        }
        index += if program.takes_value.contains(&word.as_str()) { 2 } else { 1 };
    }
    index.min(arguments.len())
}

/// `words` without the program's global options, when it is one of `PROGRAMS` and had any.
pub(super) fn without_global_options(words: &[String]) -> Option<Vec<String>> {
    let program = program_of(words)?;
    let span = global_span(program, &words[1..]);
    if span == 0 {
        return None;
    }
    let mut kept = vec![words[0].clone()];
    kept.extend(words[1 + span..].iter().cloned());
    Some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripped(line: &str) -> Option<String> {
        let words: Vec<String> = line.split(' ').map(str::to_string).collect();
        without_global_options(&words).map(|words| words.join(" "))
    }

    /// A command per program: its global options (a value-taking one among them) go, and the
    /// subcommand with its own options stays.
    #[test]
    fn each_programs_global_options_are_removed_up_to_the_subcommand() {
        let table = [
            ("git -C . --no-pager -c a.b=c push --force origin", "git push --force origin"),
            ("git --git-dir=.git --work-tree . push", "git push"),
            ("docker --context prod -H ssh://h rm -f x", "docker rm -f x"),
            ("podman --connection prod --remote rm x", "podman rm x"),
            ("kubectl -n prod --context c delete pod x", "kubectl delete pod x"),
            ("helm --kube-context c -n prod uninstall x", "helm uninstall x"),
            ("npm --prefix sub -w pkg publish --tag x", "npm publish --tag x"),
            ("pnpm -C sub --filter pkg publish", "pnpm publish"),
            ("yarn --cwd sub publish", "yarn publish"),
            ("cargo +nightly -Z unstable-options --config x=y publish", "cargo publish"),
            ("systemctl --user -H host stop x", "systemctl stop x"),
        ];
        for program in PROGRAMS {
            assert!(table.iter().any(|(line, _)| line.starts_with(&format!("{} ", program.name))), "{}", program.name);
        }
        for (line, expected) in table {
            assert_eq!(stripped(line).as_deref(), Some(expected), "{line}");
        }
    }

    #[test]
    fn nothing_to_remove_is_no_new_form_and_a_lone_option_is_all_options() {
        assert_eq!(stripped("git push"), None);
        assert_eq!(stripped("ls -la"), None, "not a program of the table");
        assert_eq!(stripped("git -C"), Some("git".into()), "a value that never came");
        assert_eq!(stripped("/usr/bin/git -C . push"), Some("/usr/bin/git push".into()));
        assert_eq!(stripped("git2.47 -C . push"), Some("git2.47 push".into()), "a versioned name");
        assert_eq!(stripped("git -- push"), Some("git push".into()));
    }
}
