//! A session's workspace: every path a tool or a file route touches is resolved here.
//!
//! Pure filesystem logic, run on whichever thread asks (a run's worker, a request thread).
//! A path must be relative; `..` may not climb above the root; and symlinks are resolved
//! component by component before the containment check, so a link pointing outside (to a
//! file or a directory) is refused, and so is a dangling link, whose target a write would
//! create wherever it points.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

#[derive(Debug)]
pub enum PathError {
    /// Absolute, empty where a file is needed, or otherwise malformed.
    Invalid(String),
    /// Escapes the workspace, directly or through a symlink.
    Outside(String),
    NotFound(String),
    /// Inside the workspace, but a path of the server's own (its data dir, its config file,
    /// `/proc`) that no workspace may reach.
    Protected(String),
    /// Not a regular file or directory: a FIFO, a socket or a device, which could block a
    /// reader forever or stream without end.
    NotRegular(String),
    Io(String),
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathError::Invalid(why) => write!(f, "{why}"),
            PathError::Outside(path) => write!(f, "{path} is outside the workspace"),
            PathError::NotFound(path) => write!(f, "{path} does not exist"),
            PathError::Protected(path) => write!(f, "{path} is a protected server path"),
            PathError::NotRegular(path) => {
                write!(f, "{path} is not a regular file (a FIFO, socket or device); it is not opened")
            }
            PathError::Io(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for PathError {}

/// Directories a tree walk never enters.
pub const SKIPPED_DIRS: &[&str] = &[".git", "target", "node_modules", ".hg", ".svn", "__pycache__", ".venv"];

/// The longest path and file name Linux accepts (`PATH_MAX`, `NAME_MAX`); longer ones are a
/// client's mistake (400), not the server's (500).
const MAX_PATH_BYTES: usize = 4096;
const MAX_NAME_BYTES: usize = 255;

/// Entries a listing returns at most.
pub const LISTING_CAP: usize = 500;

/// Paths no workspace may reach, whatever the roots allow: resolved paths inside them are
/// refused and walks skip them.
#[derive(Debug, Clone, Default)]
pub struct Protected(Arc<[PathBuf]>);

impl Protected {
    /// `paths` that exist are canonicalized; `/proc` is always protected (the server's
    /// environment, with every key in it, is `/proc/<pid>/environ`, and each of its threads is
    /// reachable as `/proc/<tid>`).
    pub fn new(paths: impl IntoIterator<Item = PathBuf>) -> Protected {
        let mut all: Vec<PathBuf> = paths.into_iter().map(|p| p.canonicalize().unwrap_or(p)).collect();
        all.push(PathBuf::from("/proc"));
        Protected(all.into())
    }

    /// Whether `path` (absolute, symlinks resolved) is one of them or inside one.
    pub fn covers(&self, path: &Path) -> bool {
        self.0.iter().any(|protected| path.starts_with(protected))
    }

    /// The protected path `path` is at or inside, if any.
    pub fn covering(&self, path: &Path) -> Option<&Path> {
        self.0.iter().find(|protected| path.starts_with(protected)).map(PathBuf::as_path)
    }
}

/// Why a directory cannot be a session's workspace.
#[derive(Debug)]
pub enum WorkspaceRefusal {
    /// Not an absolute path to an existing directory.
    Invalid(String),
    /// Outside every root the tenant may use, or overlapping a protected path.
    Forbidden(String),
}

/// Where a tenant's sessions may work: inside one of its roots (symlinks resolved) and never
/// at or inside a protected path. A workspace may contain a protected path (the default
/// workspace, the start directory, usually holds the data dir): its tools cannot reach it.
/// The roots default to the default workspace.
#[derive(Debug, Clone)]
pub struct WorkspacePolicy {
    default_workspace: PathBuf,
    roots: Vec<PathBuf>,
    tenant_roots: HashMap<String, Vec<PathBuf>>,
    protected: Protected,
}

impl WorkspacePolicy {
    /// Roots are canonicalized; one that does not exist is an error naming it.
    pub fn new(
        default_workspace: PathBuf,
        roots: &[PathBuf],
        tenant_roots: &[(String, Vec<PathBuf>)],
        protected: Protected,
    ) -> Result<WorkspacePolicy, (PathBuf, std::io::Error)> {
        let canonical = |paths: &[PathBuf]| -> Result<Vec<PathBuf>, (PathBuf, std::io::Error)> {
            paths.iter().map(|p| p.canonicalize().map_err(|e| (p.clone(), e))).collect()
        };
        let roots = if roots.is_empty() { vec![default_workspace.clone()] } else { canonical(roots)? };
        let mut by_tenant = HashMap::new();
        for (tenant, paths) in tenant_roots {
            by_tenant.insert(tenant.clone(), canonical(paths)?);
        }
        Ok(WorkspacePolicy { default_workspace, roots, tenant_roots: by_tenant, protected })
    }

    pub fn protected(&self) -> &Protected {
        &self.protected
    }

    fn roots_of(&self, tenant: &str) -> &[PathBuf] {
        self.tenant_roots.get(tenant).map_or(&self.roots, Vec::as_slice)
    }

    /// The workspace of a session created without one: the default workspace if the tenant may
    /// use it, else the tenant's first root.
    pub fn default_for(&self, tenant: &str) -> PathBuf {
        let roots = self.roots_of(tenant);
        if roots.iter().any(|root| self.default_workspace.starts_with(root)) {
            self.default_workspace.clone()
        } else {
            roots.first().cloned().unwrap_or_else(|| self.default_workspace.clone())
        }
    }

    /// Checks a requested workspace; returns it canonical.
    pub fn check(&self, tenant: &str, requested: &Path) -> Result<PathBuf, WorkspaceRefusal> {
        if !requested.is_absolute() {
            return Err(WorkspaceRefusal::Invalid("workspace must be an absolute path".into()));
        }
        let canonical = match requested.canonicalize() {
            Ok(path) if path.is_dir() => path,
            _ => {
                let why = format!("workspace {} is not an existing directory", requested.display());
                return Err(WorkspaceRefusal::Invalid(why));
            }
        };
        self.allows(tenant, &canonical)?;
        Ok(canonical)
    }

    /// Whether `tenant` may work in `canonical` (already resolved).
    pub fn allows(&self, tenant: &str, canonical: &Path) -> Result<(), WorkspaceRefusal> {
        if let Some(protected) = self.protected.covering(canonical) {
            let why = format!(
                "workspace {} is inside {}, which the server protects",
                canonical.display(),
                protected.display()
            );
            return Err(WorkspaceRefusal::Forbidden(why));
        }
        if !self.roots_of(tenant).iter().any(|root| canonical.starts_with(root)) {
            let why = format!("workspace {} is outside the directories this server allows", canonical.display());
            return Err(WorkspaceRefusal::Forbidden(why));
        }
        Ok(())
    }

    /// Opens a stored session's workspace, checking it again: the roots may have changed since
    /// the session was created, or the directory may have been replaced by a link.
    pub fn open(&self, tenant: &str, stored: &Path) -> Result<Workspace, PathError> {
        let workspace = Workspace::new(stored, &self.protected)?;
        self.allows(tenant, workspace.root()).map_err(|refusal| match refusal {
            WorkspaceRefusal::Invalid(why) | WorkspaceRefusal::Forbidden(why) => PathError::Protected(why),
        })?;
        Ok(workspace)
    }
}

#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    protected: Protected,
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    /// POSIX path relative to the workspace root.
    pub path: String,
    pub is_dir: bool,
    pub size: Option<u64>,
    /// Milliseconds since the epoch.
    pub modified_ms: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Listing {
    pub path: String,
    pub entries: Vec<Entry>,
    pub truncated: bool,
}

#[derive(Debug, Clone)]
pub struct FileContent {
    pub path: String,
    pub name: String,
    pub size: u64,
    pub modified_ms: i64,
    pub mime_type: String,
    /// The bytes read, at most the limit.
    pub bytes: Vec<u8>,
    /// Whether `bytes` is UTF-8 text (else binary, to be shown as base64 or described).
    pub text: bool,
    pub truncated: bool,
}

impl Workspace {
    /// A workspace rooted at an existing directory (canonicalized).
    pub fn new(root: &Path, protected: &Protected) -> Result<Workspace, PathError> {
        let root = root.canonicalize().map_err(|e| PathError::Io(format!("workspace {}: {e}", root.display())))?;
        Ok(Workspace { root, protected: protected.clone() })
    }

    /// Whether a walk must skip `path` (absolute, no symlinks on the way).
    pub fn is_protected(&self, path: &Path) -> bool {
        self.protected.covers(path)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a relative path to an absolute one inside the workspace. The path need not
    /// exist (a file about to be written), but every existing component is resolved.
    pub fn resolve(&self, relative: &str) -> Result<PathBuf, PathError> {
        if relative.contains('\0') {
            return Err(PathError::Invalid("a path cannot contain NUL".into()));
        }
        if relative.len() > MAX_PATH_BYTES {
            return Err(PathError::Invalid(format!("a path is at most {MAX_PATH_BYTES} bytes")));
        }
        let requested = Path::new(relative);
        if requested.components().any(|c| c.as_os_str().len() > MAX_NAME_BYTES) {
            return Err(PathError::Invalid(format!("a file name is at most {MAX_NAME_BYTES} bytes")));
        }
        if requested.is_absolute() {
            return Err(PathError::Invalid(format!("{relative} is absolute; paths are relative to the workspace")));
        }
        // Lexical pass: `.` is dropped and `..` may not climb above the root.
        let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
        for component in requested.components() {
            match component {
                Component::Normal(part) => parts.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    if parts.pop().is_none() {
                        return Err(PathError::Outside(relative.into()));
                    }
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(PathError::Invalid(format!("{relative} is absolute")));
                }
            }
        }
        // Physical pass: follow each existing component, symlinks included.
        let mut resolved = self.root.clone();
        let mut rest = parts.into_iter();
        for part in rest.by_ref() {
            let next = resolved.join(part);
            match fs::symlink_metadata(&next) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    resolved = next.canonicalize().map_err(|_| {
                        PathError::Outside(format!("{relative} (a symlink whose target does not exist)"))
                    })?;
                }
                Ok(_) => resolved = next,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    resolved = next;
                    break;
                }
                Err(error) => return Err(PathError::Io(format!("{relative}: {error}"))),
            }
            if !resolved.starts_with(&self.root) {
                return Err(PathError::Outside(relative.into()));
            }
        }
        // Whatever is left does not exist yet, so it cannot be a link.
        for part in rest {
            resolved.push(part);
        }
        if !resolved.starts_with(&self.root) {
            return Err(PathError::Outside(relative.into()));
        }
        if self.protected.covers(&resolved) {
            return Err(PathError::Protected(relative.into()));
        }
        Ok(resolved)
    }

    /// The POSIX path of `absolute` relative to the root (`.` for the root itself).
    pub fn relative(&self, absolute: &Path) -> String {
        let relative = absolute.strip_prefix(&self.root).unwrap_or(absolute);
        let text = relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
        if text.is_empty() {
            ".".into()
        } else {
            text
        }
    }

    /// A directory's entries: directories first, then files, each by name; at most `cap`.
    pub fn list(&self, relative: &str, cap: usize) -> Result<Listing, PathError> {
        let directory = self.resolve(relative)?;
        let meta = fs::metadata(&directory).map_err(|_| PathError::NotFound(relative.into()))?;
        if !meta.is_dir() {
            return Err(PathError::Invalid(format!("{relative} is not a directory")));
        }
        let reader = fs::read_dir(&directory).map_err(|e| PathError::Io(format!("{relative}: {e}")))?;
        let mut entries: Vec<Entry> = reader
            .filter_map(Result::ok)
            .map(|dirent| {
                let path = dirent.path();
                // Follow links for the type, so a link to a directory lists as one.
                let meta = fs::metadata(&path).ok();
                Entry {
                    name: dirent.file_name().to_string_lossy().into_owned(),
                    path: self.relative(&path),
                    is_dir: meta.as_ref().is_some_and(|m| m.is_dir()),
                    size: meta.as_ref().filter(|m| m.is_file()).map(|m| m.len()),
                    modified_ms: meta.as_ref().and_then(modified_ms),
                }
            })
            .collect();
        entries.sort_by(|a, b| b.is_dir.cmp(&a.is_dir).then_with(|| a.name.cmp(&b.name)));
        let truncated = entries.len() > cap;
        entries.truncate(cap);
        Ok(Listing { path: self.relative(&directory), entries, truncated })
    }

    /// Reads a file, at most `limit` bytes.
    pub fn read(&self, relative: &str, limit: usize) -> Result<FileContent, PathError> {
        if relative.trim().is_empty() {
            return Err(PathError::Invalid("a file path is required".into()));
        }
        let path = self.resolve(relative)?;
        let meta = fs::metadata(&path).map_err(|_| PathError::NotFound(relative.into()))?;
        if meta.is_dir() {
            return Err(PathError::Invalid(format!("{relative} is a directory")));
        }
        let (file, meta) = open_regular(&path, relative)?;
        let mut bytes = Vec::with_capacity(meta.len().min(limit as u64) as usize);
        file.take(limit as u64 + 1).read_to_end(&mut bytes).map_err(|e| PathError::Io(format!("{relative}: {e}")))?;
        let truncated = bytes.len() > limit;
        bytes.truncate(limit);
        let mime_type = mime_for(&path);
        let text = !mime_type.is_some_and(|m| m.starts_with("image/")) && is_text(&bytes, truncated);
        if text && truncated {
            // Do not end inside a UTF-8 character.
            let valid = match std::str::from_utf8(&bytes) {
                Ok(_) => bytes.len(),
                Err(error) => error.valid_up_to(),
            };
            bytes.truncate(valid);
        }
        let mime_type = match (mime_type, text) {
            (None, true) => "text/plain".to_string(),
            (None, false) => "application/octet-stream".to_string(),
            (Some(mime), _) => mime.to_string(),
        };
        Ok(FileContent {
            path: self.relative(&path),
            name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            size: meta.len(),
            modified_ms: modified_ms(&meta).unwrap_or(0),
            mime_type,
            bytes,
            text,
            truncated,
        })
    }
}

