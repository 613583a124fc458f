//! The file tools: read_file, list_directory, write_file, edit_file.

use std::fs;

use serde_json::{json, Map, Value};

use super::args::Args;
use super::schema;
use super::workspace::{write_regular, LISTING_CAP};
use crate::domain::ToolSchema;
use crate::engine::tools::{Permission, Tool, ToolContext, ToolError, ToolOutput};
use crate::policy::MatchOn;

/// Lines `read_file` returns when the call gives no limit.
const DEFAULT_LINE_LIMIT: u64 = 2000;

pub struct ReadFile {
    /// Bytes read at most from one file.
    pub read_limit: usize,
}

impl Tool for ReadFile {
    fn changes_files(&self) -> bool {
        false
    }

    fn schema(&self) -> ToolSchema {
        schema(
            "read_file",
            "Read a text file from the workspace, with line numbers. Use offset and limit to page through long files.",
            "filesystem",
            json!({
                "type": "object",
                "properties": {
                    "path": { "type": "string", "description": "Path relative to the workspace." },
                    "offset": { "type": "integer", "minimum": 1, "description": "First line to return (1-based)." },
                    "limit": { "type": "integer", "minimum": 1, "description": "How many lines to return." }
                },
                "required": ["path"]
            }),
        )
    }

    fn default_permission(&self) -> Permission {
        Permission::Auto
    }

    fn matches_on(&self) -> MatchOn {
        MatchOn::Path("path", ".")
    }

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args = Args::new(arguments);
        let path = args.string("path")?;
        let offset = args.optional_u64("offset")?.unwrap_or(1).max(1);
        let limit = args.optional_u64("limit")?.unwrap_or(DEFAULT_LINE_LIMIT).max(1);
        let file = context.workspace.read(path, self.read_limit)?;
        if !file.text {
            let content = format!("{}: binary file ({}, {} bytes); not shown.", file.path, file.mime_type, file.size);
            return Ok(ToolOutput::success(
                content,
                Some(json!({ "path": file.path, "binary": true, "size": file.size })),
            ));
        }
        let text = String::from_utf8_lossy(&file.bytes);
        let lines: Vec<&str> = text.lines().collect();
        let first = (offset - 1) as usize;
        let shown: Vec<String> = lines
            .iter()
            .enumerate()
            .skip(first)
            .take(limit as usize)
            .map(|(index, line)| format!("{:>6}\t{line}", index + 1))
            .collect();
        let mut content = shown.join("\n");
        let last = first + shown.len();
        if shown.is_empty() {
            content = format!("{}: no lines at offset {offset} (the file has {} lines).", file.path, lines.len());
        } else if last < lines.len() || first > 0 {
            content.push_str(&format!("\n[lines {}-{last} of {}; use offset to read more]", first + 1, lines.len()));
        }
        if file.truncated {
            content.push_str(&format!(
                "\n[the file is {} bytes; only the first {} were read]",
                file.size,
                file.bytes.len()
            ));
        }
        Ok(ToolOutput::success(
            content,
            Some(json!({ "path": file.path, "lines": lines.len(), "truncated": file.truncated })),
        ))
    }
}

pub struct ListDirectory;

impl Tool for ListDirectory {
    fn changes_files(&self) -> bool {
        false
    }

    fn schema(&self) -> ToolSchema {
        schema(
            "list_directory",
            "List a directory of the workspace: directories first (ending in /), then files with their sizes.",
            "filesystem",
            json!({
                "type": "object",
                "properties": { "path": { "type": "string", "description": "Directory relative to the workspace; default `.`." } }
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
        let path = Args::new(arguments).optional_string("path")?.unwrap_or(".");
        let mut listing = context.workspace.list(path, LISTING_CAP)?;
        // Its own name was judged with the call; each entry, and whether a rule covers
        // everything in it, by the call's judge of paths (`ToolContext::paths`).
        let before = listing.entries.len();
        match context.paths.contents(&listing.path) {
            true => listing.entries.retain(|entry| match entry.is_dir {
                true => context.paths.directory(&entry.path),
                false => context.paths.file(&entry.path),
            }),
            false => listing.entries.clear(),
        }
        let mut lines: Vec<String> = listing
            .entries
            .iter()
            .map(|entry| match (entry.is_dir, entry.size) {
                (true, _) => format!("{}/", entry.name),
                (false, Some(size)) => format!("{} ({size} bytes)", entry.name),
                (false, None) => entry.name.clone(),
            })
            .collect();
        if lines.is_empty() {
            let empty = if before == 0 { "is empty" } else { "has no entry that can be shown" };
            lines.push(format!("{} {empty}.", listing.path));
        }
        if listing.truncated {
            lines.push(format!("[only the first {LISTING_CAP} entries are shown]"));
        }
        Ok(ToolOutput::success(
            lines.join("\n"),
            Some(json!({ "path": listing.path, "entries": listing.entries.len() })),
        ))
    }
}

pub struct WriteFile;

impl Tool for WriteFile {
    fn schema(&self) -> ToolSchema {
        schema(
            "write_file",
            "Create or overwrite a file in the workspace with the given content. Parent directories are created.",
            "filesystem",
            json!({
                "type": "object",
                "properties": {
                    "path": { "type": "string", "description": "Path relative to the workspace." },
                    "content": { "type": "string", "description": "The whole new content of the file." }
                },
                "required": ["path", "content"]
            }),
        )
    }

    fn default_permission(&self) -> Permission {
        Permission::Ask
    }

    fn matches_on(&self) -> MatchOn {
        MatchOn::Path("path", ".")
    }

    fn content_arguments(&self) -> &'static [&'static str] {
        &["content"]
    }

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args = Args::new(arguments);
        let (path, content) = (args.string("path")?, args.string("content")?);
        let target = context.workspace.resolve(path)?;
        if target == context.workspace.root() || target.is_dir() {
            return Err(ToolError::Refused(format!("{path} is a directory")));
        }
        let created = !target.exists();
        if let Some(parent) = target.parent() {
            if let Err(error) = fs::create_dir_all(parent) {
                return Err(ToolError::Io(format!("cannot create the directories of {path}"), error));
            }
        }
        write_regular(&target, path, content.as_bytes())?;
        let relative = context.workspace.relative(&target);
        let verb = if created { "Created" } else { "Overwrote" };
        Ok(ToolOutput::success(
            format!("{verb} {relative} ({} bytes).", content.len()),
            Some(json!({ "path": relative, "bytes": content.len(), "created": created })),
        ))
    }
}

pub struct EditFile {
    pub read_limit: usize,
}

impl Tool for EditFile {
    fn schema(&self) -> ToolSchema {
        schema(
            "edit_file",
            "Replace an exact string in a workspace file. The string must appear exactly once unless replaceAll is true; include enough surrounding text to make it unique.",
            "filesystem",
            json!({
                "type": "object",
                "properties": {
                    "path": { "type": "string", "description": "Path relative to the workspace." },
                    "oldString": { "type": "string", "description": "The exact text to replace." },
                    "newString": { "type": "string", "description": "The replacement." },
                    "replaceAll": { "type": "boolean", "description": "Replace every occurrence." }
                },
                "required": ["path", "oldString", "newString"]
            }),
        )
    }

