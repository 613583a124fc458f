//! The parts of a start: the HTTP doors, tools, the BAE door's settings and its admin key, MCP
//! connections, and the sweep of commands a process left.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::StartError;
use crate::api::bae::core::Bae;
use crate::api::kestrel::KestrelApi;
use crate::auth::TokenSet;
use crate::config::{Config, ConfigError};
use crate::engine::Engine;
use crate::http::{HttpConfig, HttpServer};
use crate::store::Store;

/// Kills every process a command of one of this store's sessions, or of this data dir's
/// node, left behind.
pub(super) fn sweep_commands(store: &Store, node: &str, when: &str) {
    let ours = |owner: &str| owner == node || store.readers().session(owner).ok().flatten().is_some();
    let killed = crate::tools::orphans::sweep(&ours);
    if killed > 0 {
        log::warn!("killed {killed} command process(es) {when}");
    }
}

/// `setpriv` for commands, or a warning that they can outlive a killed server until its restart.
pub(super) fn death_signal_wrapper() -> Option<PathBuf> {
    let found = crate::tools::orphans::find_death_signal_wrapper();
    if found.is_none() {
        log::warn!(
            "setpriv (util-linux) with --pdeathsig was not found: a command's shell is not killed with the \
             server, only at its next start"
        );
    }
    found
}

/// The edge's settings; `max_connections` 0 means what the open-file limit allows.
pub(super) fn http_config(config: &Config, files: crate::http::FileLimit) -> Result<HttpConfig, ConfigError> {
    let server = &config.server;
    let millis = |ms: u64| Duration::from_millis(ms.max(1));
    let origin = crate::http::origin::Policy::new(&server.allowed_hosts, &server.allowed_origins, &own_names(config))
        .map_err(|error| ConfigError::Invalid(error.to_string()))?;
    Ok(HttpConfig {
        body_limit: server.body_limit_bytes,
        ping_interval: millis(server.sse_ping_interval_ms),
        write_timeout: millis(server.write_timeout_ms),
        header_timeout: millis(server.header_timeout_ms),
        body_timeout: millis(server.body_timeout_ms),
        keep_alive_timeout: millis(server.keep_alive_timeout_ms),
        max_head_bytes: server.max_header_bytes.max(256),
        max_connections: match server.max_connections {
            0 => files.connection_budget(),
            n => n,
        },
        runtime_dir: server.data_dir.join("run"),
        origin,
    })
}

/// The names this server is reached by as configured: its bind address's host and its
/// advertised URL's, when those are names rather than IP literals (`http/origin.rs`).
fn own_names(config: &Config) -> Vec<String> {
    let bound = config.server.addr.rsplit_once(':').map(|(host, _)| host.to_string());
    let advertised = config.cluster.advertise_url.as_deref().and_then(|url| url::Url::parse(url).ok());
    let advertised = advertised.and_then(|url| url.host_str().map(str::to_string));
    bound.into_iter().chain(advertised).collect()
}

/// The main port (Kestrel's routes and BAE's client routes) and, when configured, the admin
/// API on its loopback address.
/// The store `config` names: the data dir's SQLite file, or its PostgreSQL database, as node
/// `cluster_id` of a cluster when it is one (a cluster needs PostgreSQL).
pub(super) fn open_store(
    config: &Config,
    cluster_id: Option<&str>,
) -> Result<(Store, crate::store::WriterHandle), StartError> {
    let (dir, pool) = (&config.server.data_dir, config.store.pool_size);
    Ok(match (config.store.postgres_url(), cluster_id) {
        (Some(url), Some(node)) => Store::open_cluster_node(dir, url, pool, node)?,
        (Some(url), None) => Store::open_postgres(dir, url, pool)?,
        (None, None) => Store::open(dir)?,
        (None, Some(_)) => {
            let why = "[cluster] needs the PostgreSQL store: set [store] url (or KESTREL_DATABASE_URL)";
            return Err(StartError::Config(crate::config::ConfigError::Invalid(why.into())));
        }
    })
}

