//! Hot reload: the `kestrel-plugins` thread polls every plugin's `web/` tree and manifest.
//!
//! A `web/` tree whose revision (`revision`) changed is remembered; once no tree has changed
//! for `QUIET`, one `plugins.changed` goes out with every changed plugin's new revision, so a
//! burst of saves (an editor's write-rename-chmod, a build writing ten files) is one event. A
//! changed `plugin.json` reloads the plugin list (a manifest that now fails is reported with a
//! `notice`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::{revision, Plugins};
use crate::bus::Bus;
use crate::domain::{Event, NoticeLevel, PluginRevision};

/// How often the trees are looked at.
const POLL: Duration = Duration::from_millis(200);
/// How long the trees must stay unchanged before a burst of changes is announced.
const QUIET: Duration = Duration::from_millis(300);

/// The running watcher; dropping it stops the thread and waits for it.
pub struct Watcher {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What to do once the plugin list was read again (register the plugins' tools anew).
pub type OnReload = Box<dyn Fn() + Send>;

/// Starts watching, if hot reload is on.
pub fn start(plugins: Arc<Plugins>, bus: Bus, reloaded: OnReload) -> std::io::Result<Option<Watcher>> {
    if !plugins.hot_reload() {
        return Ok(None);
    }
    let (stop, stopped) = bounded::<()>(0);
    let thread = std::thread::Builder::new()
        .name("kestrel-plugins".into())
        .spawn(move || State::new(&plugins).run(&plugins, &bus, &reloaded, &stopped))?;
    Ok(Some(Watcher { stop: Some(stop), thread: Some(thread) }))
}

struct State {
    revisions: HashMap<String, String>,
    manifests: HashMap<PathBuf, Option<SystemTime>>,
    /// Plugins changed since the last announcement, and when the latest change was seen.
    changed: Vec<String>,
    last_change: Option<Instant>,
}

impl State {
    fn new(plugins: &Plugins) -> State {
        let mut state =
            State { revisions: HashMap::new(), manifests: HashMap::new(), changed: Vec::new(), last_change: None };
        state.revisions = current_revisions(plugins);
        state.manifests = manifest_times(plugins);
        state
    }

    fn run(mut self, plugins: &Plugins, bus: &Bus, reloaded: &OnReload, stopped: &Receiver<()>) {
        loop {
            match stopped.recv_timeout(POLL) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            self.look(plugins, bus, reloaded);
        }
    }

    fn look(&mut self, plugins: &Plugins, bus: &Bus, reloaded: &OnReload) {
        let manifests = manifest_times(plugins);
        if manifests != self.manifests {
            plugins.reload();
            reloaded();
            for problem in plugins.problems() {
                bus.publish(None, Event::Notice { level: NoticeLevel::Warn, message: problem, session_id: None });
            }
            self.manifests = manifest_times(plugins);
        }
        let now = current_revisions(plugins);
        for (id, revision) in &now {
            if self.revisions.get(id) != Some(revision) && !self.changed.contains(id) {
                self.changed.push(id.clone());
            }
        }
        if now != self.revisions {
            self.last_change = Some(Instant::now());
            self.revisions = now;
        }
        let quiet = self.last_change.is_some_and(|at| at.elapsed() >= QUIET);
        if quiet && !self.changed.is_empty() {
            let changed: Vec<PluginRevision> = std::mem::take(&mut self.changed)
                .into_iter()
                .filter_map(|id| {
                    self.revisions.get(&id).map(|revision| PluginRevision { id, revision: revision.clone() })
                })
                .collect();
            self.last_change = None;
            if !changed.is_empty() {
                bus.publish(None, Event::PluginsChanged { plugins: changed, at: crate::time::now_rfc3339() });
            }
        }
    }
}

/// Every active plugin's `web/` revision.
fn current_revisions(plugins: &Plugins) -> HashMap<String, String> {
    plugins.snapshot().iter().filter(|p| p.manifest.is_ok()).map(|p| (p.id.clone(), revision(&p.dir))).collect()
}

/// Every plugin directory's manifest modification time, and the directories there are.
fn manifest_times(plugins: &Plugins) -> HashMap<PathBuf, Option<SystemTime>> {
    let Some(dir) = &plugins.config.dir else { return HashMap::new() };
    let Ok(entries) = std::fs::read_dir(dir) else { return HashMap::new() };
    entries
        .flatten()
        .map(|entry| entry.path().join("plugin.json"))
        .filter(|manifest| manifest.exists())
        .map(|manifest| {
            let modified = std::fs::metadata(&manifest).and_then(|m| m.modified()).ok();
            (manifest, modified)
        })
        .collect()
}
