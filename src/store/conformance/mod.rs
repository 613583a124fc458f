//! The store contract (`contract.rs`) as checks every backend must pass. `run_all` takes a
//! way to open one more handle on the same store, standing for one more node; each check
//! opens what it needs, several at once where the contract is about several nodes.
//! `sqlite.rs` runs it on a SQLite file shared by several handles, each with its own writer
//! connection, as several processes would have.

mod limits;
mod messages;
mod schedules;

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Backend, EventQuery, LoggedEvent, SessionPatch, SessionWalk, StoreError, TurnClaim, WriteOp};
use crate::domain::{Message, Role, SessionRecord, SessionStatus, SessionSummary};

/// An open handle and how to close it.
pub type Opened = (Arc<dyn Backend>, Box<dyn FnOnce() + Send>);

/// Opens one more handle (node) on the store under test.
pub type Open<'a> = &'a (dyn Fn(&std::path::Path) -> Result<Opened, StoreError> + Sync);

/// Every check, each on a store of its own under a temporary directory.
pub fn run_all(open: Open<'_>) {
    batches_commit_whole_or_not_at_all(open);
    seqs_are_commit_ordered_however_many_nodes_write(open);
    seqs_never_go_back_when_the_last_events_are_deleted(open);
    a_turn_claim_is_compare_and_set(open);
    recovery_ends_only_what_its_node_held(open);
    a_walk_keeps_each_session_where_it_stood(open);
    the_log_drops_its_oldest_past_capacity_but_never_bae_history(open);
    a_checkpoint_of_unchanged_files_shares_the_manifest_of_its_session(open);
    rules_keep_to_their_tenant_and_session_and_the_audit_log_pages_and_trims(open);
    schedules::schedules_keep_to_their_tenant_and_their_last_fires(open);
    messages::messages_by_id_finds_each_listed_message_of_its_session(open);
    limits::a_tenant_s_sessions_stop_at_the_room_asked_for_on_every_node(open);
    limits::due_deliveries_leave_out_busy_endpoints_and_full_tenants(open);
}

/// A store under a fresh directory, opened `nodes` times.
fn nodes(open: Open<'_>, count: usize) -> (tempfile::TempDir, Vec<Opened>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("conformance.db");
    let opened = (0..count).map(|_| open(&path).expect("the store opens")).collect();
    (dir, opened)
}

fn close(nodes: Vec<Opened>) {
    for (_, closer) in nodes {
        closer();
    }
}

fn write(backend: &dyn Backend, ops: Vec<WriteOp>) -> Result<super::Committed, StoreError> {
    backend.submit_and_wait(ops)
}

/// A session of tenant `t` to insert (other modules' tests use it too).
pub(crate) fn session(id: &str, status: SessionStatus) -> WriteOp {
    WriteOp::InsertSession(SessionRecord {
        summary: SessionSummary {
            id: id.into(),
            title: "t".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-01T00:00:00Z".into(),
            status,
            model: "builtin/echo".into(),
            message_count: 0,
            workspace: "/tmp".into(),
            forked_from: None,
        },
        tenant: "t".into(),
        system_prompt: None,
    })
}

fn event(session: &str, kind: &str) -> LoggedEvent {
    LoggedEvent {
        seq: 0,
        tenant: Some("t".into()),
        session_id: Some(session.into()),
        actor: None,
        kind: kind.into(),
        at: "2026-01-01T00:00:00Z".into(),
        body: "{}".into(),
        form: crate::domain::STORED_FORM,
    }
}

fn append(entries: Vec<Option<LoggedEvent>>) -> WriteOp {
    WriteOp::AppendLog { entries, floor: 0, keep: i64::MAX as u64, live: Vec::new() }
}

/// Every logged event, in seq order.
fn all_events(backend: &dyn Backend) -> Vec<LoggedEvent> {
    let query = EventQuery { after: 0, before: i64::MAX as u64, tenant: "t", session: None };
    backend.events(&query, 1_000_000).expect("the log reads")
}

