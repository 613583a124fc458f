//! What a walking tool (`search_text`, `find_files`, `list_directory`) may open or return: the
//! tool asks a `PathJudge` of each file and each directory it reaches, and the judge keeps the
//! tally of what it withheld (docs/permissions.md, "Walking tools").
//!
//! Pure but for the tally (behind a lock: a tool runs on its own thread, and the engine reads
//! the tally once the tool is done). The judge holds the tool's deny and ask rules that have a
//! pattern, compiled once per call; each path is read the way a file tool's path argument is
//! (`PathNames`: normalized, links inside the workspace followed, the same case rules), so a
//! walk reaches nothing that a call naming the path would be refused. A person who allows
//! withheld paths answers, for each, only the ask rules that withheld it (`allowing`): an
//! allowed directory lets through what those rules cover in it, not what another ask rule
//! covers, which the person never saw.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{Compiled, Outcome, PathNames, Rule};
use crate::tools::workspace::Workspace;

/// Paths one approval asks a person about, at most; an ask rule's paths past this many are
/// withheld without asking (the result says how many).
pub const ASKED_AT_MOST: usize = 100;

/// A name no file has: a directory is covered as a whole when a rule matches this name in it,
/// and in a directory in it, as `dir/**` does.
const PROBE: &str = "\u{1}";

/// Judges the paths one call of a walking tool reaches.
#[derive(Debug, Default)]
pub struct PathJudge {
    /// The tool's deny and ask rules with a path pattern; none: every path is reachable.
    rules: Vec<Compiled>,
    workspace: Option<Workspace>,
    /// Paths a person allowed, each with the ids of the ask rules that withheld it when the
    /// person was asked: only those rules are answered for it, and for everything in it when
    /// it is a directory (ending in `/`). Another ask rule still withholds what it covers.
    allowed: Vec<(String, Vec<String>)>,
    /// The rules could not be read: every path is withheld.
    closed: bool,
    tally: Mutex<Tally>,
}

/// What a judge withheld.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Paths a deny rule covers: skipped.
    pub denied: usize,
    /// Paths an ask rule covers, in the order reached (a directory ends in `/`): withheld
    /// until a person allows them. At most `ASKED_AT_MOST`.
    pub asked: Vec<String>,
    /// Paths an ask rule covers past `ASKED_AT_MOST`.
    pub over: usize,
    /// The first ask rule that withheld a path.
    pub rule: Option<Arc<Rule>>,
    /// For each path of `asked`, the ids of the ask rules that withheld it: what a person who
    /// allows that path answers.
    pub withheld_by: BTreeMap<String, Vec<String>>,
}

impl PathJudge {
    /// A judge that withholds nothing: a tool run outside a run's rules, or a tool with none.
    pub fn open() -> PathJudge {
        PathJudge::default()
    }

    /// A judge that withholds everything: the rules could not be read (fail closed).
    pub fn closed() -> PathJudge {
        PathJudge { closed: true, ..PathJudge::default() }
    }

    /// The judge of a call of `tool` under `rules` (every rule that holds for the call; those
    /// that judge no path are left out), minus the ask rules a person already answered for
    /// this call (`answered`, by id: they asked about the call's own path).
    pub fn new(tool: &str, rules: &[Compiled], answered: &[String], workspace: Option<Workspace>) -> PathJudge {
        let rules = rules
            .iter()
            .filter(|rule| rule.judges_paths_of(tool))
            .filter(|rule| !(rule.rule.outcome == Outcome::Ask && answered.contains(&rule.rule.id)))
            .cloned()
            .collect();
        PathJudge { rules, workspace, ..PathJudge::default() }
    }

    /// The same judge, with a fresh tally, letting through `paths` (as a person allowed them,
    /// of those this judge asked about) for the ask rules that withheld each: a directory's
    /// rules are answered for everything in it, and no other rule is. A path this judge never
    /// asked about is allowed for no rule.
    pub fn allowing(&self, paths: Vec<String>) -> PathJudge {
        let withheld_by = self.tally().withheld_by;
        let allowed = paths
            .into_iter()
            .map(|path| {
                let rules = withheld_by.get(&path).cloned().unwrap_or_default();
                (path, rules)
            })
            .collect();
        PathJudge {
            rules: self.rules.clone(),
            workspace: self.workspace.clone(),
            allowed,
            closed: self.closed,
            tally: Mutex::default(),
        }
    }

    /// Whether a file (workspace-relative) may be opened or returned.
    pub fn file(&self, relative: &str) -> bool {
        self.reach(relative, false, true, false)
    }

