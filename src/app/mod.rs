//! Starts every thread, owns their handles, and stops them in one fixed order.
//!
//! Start: store writer (which locks the data dir) → kill commands a crashed predecessor left →
//! bus → engine → HTTP. Shutdown: stop accepting → stop runs (they are stored as
//! `interrupted`) → kill the commands' leftovers → stop the bus (every stream ends) → wait for
//! connections → stop the store writer last, after it has committed everything queued.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::api::bae::core::Bae;
use crate::bus::{Bus, BusConfig, BusHandle};
use crate::config::{Config, ConfigError};
use crate::domain::{Event, NoticeLevel};
use crate::engine::tools::ToolRegistry;
use crate::engine::{Engine, EngineConfig};
use crate::http::HttpServer;
use crate::plugins::Plugins;
use crate::providers::{Echo, ModelRegistry};
use crate::store::{Store, StoreError, WriterHandle};
use crate::tools::workspace::{Protected, WorkspacePolicy};
use crate::tools::ToolSettings;

mod parts;

use parts::*;

/// How long shutdown waits for runs and requests to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub enum StartError {
    Config(ConfigError),
    /// A non-loopback address with no token and no explicit opt-out.
    Unauthenticated(SocketAddr),
    UnknownDefaultModel(String),
    Providers(crate::providers::SetupError),
    Workspace(PathBuf, std::io::Error),
    Store(StoreError),
    Bind(SocketAddr, std::io::Error),
    /// The BAE key secret could not be read or written.
    Keyring(crate::auth::keys::KeyringError),
    /// The admin key could not be set up.
    AdminKey(String),
    /// A thread the server needs could not be started.
    Thread(&'static str, std::io::Error),
    /// What the last process left unfinished could not be recorded.
    Recovery(crate::engine::EngineError),
    /// The config file's webhook endpoints cannot be used.
    Webhooks(crate::webhooks::WebhookError),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(error) => write!(f, "{error}"),
            StartError::Unauthenticated(addr) => write!(
                f,
                "refusing to serve {addr} without a token: anyone who can reach it could run commands \
                 through the agent. Set KESTREL_TOKEN (or [auth] in the config), listen on a loopback \
                 address, or pass --allow-unauthenticated if a proxy in front does the authentication"
            ),
            StartError::UnknownDefaultModel(model) => {
                write!(f, "agent.default_model `{model}` is not a registered model")
            }
            StartError::Providers(error) => write!(f, "{error}"),
            StartError::Workspace(path, error) => write!(f, "workspace {}: {error}", path.display()),
            StartError::Store(error) => write!(f, "cannot open the store: {error}"),
            StartError::Bind(addr, error) => write!(f, "cannot listen on {addr}: {error}"),
            StartError::Keyring(error) => write!(f, "{error}"),
            StartError::AdminKey(why) => write!(f, "admin key: {why}"),
            StartError::Thread(name, error) => write!(f, "cannot start the {name} thread: {error}"),
            StartError::Recovery(error) => write!(f, "recovering what the last process left: {error}"),
            StartError::Webhooks(error) => write!(f, "webhooks: {error}"),
        }
    }
}

impl std::error::Error for StartError {}

impl From<StoreError> for StartError {
    fn from(error: StoreError) -> Self {
        StartError::Store(error)
    }
}

/// A running server. Dropping it shuts it down.
pub struct Server {
    http: Option<HttpServer>,
    engine: Engine,
    store: Store,
    bus: Option<BusHandle>,
    store_writer: Option<WriterHandle>,
    /// The hot reload watcher, when it runs.
    plugin_watcher: Option<crate::plugins::watch::Watcher>,
    /// This data dir's process marker (`orphans::node_marker`).
    node: String,
    /// The thread that fires schedules.
    scheduler: Option<crate::schedule::SchedulerHandle>,
    /// The threads that send webhook deliveries.
    webhook_sender: Option<crate::webhooks::WebhookSender>,
    /// This node's heartbeat and lease renewal, when it is one of a cluster.
    cluster: Option<crate::cluster::ClusterHandle>,
    /// What tells the bus of other nodes' events, when it is one of a cluster.
    listener: Option<crate::store::postgres::listen::Listener>,
}

/// Counters a test or an operator can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub open_connections: usize,
    pub open_streams: usize,
    /// Requests between their head and the end of their reply.
    pub open_requests: usize,
    /// Connections answered 503 because every slot was taken.
    pub refused_connections: usize,
    /// Times tiny_http was found dead and replaced.
    pub backend_restarts: usize,
    pub bus_subscribers: usize,
    pub active_runs: usize,
}

