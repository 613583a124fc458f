//! Reading a session's messages by id, as a page of logged model requests does.

use super::{close, nodes, session, write, Open};
use crate::domain::{Message, Role, SessionStatus};
use crate::store::WriteOp;

/// Every listed id of the session that is stored is found, with its own contents, whatever
/// the order of the list, and only those: not another session's, not one that is not stored.
pub fn messages_by_id_finds_each_listed_message_of_its_session(open: Open<'_>) {
    let (_dir, opened) = nodes(open, 1);
    let backend = &*opened[0].0;
    let message = |text: String| Message::text_of(Role::User, &text);
    let mine: Vec<Message> = (0..40).map(|n| message(format!("mine {n}"))).collect();
    let theirs = message("theirs".into());
    let mut ops = vec![session("s", SessionStatus::Idle), session("t", SessionStatus::Idle)];
    ops.extend(mine.iter().map(|m| WriteOp::AppendMessage {
        session_id: "s".into(),
        message: m.clone(),
        updated_at: "now".into(),
    }));
    ops.push(WriteOp::AppendMessage { session_id: "t".into(), message: theirs.clone(), updated_at: "now".into() });
    write(backend, ops).expect("the messages commit");
    let id = |m: &Message| m.id.clone();

    // In stored order; in stored order but starting and ending with ids that are not the
    // session's; reversed; every other one; and short.
    let in_order: Vec<String> = mine.iter().map(id).collect();
    let mut framed = vec!["msg_missing".to_string(), id(&theirs)];
    framed.extend(in_order.iter().cloned());
    framed.extend([id(&theirs), "msg_missing_too".to_string()]);
    let mut reversed = in_order.clone();
    reversed.reverse();
    let short = vec![id(&mine[7]), id(&theirs), id(&mine[3])];
    let every_other: Vec<Message> = mine.iter().step_by(2).cloned().collect();
    let every_other_ids: Vec<String> = every_other.iter().map(id).collect();
    for (label, ids, expected) in [
        ("stored order", &in_order, &mine[..]),
        ("framed by strangers", &framed, &mine[..]),
        ("reversed", &reversed, &mine[..]),
        ("every other", &every_other_ids, &every_other[..]),
        ("short", &short, &[mine[7].clone(), mine[3].clone()][..]),
    ] {
        let found = backend.messages_by_id("s", ids).expect("reads");
        assert_eq!(found.len(), expected.len(), "{label}: {:?}", found.keys().collect::<Vec<_>>());
        for message in expected {
            assert_eq!(found.get(&message.id).map(|m| &m.blocks), Some(&message.blocks), "{label}: {}", message.id);
        }
    }
    close(opened);
}
