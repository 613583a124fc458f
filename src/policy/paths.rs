//! A file tool's path as the rules see it: workspace-relative, normalized, and with links
//! inside the workspace resolved.

use crate::tools::workspace::Workspace;

/// The names a file tool's path goes by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathNames {
    /// The path with `.` and `..` worked out lexically, and the file it reaches once the
    /// workspace's links are followed; one entry when they are the same.
    pub names: Vec<String>,
    /// Whether both could be worked out. A path that climbs out of the workspace, or through
    /// a link that leads out, is not complete: no pattern allows it (the tool refuses it too).
    pub complete: bool,
}

impl PathNames {
    pub fn read(path: &str, workspace: Option<&Workspace>) -> PathNames {
        let mut names = Vec::new();
        let lexical = lexical(path);
        if let Some(lexical) = &lexical {
            names.push(lexical.clone());
        }
        let resolved = workspace.and_then(|w| w.resolve(path).ok().map(|absolute| w.relative(&absolute)));
        if let Some(resolved) = &resolved {
            if !names.contains(resolved) {
                names.push(resolved.clone());
            }
        }
        PathNames { complete: lexical.is_some() && resolved.is_some(), names }
    }
}

/// `path` with `.` dropped, `..` taking the name before it, and `/` between names; `None`
/// when it is absolute or climbs above the root.
fn lexical(path: &str) -> Option<String> {
    if path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    Some(if parts.is_empty() { ".".to_string() } else { parts.join("/") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_and_doubled_slashes_normalize_and_climbing_out_does_not() {
        assert_eq!(lexical("./.env").as_deref(), Some(".env"));
        assert_eq!(lexical("a/../.env").as_deref(), Some(".env"));
        assert_eq!(lexical("a//b/./c/").as_deref(), Some("a/b/c"));
        assert_eq!(lexical("").as_deref(), Some("."));
        assert_eq!(lexical("../x"), None);
        assert_eq!(lexical("/etc/passwd"), None);
    }
}
