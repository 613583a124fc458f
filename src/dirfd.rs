//! Directory handles that never follow a symbolic link.
//!
//! A path checked once can be swapped for a link before it is used (a directory exchanged for
//! a link to `/etc` with `renameat2(RENAME_EXCHANGE)` between the check and the write). Work
//! that must stay inside a tree a hostile process can change (a workspace being restored or
//! captured, a plugin's `web/` walk) therefore goes through `Dir`: an open descriptor of a
//! directory, and operations relative to it (`openat`, `mkdirat`, `unlinkat`, `renameat`),
//! each on one name, never a path, each refusing to follow a link (`O_NOFOLLOW`,
//! `AT_SYMLINK_NOFOLLOW`). A name is one component: no `/`, not `.` or `..`. Whatever a racer
//! swaps, an operation either acts on the object under that name in this directory, or fails.
//!
//! Pure system calls on the caller's thread; nothing here blocks on a FIFO (files are opened
//! with `O_NONBLOCK` and checked to be regular on the opened handle).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// What a directory entry is, as `lstat` sees it: a link is a link, never its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A FIFO, a socket or a device.
    Other,
}

impl Kind {
    fn of(stat: &FileStat) -> Kind {
        match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }
}

/// One entry of a directory: its name and what it is (never followed).
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: OsString,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits (`& 0o7777`).
    pub mode: u32,
    /// The modification time, in nanoseconds since the epoch (0 before it).
    pub modified_ns: u128,
    /// The inode's change time, likewise: unlike `modified_ns` no call can set it back.
    pub changed_ns: u128,
    pub inode: u64,
    pub device: u64,
}

/// An open directory.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

/// The flags every directory is opened with.
fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// A name is one path component.
fn component(name: &OsStr) -> io::Result<&OsStr> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a file name")));
    }
    Ok(name)
}

impl Dir {
    /// Opens `path` as a directory. Links in the components above the last are followed (the
    /// caller vouches for them: a workspace root canonicalized and checked against its
    /// tenant's roots); the last must be a real directory.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = nix::fcntl::open(path, dir_flags(), Mode::empty())?;
        Ok(Dir { fd })
    }

    /// The child directory `name`, which must be a directory and not a link to one.
    pub fn dir(&self, name: &OsStr) -> io::Result<Dir> {
        let fd = openat(&self.fd, component(name)?, dir_flags(), Mode::empty())?;
        Ok(Dir { fd })
    }

    /// The directory at `relative` (components split on `/`), each one opened without
    /// following links.
    pub fn descend(&self, relative: &str) -> io::Result<Dir> {
        let mut parts = relative.split('/').filter(|part| !part.is_empty());
        let Some(first) = parts.next() else { return self.try_clone() };
        let mut at = self.dir(OsStr::new(first))?;
        for part in parts {
            at = at.dir(OsStr::new(part))?;
        }
        Ok(at)
    }

    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir { fd: self.fd.try_clone()? })
    }

    /// `name` as `lstat` sees it; `None` when nothing has that name.
    pub fn entry(&self, name: &OsStr) -> io::Result<Option<Entry>> {
        match fstatat(&self.fd, component(name)?, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(entry_of(name.to_os_string(), &stat))),
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            Err(errno) => Err(errno.into()),
        }
    }

    /// The directory itself, as its handle sees it.
    pub fn itself(&self) -> io::Result<Entry> {
        Ok(entry_of(OsString::from("."), &fstat(&self.fd)?))
    }

    /// Every entry but `.` and `..`, unsorted. An entry gone between the listing and its
    /// `lstat` is left out.
    pub fn entries(&self) -> io::Result<Vec<Entry>> {
        let listing = openat(&self.fd, ".", dir_flags(), Mode::empty())?;
        let mut stream = nix::dir::Dir::from_fd(listing)?;
        let mut entries = Vec::new();
        for item in stream.iter() {
            let item = item?;
            let name = OsStr::from_bytes(item.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            match fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => entries.push(entry_of(name.to_os_string(), &stat)),
                Err(nix::errno::Errno::ENOENT) => {}
                Err(errno) => return Err(errno.into()),
            }
        }
        Ok(entries)
    }

    /// Opens the regular file `name` to read: never through a link, never blocking on a FIFO
    /// (`O_NONBLOCK`), and refused unless the opened handle is a regular file. Its size as the
    /// handle sees it comes along.
    pub fn open_file(&self, name: &OsStr) -> io::Result<(File, Entry)> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
        let fd = openat(&self.fd, component(name)?, flags, Mode::empty()).map_err(not_followed)?;
        let stat = fstat(&fd)?;
        let entry = entry_of(name.to_os_string(), &stat);
        if entry.kind != Kind::File {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a regular file")));
        }
        Ok((File::from(fd), entry))
    }

    /// Reads the regular file `name`, at most `limit` bytes: `Err(TooLarge)` past it, however
    /// large the file has grown since anyone looked.
    pub fn read_file(&self, name: &OsStr, limit: u64) -> Result<(Vec<u8>, Entry), ReadError> {
        let (file, entry) = self.open_file(name).map_err(ReadError::Io)?;
        if entry.size > limit {
            return Err(ReadError::TooLarge);
        }
        let mut content = Vec::with_capacity(entry.size as usize);
        file.take(limit + 1).read_to_end(&mut content).map_err(ReadError::Io)?;
        if content.len() as u64 > limit {
            return Err(ReadError::TooLarge);
        }
        Ok((content, entry))
    }

    /// Makes the directory `name` (`mode`, less the umask).
    pub fn make_dir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        Ok(mkdirat(&self.fd, component(name)?, Mode::from_bits_truncate(mode))?)
    }

    /// Creates a new file `name` to write (it must not exist: `O_EXCL`, which also refuses a
    /// link in its place), readable only by its owner until `set_mode`.
    pub fn create_new(&self, name: &OsStr) -> io::Result<File> {
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, component(name)?, flags, Mode::from_bits_truncate(0o600))?;
        Ok(File::from(fd))
    }

    /// Removes the file, link or other non-directory `name` (a link itself, never its target).
    pub fn remove_file(&self, name: &OsStr) -> io::Result<()> {
        Ok(unlinkat(&self.fd, component(name)?, UnlinkatFlags::NoRemoveDir)?)
    }

    /// Removes the empty directory `name`.
    pub fn remove_dir(&self, name: &OsStr) -> io::Result<()> {
        Ok(unlinkat(&self.fd, component(name)?, UnlinkatFlags::RemoveDir)?)
    }

    /// Removes `name` whatever it is; a directory with everything in it, each level opened
    /// without following links, so a link inside is removed and never entered.
    pub fn remove_all(&self, name: &OsStr) -> io::Result<()> {
        match self.entry(name)? {
            None => Ok(()),
            Some(entry) if entry.kind == Kind::Dir => {
                let child = self.dir(name)?;
                for inner in child.entries()? {
                    child.remove_all(&inner.name)?;
                }
                self.remove_dir(name)
            }
            Some(_) => self.remove_file(name),
        }
    }

    /// Renames `from` to `to` in this directory; `to` is replaced if it is a file or a link
    /// (the link itself: a rename never writes through one).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        Ok(renameat(&self.fd, component(from)?, &self.fd, component(to)?)?)
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Sets a file's permission bits through its handle.
pub fn set_mode(file: &File, mode: u32) -> io::Result<()> {
    Ok(fchmod(file, Mode::from_bits_truncate(mode & 0o7777))?)
}