/// A batch whose last op fails leaves nothing of its others; a whole one is read back.
pub fn batches_commit_whole_or_not_at_all(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 1);
    let backend = &*opened[0].0;
    let message = Message::text_of(Role::User, "hello");
    let whole = vec![
        session("s1", SessionStatus::Idle),
        WriteOp::AppendMessage { session_id: "s1".into(), message, updated_at: "now".into() },
        append(vec![Some(event("s1", "message.completed"))]),
    ];
    let committed = write(backend, whole).expect("a whole batch commits");
    assert!(committed.first_seq.is_some(), "a log append says where its seqs start");
    let broken = vec![
        session("s2", SessionStatus::Idle),
        append(vec![Some(event("s2", "session.updated"))]),
        WriteOp::AppendMessage {
            session_id: "missing".into(),
            message: Message::text_of(Role::User, "lost"),
            updated_at: "now".into(),
        },
    ];
    let refused = write(backend, broken);
    assert!(matches!(refused, Err(StoreError::MissingSession)), "{refused:?}");
    assert!(backend.session("s2").expect("reads").is_none(), "nothing of a failed batch is kept");
    assert_eq!(all_events(backend).len(), 1, "nor its events");
    assert_eq!(backend.messages("s1").expect("reads").len(), 1);
    assert_eq!(backend.last_seq().expect("reads"), committed.first_seq.unwrap_or(0));
    close(opened);
}

/// Several nodes append batches of kept and unkept entries at once while a reader follows the
/// log with a cursor: every batch gets consecutive seqs no other batch shares, and no event
/// ever commits behind the reader's cursor (it never saw N+1 before N).
pub fn seqs_are_commit_ordered_however_many_nodes_write(open: Open<'_>) {
    const NODES: usize = 3;
    const WRITERS_PER_NODE: usize = 2;
    const BATCHES: usize = 60;
    let (_dir, opened) = nodes(open, NODES + 1);
    write(&*opened[0].0, vec![session("s", SessionStatus::Idle)]).expect("a session");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (backend, stop) = (Arc::clone(&opened[NODES].0), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut cursor = 0;
            loop {
                let done = stop.load(std::sync::atomic::Ordering::SeqCst);
                let query = EventQuery { after: cursor, before: i64::MAX as u64, tenant: "t", session: None };
                for event in backend.events(&query, 100).expect("the log reads") {
                    assert!(event.seq > cursor, "seqs read in order");
                    cursor = event.seq;
                    seen.push(event.seq);
                }
                if done {
                    return seen;
                }
            }
        })
    };
    let writers: Vec<_> = (0..NODES * WRITERS_PER_NODE)
        .map(|index| {
            let backend = Arc::clone(&opened[index % NODES].0);
            std::thread::spawn(move || {
                let mut ranges = Vec::new();
                for batch in 0..BATCHES {
                    let size = 1 + (index + batch) % 4;
                    let entries: Vec<Option<LoggedEvent>> =
                        (0..size).map(|n| (n % 2 == 0).then(|| event("s", "tool.started"))).collect();
                    let committed = write(&*backend, vec![append(entries)]).expect("an append commits");
                    let first = committed.first_seq.expect("a first seq");
                    ranges.push((first, size as u64));
                }
                ranges
            })
        })
        .collect();
    let mut ranges: Vec<(u64, u64)> = writers.into_iter().flat_map(|w| w.join().expect("a writer")).collect();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = reader.join().expect("the reader");
    ranges.sort();
    for pair in ranges.windows(2) {
        assert!(pair[0].0 + pair[0].1 <= pair[1].0, "batches share no seq: {pair:?}");
    }
    let logged: Vec<u64> = all_events(&*opened[0].0).iter().map(|e| e.seq).collect();
    let expected: BTreeSet<u64> =
        ranges.iter().flat_map(|&(first, size)| (0..size).filter(|n| n % 2 == 0).map(move |n| first + n)).collect();
    assert_eq!(logged.iter().copied().collect::<BTreeSet<_>>(), expected, "each kept entry at its seq");
    assert_eq!(seen, logged, "the reader's cursor missed nothing: nothing committed behind it");
    let last = ranges.last().map_or(0, |&(first, size)| first + size - 1);
    assert_eq!(opened[0].0.last_seq().expect("reads"), last);
    close(opened);
}

