//! A `run_command` line as the rules see it.
//!
//! A pattern may allow a command only when the line is one simple command the shell runs as
//! written: no control syntax (`;`, `&`, `|`, `` ` ``, `$(`, `>`, `<`, newlines), no expansion
//! (`$`, globs, `~`, braces), nothing outside printable ASCII. Anything else is `compound`: a
//! pattern never allows it. For `deny` and `ask`, the line is cut at every control character
//! (inside quotes too: cutting too often can only find more to deny), each part is read as
//! words the way the shell would (quotes and escapes removed), and a rule is tried against
//! every tail of every part, with the first word also by its base name, and, for a program
//! whose subcommand follows options of its own, without those (`global_options.rs`). `env rm
//! -rf x`, `sudo /bin/rm -rf x`, `bash -c 'rm -rf x'` and `echo ok; rm -rf x` all meet `rm *`,
//! and `git -C . push` meets `git push*`. A line whose program is given an option that loads
//! code or config (`loads_code.rs`) is never allowed by a pattern either.

/// Characters that chain, substitute, redirect or background a command.
const CONTROL: &[char] = &[';', '&', '|', '`', '>', '<', '\n', '\r', '(', ')'];

/// Characters that make the shell rewrite a word (expansion, globbing, brace lists, `~`) or
/// that a pattern cannot see through (escapes, quotes are handled by the word reader).
const EXPANDING: &[char] = &['$', '*', '?', '[', ']', '{', '}', '~', '\\', '!'];

use super::global_options::without_global_options;
use super::loads_code::{loads_code, LoadsCode};

/// A command line, read.
#[derive(Debug, Clone)]
pub struct CommandLine {
    /// The line as one simple command in normal form (words joined by one space), when it is
    /// one that a pattern may allow.
    pub simple: Option<String>,
    /// Every text a `deny` or `ask` pattern is tried against.
    pub candidates: Vec<String>,
    /// The first option found, in any part, that makes its program load code or config: no
    /// pattern allows the line then.
    pub loads_code: Option<&'static LoadsCode>,
}

impl CommandLine {
    pub fn read(line: &str) -> CommandLine {
        let simple = simple_form(line);
        let mut candidates = Vec::new();
        let mut found = None;
        for part in line.split(|c: char| CONTROL.contains(&c) || c == '$') {
            let words = words_of(part);
            for start in 0..words.len() {
                let tail = &words[start..];
                found = found.or_else(|| loads_code(tail));
                let mut forms = vec![tail.to_vec()];
                if let Some(base) = tail[0].rsplit('/').next().filter(|base| *base != tail[0]) {
                    let mut renamed = vec![base.to_string()];
                    renamed.extend(tail[1..].iter().cloned());
                    forms.push(renamed);
                }
                // `git -C . push`: the program and its subcommand, as a deny names them.
                let stripped: Vec<Vec<String>> = forms.iter().filter_map(|form| without_global_options(form)).collect();
                forms.extend(stripped);
                for form in forms {
                    push_unique(&mut candidates, form.join(" "));
                }
                // `bash -c 'rm -rf x'`: a quoted script is itself a command line.
                if tail[0].contains(' ') && start > 0 {
                    let inner = CommandLine::read(&tail[0]);
                    found = found.or(inner.loads_code);
                    for candidate in inner.candidates {
                        push_unique(&mut candidates, candidate);
                    }
                }
            }
        }
        if let Some(simple) = &simple {
            push_unique(&mut candidates, simple.clone());
        }
        CommandLine { simple, candidates, loads_code: found }
    }
}