pub(super) fn serve(
    config: &Config,
    engine: &Engine,
    tokens: Vec<crate::config::TenantToken>,
    (addr, admin_addr): (SocketAddr, Option<SocketAddr>),
    services: crate::api::kestrel::Services,
) -> Result<HttpServer, StartError> {
    let cluster = services.cluster.clone();
    let kestrel = KestrelApi::new(
        engine.clone(),
        TokenSet::new(tokens).serving(match config.server.allow_unauthenticated {
            true => crate::auth::Tokenless::Anyone,
            false => crate::auth::Tokenless::OwnUser,
        }),
        config.sanitized(),
        config.agent.file_read_limit_bytes.max(1),
        services,
    );
    let bae = Bae::new(engine.clone());
    let client_door = crate::api::bae::ClientApi::new(bae.clone());
    let main = Arc::new(crate::api::MainDoor { kestrel, bae: client_door, cluster });
    let listener = crate::http::bind(addr).map_err(|e| StartError::Bind(addr, e))?;
    let mut listeners: Vec<(std::net::TcpListener, Arc<dyn crate::http::Handler>)> = vec![(listener, main)];
    if let Some(admin_addr) = admin_addr {
        let listener = crate::http::bind(admin_addr).map_err(|e| StartError::Bind(admin_addr, e))?;
        let views = crate::api::bae::admin::views(config, &bae);
        let admin = crate::api::bae::admin::AdminApi::new(bae, config.bae.dangerously_disable_admin_auth, views);
        listeners.push((listener, admin));
    }
    let http_config = http_config(config, crate::http::raise_open_file_limit()).map_err(StartError::Config)?;
    let http = HttpServer::start(listeners, http_config).map_err(|e| StartError::Bind(addr, e))?;
    if let Some(admin) = http.addrs().get(1) {
        log::info!("admin API on http://{admin}");
    }
    Ok(http)
}

/// Tells the metrics which tools the server has now, so their names may be labels.
pub(super) fn know_tools(engine: &Engine) {
    let names: Vec<String> = engine.tools().schemas().into_iter().map(|schema| schema.name).collect();
    crate::metrics::get().know_tools(&names);
}

/// The admin key: minted into the key file on first start, or rotated on request; nothing
/// when admin auth is disabled (said loudly at every start).
pub(super) fn bootstrap_admin(config: &Config, engine: &Bae) -> Result<(), StartError> {
    let bae = &config.bae;
    if bae.dangerously_disable_admin_auth {
        if bae.rotate_admin_key {
            return Err(StartError::AdminKey("--rotate-admin-key cannot be combined with disabled admin auth".into()));
        }
        log::warn!("admin API authentication is DISABLED: anyone who can reach the admin port has full control");
        return Ok(());
    }
    let path = bae.admin_key_path(&config.server.data_dir);
    match engine.admin_bootstrap(&path, bae.rotate_admin_key) {
        Ok(crate::api::bae::core::AdminBootstrap::Minted) => {
            log::info!("no admin key found; a new one was written to {}", path.display())
        }
        Ok(crate::api::bae::core::AdminBootstrap::Rotated) => {
            log::info!("admin key rotated; the new one is in {}", path.display())
        }
        Ok(crate::api::bae::core::AdminBootstrap::Existing) => {}
        Err(error) => return Err(StartError::AdminKey(format!("{error:?}"))),
    }
    Ok(())
}

/// The file in the data dir holding the secret BAE keys are hashed under.
pub(super) const KEY_SECRET_FILE: &str = "bae-key-secret";

/// The engine's BAE settings; the key secret is created in the data dir on first start.
/// Each tenant's token name for the audit log: `name`, or the tenant itself.
pub(super) fn token_names(config: &Config) -> std::collections::HashMap<String, String> {
    config.auth.tokens.iter().map(|t| (t.tenant.clone(), t.name.clone().unwrap_or_else(|| t.tenant.clone()))).collect()
}

pub(super) fn bae_settings(
    config: &Config,
    mcp_spawning: crate::mcp::Spawning,
    cluster: Option<&Arc<dyn crate::store::cluster::Membership>>,
) -> Result<crate::api::bae::core::BaeSettings, StartError> {
    use crate::auth::keys::{Keyring, KeyringError};
    let mut keyring = Keyring::open(&config.server.data_dir.join(KEY_SECRET_FILE)).map_err(StartError::Keyring)?;
    // In a cluster every node hashes keys under one secret: the first node's, kept in the
    // database, so that a key minted at one node is known at all.
    if let Some(membership) = cluster {
        let agreed = membership.agree("bae_key_secret", &keyring.secret_hex())?;
        keyring = Keyring::from_hex(&agreed).ok_or(StartError::Keyring(KeyringError::Malformed))?;
    }
    Ok(crate::api::bae::core::BaeSettings {
        keyring: Arc::new(keyring),
        turn_timeout: Duration::from_secs(config.bae.turn_timeout_secs),
        loop_limit: config.bae.loop_limit.max(1),
        mcp_servers: mcp_servers(config).map(|server| server.name.clone()).collect(),
        mcp_configs: mcp_servers(config).cloned().collect(),
        mcp_spawning,
        sandbox: sandbox_driver(config)?,
        sandbox_exec: crate::sandbox::ExecLimits {
            timeout: Duration::from_secs(config.bae.sandbox_exec_timeout_secs.max(1)),
            output_cap: config.bae.sandbox_output_limit_bytes.max(1),
        },
        subagent_timeout: Duration::from_secs(config.bae.subagent_timeout_secs.max(1)),
        max_subagents: config.bae.max_subagents_per_session,
    })
}

