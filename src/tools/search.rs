//! The search tools: find_files (globs) and search_text (a regular expression over the tree).
//!
//! Both walk the workspace without following symlinked directories (a link could lead outside
//! or into a loop) and skip the directories in `SKIPPED_DIRS`. Each directory they would enter
//! and each file they would open or return is put to the call's judge of paths first
//! (`ToolContext::paths`): what it withholds is neither entered, opened nor shown.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobSetBuilder};
use regex::RegexBuilder;
use serde_json::{json, Map, Value};

use super::args::Args;
use super::schema;
use super::workspace::{is_text, PathError, Workspace, SKIPPED_DIRS};
use crate::domain::ToolSchema;
use crate::engine::tools::{Permission, Tool, ToolContext, ToolError, ToolOutput};
use crate::policy::MatchOn;

const MAX_FILES: usize = 1000;
const MAX_MATCHES: usize = 200;
const MAX_LINE_CHARS: usize = 300;
/// Files larger than this are not searched.
const MAX_SEARCHED_BYTES: u64 = 2 * 1024 * 1024;

/// A file a walk reached.
struct Found<'a> {
    path: &'a Path,
    /// POSIX path relative to the workspace.
    relative: String,
    name: String,
}

impl Found<'_> {
    /// Whether a glob matches the relative path or the bare name (`lib.rs` finds `src/lib.rs`).
    fn matches(&self, glob: impl Fn(&str) -> bool) -> bool {
        glob(&self.relative) || glob(&self.name)
    }
}

/// Every file under `start` (a file or a directory), in sorted order, skipping ignored
/// directories, symlinked directories and the directories the judge of paths withholds (the
/// start included, when a rule covers everything in it; a start file was judged with the
/// call). `visit` returns false to stop the walk, and the walk stops on cancel too. `visit`
/// judges the files it would open or return.
fn walk(context: &ToolContext<'_>, start: &Path, visit: &mut dyn FnMut(&Found<'_>) -> bool) {
    let mut visit = |path: &Path| {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        visit(&Found { path, relative: context.workspace.relative(path), name }) && !context.cancel.is_cancelled()
    };
    if start.is_file() {
        visit(start);
        return;
    }
    if !context.paths.contents(&context.workspace.relative(start)) {
        return;
    }
    let mut stack = vec![start.to_path_buf()];
    while let Some(directory) = stack.pop() {
        let Ok(reader) = fs::read_dir(&directory) else { continue };
        let mut entries: Vec<(PathBuf, fs::FileType)> =
            reader.filter_map(Result::ok).filter_map(|e| Some((e.path(), e.file_type().ok()?))).collect();
        entries.sort_by(|a, b| b.0.cmp(&a.0)); // reversed: the stack pops them in order
        let mut subdirectories = Vec::new();
        for (path, kind) in entries.into_iter().rev() {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if context.workspace.is_protected(&path) {
                continue;
            }
            if kind.is_dir() {
                if !SKIPPED_DIRS.contains(&name.as_str()) && context.paths.directory(&context.workspace.relative(&path))
                {
                    subdirectories.push(path);
                }
            } else if kind.is_file() && !visit(&path) {
                return;
            }
        }
        stack.extend(subdirectories.into_iter().rev());
    }
}

fn start_of(workspace: &Workspace, path: Option<&str>) -> Result<PathBuf, ToolError> {
    let start = workspace.resolve(path.unwrap_or("."))?;
    if !start.exists() {
        return Err(ToolError::Path(PathError::NotFound(path.unwrap_or(".").to_string())));
    }
    Ok(start)
}

pub struct FindFiles;

impl Tool for FindFiles {
    fn changes_files(&self) -> bool {
        false
    }

