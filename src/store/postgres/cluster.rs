//! Membership and session leases (`store/cluster.rs`) in `cluster_nodes` and
//! `session_leases` (schema 0002), on pooled connections, and the writer's fence check.

use std::sync::Arc;

use super::super::cluster::{Claim, LeaseBook, Membership, NodeRow, Owner};
use super::super::{StoreError, WriteOp};
use super::conn::{Pool, Tx};

/// A time as RFC 3339 in UTC, with milliseconds.
macro_rules! rfc3339 {
    ($column:literal) => {
        concat!("to_char(", $column, " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
    };
}

pub(super) struct PgMembership {
    pub(super) pool: Arc<Pool>,
    pub(super) url: Arc<str>,
}

impl Membership for PgMembership {
    fn heartbeat(&self, node: &str, advertise_url: &str) -> Result<(), StoreError> {
        self.pool.with(|conn| {
            conn.exec(
                "INSERT INTO cluster_nodes (id, advertise_url, started_at, heartbeat_at)
                 VALUES ($1, $2, clock_timestamp(), clock_timestamp())
                 ON CONFLICT (id) DO UPDATE SET advertise_url = EXCLUDED.advertise_url, heartbeat_at = EXCLUDED.heartbeat_at",
                &[&node, &advertise_url],
            )
            .map(drop)
        })
    }

    fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        let sql = concat!(
            "SELECT n.id, n.advertise_url, ",
            rfc3339!("n.started_at"),
            ", ",
            rfc3339!("n.heartbeat_at"),
            ", (extract(epoch FROM clock_timestamp() - n.heartbeat_at) * 1000)::bigint,
             (SELECT count(*) FROM session_leases l WHERE l.node_id = n.id AND l.expires_at > clock_timestamp())
             FROM cluster_nodes n ORDER BY n.id"
        );
        self.pool.with(|conn| {
            let rows = conn.query(sql, &[])?;
            Ok(rows
                .iter()
                .map(|row| NodeRow {
                    id: row.get(0),
                    advertise_url: row.get(1),
                    started_at: row.get(2),
                    heartbeat_at: row.get(3),
                    heartbeat_age_ms: row.get(4),
                    live_sessions: row.get(5),
                })
                .collect())
        })
    }

    fn claim(&self, session_id: &str, node: &str, lease_ms: u64) -> Result<Claim, StoreError> {
        let lease_ms = lease_ms as f64;
        self.pool.with(|conn| {
            // Free, expired, or the caller's own: taken (a lease of another node, or one that
            // ran out, gets a new epoch; the caller's live one keeps its epoch).
            let taken = conn.opt(
                "INSERT INTO session_leases (session_id, node_id, epoch, expires_at)
                 VALUES ($1, $2, nextval('lease_epochs'), clock_timestamp() + $3 * interval '1 millisecond')
                 ON CONFLICT (session_id) DO UPDATE SET
                     node_id = EXCLUDED.node_id,
                     epoch = CASE WHEN session_leases.node_id = EXCLUDED.node_id
                                   AND session_leases.expires_at > clock_timestamp()
                             THEN session_leases.epoch ELSE EXCLUDED.epoch END,
                     expires_at = EXCLUDED.expires_at
                 WHERE session_leases.node_id = EXCLUDED.node_id OR session_leases.expires_at <= clock_timestamp()
                 RETURNING epoch",
                &[&session_id, &node, &lease_ms],
            )?;
            if let Some(row) = taken {
                return Ok(Claim::Held { epoch: row.get(0) });
            }
            match owner_on(conn, session_id)? {
                Some(owner) => Ok(Claim::Owned(owner)),
                // Released between the two statements: the next claim takes it.
                None => Err(StoreError::Busy),
            }
        })
    }

    fn renew(&self, node: &str, lease_ms: u64) -> Result<Vec<(String, i64)>, StoreError> {
        let lease_ms = lease_ms as f64;
        self.pool.with(|conn| {
            let rows = conn.query(
                "UPDATE session_leases SET expires_at = clock_timestamp() + $2 * interval '1 millisecond'
                 WHERE node_id = $1 AND expires_at > clock_timestamp() RETURNING session_id, epoch",
                &[&node, &lease_ms],
            )?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })
    }

    fn release(&self, session_id: &str, node: &str, epoch: i64) -> Result<bool, StoreError> {
        self.pool.with(|conn| {
            let gone = conn.exec(
                "DELETE FROM session_leases WHERE session_id = $1 AND node_id = $2 AND epoch = $3",
                &[&session_id, &node, &epoch],
            )?;
            Ok(gone > 0)
        })
    }

    fn orphans(&self, node: &str, limit: i64) -> Result<Vec<String>, StoreError> {
        self.pool.with(|conn| {
            let rows = conn.query(
                "SELECT session_id FROM session_leases WHERE expires_at <= clock_timestamp() OR node_id = $1
                 ORDER BY expires_at LIMIT $2",
                &[&node, &limit],
            )?;
            Ok(rows.iter().map(|row| row.get(0)).collect())
        })
    }

    fn follow_log(&self, on_commit: super::listen::OnCommit) -> Result<super::listen::Listener, StoreError> {
        super::listen::Listener::start(&self.url, on_commit)
    }

    fn log_position(&self) -> Result<u64, StoreError> {
        self.pool
            .with(|conn| Ok(conn.one("SELECT value FROM meta WHERE key = 'seq_last'", &[])?.get::<_, i64>(0) as u64))
    }

    fn agree(&self, name: &str, proposed: &str) -> Result<String, StoreError> {
        self.pool.with(|conn| {
            conn.exec(
                "INSERT INTO cluster_values (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[&name, &proposed],
            )?;
            Ok(conn.one("SELECT value FROM cluster_values WHERE name = $1", &[&name])?.get(0))
        })
    }

    fn owner(&self, session_id: &str) -> Result<Option<Owner>, StoreError> {
        self.pool.with(|conn| owner_on(conn, session_id))
    }
}

