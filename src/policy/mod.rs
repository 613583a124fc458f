//! Permission rules: which tool calls run, which wait for a person, which never run.
//!
//! Pure: the engine gathers the rules that concern a call (the server's from the config, the
//! tenant's from the config and the store, the session's and the remembered approvals from
//! the store) and asks `decide`. The rule language and its precedence are in
//! `docs/permissions.md`; in short:
//!
//! - a rule names a tool (a glob: `mcp__*`, `plugin.*`), optionally a `match` pattern (a glob
//!   over the command of `run_command`, over the path of a file tool), and an outcome;
//! - of every rule that applies, at every level, the strictest wins: `deny` over `ask` over
//!   `allow`, whatever the order they were written in. A tenant or session can add rules but
//!   no rule of theirs weakens one of the server's, and nothing turns a `deny` into anything
//!   else;
//! - when no rule applies, the tool's own permission (`[agent.permissions]`) decides;
//! - a pattern never allows a command with shell control syntax or expansion (`command.rs`),
//!   nor one carrying an option that loads code or config (`loads_code.rs`), nor a path that
//!   leaves the workspace (`paths.rs`); a command too long for the rules to read whole asks
//!   at least, whatever its tool's own permission (`command.rs`, `decide`);
//! - a tool that walks the workspace has each path it reaches judged by its deny and ask
//!   rules (`walk.rs`).

mod audit;
mod book;
mod budget;
mod command;
mod global_options;
mod loads_code;
mod paths;
mod walk;

use std::sync::Arc;

use globset::{Glob, GlobBuilder, GlobMatcher};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use audit::{
    audited_arguments, digested_arguments, truncated, AuditEntry, DecidedBy, Decision as AuditDecision, ARGUMENTS_CHARS,
};
pub use book::Rulebook;
pub use budget::{periods, Admission, Bucket, Budget, BudgetError, Reserve, Spent};
pub use command::CommandLine;
pub use loads_code::LoadsCode;
pub use paths::PathNames;
pub use walk::{PathJudge, Withheld};

/// What a rule says of the calls it applies to; ordered from the loosest to the strictest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Allow,
    Ask,
    Deny,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allow => "allow",
            Outcome::Ask => "ask",
            Outcome::Deny => "deny",
        }
    }

    pub fn parse(text: &str) -> Option<Outcome> {
        match text {
            "allow" => Some(Outcome::Allow),
            "ask" => Some(Outcome::Ask),
            "deny" => Some(Outcome::Deny),
            _ => None,
        }
    }
}

/// Where a rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The config file (`[[agent.rules]]`, a token's `rules`): listed, never revoked by the API.
    Config,
    /// `POST /api/rules` or `/api/sessions/:id/rules`.
    Api,
    /// A person's approval with `remember`.
    Remembered,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Api => "api",
            Source::Remembered => "remembered",
        }
    }

    pub fn parse(text: &str) -> Option<Source> {
        match text {
            "config" => Some(Source::Config),
            "api" => Some(Source::Api),
            "remembered" => Some(Source::Remembered),
            _ => None,
        }
    }
}

/// A rule as written in the config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub tool: String,
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub outcome: Outcome,
}

/// A rule with where it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub id: String,
    /// `None`: the server's.
    pub tenant: Option<String>,
    /// `Some`: this session's only.
    pub session_id: Option<String>,
    pub tool: String,
    pub pattern: Option<String>,
    /// A remembered approval of one exact call of a tool that has no pattern subject: the
    /// call's arguments, as `canonical_arguments` writes them.
    pub arguments: Option<String>,
    pub outcome: Outcome,
    pub source: Source,
    pub created_at: String,
    /// Who added it (a token's name), when known.
    pub created_by: Option<String>,
}

impl Rule {
    /// Where the rule holds: `server`, `tenant` or `session`.
    pub fn scope(&self) -> &'static str {
        match (&self.tenant, &self.session_id) {
            (_, Some(_)) => "session",
            (Some(_), None) => "tenant",
            (None, None) => "server",
        }
    }

    /// The rule as clients see it.
    pub fn view(&self) -> crate::domain::RuleView {
        crate::domain::RuleView {
            id: self.id.clone(),
            tool: self.tool.clone(),
            pattern: self.pattern.clone(),
            arguments: self.arguments.clone(),
            outcome: self.outcome.as_str().to_string(),
            scope: self.scope().to_string(),
            source: self.source.as_str().to_string(),
            session_id: self.session_id.clone(),
            created_at: self.created_at.clone(),
            created_by: self.created_by.clone(),
        }
    }
}