    fn schema(&self) -> ToolSchema {
        schema(
            "find_files",
            "Find files in the workspace whose paths match glob patterns such as `**/*.rs` or `src/*.toml`.",
            "search",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {
                        "description": "A glob, or an array of globs, matched against paths relative to the workspace.",
                        "anyOf": [{ "type": "string" }, { "type": "array", "items": { "type": "string" } }]
                    },
                    "path": { "type": "string", "description": "Directory to search in; default the whole workspace." }
                },
                "required": ["pattern"]
            }),
        )
    }

    fn default_permission(&self) -> Permission {
        Permission::Auto
    }

    fn matches_on(&self) -> MatchOn {
        MatchOn::Path("path", ".")
    }

    fn walks(&self) -> bool {
        true
    }

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args = Args::new(arguments);
        let (patterns, path) = (args.strings("pattern")?, args.optional_string("path")?);
        let mut builder = GlobSetBuilder::new();
        for pattern in &patterns {
            builder.add(
                Glob::new(pattern).map_err(|error| ToolError::Arguments(format!("bad glob {pattern:?}: {error}")))?,
            );
        }
        let globs = builder.build().map_err(|error| ToolError::Arguments(format!("bad globs: {error}")))?;
        let start = start_of(context.workspace, path)?;
        let mut found = Vec::new();
        let mut more = false;
        walk(context, &start, &mut |file| {
            if file.matches(|path| globs.is_match(path)) && (file.path == start || context.paths.file(&file.relative)) {
                if found.len() == MAX_FILES {
                    more = true;
                    return false;
                }
                found.push(file.relative.clone());
            }
            true
        });
        let mut content = if found.is_empty() { "No files match.".to_string() } else { found.join("\n") };
        if more {
            content.push_str(&format!("\n[only the first {MAX_FILES} matches are shown]"));
        }
        Ok(ToolOutput::success(content, Some(json!({ "files": found.len(), "truncated": more }))))
    }
}

pub struct SearchText;

impl Tool for SearchText {
    fn changes_files(&self) -> bool {
        false
    }

    fn schema(&self) -> ToolSchema {
        schema(
            "search_text",
            "Search the workspace's text files for a regular expression; prints `path:line: text` for each match. Binary files and directories like .git, target and node_modules are skipped.",
            "search",
            json!({
                "type": "object",
                "properties": {
                    "pattern": { "type": "string", "description": "A regular expression (Rust regex syntax)." },
                    "path": { "type": "string", "description": "File or directory to search; default the whole workspace." },
                    "glob": { "type": "string", "description": "Only search files whose path matches this glob, e.g. `*.rs`." },
                    "caseInsensitive": { "type": "boolean" }
                },
                "required": ["pattern"]
            }),
        )
    }

    fn default_permission(&self) -> Permission {
        Permission::Auto
    }

    fn matches_on(&self) -> MatchOn {
        MatchOn::Path("path", ".")
    }

    fn walks(&self) -> bool {
        true
    }

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args = Args::new(arguments);
        let (pattern, path, glob) =
            (args.string("pattern")?, args.optional_string("path")?, args.optional_string("glob")?);
        let regex = RegexBuilder::new(pattern)
            .case_insensitive(args.flag("caseInsensitive")?)
            .size_limit(1 << 20)
            .build()
            .map_err(|error| ToolError::Arguments(format!("bad regular expression: {error}")))?;
        let filter = glob
            .map(Glob::new)
            .transpose()
            .map_err(|error| ToolError::Arguments(format!("bad glob: {error}")))?
            .map(|glob| glob.compile_matcher());
        let start = start_of(context.workspace, path)?;
        let mut matches = Vec::new();
        let mut more = false;
        walk(context, &start, &mut |file| {
            if filter.as_ref().is_some_and(|f| !file.matches(|path| f.is_match(path))) {
                return true;
            }
            if file.path != start && !context.paths.file(&file.relative) {
                return true;
            }
            let Some(text) = read_text(file.path) else { return true };
            for (index, line) in text.lines().enumerate() {
                if regex.is_match(line) {
                    if matches.len() == MAX_MATCHES {
                        more = true;
                        return false;
                    }
                    let shown: String = line.chars().take(MAX_LINE_CHARS).collect();
                    matches.push(format!("{}:{}: {shown}", file.relative, index + 1));
                }
            }
            true
        });
        let mut content = if matches.is_empty() { "No matches.".to_string() } else { matches.join("\n") };
        if more {
            content.push_str(&format!("\n[stopped at {MAX_MATCHES} matches; narrow the pattern or the path]"));
        }
        Ok(ToolOutput::success(content, Some(json!({ "matches": matches.len(), "truncated": more }))))
    }
}

/// A file's text, or `None` for binary and oversized files.
fn read_text(path: &Path) -> Option<String> {
    let meta = fs::metadata(path).ok()?;
    if meta.len() > MAX_SEARCHED_BYTES {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    let (file, _) = super::workspace::open_regular(path, "").ok()?;
    file.take(MAX_SEARCHED_BYTES).read_to_end(&mut bytes).ok()?;
    if !is_text(&bytes, false) {
        return None;
    }
    String::from_utf8(bytes).ok()
}
