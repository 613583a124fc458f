//! The thread long-lived children are started from.
//!
//! `setpriv --pdeathsig KILL` ties a child to the *thread* that forked it: the kernel kills the
//! child when that thread ends. That is right for a command a tool's thread waits for, and
//! wrong for a child that outlives the request that made it (a stdio MCP server started while
//! a BAE session opened, on a pooled connection thread that ends when it idles). Such children
//! are started here, on one `kestrel-spawner` thread that lives as long as anything can still
//! ask it (every `Spawner` clone), so they die with the server, not with a request.

use std::process::{Child, Command};

use crossbeam_channel::{bounded, unbounded, Sender};

/// A request: the command, and where its child goes.
type Job = (Command, Sender<std::io::Result<Child>>);

/// A handle to the spawner thread; the thread ends once every handle is dropped.
#[derive(Debug, Clone)]
pub struct Spawner {
    spawner_tx: Sender<Job>,
}

impl Spawner {
    pub fn start() -> std::io::Result<Spawner> {
        let (spawner_tx, inbox) = unbounded::<Job>();
        std::thread::Builder::new().name("kestrel-spawner".into()).spawn(move || {
            for (mut command, reply) in inbox {
                let _ = reply.send(command.spawn());
            }
        })?;
        Ok(Spawner { spawner_tx })
    }

    /// Starts `command` on the spawner thread.
    pub fn spawn(&self, command: Command) -> std::io::Result<Child> {
        let (reply, child) = bounded(1);
        self.spawner_tx.send((command, reply)).map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
        child.recv().map_err(|_| std::io::Error::other("the spawner thread is gone"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_started_for_a_thread_that_ended_lives_on() {
        let spawner = Spawner::start().unwrap();
        let Some(setpriv) = crate::tools::orphans::find_death_signal_wrapper() else { return };
        let cloned = spawner.clone();
        let mut child = std::thread::spawn(move || {
            let mut command = Command::new(setpriv);
            command.args(["--pdeathsig", "KILL", "--", "sleep", "30"]);
            cloned.spawn(command).unwrap()
        })
        .join()
        .unwrap();
        // The asking thread is gone; the child is not (its parent thread is the spawner's).
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while std::time::Instant::now() < deadline {
            assert!(child.try_wait().unwrap().is_none(), "the child died with the thread that asked for it");
            std::thread::yield_now();
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
