//! Forwarding without waiting on a holder that lost its lease (docs/cluster.md, failures): a
//! node paused or cut off keeps its sockets open, so a call to it neither fails nor answers.
//! While a forwarded call waits, the forwarding node looks at the session's lease once a
//! lease period: a holder that no longer holds it is not waited for, and the client hears a
//! retryable 503. Whatever the old holder does once its lease ran out is refused (fencing).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, RecvTimeoutError};

use super::forward::{unanswered, Call, ForwardError};
use super::{Node, READ_TIMEOUT};

impl Node {
    /// A read (GET, HEAD) of a session, which waits `lease_ms` at most for each of the
    /// holder's bytes: when they are late, a holder that still holds the session is asked
    /// again (a read changes nothing), and one that no longer does (paused or cut off past
    /// its lease) is not waited for: the client hears a retryable 503.
    pub(super) fn read_watching(&self, call: &Call, url: &str, session: &str) -> Result<ureq::Response, ForwardError> {
        let deadline = Instant::now() + READ_TIMEOUT;
        loop {
            match self.call_with(&self.watch_agent, call, url, &[]) {
                Err(error) if timed_out(&error) => {
                    if Instant::now() >= deadline || !self.still_held_at(session, url) {
                        return Err(ForwardError::Unavailable(format!("the node at {url} no longer answers")));
                    }
                }
                answered => return answered.map_err(|error| unanswered(url, &error)),
            }
        }
    }

    /// Any other call: `send` on a `kestrel-forward` thread, while this one looks at the
    /// session's lease each `lease_ms`. The thread ends when the holder answers or its read
    /// times out.
    pub(super) fn send_watching(
        self: &Arc<Self>,
        call: Call,
        url: &str,
        body: Vec<u8>,
        session: &str,
    ) -> Result<ureq::Response, ForwardError> {
        let (sender, answered) = bounded(1);
        let (node, target) = (Arc::clone(self), url.to_string());
        std::thread::Builder::new()
            .name("kestrel-forward".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                let _ = sender.send(node.send(&call, &target, &body));
            })
            .map_err(|error| ForwardError::Unavailable(format!("no thread to forward on: {error}")))?;
        let every = Duration::from_millis(self.lease_ms());
        loop {
            match answered.recv_timeout(every) {
                Ok(answer) => return answer,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(ForwardError::Unavailable(format!("the call to {url} was lost")));
                }
                Err(RecvTimeoutError::Timeout) if !self.still_held_at(session, url) => {
                    return Err(ForwardError::Unavailable(format!("the node at {url} no longer holds the session")));
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Whether the node at `url` still holds `session`'s lease (when the database cannot say,
    /// it is given the benefit of the doubt).
    fn still_held_at(&self, session: &str, url: &str) -> bool {
        match self.membership.owner(session) {
            Ok(Some(owner)) => !owner.expired && owner.advertise_url.as_deref() == Some(url),
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

/// Whether a call failed by waiting too long for the other node's bytes.
fn timed_out(error: &ureq::Transport) -> bool {
    use std::error::Error as _;
    let io = error.source().and_then(|source| source.downcast_ref::<std::io::Error>());
    io.is_some_and(|io| matches!(io.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, holder, node, OK};
    use super::*;

    #[test]
    fn a_read_a_slow_holder_still_holds_is_asked_again_and_one_that_lost_it_is_not_waited_for() {
        let (answer, answers) = crossbeam_channel::unbounded();
        let (url, _) = holder(answers);
        let read = call("GET", "/api/sessions/s");
        // Silent at first, then answered: the holder still holds the lease.
        answer.send(None).unwrap();
        answer.send(OK).unwrap();
        let (held, looks) = node(&url, false);
        let answered = held.read_watching(&read, &url, "s").expect("asked again");
        assert_eq!(answered.status(), 200);
        assert_eq!(looks.try_iter().count(), 1, "the lease was looked at once, after the first wait");
        // Silent, and the lease ran out: a retryable refusal, not a wait.
        answer.send(None).unwrap();
        let (lost, _) = node(&url, true);
        assert!(matches!(lost.read_watching(&read, &url, "s"), Err(ForwardError::Unavailable(_))));
    }

    #[test]
    fn a_write_is_waited_for_while_its_holder_holds_the_lease_and_given_up_once_it_does_not() {
        let (answer, answers) = crossbeam_channel::unbounded();
        let (url, _) = holder(answers);
        let write = || call("POST", "/api/sessions/s/messages");
        // Answered only after the forwarding node has looked at the lease and waited on.
        let (held, looks) = node(&url, false);
        std::thread::spawn(move || {
            if looks.recv().is_ok() {
                let _ = answer.send(OK);
                let _ = answer.send(None);
            }
        });
        let sent = held.send_watching(write(), &url, b"{}".to_vec(), "s").expect("waited for");
        assert_eq!(sent.status(), 200);
        // The holder stays silent and its lease ran out: given up.
        let (lost, _) = node(&url, true);
        let given_up = lost.send_watching(write(), &url, b"{}".to_vec(), "s");
        assert!(matches!(given_up, Err(ForwardError::Unavailable(_))));
    }
}
