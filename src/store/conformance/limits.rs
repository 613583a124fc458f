//! The contract's limits under pressure (issue 35): a tenant's sessions stop at the room a
//! write asks for, however many nodes insert at once; and due webhook deliveries are read
//! past the endpoints and tenants a sender leaves out.

use super::{close, nodes, write, Open};
use crate::domain::SessionStatus;
use crate::store::{Busy, LoggedEvent, StoreError, WebhookWrite, WriteOp};
use crate::webhooks::{Source, Webhook};

/// A new session `id` of `tenant`, inserted only while the tenant has fewer than `max`.
fn room_and_session(id: &str, tenant: &str, max: u64) -> Vec<WriteOp> {
    let WriteOp::InsertSession(mut record) = super::session(id, SessionStatus::Idle) else {
        unreachable!("session() inserts a session")
    };
    record.tenant = tenant.into();
    vec![WriteOp::SessionRoom { tenant: tenant.into(), max }, WriteOp::InsertSession(record)]
}

pub fn a_tenant_s_sessions_stop_at_the_room_asked_for_on_every_node(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 2);
    let (a, b) = (&*opened[0].0, &*opened[1].0);
    write(a, room_and_session("s1", "t", 2)).expect("room for one");
    write(b, room_and_session("s2", "t", 2)).expect("room for two");
    let refused = write(a, room_and_session("s3", "t", 2));
    assert!(matches!(refused, Err(StoreError::SessionLimit(2))), "{refused:?}");
    assert!(a.session("s3").expect("reads").is_none(), "nothing of the refused write is kept");
    write(b, room_and_session("s4", "u", 2)).expect("another tenant's room is its own");

    // Twenty inserts at once on two nodes, room for five more of tenant v.
    let inserted: usize = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..20)
            .map(|i| {
                let node = &*opened[i % 2].0;
                scope.spawn(move || write(node, room_and_session(&format!("v{i}"), "v", 5)).is_ok())
            })
            .collect();
        threads.into_iter().map(|thread| thread.join().expect("an insert")).filter(|ok| *ok).count()
    });
    assert_eq!(inserted, 5, "exactly the room, whichever node inserts");
    close(opened);
}

fn webhook(id: &str, tenant: &str) -> WriteOp {
    WriteOp::Webhook(WebhookWrite::Insert(Webhook {
        id: id.into(),
        tenant: tenant.into(),
        url: "https://example.com/hook".into(),
        description: None,
        secret: "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0".into(),
        events: vec!["session.created".into()],
        source: Source::Api,
        enabled: true,
        failures: 0,
        disabled_reason: None,
        created_at: "2026-01-01T00:00:00Z".into(),
    }))
}

fn created(tenant: &str) -> Option<LoggedEvent> {
    Some(LoggedEvent { tenant: Some(tenant.into()), ..super::event("s", "session.created") })
}

pub fn due_deliveries_leave_out_busy_endpoints_and_full_tenants(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 1);
    let backend = &*opened[0].0;
    write(backend, vec![webhook("wh_t1", "t"), webhook("wh_t2", "t"), webhook("wh_u1", "u")]).expect("endpoints");
    write(backend, vec![super::append(vec![created("t"), created("u"), created("t")])]).expect("events");
    let due = |busy: Busy<'_>| -> Vec<(String, String)> {
        let read = backend.due_deliveries(i64::MAX, 100, &busy).expect("the outbox reads");
        read.into_iter().map(|(tenant, delivery)| (tenant, delivery.webhook_id)).collect()
    };
    let all = due(Busy::default());
    assert_eq!(all.len(), 5, "two events of t for two endpoints, one of u for one: {all:?}");
    assert!(all.iter().all(|(tenant, webhook)| webhook.starts_with(&format!("wh_{tenant}"))), "{all:?}");
    let busy = ["wh_t1".to_string()];
    let without_t1 = due(Busy { webhooks: &busy, ..Busy::default() });
    assert_eq!(without_t1.len(), 3, "{without_t1:?}");
    assert!(without_t1.iter().all(|(_, webhook)| webhook != "wh_t1"));
    let full = ["t".to_string()];
    assert_eq!(due(Busy { tenants: &full, ..Busy::default() }), [("u".to_string(), "wh_u1".to_string())]);
    assert!(backend.due_deliveries(0, 100, &Busy::default()).expect("reads").is_empty(), "none due before now");
    close(opened);
}