fn owner_on(conn: &mut super::conn::Conn, session_id: &str) -> Result<Option<Owner>, StoreError> {
    let row = conn.opt(
        "SELECT l.node_id, n.advertise_url, l.epoch, l.expires_at <= clock_timestamp()
         FROM session_leases l LEFT JOIN cluster_nodes n ON n.id = l.node_id WHERE l.session_id = $1",
        &[&session_id],
    )?;
    Ok(row.map(|row| Owner { node_id: row.get(0), advertise_url: row.get(1), epoch: row.get(2), expired: row.get(3) }))
}

/// Refuses the batch if one of its messages writes a session `book` says this node may not
/// write (see `store/cluster.rs`): one read of the lease rows for the whole transaction, which
/// stay locked for share until it ends. A refused batch is tried again a message at a time
/// (`group_commit.rs`), so only the fenced message fails.
pub(super) fn fence(tx: &mut Tx<'_>, book: &LeaseBook, messages: &[&[WriteOp]]) -> Result<(), StoreError> {
    let sessions = super::super::cluster::sessions_written(messages.iter().flat_map(|ops| ops.iter()));
    if sessions.is_empty() {
        return Ok(());
    }
    let rows = tx.query(
        "SELECT session_id, node_id, epoch, expires_at > clock_timestamp() FROM session_leases
         WHERE session_id = ANY($1) FOR SHARE",
        &[&sessions],
    )?;
    for session in &sessions {
        let row = rows.iter().find(|row| row.get::<_, &str>(0) == session);
        let lease = row.map(|row| (row.get::<_, &str>(1), row.get::<_, i64>(2), row.get::<_, bool>(3)));
        book.admits(session, lease)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::super::conformance::session;
    use super::super::super::contract::{SessionReads, Writes};
    use super::super::{pg_cluster, Postgres};
    use super::*;
    use crate::domain::{Message, Role, SessionStatus};

    /// A node: a backend fenced by its own lease book, and its membership.
    struct TestNode {
        backend: Postgres,
        book: Arc<LeaseBook>,
        membership: Arc<dyn Membership>,
        handle: Option<crate::store::WriterHandle>,
    }

    impl TestNode {
        fn open(url: &str, id: &str) -> TestNode {
            let book = LeaseBook::new(id);
            let (backend, handle) = Postgres::open(url, 4, None, Some(Arc::clone(&book))).expect("opens");
            let membership = backend.membership();
            TestNode { backend, book, membership, handle: Some(handle) }
        }

        fn claim(&self, session: &str, lease_ms: u64) -> Claim {
            let started = std::time::Instant::now();
            let claim = self.membership.claim(session, self.book.node(), lease_ms).expect("claims");
            if let Claim::Held { epoch } = claim {
                self.book.hold(session, epoch, started + std::time::Duration::from_millis(lease_ms));
            }
            claim
        }

        /// A delta of `session` alone: not kept, streamed by the other nodes.
        fn stream_delta(&self, session: &str) -> Result<(), StoreError> {
            let delta = super::super::super::cluster::streamed_delta(session);
            let append = WriteOp::AppendLog { entries: vec![None], floor: 0, keep: 1000, live: vec![(0, delta)] };
            self.backend.submit_and_wait(vec![append]).map(drop)
        }

        fn say(&self, session: &str, text: &str) -> Result<(), StoreError> {
            let message = Message::text_of(Role::User, text);
            let op = WriteOp::AppendMessage { session_id: session.into(), message, updated_at: "now".into() };
            self.backend.submit_and_wait(vec![op]).map(drop)
        }
    }

    impl Drop for TestNode {
        fn drop(&mut self) {
            if let Some(handle) = self.handle.take() {
                handle.shutdown();
            }
        }
    }

    /// The database's clock passing `ms`, seen through a lease's expiry: waits until the
    /// lease row says it has run out (a deadline, never a fixed sleep).
    fn until_expired(node: &TestNode, session: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !node.membership.owner(session).expect("reads").is_some_and(|owner| owner.expired) {
            assert!(std::time::Instant::now() < deadline, "the lease never ran out");
            std::thread::yield_now();
        }
    }

    #[test]
    fn one_node_holds_a_session_at_a_time_and_a_node_that_lost_its_lease_cannot_write() {
        let Some(database) = pg_cluster::database() else { return };
        let (a, b) = (TestNode::open(&database.url, "node-a"), TestNode::open(&database.url, "node-b"));
        a.backend.submit_and_wait(vec![session("s", SessionStatus::Idle)]).expect("the session commits");
        for node in [&a, &b] {
            node.membership.heartbeat(node.book.node(), "http://127.0.0.1:1").expect("beats");
        }

        // Of many claims at once from both nodes, all of one node's win and none of the other's.
        let claims: Vec<(String, Claim)> = std::thread::scope(|scope| {
            let racing: Vec<_> = (0..16)
                .map(|n| {
                    let node = if n % 2 == 0 { &a } else { &b };
                    scope.spawn(move || (node.book.node().to_string(), node.claim("s", 60_000)))
                })
                .collect();
            racing.into_iter().map(|claim| claim.join().unwrap()).collect()
        });
        let winners: std::collections::BTreeSet<&str> =
            claims.iter().filter(|(_, claim)| matches!(claim, Claim::Held { .. })).map(|(n, _)| n.as_str()).collect();
        assert_eq!(winners.len(), 1, "{claims:?}");
        let (holder, other) = if winners.contains("node-a") { (&a, &b) } else { (&b, &a) };
        let Claim::Owned(owner) = other.claim("s", 60_000) else { panic!("the other node cannot take it") };
        assert_eq!(
            (owner.node_id.as_str(), owner.advertise_url.as_deref()),
            (holder.book.node(), Some("http://127.0.0.1:1"))
        );
        assert!(holder.say("s", "from the holder").is_ok());
        let refused = other.say("s", "from the other");
        assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");

        // The holder stops renewing (paused): its lease runs out, the other takes the session
        // with a new epoch, and the holder's writes are refused from then on.
        let Claim::Held { epoch: first } = holder.claim("s", 200) else { panic!("its own lease is kept") };
        until_expired(holder, "s");
        let Claim::Held { epoch: second } = other.claim("s", 60_000) else { panic!("an expired lease is taken") };
        assert!(second > first, "{second} > {first}");
        let fenced = holder.say("s", "after losing it");
        assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
        // Its deltas too: other nodes would stream them to their clients.
        let fenced = holder.stream_delta("s");
        assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
        assert!(other.stream_delta("s").is_ok());
        assert!(other.say("s", "from the new holder").is_ok());
        assert_eq!(holder.membership.renew(holder.book.node(), 60_000).expect("renews"), vec![]);
        let texts: Vec<String> = a.backend.messages("s").expect("reads").iter().map(|m| m.text()).collect::<Vec<_>>();
        assert_eq!(texts, ["from the holder", "from the new holder"]);

        // Released, it is free again: the first node takes it back at yet another epoch.
        assert!(other.membership.release("s", other.book.node(), second).expect("releases"));
        other.book.drop_session("s");
        let Claim::Held { epoch: third } = holder.claim("s", 60_000) else { panic!("a released lease is free") };
        assert!(third > second);
        assert!(holder.say("s", "back again").is_ok());

        let nodes = a.membership.nodes().expect("lists");
        let listed: Vec<(&str, i64)> = nodes.iter().map(|n| (n.id.as_str(), n.live_sessions)).collect();
        let expected = if holder.book.node() == "node-a" {
            [("node-a", 1), ("node-b", 0)]
        } else {
            [("node-a", 0), ("node-b", 1)]
        };
        assert_eq!(listed, expected);
        assert!(nodes.iter().all(|n| n.heartbeat_at.ends_with('Z') && n.heartbeat_age_ms >= 0), "{nodes:?}");
    }
}