/// The server's own files, hidden from every sandboxed command should a sandbox show their
/// tree: the data dir, the admin key, the config files.
fn server_paths(config: &Config) -> Vec<PathBuf> {
    let data_dir = &config.server.data_dir;
    [data_dir.clone(), config.bae.admin_key_path(data_dir)]
        .into_iter()
        .chain(config.file.clone())
        .chain(config.bae.config_file.clone())
        .collect()
}

/// run_command's sandbox as the config sets it, bubblewrap probed (docs/sandbox.md).
pub(super) fn command_sandbox(config: &Config) -> Result<crate::tools::sandbox::CommandSandbox, StartError> {
    use crate::tools::sandbox::{CommandSandbox, SandboxConfig, Setting};
    let agent = &config.agent;
    Ok(CommandSandbox::start(SandboxConfig {
        server: Setting { mode: agent.sandbox, network: agent.sandbox_network },
        tenants: config.auth.tenant_sandboxes().map_err(StartError::Config)?,
        program: agent.sandbox_bwrap.clone(),
        hidden: server_paths(config),
        empty_dir: config.server.data_dir.join("sandbox"),
    }))
}

/// The remote sandboxes' driver named by `[bae] sandbox_driver` / `BAE_SANDBOX_DRIVER`.
pub(super) fn sandbox_driver(config: &Config) -> Result<crate::api::bae::core::sandbox::SandboxDriver, StartError> {
    // Sandbox commands die with the server, as a tool's commands do.
    let setpriv = crate::tools::orphans::find_death_signal_wrapper();
    let driver: Arc<dyn crate::sandbox::Driver> = match config.bae.sandbox_driver.as_str() {
        "local" => {
            let data_dir = &config.server.data_dir;
            Arc::new(crate::sandbox::local::Local::new(&data_dir.join("sandboxes"), setpriv, &server_paths(config)))
        }
        "docker" => Arc::new(crate::sandbox::docker::Docker { program: config.bae.docker_cli.clone(), setpriv }),
        other => {
            let why = format!("bae.sandbox_driver {other:?}: \"local\" or \"docker\"");
            return Err(StartError::Config(ConfigError::Invalid(why)));
        }
    };
    Ok(crate::api::bae::core::sandbox::SandboxDriver(driver))
}

/// Every configured MCP server: the BAE config file's, then Kestrel's own.
pub(super) fn mcp_servers(config: &Config) -> impl Iterator<Item = &crate::config::bae::McpServer> {
    config.bae.file.mcp.servers.iter().chain(config.mcp.servers.iter())
}

/// Connects Kestrel's MCP servers in the background (a slow one does not hold up the start)
/// and gives Kestrel sessions their tools as they arrive.
pub(super) fn connect_mcp(config: &Config, engine: &Engine, node: crate::mcp::Spawning) -> Result<(), StartError> {
    let servers = config.mcp.servers.clone();
    if servers.is_empty() {
        return Ok(());
    }
    let engine = engine.clone();
    let connect = move || {
        let mut listed = Vec::new();
        for server in servers {
            let name = server.name.clone();
            match crate::mcp::tool::Pool::connect(server, node.clone()) {
                Ok((pool, tools)) => {
                    log::info!("MCP server {name:?}: {} tools", tools.len());
                    listed.extend(tools.into_iter().map(|tool| (name.clone(), Arc::clone(&pool), tool)));
                }
                Err(error) => log::error!("MCP server {name:?} did not connect: {error}"),
            }
        }
        let pairs: Vec<(String, String)> =
            listed.iter().map(|(server, _, tool)| (server.clone(), tool.name.clone())).collect();
        let names = crate::mcp::tool::unique_names(&pairs);
        let mut tools: Vec<Box<dyn crate::engine::tools::Tool>> = Vec::new();
        for ((server, pool, tool), name) in listed.into_iter().zip(names) {
            match name {
                Some(name) => tools.push(Box::new(crate::mcp::tool::KestrelMcpTool::new(pool, tool, name))),
                None => log::warn!("MCP server {server:?}: tool {:?} has no free name and is left out", tool.name),
            }
        }
        engine.tools().replace_group("mcp", tools);
        know_tools(&engine);
    };
    std::thread::Builder::new()
        .name("kestrel-mcp-connect".into())
        .spawn(connect)
        .map_err(|e| StartError::Thread("kestrel-mcp-connect", e))?;
    Ok(())
}