    /// Whether a directory may be entered, or returned by name: neither when a rule covers
    /// its name or everything in it.
    pub fn directory(&self, relative: &str) -> bool {
        self.reach(relative, true, true, true)
    }

    /// Whether a walk may enter the directory it starts at: its name was judged with the
    /// call, so only whether a rule covers everything in it.
    pub fn contents(&self, relative: &str) -> bool {
        self.reach(relative, true, false, true)
    }

    /// What was withheld so far.
    pub fn tally(&self) -> Tally {
        self.tally.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn reach(&self, relative: &str, directory: bool, by_name: bool, by_contents: bool) -> bool {
        if self.closed {
            self.tally.lock().unwrap_or_else(|e| e.into_inner()).denied += 1;
            return false;
        }
        if self.rules.is_empty() {
            return true;
        }
        let names = PathNames::read(relative, self.workspace.as_ref());
        let applies = |rule: &Compiled| {
            let named = by_name && (names.names.is_empty() || names.names.iter().any(|n| rule.path_matches(n)));
            named || (by_contents && names.names.iter().any(|n| covers_contents(rule, n)))
        };
        // Deny over ask, as `decide` does; an ask withholds unless a person answered that very
        // rule for this path or a directory it is in.
        let (mut denied, mut withholding) = (false, Vec::new());
        for rule in self.rules.iter().filter(|rule| applies(rule)) {
            match rule.rule.outcome {
                Outcome::Deny => denied = true,
                Outcome::Ask if self.answered(relative, &rule.rule.id) => {}
                Outcome::Ask => withholding.push(rule),
                // `new` keeps no allow: an allow withholds nothing.
                Outcome::Allow => {}
            }
        }
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        if denied {
            tally.denied += 1;
            return false;
        }
        let Some(first) = withholding.first() else { return true };
        tally.rule.get_or_insert_with(|| Arc::clone(&first.rule));
        if tally.asked.len() < ASKED_AT_MOST {
            let listed = if directory { format!("{relative}/") } else { relative.to_string() };
            tally.withheld_by.insert(listed.clone(), withholding.iter().map(|rule| rule.rule.id.clone()).collect());
            tally.asked.push(listed);
        } else {
            tally.over += 1;
        }
        false
    }

    /// Whether a person allowed `relative` for the ask rule `rule`: the path itself, or a
    /// directory it is in, was allowed, and that rule withheld it.
    fn answered(&self, relative: &str, rule: &str) -> bool {
        self.allowed.iter().any(|(allowed, rules)| {
            rules.iter().any(|id| id == rule)
                && match allowed.strip_suffix('/') {
                    Some(".") => true,
                    Some(directory) => {
                        relative == directory
                            || relative.strip_prefix(directory).is_some_and(|rest| rest.starts_with('/'))
                    }
                    None => allowed == relative,
                }
        })
    }
}

/// Whether `rule` covers everything in directory `name`: a name in it, and one in a directory
/// in it.
fn covers_contents(rule: &Compiled, name: &str) -> bool {
    let inside = if name == "." { String::new() } else { format!("{name}/") };
    rule.path_matches(&format!("{inside}{PROBE}")) && rule.path_matches(&format!("{inside}{PROBE}/{PROBE}"))
}

/// What a call's result says it withheld, once any person's decision is in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Withheld {
    /// Covered by a deny rule.
    pub denied: usize,
    /// Covered by an ask rule, and a person said no (or the run ended before they answered).
    pub refused: usize,
    /// Covered by an ask rule, and not put to a person: past `ASKED_AT_MOST`, found only when
    /// the call ran again, or reached by a tool that is not run again.
    pub unasked: usize,
}

impl Withheld {
    /// Nothing withheld.
    pub fn is_empty(&self) -> bool {
        *self == Withheld::default()
    }

    /// For the model, after the tool's own output.
    pub fn note(&self) -> String {
        let mut lines = Vec::new();
        let count = |n: usize| if n == 1 { "1 path".to_string() } else { format!("{n} paths") };
        if self.denied > 0 {
            lines.push(format!(
                "[{} withheld: a permission rule denies {}; not opened or shown]",
                self.denied,
                if self.denied == 1 { "it" } else { "them" }
            ));
        }
        if self.refused > 0 {
            lines.push(format!("[{} withheld by a person's decision; not opened or shown]", count(self.refused)));
        }
        if self.unasked > 0 {
            lines.push(format!(
                "[{} withheld: a permission rule asks a person first, and this call did not ask; narrow the path or the pattern]",
                count(self.unasked)
            ));
        }
        lines.join("\n")
    }

