//! Programs whose subcommand comes after options of the program's own (`git -C . push`,
//! `kubectl -n prod delete`), and where those options end: what `loads_code.rs` needs for its
//! rows that count only before the subcommand (`git -c`, `git -C`), and for its rows on a
//! subcommand (`git config`).
//!
//! Pure. Deny and ask rules do not rely on this table: `command.rs` reads every program with
//! each later suffix of its words, whatever options come between. Every word before the
//! subcommand that starts with `-` (or `+`, cargo's toolchain) is a global option, and each
//! option of the table below takes the next word with it unless written `--opt=value`.

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The subcommand of `line`: the word after the program's global options.
    fn subcommand(line: &str) -> Option<String> {
        let words: Vec<String> = line.split(' ').map(str::to_string).collect();
        let program = program_of(&words)?;
        let span = global_span(program, &words[1..]);
        words.get(1 + span).cloned()
    }

    /// A command per program: its global options (a value-taking one among them) are passed
    /// over, up to the subcommand.
    #[test]
    fn each_programs_global_options_end_at_the_subcommand() {
        let table = [
            ("git -C . --no-pager -c a.b=c push --force origin", "push"),
            ("git --git-dir=.git --work-tree . config x y", "config"),
            ("docker --context prod -H ssh://h rm -f x", "rm"),
            ("podman --connection prod --remote rm x", "rm"),
            ("kubectl -n prod --context c delete pod x", "delete"),
            ("helm --kube-context c -n prod uninstall x", "uninstall"),
            ("npm --prefix sub -w pkg publish --tag x", "publish"),
            ("pnpm -C sub --filter pkg publish", "publish"),
            ("yarn --cwd sub publish", "publish"),
            ("cargo +nightly -Z unstable-options --config x=y publish", "publish"),
            ("systemctl --user -H host stop x", "stop"),
        ];
        for program in PROGRAMS {
            assert!(table.iter().any(|(line, _)| line.starts_with(&format!("{} ", program.name))), "{}", program.name);
        }
        for (line, expected) in table {
            assert_eq!(subcommand(line).as_deref(), Some(expected), "{line}");
        }
    }

    #[test]
    fn no_option_a_lone_option_a_path_and_a_version() {
        assert_eq!(subcommand("git push").as_deref(), Some("push"));
        assert_eq!(subcommand("ls -la"), None, "not a program of the table");
        assert_eq!(subcommand("git -C"), None, "a value that never came");
        assert_eq!(subcommand("/usr/bin/git -C . push").as_deref(), Some("push"));
        assert_eq!(subcommand("git2.47 -C . push").as_deref(), Some("push"), "a versioned name");
        assert_eq!(subcommand("git -- push").as_deref(), Some("push"));
    }
}
