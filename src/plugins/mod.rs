//! Plugins: directories under `plugins.dir`, each with a `plugin.json` (`manifest.rs`) and an
//! optional `web/` tree served as static files at `/plugins/<id>/web/<path>`.
//!
//! A plugin whose manifest does not pass is listed as failed, with why, and reported with a
//! `notice`; it never stops the server. The list is read at start (and again by the hot reload
//! watcher when a manifest changes); readers take a snapshot.

pub mod manifest;
pub mod tool;
pub mod watch;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use serde::Serialize;

use crate::dirfd::{Dir, Kind, ReadError};
pub use manifest::PluginError;
use manifest::{relative_path_ok, Manifest};

/// `[plugins]` in the config file.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginConfig {
    /// Where plugins live; none: no plugins.
    pub dir: Option<PathBuf>,
    /// Watch plugins' `web/` trees and announce saves on `/api/plugins/events`.
    pub hot_reload: bool,
}

/// One plugin directory, loaded or not.
#[derive(Debug, Clone)]
pub struct Plugin {
    /// The manifest's id, or the directory's name when the manifest failed.
    pub id: String,
    pub dir: PathBuf,
    pub manifest: Result<Manifest, PluginError>,
}

/// `PluginInfo` on the wire.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    pub id: String,
    pub name: String,
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `"active"` or `"failed"`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub web: Option<WebInfo>,
    pub tools: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WebInfo {
    /// URLs of the entry module and the stylesheet.
    pub entry: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stylesheet: Option<String>,
    /// A fingerprint of the `web/` tree, while hot reload watches it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// Why a web asset is not served.
#[derive(Debug, PartialEq, Eq)]
pub enum AssetError {
    NotFound,
    /// A path that climbs out, or names something that is not a regular file inside `web/`.
    Forbidden,
}

pub struct Plugins {
    config: PluginConfig,
    reserved_tools: Vec<String>,
    loaded: RwLock<Vec<Plugin>>,
}

impl Plugins {
    /// Reads every plugin directory; `reserved_tools` are names no plugin tool may take.
    pub fn load(config: PluginConfig, reserved_tools: Vec<String>) -> Plugins {
        let plugins = Plugins { config, reserved_tools, loaded: RwLock::new(Vec::new()) };
        plugins.reload();
        plugins
    }

    /// Reads the plugin directories again.
    pub fn reload(&self) {
        let found = match &self.config.dir {
            Some(dir) => scan(dir, &self.reserved_tools),
            None => Vec::new(),
        };
        *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = found;
    }

    /// Every active plugin's tools, ready to register.
    pub fn tools(&self, launcher: &crate::tools::process::Launcher) -> Vec<Box<dyn crate::engine::tools::Tool>> {
        let plugins = self.snapshot();
        let active = plugins.iter().filter_map(|p| p.manifest.as_ref().ok().map(|m| (p, m)));
        let mut tools: Vec<Box<dyn crate::engine::tools::Tool>> = Vec::new();
        for (plugin, manifest) in active {
            for declared in &manifest.tools {
                let tool = tool::PluginTool::new(&manifest.id, plugin.dir.clone(), declared.clone(), launcher.clone());
                tools.push(Box::new(tool));
            }
        }
        tools
    }

    /// What is wrong with the plugins that failed, for notices.
    pub fn problems(&self) -> Vec<String> {
        let plugins = self.snapshot();
        plugins.iter().filter_map(|p| p.manifest.as_ref().err().map(|e| format!("plugin {}: {e}", p.id))).collect()
    }

    pub fn hot_reload(&self) -> bool {
        self.config.hot_reload && self.config.dir.is_some()
    }

    pub fn snapshot(&self) -> Vec<Plugin> {
        self.loaded.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn active_count(&self) -> usize {
        self.snapshot().iter().filter(|p| p.manifest.is_ok()).count()
    }

    /// Every plugin as `GET /api/plugins` lists it.
    pub fn infos(&self) -> Vec<PluginInfo> {
        self.snapshot().iter().map(|plugin| self.info(plugin)).collect()
    }

    fn info(&self, plugin: &Plugin) -> PluginInfo {
        match &plugin.manifest {
            Ok(manifest) => PluginInfo {
                id: manifest.id.clone(),
                name: manifest.name.clone(),
                version: manifest.version.clone(),
                description: manifest.description.clone(),
                status: "active",
                error: None,
                web: manifest.web.as_ref().map(|web| WebInfo {
                    entry: asset_url(&manifest.id, &web.entry),
                    stylesheet: web.stylesheet.as_ref().map(|s| asset_url(&manifest.id, s)),
                    revision: self.hot_reload().then(|| revision(&plugin.dir)),
                }),
                tools: manifest.tools.iter().map(|t| t.name.clone()).collect(),
            },
            Err(error) => PluginInfo {
                id: plugin.id.clone(),
                name: plugin.id.clone(),
                version: String::new(),
                description: None,
                status: "failed",
                error: Some(error.to_string()),
                web: None,
                tools: Vec::new(),
            },
        }
    }

    /// A file of an active plugin's `web/` tree and its content type. Read through directory
    /// handles from the plugin's directory down, none of them following a link: a link
    /// anywhere on the way (`web` itself included) is refused, never resolved.
    pub fn asset(&self, id: &str, path: &str) -> Result<(Vec<u8>, &'static str), AssetError> {
        let plugins = self.snapshot();
        let plugin = plugins.iter().find(|p| p.id == id && p.manifest.is_ok()).ok_or(AssetError::NotFound)?;
        if !relative_path_ok(path) {
            return Err(AssetError::Forbidden);
        }
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        let refused = |error: std::io::Error| match error.kind() {
            std::io::ErrorKind::NotFound => AssetError::NotFound,
            _ => AssetError::Forbidden,
        };
        let web = Dir::open(&plugin.dir).and_then(|dir| dir.dir(OsStr::new("web"))).map_err(refused)?;
        let dir = web.descend(parent).map_err(refused)?;
        match dir.read_file(OsStr::new(name), ASSET_LIMIT) {
            Ok((bytes, _)) => Ok((bytes, content_type(Path::new(name)))),
            Err(ReadError::TooLarge) => Err(AssetError::Forbidden),
            Err(ReadError::Io(error)) => Err(refused(error)),
        }
    }
}

/// What a plugin's web file may do when it is opened on its own (an HTML page or an SVG a
/// link leads to): nothing. `sandbox` gives such a document an opaque origin with no
/// scripts, so it can never reach the console's storage (the token) or script its page. The
/// console's own imports of a plugin's modules and stylesheets are not documents and are
/// unaffected; they run as part of the console, by design.
pub const ASSET_POLICY: &[(&str, &str)] = &[
    (
        "Content-Security-Policy",
        "sandbox; default-src 'none'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'",
    ),
    ("X-Frame-Options", "DENY"),
];

/// The largest web asset served.
const ASSET_LIMIT: u64 = 64 * 1024 * 1024;

/// Entries a revision walk looks at, at most: a `web/` tree past it is fingerprinted by its
/// first entries (and the count), never walked to its end every poll.
const REVISION_ENTRIES: usize = 10_000;

fn asset_url(id: &str, path: &str) -> String {
    format!("/plugins/{id}/web/{path}")
}

/// Every directory under `dir` holding a `plugin.json`, by name; ids must be unique.
fn scan(dir: &Path, reserved_tools: &[String]) -> Vec<Plugin> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        log::warn!("plugins.dir {} cannot be read", dir.display());
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.join("plugin.json").is_file()).collect();
    dirs.sort();
    let mut plugins: Vec<Plugin> = Vec::new();
    let mut taken: Vec<String> = reserved_tools.to_vec();
    for dir in dirs {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // Built-in tools' names and those of the plugins read before are taken.
        let mut manifest = manifest::read(&dir, &taken);
        if let Ok(read) = &manifest {
            if plugins.iter().any(|p| p.id == read.id) {
                manifest = Err(PluginError::IdTaken(read.id.clone()));
            } else if let Err(why) = web_dir_ok(&dir, read.web.is_some()) {
                manifest = Err(why);
            }
        }
        if let Ok(read) = &manifest {
            taken.extend(read.tools.iter().map(|t| t.name.clone()));
        }
        let id = manifest.as_ref().map_or(name, |m| m.id.clone());
        if let Err(error) = &manifest {
            log::warn!("plugin {id}: {error}");
        }
        plugins.push(Plugin { id, dir, manifest });
    }
    plugins
}