/// Deleting the session whose events hold the highest seqs, or allocating seqs no kept event
/// takes, never lets a later append reuse a seq.
pub fn seqs_never_go_back_when_the_last_events_are_deleted(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 1);
    let backend = &*opened[0].0;
    write(backend, vec![session("old", SessionStatus::Idle), session("kept", SessionStatus::Idle)]).expect("sessions");
    let first = write(backend, vec![append(vec![Some(event("kept", "a"))])]).expect("an append").first_seq.unwrap();
    let last = write(backend, vec![append(vec![Some(event("old", "b")), Some(event("old", "c"))])]);
    let last = last.expect("an append").first_seq.unwrap() + 1;
    write(backend, vec![WriteOp::DeleteSession { id: "old".into() }]).expect("a delete");
    assert_eq!(backend.last_seq().expect("reads"), last, "the deleted events' seqs stay allocated");
    let deltas = write(backend, vec![append(vec![Some(event("kept", "d")), None, None])]).expect("an append");
    assert_eq!(deltas.first_seq, Some(last + 1));
    assert_eq!(backend.last_seq().expect("reads"), last + 3, "seqs no kept event took stay allocated");
    let next = write(backend, vec![append(vec![Some(event("kept", "e"))])]).expect("an append");
    assert_eq!(next.first_seq, Some(last + 4));
    assert!(first < last);
    close(opened);
}

/// Of many nodes racing to claim one session's turn, one wins; a release by another run
/// ends nothing; once released, the next claim wins.
pub fn a_turn_claim_is_compare_and_set(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 2);
    write(&*opened[0].0, vec![session("s", SessionStatus::Idle)]).expect("a session");
    let claim = |node: usize, run: &str| TurnClaim {
        session_id: "s".into(),
        run_id: run.into(),
        node: format!("node-{node}"),
        at: "2026-01-01T00:00:00Z".into(),
    };
    let racers: Vec<_> = (0..8)
        .map(|n| {
            let (backend, claim) = (Arc::clone(&opened[n % 2].0), claim(n % 2, &format!("run-{n}")));
            std::thread::spawn(move || backend.claim_turn(&claim, Vec::new()).map(|()| claim.run_id))
        })
        .collect();
    let outcomes: Vec<_> = racers.into_iter().map(|r| r.join().expect("a racer")).collect();
    let winners: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    assert!(outcomes.iter().filter(|o| o.is_err()).all(|o| matches!(o, Err(StoreError::Busy))));
    let backend = &*opened[0].0;
    assert_eq!(backend.session("s").expect("reads").expect("the session").summary.status, SessionStatus::Running);
    let release = |run: &str| WriteOp::ReleaseTurn {
        session_id: "s".into(),
        run_id: run.into(),
        status: SessionStatus::Idle,
        at: "later".into(),
    };
    write(backend, vec![release("someone-else")]).expect("a stale release commits, ending nothing");
    assert!(matches!(backend.claim_turn(&claim(0, "late"), Vec::new()), Err(StoreError::Busy)));
    write(backend, vec![release(winners[0])]).expect("the holder releases");
    assert_eq!(backend.session("s").expect("reads").expect("the session").summary.status, SessionStatus::Idle);
    let with = vec![WriteOp::AppendMessage {
        session_id: "s".into(),
        message: Message::text_of(Role::User, "next"),
        updated_at: "now".into(),
    }];
    backend.claim_turn(&claim(1, "next"), with).expect("a free session is claimed, with its writes");
    assert_eq!(backend.messages("s").expect("reads").len(), 1);
    let refused = vec![WriteOp::AppendMessage {
        session_id: "s".into(),
        message: Message::text_of(Role::User, "lost"),
        updated_at: "now".into(),
    }];
    assert!(matches!(backend.claim_turn(&claim(0, "again"), refused), Err(StoreError::Busy)));
    assert_eq!(backend.messages("s").expect("reads").len(), 1, "a lost claim commits none of its writes");
    let missing = TurnClaim { session_id: "gone".into(), ..claim(0, "x") };
    assert!(matches!(backend.claim_turn(&missing, Vec::new()), Err(StoreError::MissingSession)));
    close(opened);
}