/// A bad rule: its glob does not compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError(pub String);

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RuleError {}

/// How patterns compare names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Matching {
    /// Paths compare without regard to case (`.ENV` meets a rule on `.env`); commands never.
    pub paths_ignore_case: bool,
}

/// A rule ready to match. Cheap to clone, and clones share their matchers: a regex's clone
/// would build its match cache anew on its first use.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub rule: Arc<Rule>,
    tool: Arc<GlobMatcher>,
    command: Option<Arc<GlobMatcher>>,
    path: Option<Arc<GlobMatcher>>,
}

impl Compiled {
    pub fn new(rule: Rule, matching: Matching) -> Result<Compiled, RuleError> {
        let tool = Arc::new(glob(&rule.tool, false, false)?);
        let (command, path) = match &rule.pattern {
            Some(pattern) => {
                let command = glob(pattern, false, false)?;
                (Some(Arc::new(command)), Some(Arc::new(glob(pattern, true, matching.paths_ignore_case)?)))
            }
            None => (None, None),
        };
        Ok(Compiled { rule: Arc::new(rule), tool, command, path })
    }

    /// Whether the rule applies to `call`, for its own outcome: an `allow` needs every name of
    /// the call to match its pattern (and a simple command that loads no code or config), a
    /// `deny` or `ask` any one.
    fn applies(&self, call: &Call<'_>) -> bool {
        if !self.tool.is_match(call.tool) {
            return false;
        }
        if let Some(exact) = &self.rule.arguments {
            return *exact == call.canonical;
        }
        let allow = self.rule.outcome == Outcome::Allow;
        match (&call.subject, &self.command, &self.path) {
            (_, None, _) => true,
            (Subject::Command(line), Some(pattern), _) => match allow {
                true => {
                    line.whole
                        && line.loads_code.is_none()
                        && line.simple.as_deref().is_some_and(|simple| pattern.is_match(simple))
                }
                false => line.candidates.iter().any(|c| pattern.is_match(c)),
            },
            (Subject::Path(path), _, Some(pattern)) => match allow {
                true => path.complete && path.names.iter().all(|n| pattern.is_match(n)),
                false => path.names.is_empty() || path.names.iter().any(|n| pattern.is_match(n)),
            },
            // A pattern on a tool whose calls have no command or path: a `deny` or `ask`
            // holds for every call, an `allow` for none.
            _ => !allow,
        }
    }

    /// Whether the rule judges the paths a walk of `tool` reaches: a `deny` or `ask` with a
    /// pattern (one without judges calls, not paths; an `allow` never withholds anything).
    fn judges_paths_of(&self, tool: &str) -> bool {
        self.rule.outcome != Outcome::Allow
            && self.rule.arguments.is_none()
            && self.path.is_some()
            && self.tool.is_match(tool)
    }

    /// Whether the rule's path pattern matches `name` (a workspace-relative path).
    fn path_matches(&self, name: &str) -> bool {
        self.path.as_ref().is_some_and(|pattern| pattern.is_match(name))
    }
}

/// `*` matches across `/` in commands; in paths it stays within a name and `**` crosses.
fn glob(pattern: &str, literal_separator: bool, ignore_case: bool) -> Result<GlobMatcher, RuleError> {
    let glob: Glob = GlobBuilder::new(pattern)
        .literal_separator(literal_separator)
        .case_insensitive(ignore_case)
        .backslash_escape(true)
        .build()
        .map_err(|error| RuleError(format!("`{pattern}` is not a valid pattern: {error}")))?;
    Ok(glob.compile_matcher())
}

/// What a call is matched on.
#[derive(Debug, Clone)]
pub enum Subject {
    Command(CommandLine),
    Path(PathNames),
    /// A tool with neither (an MCP or plugin tool, most built-in ones).
    Other,
}

/// Which argument of a tool the rules' `match` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOn {
    Nothing,
    /// A command line in this argument.
    Command(&'static str),
    /// A workspace path in this argument; the default when it is absent.
    Path(&'static str, &'static str),
}

/// One tool call, read for the rules.
pub struct Call<'a> {
    pub tool: &'a str,
    pub subject: Subject,
    /// The arguments as `canonical_arguments` writes them, with the tool's content arguments
    /// as their digests (`digested_arguments`): what a remembered exact call holds.
    pub canonical: String,
}