impl Server {
    /// Starts a server; returns once it is accepting connections.
    pub fn start(config: Config) -> Result<Server, StartError> {
        let addr = config.socket_addr().map_err(StartError::Config)?;
        let admin_addr = config.admin_addr().map_err(StartError::Config)?;
        let tokens = config.tenant_tokens(&|name| std::env::var(name).ok()).map_err(StartError::Config)?;
        if tokens.is_empty() && !addr.ip().is_loopback() && !config.server.allow_unauthenticated {
            return Err(StartError::Unauthenticated(addr));
        }
        let workspace = match &config.agent.workspace {
            Some(path) => path.clone(),
            None => std::env::current_dir().map_err(|e| StartError::Workspace(PathBuf::from("."), e))?,
        };
        let workspace = workspace.canonicalize().map_err(|e| StartError::Workspace(workspace.clone(), e))?;

        let echo = Echo {
            delay: Duration::from_millis(config.builtin.delay_ms),
            context_window: config.builtin.context_window,
            pricing: config.builtin.pricing.clone(),
        };
        let mut models = ModelRegistry::from_config(&config, echo, &|name| std::env::var(name).ok())
            .map_err(StartError::Providers)?;
        if let Some(model) = &config.agent.default_model {
            if !models.set_default(model) {
                return Err(StartError::UnknownDefaultModel(model.clone()));
            }
        }

        // One process per data dir: its node id is the data dir's, or its cluster node id.
        let marker = crate::tools::orphans::node_marker(&config.server.data_dir);
        let cluster_id = config.cluster.secret().map(|_| match config.cluster.node_id.as_deref() {
            Some(id) if !id.is_empty() => id.to_string(),
            _ => crate::cluster::default_node_id(&marker),
        });
        let (store, store_writer) = open_store(&config, cluster_id.as_deref())?;
        let cluster_node = store.cluster().map(|(membership, book)| {
            let secret = config.cluster.secret().unwrap_or_default();
            crate::cluster::Node::new(&config.cluster, secret, Arc::clone(membership), Arc::clone(book))
        });
        // The data dir holds every tenant's transcripts and the config file their tokens: no
        // workspace may reach either, whatever the roots say.
        let protected = Protected::new([config.server.data_dir.clone()].into_iter().chain(config.file.clone()));
        let workspaces = WorkspacePolicy::new(
            workspace.clone(),
            &config.agent.workspace_roots,
            &config.tenant_workspace_roots(),
            protected,
        )
        .map_err(|(path, error)| StartError::Workspace(path, error))?;
        // A default workspace inside the data dir would make every session creation a 403.
        if let Some(protected) = workspaces.protected().covering(&workspace) {
            let why = format!("it is inside {}, which the server protects; choose another", protected.display());
            return Err(StartError::Workspace(workspace, std::io::Error::other(why)));
        }
        // Runs that were in flight when the last process died cannot still be running, and
        // neither may the commands they started.
        let node = cluster_id.unwrap_or(marker);
        let interrupted = store.recover(&node)?;
        if !interrupted.is_empty() {
            log::info!("{} session(s) whose turn the last process left running are interrupted", interrupted.len());
        }
        // MCP servers' configured headers are credentials: the log masks their values.
        crate::logging::mask_headers(mcp_servers(&config).flat_map(|server| server.headers.keys().map(String::as_str)));
        sweep_commands(&store, &node, "left by the previous run of this data dir");
        let bus_config = BusConfig {
            replay_capacity: config.server.replay_buffer,
            replay_bytes: config.server.replay_buffer_bytes.max(1),
            subscriber_capacity: config.server.subscriber_buffer.max(1),
            log_capacity: config.server.event_log_events.max(1),
            renderers: crate::api::RENDERERS,
            shared_log: store.cluster().is_some(),
        };
        let (bus, bus_handle) = Bus::start(store.clone(), bus_config)?;
        // Other nodes' events reach this node's streams, in seq order with its own.
        let listener = match store.cluster() {
            Some((membership, _)) => {
                let hearing = bus.clone();
                Some(membership.follow_log(Box::new(move |heard| match heard {
                    crate::store::postgres::listen::Heard::Logged(seq) => hearing.heard(seq),
                    crate::store::postgres::listen::Heard::Live(events) => hearing.heard_live(events),
                }))?)
            }
            None => None,
        };
        let mut tools = ToolRegistry::new(
            config.agent.permissions.clone().into_iter().collect(),
            config.agent.tool_output_limit_chars.max(1),
        );
        let tool_settings = ToolSettings {
            read_limit: config.agent.file_read_limit_bytes.max(1),
            command_timeout: Duration::from_secs(config.agent.command_timeout_secs.max(1)),
            command_max_timeout: Duration::from_secs(config.agent.command_max_timeout_secs.max(1)),
            hidden_env: config.secret_env_names(),
            death_signal_wrapper: death_signal_wrapper(),
            sandbox: Arc::new(command_sandbox(&config)?),
        };
        if tokens.is_empty() && tool_settings.sandbox.state(crate::config::DEFAULT_TENANT).network {
            // A command runs as this server's user, which a server with no token serves: one
            // that reaches the loopback can call the API and approve its own calls.
            log::warn!(
                "this server has no token and its commands can reach the network (sandbox off, \
                 unavailable, or sandbox_network = true): a command could call this server's API \
                 as its user; configure a token (docs/security.md)"
            );
        }
        crate::tools::register_builtins(&mut tools, &tool_settings);
        // Long-lived children (stdio MCP servers) start from a thread that lives as long as
        // the server, so `setpriv`'s death signal ties them to the server, not to a request.
        let spawner = crate::tools::spawner::Spawner::start().map_err(|e| StartError::Thread("kestrel-spawner", e))?;
        let spawning = crate::mcp::Spawning {
            marker: node.clone(),
            setpriv: tool_settings.death_signal_wrapper.clone(),
            spawner: Some(spawner),
        };
        let reserved = tools.schemas().into_iter().map(|schema| schema.name).collect();
        let plugins = Arc::new(Plugins::load(config.plugins.clone(), reserved));
        let launcher = crate::tools::process::Launcher {
            hidden_env: tool_settings.hidden_env.clone(),
            death_signal_wrapper: tool_settings.death_signal_wrapper.clone(),
        };
        tools.replace_plugin_tools(plugins.tools(&launcher));
        let bae = crate::api::bae::core::BaeShared::new(bae_settings(
            &config,
            spawning.clone(),
            store.cluster().map(|(membership, _)| membership),
        )?);
        let engine = Engine::new(
            store.clone(),
            bus,
            models,
            tools,
            EngineConfig {
                workspaces,
                max_steps: config.agent.max_steps.max(1),
                compact_at: config.agent.compact_at.clamp(0.05, 1.0),
                compaction_keep_turns: config.agent.compaction_keep_turns.max(1),
                checkpoints: config.checkpoints.clone(),
                data_dir: config.server.data_dir.clone(),
                node: node.clone(),
                rulebook: config.rulebook().map_err(StartError::Config)?,
                token_names: token_names(&config),
                audit_retention: Duration::from_secs(config.agent.audit_retention_days.max(1) * 86_400),
                budget: config.agent.budget.clone(),
                tenant_budgets: config
                    .auth
                    .tokens
                    .iter()
                    .filter_map(|t| Some((t.tenant.clone(), t.budget.clone()?)))
                    .collect(),
                sandbox: Arc::clone(&tool_settings.sandbox),
                max_sessions_per_tenant: config.agent.max_sessions_per_tenant,
            },
            vec![Arc::new(bae)],
        );

        if let Some(node) = &cluster_node {
            node.serve(&engine);
        }
        let bae = Bae::new(engine.clone());
        bootstrap_admin(&config, &bae)?;
        // BAE calls the last process started and never finished are recorded, not run again.
        // In a cluster, other nodes run sessions meanwhile: each session's are recorded by the
        // node that takes its lease over (`engine/tenure.rs`), this one's own included.
        if cluster_node.is_none() {
            bae.recover_calls().map_err(StartError::Recovery)?;
        }
        crate::metrics::get().prime(engine.models().infos());
        know_tools(&engine);
        // Every live profile's sandbox images are made ready again, in the background.
        if let Err(error) = bae.provision_profiles() {
            log::error!("sandbox images were not queued for provisioning: {error:?}");
        }
        // In a cluster another node may be capturing meanwhile, its new blobs not yet named by
        // a manifest, and its stat cache trusting blobs a collection would remove: blobs are
        // not collected there (docs/cluster.md, limits).
        if cluster_node.is_none() {
            collect_blobs(&engine);
        }
        for problem in plugins.problems() {
            engine.bus().publish(None, Event::Notice { level: NoticeLevel::Warn, message: problem, session_id: None });
        }
        // A reloaded manifest brings its tools along.
        let reloaded: crate::plugins::watch::OnReload = {
            let (engine, plugins) = (engine.clone(), Arc::clone(&plugins));
            Box::new(move || {
                engine.tools().replace_plugin_tools(plugins.tools(&launcher));
                know_tools(&engine);
            })
        };
        connect_mcp(&config, &engine, spawning)?;
        let plugin_watcher = crate::plugins::watch::start(Arc::clone(&plugins), engine.bus().clone(), reloaded)
            .map_err(|e| StartError::Thread("kestrel-plugins", e))?;
        let plan: crate::schedule::PlanFactory = Arc::new(crate::api::kestrel::kestrel_turn);
        let (schedules, scheduler) =
            crate::schedule::Schedules::start(engine.clone(), Arc::clone(&config.clock.0), plan, &config.schedules)
                .map_err(|e| StartError::Thread("kestrel-scheduler", e))?;
        let (webhooks, webhook_sender) = crate::webhooks::start(
            store.clone(),
            config.webhooks.settings(),
            crate::api::kestrel::webhook_event,
            (engine.bus().clone(), engine.quiet_ends_logged()),
        )
        .map_err(|e| StartError::Thread("kestrel-webhooks", e))?;
        webhooks.sync_config(&config.webhooks.endpoints).map_err(StartError::Webhooks)?;
        let cluster = cluster_node.clone();
        let services = crate::api::kestrel::Services { plugins: Arc::clone(&plugins), schedules, webhooks, cluster };
        let http = serve(&config, &engine, tokens, (addr, admin_addr), services)?;
        log::info!("listening on http://{}", http.addr());
        let cluster = cluster_node.map(|node| crate::cluster::start(&node, http.addr())).transpose()?;
        let (bus, store_writer) = (Some(bus_handle), Some(store_writer));
        let (scheduler, webhook_sender) = (Some(scheduler), Some(webhook_sender));
        Ok(Server {
            http: Some(http),
            engine,
            store,
            bus,
            store_writer,
            plugin_watcher,
            node,
            scheduler,
            webhook_sender,
            cluster,
            listener,
        })
    }

    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.http.as_ref().map(HttpServer::addr).expect("a running server has an address")
    }

    /// The admin API's bound address, when it is served.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|http| http.addrs().get(1).copied())
    }

    pub fn stats(&self) -> Stats {
        let gauges = self.http.as_ref().map(|http| Arc::clone(http.gauges()));
        Stats {
            open_connections: gauges.as_ref().map_or(0, |g| g.open_connections()),
            open_streams: gauges.as_ref().map_or(0, |g| g.open_streams()),
            open_requests: gauges.as_ref().map_or(0, |g| g.open_requests()),
            refused_connections: gauges.as_ref().map_or(0, |g| g.refused_connections()),
            backend_restarts: gauges.as_ref().map_or(0, |g| g.backend_restarts()),
            bus_subscribers: self.engine.bus().subscriber_count(),
            active_runs: self.engine.active_runs(),
        }
    }

    /// Stops everything in order and waits for every thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(mut http) = self.http.take() else {
            return;
        };
        http.stop_accepting();
        self.plugin_watcher.take();
        // No fire starts a run once the runs are being stopped.
        if let Some(scheduler) = self.scheduler.take() {
            scheduler.shutdown();
        }
        self.engine.shutdown(SHUTDOWN_GRACE);
        sweep_commands(&self.store, &self.node, "still running at shutdown");
        // Its runs are stopped: other nodes may take its sessions over now.
        if let Some(cluster) = self.cluster.take() {
            cluster.shutdown();
        }
        // Attempts in flight are recorded before the store stops; what is pending goes out
        // after the next start.
        if let Some(sender) = self.webhook_sender.take() {
            sender.shutdown();
        }
        if let Some(listener) = self.listener.take() {
            listener.shutdown();
        }
        if let Some(bus) = self.bus.take() {
            bus.shutdown();
        }
        http.wait_for_requests(SHUTDOWN_GRACE);
        if let Some(writer) = self.store_writer.take() {
            writer.shutdown();
        }
        log::info!("stopped");
    }
}

/// In the background: a data dir of many blobs must not hold up the start, and captures wait
/// for a collection (and it for them), never race it.
fn collect_blobs(engine: &Engine) {
    let collector = engine.clone();
    let collected = std::thread::Builder::new().name("kestrel-collect".into()).spawn(move || {
        match collector.collect_checkpoint_garbage() {
            Ok(0) => {}
            Ok(removed) => log::info!("removed {removed} checkpoint blobs no checkpoint refers to"),
            Err(error) => log::warn!("checkpoint blobs were not collected: {error}"),
        }
    });
    if let Err(error) = collected {
        log::warn!("checkpoint blobs were not collected: {error}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