/// A node's recovery ends its own turns and those of rows no node owns, not another node's.
pub fn recovery_ends_only_what_its_node_held(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 2);
    let (a, b) = (&*opened[0].0, &*opened[1].0);
    let sessions = ["mine", "theirs", "unowned", "idle"]
        .map(|id| session(id, if id == "unowned" { SessionStatus::Running } else { SessionStatus::Idle }));
    write(a, sessions.into()).expect("sessions");
    let claim = |id: &str, node: &str| TurnClaim {
        session_id: id.into(),
        run_id: format!("run-{id}"),
        node: node.into(),
        at: "2026-01-01T00:00:00Z".into(),
    };
    a.claim_turn(&claim("mine", "a"), Vec::new()).expect("a claims");
    b.claim_turn(&claim("theirs", "b"), Vec::new()).expect("b claims");
    let ended = a.recover("a", "2026-01-02T00:00:00Z").expect("a recovers");
    assert_eq!(ended, ["mine", "unowned"]);
    let status = |id: &str| a.session(id).expect("reads").expect("a session").summary.status;
    assert_eq!(status("mine"), SessionStatus::Interrupted);
    assert_eq!(status("unowned"), SessionStatus::Interrupted);
    assert_eq!(status("theirs"), SessionStatus::Running, "another node's turn is left alone");
    assert_eq!(status("idle"), SessionStatus::Idle);
    a.claim_turn(&claim("mine", "a"), Vec::new()).expect("an interrupted session is claimed again");
    close(opened);
}

/// A walk lists the sessions as they stood at its start, each once, at the place it had
/// then, however other nodes move them or add more between its pages.
pub fn a_walk_keeps_each_session_where_it_stood(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 2);
    let stamp = |n: usize| format!("2026-01-01T00:00:{:02}.000Z", n);
    let created = |n: usize| match session(&format!("s{n:02}"), SessionStatus::Idle) {
        WriteOp::InsertSession(mut record) => {
            record.summary.updated_at = stamp(n);
            WriteOp::InsertSession(record)
        }
        _ => unreachable!("session() inserts"),
    };
    let touch = |n: usize, at: usize| WriteOp::UpdateSession {
        id: format!("s{n:02}"),
        patch: SessionPatch { title: Some(format!("moved at {at}")), ..SessionPatch::default() },
        updated_at: stamp(at),
    };
    write(&*opened[0].0, (0..10).map(created).collect()).expect("ten sessions");
    let reader = &*opened[1].0;
    let page = |walk: &SessionWalk| reader.sessions_page("t", walk, 3).expect("a page");
    let first = page(&SessionWalk { as_of: None, after: None });
    let ids = |page: &super::WalkPage| page.sessions.iter().map(|w| w.summary.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&first), ["s09", "s08", "s07"]);
    // Between pages, another node moves one listed and one not yet listed to the top, and
    // adds a session.
    write(&*opened[1].0, vec![touch(8, 40), touch(2, 41), created(50)]).expect("moves");
    let mut listed = ids(&first);
    let mut walk = SessionWalk { as_of: Some(first.as_of), after: None };
    let mut last = first;
    while let Some(at) = last.sessions.last() {
        walk.after = Some((at.position.clone(), at.summary.id.clone()));
        last = page(&walk);
        listed.extend(ids(&last));
    }
    let expected: Vec<String> = (0..10).rev().map(|n| format!("s{n:02}")).collect();
    assert_eq!(listed, expected, "each once, where it stood at the start");
    let fresh = page(&SessionWalk { as_of: None, after: None });
    assert_eq!(ids(&fresh), ["s50", "s02", "s08"], "a new walk sees the moves");
    close(opened);
}