/// Why `Dir::read_file` read nothing.
#[derive(Debug)]
pub enum ReadError {
    TooLarge,
    Io(io::Error),
}

fn entry_of(name: OsString, stat: &FileStat) -> Entry {
    let nanos = |secs: i64, nsec: i64| (secs.max(0) as u128) * 1_000_000_000 + nsec.max(0) as u128;
    Entry {
        name,
        kind: Kind::of(stat),
        size: stat.st_size.max(0) as u64,
        mode: stat.st_mode & 0o7777,
        modified_ns: nanos(stat.st_mtime, stat.st_mtime_nsec),
        changed_ns: nanos(stat.st_ctime, stat.st_ctime_nsec),
        inode: stat.st_ino,
        device: stat.st_dev,
    }
}

/// `openat` with `O_NOFOLLOW` on a link answers `ELOOP`; say what happened.
fn not_followed(errno: nix::errno::Errno) -> io::Error {
    match errno {
        nix::errno::Errno::ELOOP => io::Error::new(io::ErrorKind::InvalidInput, "a symbolic link is not followed"),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn nothing_is_reached_through_a_link() {
        let (root, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        symlink(outside.path(), root.path().join("link")).unwrap();
        symlink(outside.path().join("secret"), root.path().join("file-link")).unwrap();
        let dir = Dir::open(root.path()).unwrap();
        assert!(dir.dir(OsStr::new("link")).is_err(), "a link to a directory is not entered");
        assert!(dir.descend("link").is_err());
        assert!(dir.open_file(OsStr::new("file-link")).is_err(), "a link to a file is not opened");
        assert_eq!(dir.entry(OsStr::new("link")).unwrap().unwrap().kind, Kind::Symlink);
        dir.remove_all(OsStr::new("link")).unwrap();
        assert!(outside.path().join("secret").exists(), "removing a link leaves its target");
        assert!(dir.dir(OsStr::new("..")).is_err() && dir.dir(OsStr::new("a/b")).is_err());
    }

    #[test]
    fn a_fifo_is_refused_without_blocking_and_reads_are_capped() {
        let root = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&root.path().join("pipe"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::write(root.path().join("big"), vec![b'x'; 100]).unwrap();
        let dir = Dir::open(root.path()).unwrap();
        assert!(dir.open_file(OsStr::new("pipe")).is_err());
        assert!(matches!(dir.read_file(OsStr::new("big"), 99), Err(ReadError::TooLarge)));
        assert_eq!(dir.read_file(OsStr::new("big"), 100).unwrap().0.len(), 100);
    }

    #[test]
    fn remove_all_removes_a_tree_but_not_what_its_links_point_at() {
        let (root, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(outside.path().join("keep"), "k").unwrap();
        std::fs::create_dir_all(root.path().join("t/a/b")).unwrap();
        std::fs::write(root.path().join("t/a/b/f"), "f").unwrap();
        symlink(outside.path(), root.path().join("t/a/out")).unwrap();
        let dir = Dir::open(root.path()).unwrap();
        dir.remove_all(OsStr::new("t")).unwrap();
        assert!(!root.path().join("t").exists());
        assert!(outside.path().join("keep").exists());
    }
}
