//! What a checkpoint leaves out: `.git` always, and what the workspace's own `.gitignore`
//! (the one at its root) names, in a subset of git's syntax that covers what such files
//! mostly hold (`node_modules/`, `target`, `*.log`, `/dist`, `build/*.o`):
//!
//! - blank lines and lines starting with `#` are skipped;
//! - a trailing `/` matches directories only;
//! - a pattern with no `/` but a trailing one matches a name at any depth; one with a `/`
//!   elsewhere (a leading one included) matches the path from the workspace root;
//! - `*` matches any run of characters but `/`, `?` one character, `**` any run including `/`;
//! - negation (`!pattern`) is not read, so a file one would bring back stays out;
//!   `.gitignore` files below the root are not read, so what they name is kept.

/// Where a fork's copy of a workspace goes when no directory beside the workspace is allowed
/// (the workspace is a root itself): `<workspace>/.kestrel-forks/<session id>`.
pub const FORKS_DIR: &str = ".kestrel-forks";

/// One `.gitignore` line.
#[derive(Debug, Clone)]
struct Rule {
    pattern: String,
    directory_only: bool,
    /// Matched against the whole relative path rather than each name.
    anchored: bool,
}

#[derive(Debug, Clone, Default)]
pub struct IgnoreRules {
    rules: Vec<Rule>,
}

impl IgnoreRules {
    /// The rules of a `.gitignore` file's text.
    pub fn parse(text: &str) -> IgnoreRules {
        let rules = text
            .lines()
            .map(str::trim_end)
            .filter(|line| !line.trim().is_empty() && !line.starts_with('#') && !line.starts_with('!'))
            .map(|line| {
                let directory_only = line.ends_with('/');
                let line = line.trim_end_matches('/');
                let anchored = line.contains('/');
                Rule { pattern: line.trim_start_matches('/').to_string(), directory_only, anchored }
            })
            .filter(|rule| !rule.pattern.is_empty())
            .collect();
        IgnoreRules { rules }
    }

    /// Whether `path` (POSIX, relative to the workspace) is left out. `.git` always is, and
    /// so is the root's `FORKS_DIR` (the copies forks of its sessions made inside it).
    pub fn ignores(&self, path: &str, is_dir: bool) -> bool {
        let name = path.rsplit('/').next().unwrap_or(path);
        if name == ".git" || path == FORKS_DIR {
            return true;
        }
        self.rules.iter().any(|rule| {
            if rule.directory_only && !is_dir {
                return false;
            }
            match rule.anchored {
                true => glob(rule.pattern.as_bytes(), path.as_bytes()),
                false => glob(rule.pattern.as_bytes(), name.as_bytes()),
            }
        })
    }
}

/// Glob matching with `*`, `?` and `**`.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern {
        [] => text.is_empty(),
        [b'*', b'*', rest @ ..] => {
            let rest = rest.strip_prefix(b"/").unwrap_or(rest);
            (0..=text.len()).any(|skip| glob(rest, &text[skip..]))
        }
        [b'*', rest @ ..] => (0..=text.len())
            .take_while(|&skip| skip == 0 || text[skip - 1] != b'/')
            .any(|skip| glob(rest, &text[skip..])),
        [b'?', rest @ ..] => matches!(text, [c, tail @ ..] if *c != b'/' && glob(rest, tail)),
        [c, rest @ ..] => matches!(text, [t, tail @ ..] if t == c && glob(rest, tail)),
    }
}

#[cfg(test)]
mod tests {
    use super::IgnoreRules;

    #[test]
    fn names_paths_directories_and_globs() {
        let rules =
            IgnoreRules::parse("# deps\nnode_modules/\ntarget\n*.log\n/dist\nbuild/*.o\ndocs/**/tmp\n!keep.log\n\n");
        assert!(rules.ignores("node_modules", true));
        assert!(rules.ignores("web/node_modules", true));
        assert!(!rules.ignores("node_modules", false), "a trailing slash matches directories only");
        assert!(rules.ignores("target", true) && rules.ignores("crates/x/target", true));
        assert!(rules.ignores("a/b/run.log", false));
        assert!(rules.ignores("dist", true) && !rules.ignores("web/dist", true), "a leading slash anchors");
        assert!(rules.ignores("build/x.o", false) && !rules.ignores("build/sub/x.o", false));
        assert!(rules.ignores("docs/a/b/tmp", true) && rules.ignores("docs/tmp", true));
        assert!(rules.ignores(".git", true) && rules.ignores("vendor/.git", true));
        assert!(rules.ignores(".kestrel-forks", true) && !rules.ignores("src/.kestrel-forks", true));
        assert!(!rules.ignores("src/main.rs", false) && !rules.ignores("logs", true));
        assert!(rules.ignores("keep.log", false), "negation is not read");
    }
}
