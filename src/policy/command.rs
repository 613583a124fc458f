//! A `run_command` line as the rules see it.
//!
//! A pattern may allow a command only when the line is one simple command the shell runs as
//! written: no control syntax (`;`, `&`, `|`, `` ` ``, `$(`, `>`, `<`, newlines), no expansion
//! (`$`, globs, `~`, braces), nothing outside printable ASCII. Anything else is `compound`: a
//! pattern never allows it. For `deny` and `ask`, the line is cut at every control character
//! (inside quotes too: cutting too often can only find more to deny), each part is read as
//! words the way the shell would (quotes and escapes removed), and a rule is tried against
//! every tail of every part, with the first word also by its base name. `env rm -rf x`,
//! `sudo /bin/rm -rf x`, `bash -c 'rm -rf x'` and `echo ok; rm -rf x` all meet `rm *`.

/// Characters that chain, substitute, redirect or background a command.
const CONTROL: &[char] = &[';', '&', '|', '`', '>', '<', '\n', '\r', '(', ')'];

/// Characters that make the shell rewrite a word (expansion, globbing, brace lists, `~`) or
/// that a pattern cannot see through (escapes, quotes are handled by the word reader).
const EXPANDING: &[char] = &['$', '*', '?', '[', ']', '{', '}', '~', '\\', '!'];

/// A command line, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLine {
    /// The line as one simple command in normal form (words joined by one space), when it is
    /// one that a pattern may allow.
    pub simple: Option<String>,
    /// Every text a `deny` or `ask` pattern is tried against.
    pub candidates: Vec<String>,
}

impl CommandLine {
    pub fn read(line: &str) -> CommandLine {
        let simple = simple_form(line);
        let mut candidates = Vec::new();
        for part in line.split(|c: char| CONTROL.contains(&c) || c == '$') {
            let words = words_of(part);
            for start in 0..words.len() {
                let tail = &words[start..];
                push_unique(&mut candidates, tail.join(" "));
                if let Some(base) = tail[0].rsplit('/').next().filter(|base| *base != tail[0]) {
                    let mut renamed = vec![base.to_string()];
                    renamed.extend(tail[1..].iter().cloned());
                    push_unique(&mut candidates, renamed.join(" "));
                }
                // `bash -c 'rm -rf x'`: a quoted script is itself a command line.
                if tail[0].contains(' ') && start > 0 {
                    for inner in CommandLine::read(&tail[0]).candidates {
                        push_unique(&mut candidates, inner);
                    }
                }
            }
        }
        if let Some(simple) = &simple {
            push_unique(&mut candidates, simple.clone());
        }
        CommandLine { simple, candidates }
    }
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

    #[test]
    fn every_part_and_tail_is_a_candidate() {
        let line = CommandLine::read("echo ok; sudo /bin/rm -rf /tmp/x | bash -c 'rm -rf y'");
        for expected in ["echo ok", "rm -rf /tmp/x", "/bin/rm -rf /tmp/x", "rm -rf y"] {
            assert!(line.candidates.contains(&expected.to_string()), "{expected:?} in {:?}", line.candidates);
        }
    }
}