/// Opens a regular file for reading without ever blocking in `open` (a FIFO with no writer
/// would block it forever): `O_NONBLOCK`, then the opened file itself is checked, so a file
/// swapped for a FIFO after a check is refused too.
pub fn open_regular(path: &Path, shown: &str) -> Result<(fs::File, fs::Metadata), PathError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| PathError::Io(format!("{shown}: {e}")))?;
    let meta = file.metadata().map_err(|e| PathError::Io(format!("{shown}: {e}")))?;
    if !meta.is_file() {
        return Err(PathError::NotRegular(shown.into()));
    }
    Ok((file, meta))
}

/// Creates or replaces a regular file's content, refusing anything else: opening a FIFO to
/// write blocks until a reader comes, and a device file could be anything.
pub fn write_regular(path: &Path, shown: &str, content: &[u8]) -> Result<(), PathError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if fs::symlink_metadata(path).is_ok_and(|meta| !meta.is_file()) {
        return Err(PathError::NotRegular(shown.into()));
    }
    let mut file =
        fs::OpenOptions::new().write(true).create(true).custom_flags(nix::libc::O_NONBLOCK).open(path).map_err(
            |e| match e.raw_os_error() {
                Some(nix::libc::ENXIO) => PathError::NotRegular(shown.into()),
                _ => PathError::Io(format!("cannot write {shown}: {e}")),
            },
        )?;
    let meta = file.metadata().map_err(|e| PathError::Io(format!("{shown}: {e}")))?;
    if !meta.is_file() {
        return Err(PathError::NotRegular(shown.into()));
    }
    file.set_len(0)
        .and_then(|()| file.write_all(content))
        .map_err(|e| PathError::Io(format!("cannot write {shown}: {e}")))
}

