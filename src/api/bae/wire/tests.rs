use super::*;

/// A page renders each stored message once, and its views are those of the requests
/// resolved one by one: a history that grows, one that drops a message (compaction) and
/// one that names a message that is gone.
#[test]
fn a_page_renders_requests_as_they_read_resolved() {
    let text = |id: &str, words: &str| Message {
        id: id.into(),
        blocks: vec![Block::Text { text: words.into() }],
        ..Message::new(Role::User)
    };
    let stored: HashMap<String, Message> =
        ["a", "b", "c"].iter().map(|id| (id.to_string(), text(id, &format!("said {id}")))).collect();
    let request = |ids: &[&str], own: &str| {
        let mut messages: Vec<Message> = ids.iter().map(|id| Message { id: id.to_string(), ..text(id, "") }).collect();
        messages.push(text("own", own));
        let request = ProviderRequest {
            session_id: "ses_1".into(),
            attempt: 0,
            fallback: None,
            provider: "anthropic".into(),
            base_url: Some("http://x".into()),
            model: "m".into(),
            max_tokens: Some(10),
            messages,
            tools: Vec::new(),
            stored: ids.len(),
            unresolved: true,
        };
        let stored_form = serde_json::to_string(&Event::ProviderRequest(Box::new(request))).unwrap();
        Event::from_stored("provider.request", &stored_form).unwrap()
    };
    let events = [
        request(&["a"], "one"),
        request(&["a", "b"], "two"),
        Event::DriverRegistered { session_id: "ses_1".into() },
        request(&["b", "c"], "three"),
        request(&["a", "gone", "c"], "four"),
    ];
    let envelope = |seq: usize, event: Event| {
        let origin = crate::bus::Origin { actor: Some("key_1".into()), turn: None };
        Envelope::new(seq as u64, "2026-01-01T00:00:00.000Z".into(), None, origin, std::sync::Arc::new(event))
    };
    let page = LogPage {
        envelopes: events.iter().cloned().enumerate().map(|(seq, event)| envelope(seq, event)).collect(),
        history: HashMap::from([("ses_1".to_string(), stored.clone())]),
    };
    let one_by_one: Vec<String> = events
        .into_iter()
        .enumerate()
        .filter_map(|(seq, mut event)| {
            if let Event::ProviderRequest(request) = &mut event {
                request.resolve(&stored);
            }
            view(&envelope(seq, event))
        })
        .collect();
    let mut written = Vec::new();
    write_page_views(&page, &mut written);
    assert_eq!(String::from_utf8(written).unwrap(), one_by_one.join(","));
    let last: Value = serde_json::from_str(&one_by_one[4]).unwrap();
    assert_eq!(
        last["payload"]["messages"],
        json!([
            { "role": "user", "content": [{ "type": "text", "text": "said a" }] },
            { "role": "user", "content": [] },
            { "role": "user", "content": [{ "type": "text", "text": "said c" }] },
            { "role": "user", "content": [{ "type": "text", "text": "four" }] },
        ])
    );
}

#[test]
fn event_ids_are_seqs() {
    assert_eq!(event_id(42), "evt_0000000000000000000000000000002a");
    assert_eq!(parse_event_id(&event_id(42)), Some(42));
    assert_eq!(parse_event_id("evt_xyz"), None);
    assert_eq!(parse_event_id("evt_ffffffffffffffffffffffffffffffff"), None);
    assert_eq!(parse_event_id("nope"), None);
}

#[test]
fn plain_text_stays_a_string_and_blocks_keep_their_dispatch() {
    let message = crate::api::bae::core::merge::to_message(Role::User, &json!("hi"), &Default::default()).unwrap();
    assert_eq!(content(&message), json!("hi"));
    let mut answer = Message::new(Role::Assistant);
    let mut call = crate::domain::ToolCall::new("tu_1", "clock", Map::new());
    call.dispatch = Dispatch::Client;
    answer.blocks.push(Block::ToolCall(call));
    assert_eq!(
        content(&answer),
        json!([{"type": "tool_use", "id": "tu_1", "name": "clock", "input": {}, "dispatch": "client"}])
    );
}
