//! Engine tests that need a whole engine in-process: a store, a bus, the echo model.

use std::collections::HashMap;

use super::*;
use crate::bus::BusConfig;
use crate::providers::Echo;

/// The Kestrel door's plan: these tests run its turns.
fn kestrel() -> Box<dyn TurnPlan> {
    Box::new(crate::api::kestrel::KestrelTurn)
}

fn engine(data: &Path) -> (Engine, crate::store::WriterHandle, crate::bus::BusHandle) {
    engine_with(data, ToolRegistry::new(HashMap::new(), 1000))
}

fn engine_with(data: &Path, tools: ToolRegistry) -> (Engine, crate::store::WriterHandle, crate::bus::BusHandle) {
    let (store, writer) = Store::open(data).unwrap();
    let (bus, bus_handle) = Bus::start(
        store.clone(),
        BusConfig {
            replay_bytes: 1 << 30,
            replay_capacity: 100,
            subscriber_capacity: 100,
            log_capacity: 1000,
            renderers: [None, None, None],
            shared_log: false,
        },
    )
    .unwrap();
    let echo = Echo { delay: Duration::ZERO, context_window: 1_000_000, pricing: None };
    let models = ModelRegistry::from_config(&crate::Config::default(), echo, &|_| None).unwrap();
    let workspaces = WorkspacePolicy::new(data.canonicalize().unwrap(), &[], &[], Default::default()).unwrap();
    let bae = crate::api::bae::core::BaeSettings {
        keyring: Arc::new(crate::auth::keys::Keyring::with_secret([1; 32])),
        turn_timeout: std::time::Duration::from_secs(120),
        loop_limit: 8,
        mcp_servers: Vec::new(),
        mcp_configs: Vec::new(),
        mcp_spawning: crate::mcp::Spawning::default(),
        sandbox: crate::api::bae::core::sandbox::SandboxDriver(Arc::new(crate::sandbox::local::Local::unisolated(
            &data.join("sandboxes"),
            None,
        ))),
        sandbox_exec: crate::sandbox::ExecLimits { timeout: std::time::Duration::from_secs(5), output_cap: 65_536 },
        subagent_timeout: std::time::Duration::from_secs(5),
        max_subagents: 2,
    };
    let checkpoints = crate::checkpoints::CheckpointConfig::default();
    let config = EngineConfig {
        workspaces,
        max_steps: 5,
        compact_at: 0.8,
        compaction_keep_turns: 2,
        checkpoints,
        data_dir: data.to_path_buf(),
        node: "node-test".into(),
        rulebook: Default::default(),
        token_names: Default::default(),
        audit_retention: std::time::Duration::from_secs(86_400),
        budget: Default::default(),
        tenant_budgets: Default::default(),
        sandbox: Arc::new(crate::tools::sandbox::CommandSandbox::off()),
        max_sessions_per_tenant: 10_000,
    };
    let doors: Vec<Arc<dyn DoorShared>> = vec![Arc::new(crate::api::bae::core::BaeShared::new(bae))];
    (Engine::new(store, bus, models, tools, config, doors), writer, bus_handle)
}

#[test]
fn a_run_whose_worker_cannot_start_leaves_the_session_resumable_not_running() {
    let data = tempfile::tempdir().unwrap();
    let (mut engine, writer, bus) = engine(data.path());
    Arc::get_mut(&mut engine.shared).unwrap().spawn_run = |_| Err(std::io::Error::other("no threads left"));
    let new = NewSession { title: None, model: None, system_prompt: None, workspace: None };
    let session = engine.create_session("t", new, None).unwrap();
    let id = session.summary.id;
    let sent = engine.send_message(
        "t",
        &id,
        NewMessage { content: "hello".into(), images: Vec::new(), response_format: None },
        None,
        kestrel(),
    );
    assert!(matches!(sent, Err(EngineError::Overloaded)), "{sent:?}");
    assert_eq!(engine.active_runs(), 0, "no run holds the session");
    let detail = engine.session("t", &id).unwrap();
    assert_eq!(detail.summary.status, SessionStatus::Error);
    assert_eq!(detail.messages.len(), 1, "the message is kept");
    assert!(
        matches!(engine.resume("t", &id, kestrel()), Err(EngineError::Overloaded)),
        "resume is allowed, and fails the same way"
    );
    engine.shutdown(Duration::from_secs(1));
    bus.shutdown();
    writer.shutdown();
}

/// A tool stuck in a call that ignores the cancel, as a read on a hung network mount would.
struct Stuck(crossbeam_channel::Receiver<()>);

impl tools::Tool for Stuck {
    fn schema(&self) -> crate::domain::ToolSchema {
        crate::domain::ToolSchema {
            name: "stuck".into(),
            description: "never returns".into(),
            parameters: serde_json::json!({ "type": "object" }),
            permission: None,
            category: None,
        }
    }

    fn default_permission(&self) -> tools::Permission {
        tools::Permission::Auto
    }

    fn run(
        &self,
        _: &serde_json::Map<String, serde_json::Value>,
        _: &tools::ToolContext<'_>,
    ) -> Result<tools::ToolOutput, tools::ToolError> {
        let _ = self.0.recv();
        Err(tools::ToolError::Refused("released".into()))
    }
}