impl<'a> Call<'a> {
    /// `content`: the tool's content arguments (`Tool::content_arguments`).
    pub fn read(
        tool: &'a str,
        arguments: &Map<String, Value>,
        on: MatchOn,
        content: &[&str],
        workspace: Option<&crate::tools::workspace::Workspace>,
    ) -> Call<'a> {
        let text = |name: &str| arguments.get(name).and_then(Value::as_str);
        let subject = match on {
            MatchOn::Nothing => Subject::Other,
            // A command that is not a string runs nothing; the empty line matches no allow.
            MatchOn::Command(name) => Subject::Command(CommandLine::read(text(name).unwrap_or(""))),
            MatchOn::Path(name, default) => Subject::Path(PathNames::read(text(name).unwrap_or(default), workspace)),
        };
        Call { tool, subject, canonical: canonical_arguments(&digested_arguments(arguments, content)) }
    }

    /// Whether the rules read the call whole: `false` for a command past the candidate caps
    /// (`command.rs`), which no allow holds for and which asks at least.
    pub fn read_whole(&self) -> bool {
        match &self.subject {
            Subject::Command(line) => line.whole,
            Subject::Path(_) | Subject::Other => true,
        }
    }

    /// The pattern `remember` adds when it is given none: this exact command or path (as a
    /// glob that matches only it), or `None` for a tool that has neither (then the rule holds
    /// the exact arguments).
    pub fn exact_pattern(&self) -> Option<String> {
        match &self.subject {
            Subject::Command(line) => line.simple.as_deref().map(globset::escape),
            Subject::Path(path) if path.complete => path.names.last().map(|n| globset::escape(n)),
            _ => None,
        }
    }
}

/// Arguments with their keys in order (serde_json's maps are ordered by key), compact.
pub fn canonical_arguments(arguments: &Map<String, Value>) -> String {
    serde_json::to_string(arguments).unwrap_or_default()
}

/// What decided a call.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub outcome: Outcome,
    /// The rule that decided it; `None`: no rule applied, the tool's own permission did.
    pub rule: Option<Arc<Rule>>,
}

impl Verdict {
    /// The verdict as a call's events and result message carry it.
    pub fn note(&self) -> crate::domain::PermissionNote {
        crate::domain::PermissionNote {
            outcome: self.outcome.as_str().to_string(),
            rule: self.rule.as_ref().map(|rule| rule.view()),
        }
    }
}

/// What the audit log notes of a call the rules did not read whole (`Call::read_whole`).
pub const NOT_READ_WHOLE: &str = "the command is too long for the rules to read whole: \
no allow holds for it and it asks at least (docs/permissions.md, \"Cost\")";

/// The strictest outcome of every rule that applies to `call`; the tool's own permission
/// (`default`) when none does. A tool whose own permission is `deny` stays denied. A call the
/// rules did not read whole asks at least, whatever allowed it: only a deny in what was read
/// is stricter.
pub fn decide(call: &Call<'_>, default: Outcome, rules: &[Compiled]) -> Verdict {
    let verdict = strictest(call, default, rules);
    match verdict.outcome {
        Outcome::Allow if !call.read_whole() => Verdict { outcome: Outcome::Ask, rule: None },
        Outcome::Allow | Outcome::Ask | Outcome::Deny => verdict,
    }
}

fn strictest(call: &Call<'_>, default: Outcome, rules: &[Compiled]) -> Verdict {
    if default == Outcome::Deny {
        return Verdict { outcome: Outcome::Deny, rule: None };
    }
    let mut best: Option<&Compiled> = None;
    for rule in rules.iter().filter(|r| r.applies(call)) {
        if best.is_none_or(|b| rule.rule.outcome > b.rule.outcome) {
            best = Some(rule);
        }
        if rule.rule.outcome == Outcome::Deny {
            break;
        }
    }
    match best {
        Some(rule) => Verdict { outcome: rule.rule.outcome, rule: Some(Arc::clone(&rule.rule)) },
        None => Verdict { outcome: default, rule: None },
    }
}

/// The ids of the ask rules that apply to `call`: a person who approves the call answers each
/// of them for it.
pub fn asking_rules(call: &Call<'_>, rules: &[Compiled]) -> Vec<String> {
    rules.iter().filter(|r| r.rule.outcome == Outcome::Ask && r.applies(call)).map(|r| r.rule.id.clone()).collect()
}

#[cfg(test)]
mod tests;