/// `web/`, where it exists or the manifest declares one, must be a real directory inside the
/// plugin's directory: a link there (to `/`, say) fails the plugin at load.
fn web_dir_ok(dir: &Path, declared: bool) -> Result<(), PluginError> {
    let found = Dir::open(dir).and_then(|plugin| plugin.entry(OsStr::new("web")));
    match found {
        Ok(Some(entry)) if entry.kind == Kind::Dir => Ok(()),
        Ok(Some(_)) => Err(PluginError::WebNotDirectory),
        Ok(None) if declared => Err(PluginError::WebMissing),
        Ok(None) => Ok(()),
        Err(error) => Err(PluginError::Read(format!("the plugin directory cannot be read: {error}"))),
    }
}

/// A fingerprint of a plugin's `web/` tree: every file's path, size and modification time,
/// hashed. The walk goes through handles that never follow a link (a link is neither entered
/// nor counted) and stops after `REVISION_ENTRIES` entries.
pub fn revision(plugin_dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let mut files = Vec::new();
    let mut seen = 0usize;
    let web = Dir::open(plugin_dir).and_then(|dir| dir.dir(OsStr::new("web")));
    let mut pending: Vec<(Dir, String)> = web.into_iter().map(|dir| (dir, String::new())).collect();
    while let Some((dir, prefix)) = pending.pop() {
        let Ok(entries) = dir.entries() else { continue };
        for entry in entries {
            seen += 1;
            if seen > REVISION_ENTRIES {
                break;
            }
            let path = format!("{prefix}/{}", entry.name.to_string_lossy());
            match entry.kind {
                Kind::Dir => pending.extend(dir.dir(&entry.name).ok().map(|child| (child, path))),
                Kind::File => files.push((path, entry.size, entry.modified_ns)),
                Kind::Symlink | Kind::Other => {}
            }
        }
    }
    files.sort();
    for (path, size, modified) in files {
        hasher.update(path.as_bytes());
        hasher.update(size.to_le_bytes());
        hasher.update(modified.to_le_bytes());
    }
    hasher.update(seen.min(REVISION_ENTRIES + 1).to_le_bytes());
    hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("woff2") => "font/woff2",
        Some("woff") => "font/woff",
        Some("txt" | "md") => "text/plain; charset=utf-8",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    }
}
