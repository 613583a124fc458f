//! The read-only workspace routes: `GET /files` (a listing) and `GET /file` (one file).

use base64::Engine as _;
use serde::Serialize;
use serde_json::{json, Value};

use super::{json, ApiError, Caller, KestrelApi};
use crate::http::{Reply, Request};
use crate::time::rfc3339_from_millis;
use crate::tools::workspace::LISTING_CAP;

/// The protocol's `WorkspaceFile`, serialized without copying the content again.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WorkspaceFile<'a> {
    path: &'a str,
    name: &'a str,
    size: u64,
    modified_at: String,
    mime_type: &'a str,
    encoding: &'static str,
    content: &'a str,
    truncated: bool,
    binary: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    lines: Option<usize>,
}

pub fn list(api: &KestrelApi, caller: &Caller, id: &str, request: &Request) -> Result<Reply, ApiError> {
    let workspace = api.engine.workspace(&caller.tenant, id)?;
    let path = request.query("path").filter(|p| !p.is_empty()).unwrap_or(".");
    let listing = workspace.list(path, LISTING_CAP)?;
    let entries: Vec<Value> = listing
        .entries
        .iter()
        .map(|entry| {
            let mut value = json!({
                "name": entry.name,
                "path": entry.path,
                "type": if entry.is_dir { "directory" } else { "file" },
            });
            if let Some(size) = entry.size {
                value["size"] = json!(size);
            }
            if let Some(modified) = entry.modified_ms {
                value["modifiedAt"] = json!(rfc3339_from_millis(modified));
            }
            value
        })
        .collect();
    let mut body = json!({ "path": listing.path, "entries": entries });
    if listing.truncated {
        body["truncated"] = json!(true);
    }
    Ok(json(200, &body))
}

pub fn read(api: &KestrelApi, caller: &Caller, id: &str, request: &Request, limit: usize) -> Result<Reply, ApiError> {
    let workspace = api.engine.workspace(&caller.tenant, id)?;
    let path = request
        .query("path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad_request("invalid_path", "`path` is required"))?;
    let file = workspace.read(path, limit)?;
    let (encoding, content) = if file.text {
        ("utf8", String::from_utf8_lossy(&file.bytes).into_owned())
    } else {
        ("base64", base64::engine::general_purpose::STANDARD.encode(&file.bytes))
    };
    let body = WorkspaceFile {
        path: &file.path,
        name: &file.name,
        size: file.size,
        modified_at: rfc3339_from_millis(file.modified_ms),
        mime_type: &file.mime_type,
        encoding,
        lines: file.text.then(|| content.lines().count()),
        content: &content,
        truncated: file.truncated,
        binary: !file.text,
    };
    Ok(json(200, &body))
}
