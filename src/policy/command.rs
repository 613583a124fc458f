//! A `run_command` line as the rules see it.
//!
//! A pattern may allow a command only when the line is one simple command the shell runs as
//! written: no control syntax (`;`, `&`, `|`, `` ` ``, `$(`, `>`, `<`, newlines), no expansion
//! (`$`, globs, `~`, braces), nothing outside printable ASCII. Anything else is `compound`: a
//! pattern never allows it. For `deny` and `ask`, the line is cut at every control character
//! (inside quotes too: cutting too often can only find more to deny), each part is read as
//! words the way the shell would (quotes and escapes removed), and a rule is tried against
//! every tail of every part, with the first word also by its base name. `env rm -rf x`, `sudo
//! /bin/rm -rf x`, `bash -c 'rm -rf x'` and `echo ok; rm -rf x` all meet `rm *`.
//!
//! A program's subcommand may follow options of its own that no table can list in full
//! (`kubectl --log-file x delete`, `terraform -chdir=infra destroy`), so every word that is
//! not an option is also read as a program followed by each later suffix of its part: `git -C
//! . push` meets `git push*` as `git push`, and `kubectl --log-file x delete ns prod` meets
//! `kubectl delete*`. This over-approximates, as the tails already do (`echo rm -rf x` meets
//! `rm *`; `git checkout push-fix` meets `git push*`): a deny or ask can only meet more.
//!
//! Those texts grow with the square of a part's words, and a line comes from the model, so
//! they are capped (`MAX_CANDIDATES`, `MAX_CANDIDATE_BYTES`): a line past the caps is read in
//! part, the tails of every part first. What was read still denies or asks; no pattern allows
//! the line, and `decide` makes it ask at least (docs/permissions.md, "Cost").
//!
//! A line whose program is given an option that loads code or config (`loads_code.rs`) is
//! never allowed by a pattern either.

use std::collections::HashSet;

use super::loads_code::{loads_code, LoadsCode};

/// Characters that chain, substitute, redirect or background a command.
const CONTROL: &[char] = &[';', '&', '|', '`', '>', '<', '\n', '\r', '(', ')'];

/// Characters that make the shell rewrite a word (expansion, globbing, brace lists, `~`) or
/// that a pattern cannot see through (escapes, quotes are handled by the word reader).
const EXPANDING: &[char] = &['$', '*', '?', '[', ']', '{', '}', '~', '\\', '!'];

/// Distinct texts, at most, that one line gives the deny and ask rules to try. A part of about
/// 140 short words, all different, reaches it.
pub const MAX_CANDIDATES: usize = 10_000;

/// Bytes of text, at most, formed for one line's candidates (repeats and quoted scripts
/// included): what reading the line and matching each rule against it cost. A part of about
/// 85 words of six or seven letters reaches it; 80 such words are read whole.
pub const MAX_CANDIDATE_BYTES: usize = 1 << 20;

/// Levels of quoted scripts in scripts read, at most (`bash -c "sh -c 'rm -rf x'"` is two).
const MAX_SCRIPT_DEPTH: usize = 8;

/// A command line, read.
#[derive(Debug, Clone)]
pub struct CommandLine {
    /// The line as one simple command in normal form (words joined by one space), when it is
    /// one that a pattern may allow.
    pub simple: Option<String>,
    /// Every text a `deny` or `ask` pattern is tried against.
    pub candidates: HashSet<String>,
    /// An option found, in any part, that makes its program load code or config: no pattern
    /// allows the line then.
    pub loads_code: Option<&'static LoadsCode>,
    /// Whether every candidate was formed. `false`: the line passed the caps and was read in
    /// part; no pattern allows it, and it asks at least.
    pub whole: bool,
}

impl CommandLine {
    pub fn read(line: &str) -> CommandLine {
        let simple = simple_form(line);
        let mut reader = Reader::default();
        let mut parts = Vec::new();
        reader.parts_of(line, 0, &mut parts);
        // Tails first, and the shortest parts first: a line past the caps is then read for its
        // plain commands before the programs' later suffixes, and a long part cannot hide a
        // short one after it (`echo <20,000 words>; rm -rf x` still meets `rm *`).
        parts.sort_by_key(|part| part.text.len());
        // The simple form, when there is one, is the one part's first tail.
        let read = parts.iter().all(|part| reader.tails_of(part)) && parts.iter().all(|part| reader.suffixes_of(part));
        CommandLine { simple, candidates: reader.seen, loads_code: reader.found, whole: read && !reader.too_deep }
    }
}