    /// For clients (`data.withheld` of the result): the counts that are not zero.
    pub fn data(&self) -> serde_json::Value {
        let mut data = serde_json::Map::new();
        for (name, count) in [("denied", self.denied), ("refused", self.refused), ("unasked", self.unasked)] {
            if count > 0 {
                data.insert(name.into(), count.into());
            }
        }
        serde_json::Value::Object(data)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::rule;
    use super::super::Matching;
    use super::*;
    use crate::tools::workspace::Protected;

    fn compiled(tool: &str, pattern: Option<&str>, outcome: Outcome, matching: Matching) -> Compiled {
        Compiled::new(rule(tool, pattern, outcome), matching).unwrap()
    }

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join(".env"), "x").unwrap();
        std::os::unix::fs::symlink("../.env", dir.path().join("sub/alias")).unwrap();
        let workspace = Workspace::new(dir.path(), &Protected::default()).unwrap();
        (dir, workspace)
    }

    fn judge(rules: Vec<Compiled>, workspace: &Workspace) -> PathJudge {
        PathJudge::new("search_text", &rules, &[], Some(workspace.clone()))
    }

    #[test]
    fn a_file_is_judged_by_every_name_it_goes_by_and_only_deny_and_ask_count() {
        use Outcome::*;
        let (_dir, workspace) = workspace();
        let m = Matching::default();
        let rules = vec![
            compiled("*", Some("**/.env"), Deny, m),
            compiled("search_text", Some("**/secret*"), Ask, m),
            compiled("search_text", Some("**"), Allow, m),
            compiled("search_text", None, Ask, m),
            compiled("find_files", Some("**/*.md"), Deny, m),
        ];
        let judge = judge(rules, &workspace);
        assert!(!judge.file(".env"));
        assert!(!judge.file("sub/alias"), "a link, by the file it reaches");
        assert!(!judge.file("a/b/secret.txt"));
        assert!(judge.file("readme.md"), "another tool's rule, an allow and a rule with no pattern judge nothing");
        let tally = judge.tally();
        assert_eq!((tally.denied, tally.asked, tally.over), (2, vec!["a/b/secret.txt".to_string()], 0));
        assert_eq!(tally.rule.map(|r| r.id.clone()).as_deref(), Some("rule:search_text:Some(\"**/secret*\"):ask"));
    }

    #[test]
    fn a_directory_is_withheld_by_its_name_or_by_a_rule_on_everything_in_it() {
        use Outcome::*;
        let (_dir, workspace) = workspace();
        let m = Matching::default();
        let rules = vec![
            compiled("*", Some("private/**"), Deny, m),
            compiled("*", Some("**/secrets"), Deny, m),
            compiled("*", Some("docs/*.md"), Deny, m),
            compiled("*", Some("vendor/**"), Ask, m),
        ];
        let judge = judge(rules, &workspace);
        assert!(!judge.directory("private"), "private/** covers everything in it");
        assert!(!judge.directory("private/deep"));
        assert!(!judge.directory("a/secrets"), "by name");
        assert!(judge.directory("docs"), "only some files in it: entered, and each judged");
        assert!(!judge.file("docs/a.md"));
        assert!(judge.directory("src"));
        assert!(!judge.contents("private"), "a start directory, by what is in it");
        assert!(judge.contents("a/secrets"), "a start's name was judged with the call");
        assert!(!judge.directory("vendor"));
        let tally = judge.tally();
        assert_eq!((tally.denied, tally.asked), (5, vec!["vendor/".to_string()]));
    }

    #[test]
    fn the_root_is_covered_only_by_a_rule_on_everything() {
        let (_dir, workspace) = workspace();
        let m = Matching::default();
        assert!(judge(vec![compiled("*", Some("**/.env"), Outcome::Deny, m)], &workspace).contents("."));
        assert!(!judge(vec![compiled("*", Some("**"), Outcome::Deny, m)], &workspace).contents("."));
    }

    #[test]
    fn case_blind_rules_withhold_other_cases() {
        let (_dir, workspace) = workspace();
        let blind = Matching { paths_ignore_case: true };
        let judge = judge(vec![compiled("*", Some("**/.env"), Outcome::Deny, blind)], &workspace);
        assert!(!judge.file("sub/.ENV"));
        assert!(!judge.file(".Env"));
    }

    #[test]
    fn a_person_allows_exactly_the_paths_they_saw_and_a_deny_still_holds() {
        use Outcome::*;
        let (_dir, workspace) = workspace();
        let m = Matching::default();
        let rules = vec![compiled("*", Some("**/secret*"), Ask, m), compiled("*", Some("**/.env"), Deny, m)];
        let first = judge(rules, &workspace);
        assert!(!first.file("a/secret.txt"));
        assert!(!first.directory("secrets"));
        assert!(!first.file("b/secret.txt"));
        let asked = first.tally().asked;
        assert_eq!(asked, ["a/secret.txt", "secrets/", "b/secret.txt"]);
        let again = first.allowing(vec!["a/secret.txt".into(), "secrets/".into()]);
        assert!(again.file("a/secret.txt"));
        assert!(again.directory("secrets"));
        assert!(again.file("secrets/inner/secret.key"), "inside an allowed directory");
        assert!(!again.file("secrets/.env"), "a deny holds inside it");
        assert!(!again.file("b/secret.txt"), "not among those allowed");
        assert!(!again.file("a/secret.txt.bak"));
        assert_eq!(again.tally().asked, ["b/secret.txt", "a/secret.txt.bak"]);
    }

    /// A directory shown by name and allowed is allowed for the rules that withheld it only:
    /// another ask rule still withholds what it covers inside, which the person never saw.
    #[test]
    fn an_allowed_directory_answers_only_the_rules_that_withheld_it() {
        use Outcome::*;
        let (_dir, workspace) = workspace();
        let m = Matching::default();
        let rules = vec![
            compiled("*", Some("secrets/**"), Ask, m),
            compiled("*", Some("**/*.key"), Ask, m),
            compiled("*", Some("**/.env"), Deny, m),
        ];
        let first = judge(rules, &workspace);
        assert!(!first.directory("secrets"));
        assert!(!first.file("a.key"));
        assert_eq!(first.tally().asked, ["secrets/", "a.key"]);
        let again = first.allowing(vec!["secrets/".into()]);
        assert!(again.directory("secrets"));
        assert!(again.directory("secrets/deep"));
        assert!(again.file("secrets/notes.txt"), "what only the directory's rule covers");
        assert!(!again.file("secrets/api.key"), "another ask rule's file, never shown");
        assert!(!again.file("secrets/deep/id.key"));
        assert!(!again.file("secrets/.env"), "a deny holds inside it");
        assert!(!again.file("a.key"), "not among those allowed");
        assert_eq!(again.tally().asked, ["secrets/api.key", "secrets/deep/id.key", "a.key"]);
        // A path the first judge never asked about is allowed for no rule.
        let stray = first.allowing(vec!["elsewhere/".into(), "b.key".into()]);
        assert!(!stray.file("elsewhere/x.key") && !stray.file("b.key"));
    }

    #[test]
    fn an_ask_answered_for_the_call_is_not_asked_again_for_its_paths() {
        let (_dir, workspace) = workspace();
        let rules = vec![compiled("*", Some("**"), Outcome::Ask, Matching::default())];
        let answered = vec![rules[0].rule.id.clone()];
        let judge = PathJudge::new("search_text", &rules, &answered, Some(workspace));
        assert!(judge.contents(".") && judge.file("a.txt"));
    }

    #[test]
    fn past_the_cap_ask_paths_are_counted_not_listed_and_a_closed_judge_withholds_all() {
        let (_dir, workspace) = workspace();
        let judge = judge(vec![compiled("*", Some("**"), Outcome::Ask, Matching::default())], &workspace);
        for n in 0..ASKED_AT_MOST + 3 {
            assert!(!judge.file(&format!("f{n}")));
        }
        let tally = judge.tally();
        assert_eq!((tally.asked.len(), tally.over), (ASKED_AT_MOST, 3));
        let closed = PathJudge::closed();
        assert!(!closed.file("a") && !closed.directory("b"));
        assert_eq!(closed.tally().denied, 2);
        assert!(PathJudge::open().file(".env"));
    }

    #[test]
    fn the_note_and_the_data_say_what_was_withheld() {
        let withheld = Withheld { denied: 3, refused: 1, unasked: 0 };
        assert!(withheld.note().contains("[3 withheld: a permission rule denies them"));
        assert!(withheld.note().contains("1 path withheld by a person's decision"));
        assert_eq!(withheld.data(), serde_json::json!({ "denied": 3, "refused": 1 }));
        assert!(Withheld::default().is_empty());
    }
}