/// Past its capacity (`keep`) the log drops its oldest events, however far behind a lowered
/// capacity leaves it, while the writer goes on committing; a BAE session's events stay.
pub fn the_log_drops_its_oldest_past_capacity_but_never_bae_history(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 1);
    let backend = &*opened[0].0;
    let bae = |n: usize| LoggedEvent { tenant: Some(super::BAE_TENANT.into()), ..event("b", &format!("bae.{n}")) };
    let unbounded = |entries| WriteOp::AppendLog { entries, floor: 0, keep: u64::MAX, live: Vec::new() };
    for chunk in 0..10 {
        let mut entries: Vec<_> = (0..1_000).map(|_| Some(event("s", "e"))).collect();
        entries[chunk] = Some(bae(chunk));
        write(backend, vec![unbounded(entries)]).expect("a chunk of events");
    }
    let query = |tenant| EventQuery { after: 0, before: i64::MAX as u64, tenant, session: None };
    let count = |tenant| backend.events(&query(tenant), 1_000_000).expect("the log reads").len();
    assert_eq!(count("t"), 9_990);
    let kept = WriteOp::AppendLog { entries: vec![Some(event("s", "last"))], floor: 0, keep: 100, live: Vec::new() };
    write(backend, vec![kept]).expect("an append with a lower capacity commits at once");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while count("t") > 101 && std::time::Instant::now() < deadline {
        // The writer drops the rest while idle: a commit gives it the chance.
        write(backend, vec![]).expect("an empty commit");
    }
    let left = backend.events(&query("t"), 1_000).expect("the log reads");
    assert!(left.len() <= 101 && left.last().is_some_and(|e| e.kind == "last"), "{} left", left.len());
    assert_eq!(count(super::BAE_TENANT), 10, "BAE history stays");
    close(opened);
}

/// A checkpoint holding the same files as an earlier one of its session reads back the same
/// entries without a copy of its own; one of another session, or of other files, has its own;
/// and deleting the session removes every entry its checkpoints held.
pub fn a_checkpoint_of_unchanged_files_shares_the_manifest_of_its_session(open: Open<'_>) {
    use super::{CheckpointEntry, CheckpointKind, CheckpointRecord, Manifest};
    let (_dir, opened) = nodes(open, 1);
    let backend = &*opened[0].0;
    write(backend, vec![session("a", SessionStatus::Idle), session("b", SessionStatus::Idle)]).expect("sessions");
    let file = |path: &str, digest: &str| CheckpointEntry {
        path: path.into(),
        digest: Some(digest.into()),
        size: 3,
        mode: 0o644,
    };
    let take = |session_id: &str, id: &str, entries: Vec<CheckpointEntry>| {
        let record = CheckpointRecord {
            id: id.into(),
            session_id: session_id.into(),
            label: None,
            kind: CheckpointKind::Auto,
            created_at: "2026-01-01T00:00:00Z".into(),
            run_id: None,
            file_count: entries.len() as u64,
            total_bytes: 3 * entries.len() as u64,
            message_count: 0,
        };
        write(backend, vec![WriteOp::InsertCheckpoint { record, manifest: Manifest::new(entries) }]).expect("stored");
    };
    let files = vec![file("z.txt", "d1"), file("a.txt", "d2")];
    take("a", "c1", files.clone());
    take("a", "c2", files.iter().rev().cloned().collect());
    take("a", "c3", vec![file("a.txt", "d2"), file("z.txt", "d3")]);
    take("b", "c4", files.clone());
    let entries = |id: &str| backend.checkpoint_entries(id).expect("entries read");
    let sorted = vec![file("a.txt", "d2"), file("z.txt", "d1")];
    for id in ["c1", "c2", "c4"] {
        assert_eq!(entries(id), sorted, "{id} holds the files it was taken with");
    }
    assert_eq!(entries("c3"), vec![file("a.txt", "d2"), file("z.txt", "d3")], "a changed file is its own");
    assert!(backend.blob_referenced("d1").expect("read"));
    write(backend, vec![WriteOp::DeleteSession { id: "a".into() }]).expect("deleted");
    assert!(entries("c2").is_empty() && entries("c3").is_empty(), "a's checkpoints went with it");
    assert_eq!(entries("c4"), sorted, "b's stayed");
    assert!(!backend.blob_referenced("d3").expect("read"), "d3 was only a's");
    close(opened);
}

