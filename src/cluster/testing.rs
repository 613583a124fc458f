//! What the cluster's unit tests share: a session's lease as the database would show it, and
//! a holder node that answers calls as a test scripts it (or not at all: paused, its
//! sockets open).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::forward::Call;
use super::Node;
use crate::config::ClusterConfig;
use crate::store::cluster::{Claim, LeaseBook, Membership, NodeRow, Owner};
use crate::store::postgres::listen::{Listener, OnCommit};
use crate::store::StoreError;

/// A session's lease as the database shows it: held by the node at `url` unless
/// `expired`; each look at it is told on `looked`.
struct Lease {
    url: String,
    expired: AtomicBool,
    looked: Sender<()>,
}

impl Lease {
    fn owner(&self) -> Owner {
        let expired = self.expired.load(Ordering::SeqCst);
        Owner { node_id: "holder".into(), advertise_url: Some(self.url.clone()), epoch: 1, expired }
    }
}

fn unused<T>() -> Result<T, StoreError> {
    Err(StoreError::Unavailable("not used by forwarding".into()))
}

impl Membership for Lease {
    fn owner(&self, _session_id: &str) -> Result<Option<Owner>, StoreError> {
        let _ = self.looked.try_send(());
        Ok(Some(Lease::owner(self)))
    }
    /// Another node holds it: a claim finds its holder.
    fn claim(&self, _session_id: &str, _node: &str, _lease_ms: u64) -> Result<Claim, StoreError> {
        Ok(Claim::Owned(Lease::owner(self)))
    }
    fn heartbeat(&self, _node: &str, _advertise_url: &str) -> Result<(), StoreError> {
        unused()
    }
    fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        unused()
    }
    fn renew(&self, _node: &str, _lease_ms: u64) -> Result<Vec<(String, i64)>, StoreError> {
        unused()
    }
    fn release(&self, _session_id: &str, _node: &str, _epoch: i64) -> Result<bool, StoreError> {
        unused()
    }
    fn orphans(&self, _node: &str, _limit: i64) -> Result<Vec<String>, StoreError> {
        unused()
    }
    fn follow_log(&self, _on_commit: OnCommit) -> Result<Listener, StoreError> {
        unused()
    }
    fn log_position(&self) -> Result<u64, StoreError> {
        unused()
    }
    fn agree(&self, _name: &str, _proposed: &str) -> Result<String, StoreError> {
        unused()
    }
}

/// A holder that takes calls and answers the n-th with `answers`' n-th: the raw HTTP
/// answer, or `None` for none at all (the call is held open, unanswered). It stops taking
/// calls once `answers` is closed. Its URL, and what it heard of each call (its head).
pub fn holder(answers: Receiver<Option<&'static str>>) -> (String, Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (heard, calls) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        let mut silent: Vec<TcpStream> = Vec::new();
        for mut call in listener.incoming().flatten() {
            let mut request = [0u8; 4096];
            let read = call.read(&mut request).unwrap_or(0);
            let _ = heard.send(String::from_utf8_lossy(&request[..read]).into_owned());
            match answers.recv() {
                Ok(Some(answer)) => {
                    let _ = call.write_all(answer.as_bytes());
                }
                Ok(None) => silent.push(call),
                Err(_) => return,
            }
        }
    });
    (url, calls)
}

pub const OK: Option<&str> = Some("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");

/// A node (lease period 300 ms) whose session is held at `url` (its lease `expired` or
/// not), and where it tells of each look at the lease.
pub fn node(url: &str, expired: bool) -> (Arc<Node>, Receiver<()>) {
    let (looked, looks) = crossbeam_channel::unbounded();
    let lease = Lease { url: url.to_string(), expired: AtomicBool::new(expired), looked };
    let config = ClusterConfig { lease_ms: 300, ..ClusterConfig::default() };
    (Node::new(&config, "secret", Arc::new(lease), LeaseBook::new("here")), looks)
}

pub fn call(method: &str, target: &str) -> Call {
    Call { method: method.into(), target: target.into(), headers: Vec::new(), stream: false }
}