#[test]
fn a_cancel_ends_the_run_even_while_a_tool_is_stuck() {
    let data = tempfile::tempdir().unwrap();
    let (release, stuck) = crossbeam_channel::bounded::<()>(0);
    let mut registry = ToolRegistry::new(HashMap::new(), 1000);
    registry.register(Box::new(Stuck(stuck)));
    let (engine, writer, bus) = engine_with(data.path(), registry);
    let new = NewSession { title: None, model: None, system_prompt: None, workspace: None };
    let id = engine.create_session("t", new, None).unwrap().summary.id;
    let events = bus_subscription(&engine, &id);
    let message = NewMessage { content: "/tool stuck {}".into(), images: Vec::new(), response_format: None };
    engine.send_message("t", &id, message, None, kestrel()).unwrap();
    wait_for(&events, "tool.started");
    assert!(engine.cancel("t", &id).unwrap());
    wait_for(&events, "run.finished");
    let detail = engine.session("t", &id).unwrap();
    assert_eq!(detail.summary.status, SessionStatus::Cancelled);
    let last = detail.messages.last().unwrap();
    assert_eq!(last.role, Role::Tool);
    let content = &last.tool_result().unwrap().content;
    assert!(content.contains("abandoned"), "{content}");
    drop(release);
    engine.shutdown(Duration::from_secs(1));
    bus.shutdown();
    writer.shutdown();
}

fn bus_subscription(engine: &Engine, id: &str) -> crate::bus::Subscription {
    let filter = crate::bus::Filter { tenant: "t".into(), scope: crate::bus::Scope::Session(id.into()), format: None };
    engine.bus().subscribe(filter, None).unwrap()
}

/// Waits (at most ten seconds) for an event of type `wanted`.
fn wait_for(events: &crate::bus::Subscription, wanted: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Ok(batch) = events.recv_timeout(Duration::from_millis(100)) {
            if batch.iter().any(|envelope| envelope.event.kind() == wanted) {
                return;
            }
        }
    }
    panic!("the event did not come");
}

#[test]
fn deletes_that_arrive_together_during_a_turn_are_all_answered() {
    let data = tempfile::tempdir().unwrap();
    let (release, stuck) = crossbeam_channel::bounded::<()>(0);
    let mut registry = ToolRegistry::new(HashMap::new(), 1000);
    registry.register(Box::new(Stuck(stuck)));
    let (engine, writer, bus) = engine_with(data.path(), registry);
    let new = NewSession { title: None, model: None, system_prompt: None, workspace: None };
    let id = engine.create_session("t", new, None).unwrap().summary.id;
    let events = bus_subscription(&engine, &id);
    let message = NewMessage { content: "/tool stuck {}".into(), images: Vec::new(), response_format: None };
    engine.send_message("t", &id, message, None, kestrel()).unwrap();
    wait_for(&events, "tool.started");
    let outcomes: Vec<Result<(), EngineError>> = std::thread::scope(|scope| {
        let deletes: Vec<_> = (0..3).map(|_| scope.spawn(|| engine.delete_session("t", &id))).collect();
        deletes.into_iter().map(|d| d.join().unwrap()).collect()
    });
    let deleted = outcomes.iter().filter(|o| o.is_ok()).count();
    let not_found = outcomes.iter().filter(|o| matches!(o, Err(EngineError::SessionNotFound))).count();
    assert_eq!((deleted, not_found), (1, 2), "{outcomes:?}");
    drop(release);
    engine.shutdown(Duration::from_secs(1));
    bus.shutdown();
    writer.shutdown();
}

/// A tool that, when it runs, reads whether the store holds its call's start mark.
struct Probe(Arc<std::sync::OnceLock<Store>>, crossbeam_channel::Sender<bool>);

impl tools::Tool for Probe {
    fn schema(&self) -> crate::domain::ToolSchema {
        crate::domain::ToolSchema {
            name: "probe".into(),
            description: "reports whether its start mark is durable".into(),
            parameters: serde_json::json!({ "type": "object" }),
            permission: None,
            category: None,
        }
    }

    fn default_permission(&self) -> tools::Permission {
        tools::Permission::Auto
    }

    fn run(
        &self,
        _: &serde_json::Map<String, serde_json::Value>,
        context: &tools::ToolContext<'_>,
    ) -> Result<tools::ToolOutput, tools::ToolError> {
        let store = self.0.get().expect("the store is set before any run");
        let started = store.readers().started_calls(context.session_id).expect("the marks read");
        let _ = self.1.send(started.contains(context.call_id));
        Ok(tools::ToolOutput::success("probed", None))
    }
}

#[test]
fn a_tool_runs_only_once_its_start_mark_is_durable() {
    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(std::sync::OnceLock::new());
    let (marked_tx, marked) = crossbeam_channel::unbounded();
    let mut registry = ToolRegistry::new(HashMap::new(), 1000);
    registry.register(Box::new(Probe(Arc::clone(&store), marked_tx)));
    let (engine, writer, bus) = engine_with(data.path(), registry);
    let _ = store.set(engine.shared.store.clone());
    let new = NewSession { title: None, model: None, system_prompt: None, workspace: None };
    let id = engine.create_session("t", new, None).unwrap().summary.id;
    let events = bus_subscription(&engine, &id);
    let message =
        NewMessage { content: "/tool probe {}\n/tool probe {}".into(), images: Vec::new(), response_format: None };
    engine.send_message("t", &id, message, None, kestrel()).unwrap();
    wait_for(&events, "run.finished");
    let seen: Vec<bool> = marked.try_iter().collect();
    assert_eq!(seen, [true, true], "each call found its mark committed when it ran");
    engine.shutdown(Duration::from_secs(1));
    bus.shutdown();
    writer.shutdown();
}