fn rule(id: &str, tenant: &str, session_id: Option<&str>) -> crate::policy::Rule {
    crate::policy::Rule {
        id: id.into(),
        tenant: Some(tenant.into()),
        session_id: session_id.map(str::to_string),
        tool: "run_command".into(),
        pattern: Some("git *".into()),
        arguments: None,
        outcome: crate::policy::Outcome::Allow,
        source: crate::policy::Source::Remembered,
        created_at: "2026-01-01T00:00:00.000Z".into(),
        created_by: Some("ci".into()),
    }
}

fn audit_entry(tenant: &str, at: &str) -> crate::policy::AuditEntry {
    use crate::policy::{AuditDecision, AuditEntry, DecidedBy};
    AuditEntry { at: at.into(), ..AuditEntry::now(tenant, "run_command", AuditDecision::Denied, DecidedBy::Rule) }
}

/// Rules read back whole for their tenant (and session) only, go with their session, and are
/// deleted by their own tenant only; audit entries page by seq, filter by tenant and time, and
/// trim by time.
pub fn rules_keep_to_their_tenant_and_session_and_the_audit_log_pages_and_trims(open: Open<'_>) {
    use super::{AuditQuery, PolicyWrite};
    let (_dir, opened) = nodes(open, 1);
    let backend = &*opened[0].0;
    write(backend, vec![session("s", SessionStatus::Idle)]).expect("a session");
    let rules = [rule("r1", "t", None), rule("r2", "t", Some("s")), rule("r3", "u", None)];
    let inserts = rules.iter().map(|r| WriteOp::Policy(PolicyWrite::InsertRule(r.clone()))).collect();
    write(backend, inserts).expect("rules");
    let of_t: Vec<String> = backend.rules_of("t", None).expect("reads").into_iter().map(|r| r.id).collect();
    assert_eq!(of_t, ["r1"]);
    assert_eq!(backend.rules_of("t", Some("s")).expect("reads"), rules[..2].to_vec(), "read back whole");
    assert_eq!(backend.session_rules("s").expect("reads"), rules[1..2].to_vec());
    let missing = write(backend, vec![WriteOp::Policy(PolicyWrite::InsertRule(rule("r4", "t", Some("gone"))))]);
    assert!(matches!(missing, Err(StoreError::MissingSession)), "{missing:?}");
    let foreign =
        write(backend, vec![WriteOp::Policy(PolicyWrite::DeleteRule { tenant: "u".into(), id: "r1".into() })]);
    assert!(matches!(foreign, Err(StoreError::NotFound)), "another tenant's rule is not found");
    write(backend, vec![WriteOp::DeleteSession { id: "s".into() }]).expect("a delete");
    assert!(backend.session_rules("s").expect("reads").is_empty(), "a session's rules go with it");

    let entries = vec![
        audit_entry("t", "2020-01-01T00:00:00.000Z"),
        audit_entry("u", "2026-01-01T00:00:00.000Z"),
        audit_entry("t", "2026-01-02T00:00:00.000Z"),
    ];
    write(backend, vec![WriteOp::Policy(PolicyWrite::Audit(entries))]).expect("entries");
    let all = backend.audit(&AuditQuery::default(), 10).expect("reads");
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3], "seqs in order from 1");
    let page = backend.audit(&AuditQuery { after: 1, ..Default::default() }, 1).expect("reads");
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
    let t = backend.audit(&AuditQuery { tenant: Some("t"), since: Some("2025"), after: 0 }, 10).expect("reads");
    assert_eq!(t.iter().map(|e| e.seq).collect::<Vec<_>>(), [3]);
    write(backend, vec![WriteOp::Policy(PolicyWrite::TrimAudit { before: "2025-01-01".into() })]).expect("a trim");
    assert_eq!(backend.audit(&AuditQuery::default(), 10).expect("reads").len(), 2);
    close(opened);
}