fn modified_ms(meta: &fs::Metadata) -> Option<i64> {
    let modified = meta.modified().ok()?;
    Some(modified.duration_since(UNIX_EPOCH).ok()?.as_millis() as i64)
}

/// Text is UTF-8 without NUL bytes; a cut at the read limit may end mid-character.
pub fn is_text(bytes: &[u8], cut: bool) -> bool {
    if bytes.iter().take(8192).any(|&b| b == 0) {
        return false;
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(error) => cut && error.error_len().is_none() && bytes.len() - error.valid_up_to() < 4,
    }
}

/// A MIME type from the extension, for the types clients render specially.
fn mime_for(path: &Path) -> Option<&'static str> {
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match extension.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "ico" => "image/x-icon",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "json" => "application/json",
        "md" => "text/markdown",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "ts" | "tsx" => "text/typescript",
        "rs" => "text/x-rust",
        "py" => "text/x-python",
        "toml" => "application/toml",
        "yaml" | "yml" => "application/yaml",
        "txt" | "log" => "text/plain",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, Workspace, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("src/deep")).unwrap();
        fs::write(dir.path().join("src/main.rs"), "fn main() {}\n").unwrap();
        fs::write(outside.path().join("secret"), "s3cret").unwrap();
        symlink(outside.path().join("secret"), dir.path().join("to-secret")).unwrap();
        symlink(outside.path(), dir.path().join("to-outside-dir")).unwrap();
        symlink("src/main.rs", dir.path().join("to-main")).unwrap();
        symlink(outside.path().join("missing"), dir.path().join("dangling")).unwrap();
        let workspace = Workspace::new(dir.path(), &Protected::default()).unwrap();
        (dir, workspace, outside)
    }

    #[test]
    fn resolves_inside_and_refuses_escapes() {
        let (dir, ws, _outside) = setup();
        let root = dir.path().canonicalize().unwrap();
        assert_eq!(ws.resolve("src/main.rs").unwrap(), root.join("src/main.rs"));
        assert_eq!(ws.resolve("./src/../src/main.rs").unwrap(), root.join("src/main.rs"));
        assert_eq!(ws.resolve("new/dir/file.txt").unwrap(), root.join("new/dir/file.txt"));
        assert_eq!(ws.resolve("to-main").unwrap(), root.join("src/main.rs"), "a link inside is fine");
        assert_eq!(ws.resolve("").unwrap(), root);
        assert!(matches!(ws.resolve("/etc/passwd"), Err(PathError::Invalid(_))));
        assert!(matches!(ws.resolve("../x"), Err(PathError::Outside(_))));
        assert!(matches!(ws.resolve("src/../../x"), Err(PathError::Outside(_))));
        assert!(matches!(ws.resolve("to-secret"), Err(PathError::Outside(_))));
        assert!(matches!(ws.resolve("to-outside-dir/secret"), Err(PathError::Outside(_))));
        assert!(matches!(ws.resolve("to-outside-dir/new-file"), Err(PathError::Outside(_))));
        assert!(matches!(ws.resolve("dangling"), Err(PathError::Outside(_))));
        assert!(matches!(ws.resolve(&"a".repeat(256)), Err(PathError::Invalid(_))));
        assert!(matches!(ws.resolve(&"a/".repeat(2100)), Err(PathError::Invalid(_))));
        assert!(ws.resolve(&"a".repeat(255)).is_ok());
    }

    #[test]
    fn lists_directories_first_and_caps() {
        let (dir, ws, _outside) = setup();
        fs::write(dir.path().join("a.txt"), "a").unwrap();
        let listing = ws.list(".", 500).unwrap();
        let names: Vec<&str> = listing.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names[0], "src");
        assert!(names.contains(&"a.txt"));
        let capped = ws.list(".", 2).unwrap();
        assert!(capped.truncated);
        assert_eq!(capped.entries.len(), 2);
    }

    #[test]
    fn reads_text_binary_and_truncates_on_a_character_boundary() {
        let (dir, ws, _outside) = setup();
        fs::write(dir.path().join("bin.dat"), [0u8, 1, 2, 3]).unwrap();
        fs::write(dir.path().join("accents.txt"), "éééé").unwrap();
        let binary = ws.read("bin.dat", 100).unwrap();
        assert!(!binary.text);
        assert_eq!(binary.mime_type, "application/octet-stream");
        let cut = ws.read("accents.txt", 5).unwrap();
        assert!(cut.text && cut.truncated);
        assert_eq!(std::str::from_utf8(&cut.bytes).unwrap(), "éé");
        assert!(matches!(ws.read("nope.txt", 10), Err(PathError::NotFound(_))));
        assert!(matches!(ws.read("src", 10), Err(PathError::Invalid(_))));
    }
}