/// One part of a line: its words, and their text joined by single spaces, so that every tail
/// is a slice of one string rather than a string of its own.
struct Part {
    words: Vec<String>,
    text: String,
    /// Where each word starts in `text`.
    starts: Vec<usize>,
}

impl Part {
    fn new(words: Vec<String>) -> Part {
        let text = words.join(" ");
        let mut starts = Vec::with_capacity(words.len());
        let mut at = 0;
        for word in &words {
            starts.push(at);
            at += word.len() + 1;
        }
        Part { words, text, starts }
    }

    /// The words from `start` on, as one text (empty past the end).
    fn from(&self, start: usize) -> &str {
        self.starts.get(start).map_or("", |&at| &self.text[at..])
    }
}

/// Forms a line's candidates within the caps.
#[derive(Default)]
struct Reader {
    seen: HashSet<String>,
    /// Bytes formed so far, repeats included.
    bytes: usize,
    /// A cap was reached: what is left of the line is not read.
    over: bool,
    /// Scripts nested past `MAX_SCRIPT_DEPTH` were not read.
    too_deep: bool,
    /// An option that loads code or config, found in a tail read.
    found: Option<&'static LoadsCode>,
}

impl Reader {
    /// Every part of `line`, cut at control characters, and of every quoted script in it
    /// (`bash -c 'rm -rf x'`: a word with a space after a part's first word is itself a command
    /// line). Each level of scripts is at most as long as the line; past `MAX_SCRIPT_DEPTH`
    /// levels the line is not read whole.
    fn parts_of(&mut self, line: &str, depth: usize, into: &mut Vec<Part>) {
        if depth > MAX_SCRIPT_DEPTH {
            self.too_deep = true;
            return;
        }
        for piece in line.split(|c: char| CONTROL.contains(&c) || c == '$') {
            let words = words_of(piece);
            if words.is_empty() {
                continue;
            }
            let part = Part::new(words);
            let scripts: Vec<String> = part.words.iter().skip(1).filter(|w| w.contains(' ')).cloned().collect();
            into.push(part);
            for script in scripts {
                self.parts_of(&script, depth + 1, into);
            }
        }
    }

    /// Every tail of `part`, with its first word also by its base name; `false` once a cap is
    /// reached.
    fn tails_of(&mut self, part: &Part) -> bool {
        for start in 0..part.words.len() {
            let (first, rest) = (&part.words[start], part.from(start + 1));
            if !self.add(first, rest) || base_name(first).is_some_and(|base| !self.add(base, rest)) {
                return false;
            }
            // After the charge for the tail: the scan is as long as the tail.
            if self.found.is_none() {
                self.found = loads_code(&part.words[start..]);
            }
        }
        true
    }

    /// Every word of `part` that may be a program (not an option, not a script), followed by
    /// every later suffix of the part that is not already a tail of it; `false` once a cap is
    /// reached.
    fn suffixes_of(&mut self, part: &Part) -> bool {
        for (index, program) in part.words.iter().enumerate() {
            if program.starts_with('-') || program.contains(' ') {
                continue;
            }
            for suffix in index + 2..part.words.len() {
                let rest = part.from(suffix);
                if !self.add(program, rest) || base_name(program).is_some_and(|base| !self.add(base, rest)) {
                    return false;
                }
            }
        }
        true
    }

    /// Adds `first rest` (`first` alone when `rest` is empty); `false` when it would pass a cap.
    fn add(&mut self, first: &str, rest: &str) -> bool {
        if !self.charge(first.len() + 1 + rest.len()) {
            return false;
        }
        let text = if rest.is_empty() { first.to_string() } else { format!("{first} {rest}") };
        if text.is_empty() || self.seen.contains(&text) {
            return true;
        }
        if self.seen.len() >= MAX_CANDIDATES {
            self.over = true;
            return false;
        }
        self.seen.insert(text);
        true
    }

    /// Counts `bytes` against `MAX_CANDIDATE_BYTES`; `false` (and over) past it.
    fn charge(&mut self, bytes: usize) -> bool {
        self.bytes = self.bytes.saturating_add(bytes);
        self.over |= self.bytes > MAX_CANDIDATE_BYTES;
        !self.over
    }
}

