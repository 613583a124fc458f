//! A hostile process inside the workspace racing restores and captures: directories swapped
//! for links to the outside (`renameat2(RENAME_EXCHANGE)`) mid-restore, files swapped for
//! links to a large outside file or for FIFOs mid-capture. Nothing outside the workspace may
//! change or appear, no capture may pass `max_bytes`, and no session may wedge.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
use serde_json::json;

use crate::support::TestServer;

/// Every file under `root` with its bytes, every directory as `None`; links as their target.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let kind = fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_dir() {
                found.insert(path.clone(), None);
                pending.push(path);
            } else if kind.is_symlink() {
                found.insert(path.clone(), Some(fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes()));
            } else {
                found.insert(path.clone(), Some(fs::read(&path).unwrap()));
            }
        }
    }
    found
}

/// A thread that keeps exchanging `workspace/<name>` with a link to `target` until stopped,
/// counting the exchanges that took place.
struct Racer {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Racer {
    fn start(workspace: &Path, name: &str, target: &Path) -> Racer {
        let (stop, swaps) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (workspace, name, target) = (workspace.to_path_buf(), name.to_string(), target.to_path_buf());
        let (stopped, counted) = (Arc::clone(&stop), Arc::clone(&swaps));
        let thread = std::thread::spawn(move || {
            let (real, link) = (workspace.join(&name), workspace.join(format!("{name}.link")));
            let mut spare = 0;
            while !stopped.load(Ordering::Relaxed) {
                match fs::symlink_metadata(&link) {
                    Ok(meta) if meta.file_type().is_symlink() => {}
                    Ok(_) => {
                        // A restore replaced our link with a real entry: keep it inside, aside.
                        spare += 1;
                        let _ = fs::rename(&link, workspace.join(format!("{name}.spare{spare}")));
                        continue;
                    }
                    Err(_) => {
                        let _ = symlink(&target, &link);
                        continue;
                    }
                }
                // In, then back: the real entry is under its name half of the time.
                for _ in 0..2 {
                    if renameat2(AT_FDCWD, &real, AT_FDCWD, &link, RenameFlags::RENAME_EXCHANGE).is_ok() {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::yield_now();
                }
            }
            // Leave the real entry under its own name.
            if fs::symlink_metadata(&real).is_ok_and(|meta| meta.file_type().is_symlink()) {
                let _ = renameat2(AT_FDCWD, &real, AT_FDCWD, &link, RenameFlags::RENAME_EXCHANGE);
            }
        });
        Racer { stop, swaps, thread: Some(thread) }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.swaps.load(Ordering::Relaxed)
    }
}

fn checkpoint(server: &TestServer, id: &str) -> String {
    let made = server.post(&format!("/api/sessions/{id}/checkpoints"), json!({}));
    assert_eq!(made.status, 201, "{}", made.text);
    made.json["checkpoint"]["id"].as_str().unwrap().to_string()
}

const FILES: usize = 3_000;

/// `dir` holds exactly the files `<prefix>0000…` with `content`.
fn fill(dir: &Path, prefix: &str, content: &str) {
    if dir.exists() {
        fs::remove_dir_all(dir).unwrap();
    }
    fs::create_dir_all(dir).unwrap();
    for n in 0..FILES {
        fs::write(dir.join(format!("{prefix}{n:04}")), content).unwrap();
    }
}

#[test]
fn a_restore_raced_by_a_directory_swapped_for_a_link_never_touches_the_outside() {
    let outside = tempfile::tempdir().unwrap();
    // The outside holds files by every name the restore writes or deletes, as bait.
    for n in 0..FILES {
        fs::write(outside.path().join(format!("f{n:04}")), "outside").unwrap();
        fs::write(outside.path().join(format!("g{n:04}")), "outside").unwrap();
    }
    let before = snapshot(outside.path());
    let server = TestServer::start();
    let work = server.workspace.join("d");
    fill(&work, "f", "checkpoint a");
    let id = server.create_session(json!({}));
    let a = checkpoint(&server, &id);
    fill(&work, "g", "checkpoint b");
    let b = checkpoint(&server, &id);

    let racer = Racer::start(&server.workspace, "d", outside.path());
    for round in 0..6 {
        let target = if round % 2 == 0 { &a } else { &b };
        let restored = server.post(&format!("/api/sessions/{id}/checkpoints/{target}/restore"), json!({}));
        // A swap mid-restore may make parts of it fail (warnings); it never errs outward.
        assert_eq!(restored.status, 200, "{}", restored.text);
    }
    let swaps = racer.finish();
    assert!(swaps > 100, "the racer swapped only {swaps} times");
    assert_eq!(snapshot(outside.path()), before, "nothing outside changed, and nothing was created there");
    let health = server.get(&format!("/api/sessions/{id}"));
    assert_eq!(health.status, 200, "the session still answers");
}

#[test]
fn a_capture_raced_by_links_to_a_large_outside_file_stays_within_its_limit() {
    let outside = tempfile::tempdir().unwrap();
    let big = outside.path().join("big.bin");
    fs::write(&big, vec![b'S'; 8 * 1024 * 1024]).unwrap();
    let server = TestServer::start_with(|config| config.checkpoints.max_bytes = 1024 * 1024);
    for n in 0..200 {
        fs::write(server.workspace.join(format!("small{n:03}.txt")), "small").unwrap();
    }
    fs::write(server.workspace.join("bait.txt"), "bait").unwrap();
    let id = server.create_session(json!({}));
    let racer = Racer::start(&server.workspace, "bait.txt", &big);
    let mut taken = 0;
    for _ in 0..30 {
        let made = server.post(&format!("/api/sessions/{id}/checkpoints"), json!({}));
        match made.status {
            201 => {
                taken += 1;
                let total = made.json["checkpoint"]["totalBytes"].as_u64().unwrap();
                assert!(total <= 1024 * 1024, "a checkpoint of {total} bytes passed max_bytes");
            }
            // Past the limit is refused, never captured.
            _ => made.assert_error(409, "checkpoints_disabled"),
        }
    }
    racer.finish();
    assert!(taken > 0, "some checkpoints were taken");
    let blobs = server.data_dir.join("blobs");
    let largest = walk_sizes(&blobs).into_iter().max().unwrap_or(0);
    assert!(largest < 1024 * 1024, "a blob of {largest} bytes came from outside the workspace");
}

#[test]
fn a_capture_raced_by_a_fifo_never_wedges_the_session() {
    let scratch = tempfile::tempdir().unwrap();
    let fifo = scratch.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let server = TestServer::start();
    fs::write(server.workspace.join("pipe"), "a file, for now").unwrap();
    // Files read after `pipe` is listed and before it is read widen the window.
    for n in 0..300 {
        fs::write(server.workspace.join(format!("a{n:03}.txt")), "x").unwrap();
    }
    let id = server.create_session(json!({}));
    // The racer exchanges `pipe` with a link; swap the link for the FIFO itself, moved in.
    let racer = FifoRacer::start(&server.workspace.join("pipe"), &fifo);
    for _ in 0..20 {
        let made = server.post(&format!("/api/sessions/{id}/checkpoints"), json!({}));
        assert_eq!(made.status, 201, "{}", made.text);
    }
    assert!(racer.finish() > 10, "the FIFO was swapped in");
    // Every later request to the session is answered (the test client gives up after its
    // deadline, which fails the test).
    assert_eq!(server.get(&format!("/api/sessions/{id}/checkpoints")).status, 200);
    assert_eq!(server.post(&format!("/api/sessions/{id}/checkpoints"), json!({})).status, 201);
}

/// Keeps exchanging a regular file with a FIFO.
struct FifoRacer(Racer);

impl FifoRacer {
    fn start(file: &Path, fifo: &Path) -> FifoRacer {
        let (stop, swaps) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (file, fifo) = (file.to_path_buf(), fifo.to_path_buf());
        let (stopped, counted) = (Arc::clone(&stop), Arc::clone(&swaps));
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                if renameat2(AT_FDCWD, &file, AT_FDCWD, &fifo, RenameFlags::RENAME_EXCHANGE).is_ok() {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::yield_now();
            }
        });
        FifoRacer(Racer { stop, swaps, thread: Some(thread) })
    }

    fn finish(self) -> u64 {
        self.0.finish()
    }
}

fn walk_sizes(root: &Path) -> Vec<u64> {
    let mut sizes = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let meta = fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                sizes.push(meta.len());
            }
        }
    }
    sizes
}