    fn default_permission(&self) -> Permission {
        Permission::Ask
    }

    fn matches_on(&self) -> MatchOn {
        MatchOn::Path("path", ".")
    }

    fn content_arguments(&self) -> &'static [&'static str] {
        &["oldString", "newString"]
    }

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args = Args::new(arguments);
        let (path, old, new) = (args.string("path")?, args.string("oldString")?, args.string("newString")?);
        let replace_all = args.flag("replaceAll")?;
        if old.is_empty() {
            return Err(ToolError::Arguments("`oldString` cannot be empty; use write_file to create a file".into()));
        }
        let file = context.workspace.read(path, self.read_limit)?;
        if !file.text || file.truncated {
            return Err(ToolError::Refused(format!("{path} is binary or too large to edit")));
        }
        let before = String::from_utf8_lossy(&file.bytes).into_owned();
        let count = before.matches(old).count();
        if count == 0 {
            return Err(ToolError::Refused(format!(
                "`oldString` was not found in {path}; read the file and copy the text exactly"
            )));
        }
        if count > 1 && !replace_all {
            return Err(ToolError::Refused(format!(
                "`oldString` appears {count} times in {path}; include more surrounding text to make it unique, or set replaceAll"
            )));
        }
        let after = if replace_all { before.replace(old, new) } else { before.replacen(old, new, 1) };
        let target = context.workspace.resolve(path)?;
        write_regular(&target, path, after.as_bytes())?;
        let diff = unified_diff(&file.path, &before, &after);
        Ok(ToolOutput::success(
            format!("Edited {}: {count} replacement(s).", file.path),
            Some(json!({ "path": file.path, "replacements": count, "diff": diff })),
        ))
    }
}

/// A unified diff of one hunk: the lines between the common prefix and the common suffix,
/// with three lines of context. Edits replace exact strings, so one hunk shows them all.
pub fn unified_diff(path: &str, before: &str, after: &str) -> String {
    let old: Vec<&str> = before.lines().collect();
    let new: Vec<&str> = after.lines().collect();
    let prefix = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    let max_suffix = old.len().min(new.len()) - prefix;
    let suffix = old.iter().rev().zip(new.iter().rev()).take(max_suffix).take_while(|(a, b)| a == b).count();
    let context = 3;
    let start = prefix.saturating_sub(context);
    let old_end = (old.len() - suffix + context).min(old.len());
    let new_end = (new.len() - suffix + context).min(new.len());
    let mut diff = format!(
        "--- a/{path}\n+++ b/{path}\n@@ -{},{} +{},{} @@\n",
        start + 1,
        old_end - start,
        start + 1,
        new_end - start
    );
    for line in &old[start..prefix] {
        diff.push_str(&format!(" {line}\n"));
    }
    for line in &old[prefix..old.len() - suffix] {
        diff.push_str(&format!("-{line}\n"));
    }
    for line in &new[prefix..new.len() - suffix] {
        diff.push_str(&format!("+{line}\n"));
    }
    for line in &old[old.len() - suffix..old_end] {
        diff.push_str(&format!(" {line}\n"));
    }
    diff
}

#[cfg(test)]
mod tests {
    use super::unified_diff;

    #[test]
    fn diffs_one_changed_region_with_context() {
        let before = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let after = "a\nb\nc\nd\nE\nE2\nf\ng\nh\n";
        let diff = unified_diff("x.txt", before, after);
        assert_eq!(diff, "--- a/x.txt\n+++ b/x.txt\n@@ -2,7 +2,8 @@\n b\n c\n d\n-e\n+E\n+E2\n f\n g\n h\n");
    }
}