/// Whether `word` runs `program`: its base name is the name, or the name and a version
/// (`python3.12`, `perl5.36`).
pub(super) fn is_program(word: &str, program: &str) -> bool {
    let base = word.rsplit('/').next().unwrap_or(word);
    base.strip_prefix(program).is_some_and(|version| version.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The line in normal form if a pattern may allow it (see the module doc).
fn simple_form(line: &str) -> Option<String> {
    let plain = line.chars().all(|c| c == ' ' || c == '\t' || (c.is_ascii_graphic() && !EXPANDING.contains(&c)));
    if !plain || line.contains(CONTROL) {
        return None;
    }
    let words = shlex::split(line)?;
    // A quoted word with a space in it is a script for whatever runs it, and `NAME=value`
    // first changes what the command does (`LD_PRELOAD=…`): neither is simple.
    if words.is_empty() || words[0].contains('=') || words.iter().any(|w| w.is_empty() || w.contains([' ', '\t'])) {
        return None;
    }
    Some(words.join(" "))
}

/// A part's words the way the shell would split them; when the quoting is broken (a part cut
/// inside quotes), whitespace-separated with quotes and escapes dropped.
fn words_of(part: &str) -> Vec<String> {
    if let Some(words) = shlex::split(part) {
        return words.into_iter().filter(|w| !w.is_empty()).collect();
    }
    part.split_whitespace()
        .map(|w| w.chars().filter(|c| !matches!(c, '\'' | '"' | '\\')).collect::<String>())
        .filter(|w| !w.is_empty())
        .collect()
}

fn push_unique(into: &mut Vec<String>, text: String) {
    if !text.is_empty() && !into.contains(&text) {
        into.push(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_command_is_simple_in_normal_form() {
        let line = CommandLine::read("git   status  'short'");
        assert_eq!(line.simple.as_deref(), Some("git status short"));
        assert!(line.candidates.contains(&"status short".to_string()));
    }

    #[test]
    fn control_expansion_and_non_ascii_are_never_simple() {
        for line in [
            "ls; rm x",
            "ls && rm",
            "ls | sh",
            "ls `x`",
            "ls $(x)",
            "ls > f",
            "ls\nrm",
            "ls &",
            "ls $HOME",
            "ls *",
            "ls ~",
            "ls {a,b}",
            "ｌs",
            "ls 'a b'",
            "l\\s",
            "ls 'unterminated",
            "A=1 ls",
        ] {
            assert_eq!(CommandLine::read(line).simple, None, "{line:?}");
        }
    }

    /// The bypasses of issue 35: each meets the deny rule it was written to get past.
    #[test]
    fn global_options_are_removed_for_deny_rules() {
        for (line, expected) in [
            ("git -C . push", "git push"),
            ("git --no-pager push origin", "git push origin"),
            ("git -c a.b=c push", "git push"),
            ("git --git-dir .git --work-tree=. push", "git push"),
            ("sudo -u root /usr/bin/git -C . push", "git push"),
            ("ls; git -p push", "git push"),
            ("bash -c 'git -C . push'", "git push"),
            ("kubectl -n prod delete pod x", "kubectl delete pod x"),
        ] {
            let line = CommandLine::read(line);
            assert!(line.candidates.contains(&expected.to_string()), "{expected:?} in {:?}", line.candidates);
        }
    }

    #[test]
    fn an_option_that_loads_code_is_found_in_any_part_or_tail() {
        for line in [
            "git -c core.fsmonitor=./evil.sh status",
            "sudo git -c x=y status",
            "ls && find . -exec rm {} ;",
            "bash -c 'git -c x=y status'",
            "env -S 'rm -rf x'",
        ] {
            assert!(CommandLine::read(line).loads_code.is_some(), "{line}");
        }
        assert!(CommandLine::read("git status --short").loads_code.is_none());
    }

    #[test]
    fn a_program_is_its_base_name_with_or_without_a_version() {
        assert!(is_program("/usr/bin/python3.12", "python"));
        assert!(is_program("git", "git"));
        assert!(!is_program("gitk", "git"));
        assert!(!is_program("shasum", "sh"));
    }

    #[test]
    fn every_part_and_tail_is_a_candidate() {
        let line = CommandLine::read("echo ok; sudo /bin/rm -rf /tmp/x | bash -c 'rm -rf y'");
        for expected in ["echo ok", "rm -rf /tmp/x", "/bin/rm -rf /tmp/x", "rm -rf y"] {
            assert!(line.candidates.contains(&expected.to_string()), "{expected:?} in {:?}", line.candidates);
        }
    }
}
