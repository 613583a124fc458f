//! The schedules' part of the contract: a tenant's own, pausing, fires kept to the last
//! `FIRES_KEPT`, and a deleted schedule's fires gone with it.

use super::{close, nodes, write, Open};
use crate::schedule::{CatchUp, Fire, FireOutcome, Schedule, Target};
use crate::store::schedules::FIRES_KEPT;
use crate::store::{ScheduleWrite, StoreError, WriteOp};

fn schedule(id: &str, tenant: &str) -> Schedule {
    Schedule {
        id: id.into(),
        tenant: tenant.into(),
        cron: "0 9 * * *".into(),
        timezone: "Europe/Oslo".into(),
        target: Target::SessionId("ses_1".into()),
        message: "good morning".into(),
        catch_up: CatchUp::Latest,
        paused: false,
        next_at: Some(1_000),
        last_fired_at: None,
        created_at: format!("2026-01-01T00:00:0{}.000Z", id.len() % 10),
        updated_at: "2026-01-01T00:00:00.000Z".into(),
    }
}

fn fired(schedule_id: &str, n: u64) -> WriteOp {
    let fire = Fire {
        seq: 0,
        schedule_id: schedule_id.into(),
        due_at: format!("due {n}"),
        at: format!("at {n}"),
        outcome: if n.is_multiple_of(2) { FireOutcome::Fired } else { FireOutcome::Skipped },
        reason: (!n.is_multiple_of(2)).then(|| "session_busy".into()),
        session_id: Some("ses_1".into()),
        run_id: n.is_multiple_of(2).then(|| format!("run_{n}")),
    };
    WriteOp::Schedule(ScheduleWrite::Fired { fire, next_at: Some(1_000 + n as i64) })
}

pub fn schedules_keep_to_their_tenant_and_their_last_fires(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 1);
    let backend = &*opened[0].0;
    let (a, b) = (schedule("sch_a", "t"), schedule("sch_bb", "u"));
    let inserts = [&a, &b].iter().map(|s| WriteOp::Schedule(ScheduleWrite::Insert((*s).clone()))).collect();
    write(backend, inserts).expect("schedules");
    assert_eq!(
        backend.schedules_of("t").expect("reads"),
        std::slice::from_ref(&a),
        "read back whole, the tenant's only"
    );
    assert_eq!(backend.schedule("sch_bb").expect("reads"), Some(b.clone()));

    let foreign = ScheduleWrite::SetPaused {
        tenant: "u".into(),
        id: "sch_a".into(),
        paused: true,
        next_at: None,
        updated_at: "x".into(),
    };
    assert!(matches!(write(backend, vec![WriteOp::Schedule(foreign)]), Err(StoreError::NotFound)));
    let pause = ScheduleWrite::SetPaused {
        tenant: "t".into(),
        id: "sch_a".into(),
        paused: true,
        next_at: None,
        updated_at: "x".into(),
    };
    write(backend, vec![WriteOp::Schedule(pause)]).expect("a pause");
    let active: Vec<String> = backend.active_schedules().expect("reads").into_iter().map(|s| s.id).collect();
    assert_eq!(active, ["sch_bb"], "a paused schedule is not active");

    // Fires and skips by turns, a skip last.
    let count = FIRES_KEPT as u64 + 6;
    for n in 0..count {
        write(backend, vec![fired("sch_bb", n)]).expect("a fire");
    }
    let fires = backend.fires("sch_bb", 1000).expect("reads");
    assert_eq!(fires.len() as i64, FIRES_KEPT, "only the last fires are kept");
    assert_eq!(fires[0].due_at, format!("due {}", count - 1), "newest first");
    assert_eq!((fires[0].outcome, fires[0].reason.as_deref()), (FireOutcome::Skipped, Some("session_busy")));
    assert_eq!(
        (fires[1].outcome, fires[1].run_id.as_deref()),
        (FireOutcome::Fired, Some(format!("run_{}", count - 2).as_str()))
    );
    let after = backend.schedule("sch_bb").expect("reads").expect("the schedule");
    assert_eq!(after.next_at, Some(1_000 + count as i64 - 1));
    assert_eq!(after.last_fired_at.as_deref(), Some(format!("at {}", count - 2).as_str()), "a skip is no fire");
    assert_eq!(fires[0].outcome, FireOutcome::Skipped);
    // A paused schedule's next fire stays unset whatever a fire in flight says.
    write(backend, vec![fired("sch_a", 0)]).expect("a fire");
    assert_eq!(backend.schedule("sch_a").expect("reads").expect("the schedule").next_at, None);

    let delete = ScheduleWrite::Delete { tenant: "u".into(), id: "sch_bb".into() };
    write(backend, vec![WriteOp::Schedule(delete)]).expect("a delete");
    assert!(backend.fires("sch_bb", 10).expect("reads").is_empty(), "its fires go with it");
    assert!(matches!(write(backend, vec![fired("sch_bb", 1)]), Err(StoreError::NotFound)));
    close(opened);
}