/// The base name of a word that names a program by a path (`/bin/rm`: `rm`).
fn base_name(word: &str) -> Option<&str> {
    word.rsplit('/').next().filter(|base| !base.is_empty() && *base != word)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_command_is_simple_in_normal_form() {
        let line = CommandLine::read("git   status  'short'");
        assert_eq!(line.simple.as_deref(), Some("git status short"));
        assert!(line.candidates.contains("status short"));
        assert!(line.whole);
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

    /// The bypasses of issue 35 and of its review: each line is also read as a program followed
    /// by each later suffix of its words, so it meets the deny rule it was written to get past,
    /// whatever options no table lists come between.
    #[test]
    fn a_program_is_also_read_with_every_later_suffix() {
        for (line, expected) in [
            ("git -C . push", "git push"),
            ("git --no-pager push origin", "git push origin"),
            ("git -c a.b=c push", "git push"),
            ("git --git-dir .git --work-tree=. push", "git push"),
            ("sudo -u root /usr/bin/git -C . push", "git push"),
            ("ls; git -p push", "git push"),
            ("bash -c 'git -C . push'", "git push"),
            ("kubectl -n prod delete pod x", "kubectl delete pod x"),
            ("kubectl --log-file x delete ns prod", "kubectl delete ns prod"),
            ("npm --tag beta publish", "npm publish"),
            ("helm --burst-limit 100 uninstall x", "helm uninstall x"),
            ("systemctl --job-mode fail stop x", "systemctl stop x"),
            ("terraform -chdir=infra destroy", "terraform destroy"),
            ("aws --profile p s3 rm s3://b/k", "aws s3 rm s3://b/k"),
            ("/opt/bin/gh --repo r repo delete", "gh repo delete"),
            ("x; sh -c \"gh --repo r repo delete\"", "gh repo delete"),
        ] {
            let line = CommandLine::read(line);
            assert!(line.candidates.contains(expected), "{expected:?} in {:?}", line.candidates);
            assert!(line.whole);
        }
        let line = CommandLine::read("git --force -C . push");
        assert!(!line.candidates.contains("--force push"), "an option is never read as a program");
    }

    /// A prompt-injected line of 20,000 words: read in part, within the caps, and said so; a
    /// short command in any part is still read, however long the others.
    #[test]
    fn a_line_past_the_caps_is_read_in_part_and_says_so() {
        let words = vec!["word"; 20_000].join(" ");
        for line in [format!("echo {words}; rm -rf x"), format!("rm -rf x; git -C . {words}")] {
            let read = CommandLine::read(&line);
            assert!(!read.whole, "not read whole");
            assert!(read.candidates.len() <= MAX_CANDIDATES);
            assert!(read.candidates.iter().map(String::len).sum::<usize>() <= MAX_CANDIDATE_BYTES);
            assert!(read.candidates.contains("rm -rf x"), "the short part is read first");
        }
        // Repeats cost what they form: a line of one word said 20,000 times passes the caps too.
        assert!(!CommandLine::read(&format!("git {}", vec!["git"; 20_000].join(" "))).whole);
        // A long but ordinary command is read whole: 60 words in one part.
        let ordinary = format!("cargo test {}", (0..58).map(|n| format!("--flag{n}")).collect::<Vec<_>>().join(" "));
        assert!(CommandLine::read(&ordinary).whole);
        let prose = format!("git commit -m {}", (0..60).map(|n| format!("lorem{n}")).collect::<Vec<_>>().join(" "));
        assert!(CommandLine::read(&prose).whole);
    }

    /// What docs/permissions.md says this reading costs, and what it does not cover.
    #[test]
    fn the_documented_price_and_limit() {
        assert!(CommandLine::read("git checkout push-fix").candidates.contains("git push-fix"), "the price");
        assert!(CommandLine::read("git log --grep push").candidates.contains("git push"), "the price");
        let between = CommandLine::read("aws s3 --profile p rm x");
        assert!(!between.candidates.contains("aws s3 rm x"), "an option between a subcommand's words");
        assert!(between.candidates.contains("aws s3 --profile p rm x"));
    }

    #[test]
    fn scripts_nested_past_the_depth_are_not_read_whole() {
        let mut line = "rm -rf x".to_string();
        for _ in 0..=MAX_SCRIPT_DEPTH {
            line = format!("sh -c {}", shlex::try_quote(&line).unwrap());
        }
        let read = CommandLine::read(&line);
        assert!(!read.whole);
        let shallow = CommandLine::read("sh -c 'bash -c \"rm -rf x\"'");
        assert!(shallow.whole && shallow.candidates.contains("rm -rf x"));
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
            assert!(line.candidates.contains(expected), "{expected:?} in {:?}", line.candidates);
        }
    }
}
