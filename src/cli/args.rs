//! The `kestrel` command line, as clap parses it: `serve` (the default: no subcommand serves
//! too, so `cargo run --release` still does) and the client subcommands, which talk HTTP to a
//! server given by `--url` / `KESTREL_URL` with a token from `KESTREL_TOKEN` or `--token-file`
//! (`--token` still works, warned about: other local users read command lines).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The environment the server reads, besides the options' own variables.
const SERVE_ENV: &str = "Environment: KESTREL_ADDR (or BAE_ADDR), KESTREL_DATA_DIR, KESTREL_WORKSPACE, \
KESTREL_TOKEN, KESTREL_ALLOWED_HOSTS, KESTREL_ALLOWED_ORIGINS, KESTREL_DEFAULT_MODEL, KESTREL_BUILTIN_DELAY_MS, \
KESTREL_ADMIN_ADDR (or BAE_ADMIN_ADDR), KESTREL_ADMIN_KEY_FILE, BAE_CONFIG, BAE_TURN_TIMEOUT, BAE_SANDBOX_DRIVER, BAE_SUBAGENT_TIMEOUT, \
BAE_MAX_SUBAGENTS_PER_SESSION, BAE_DANGEROUSLY_DISABLE_ADMIN_AUTH, RUST_LOG (or BAE_LOG; default info).";

#[derive(Debug, Parser)]
#[command(name = "kestrel", version, about = "A self-hosted agent session server, and a client for it.")]
#[command(after_help = "With no subcommand, kestrel serves (`kestrel serve --help` lists the server's options).")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The server's options, also accepted without `serve`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API, the console and the BAE doors (the default).
    #[command(after_help = SERVE_ENV)]
    Serve(ServeArgs),
    /// Chat in the terminal: replies stream as they are written, approvals are asked here.
    Chat(ChatArgs),
    /// List, show or delete sessions.
    Sessions(SessionsArgs),
    /// Send a message to a session; with --wait, print the reply.
    Send(SendArgs),
    /// Print a stream's events as JSON lines, as they happen.
    Events(EventsArgs),
    /// Ask the server whether it is up.
    Health(HealthArgs),
    /// Speak the Agent Client Protocol on stdio, for an editor (docs/acp.md).
    Acp(AcpArgs),
    /// Apply the store's schema migrations, then exit.
    Migrate(MigrateArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// A TOML config file.
    #[arg(long, env = "KESTREL_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Serve a non-loopback address without a token.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Where the BAE admin key is written.
    #[arg(long, env = "BAE_ADMIN_KEY_FILE", value_name = "PATH")]
    pub admin_key_file: Option<PathBuf>,
    /// Revoke the BAE admin key and write a new one.
    #[arg(long)]
    pub rotate_admin_key: bool,
    /// Serve the BAE admin API with no key (local development only).
    #[arg(long)]
    pub dangerously_disable_admin_auth: bool,
}

/// Where the server is, for every client subcommand.
#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// The server's base URL.
    #[arg(long, env = "KESTREL_URL", default_value = "http://127.0.0.1:8080", global = true)]
    pub url: String,
    /// The bearer token, when the server asks for one. Every local user can read a command
    /// line: prefer the KESTREL_TOKEN environment variable or --token-file.
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// A file holding the bearer token (its first line).
    #[arg(long, global = true, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
}

impl Remote {
    /// The token of `--token`, `--token-file` or `KESTREL_TOKEN` (`cli/token.rs`).
    pub fn token(&self) -> Result<Option<String>, super::CliError> {
        let env = std::env::var("KESTREL_TOKEN").ok();
        super::token::resolve(self.token.as_deref(), self.token_file.as_deref(), env)
    }
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The session to continue; a new one when left out.
    pub session: Option<String>,
    /// The model of a new session.
    #[arg(long)]
    pub model: Option<String>,
    /// The workspace directory of a new session.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Args)]
pub struct SessionsArgs {
    #[command(subcommand)]
    pub action: Option<SessionsAction>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Subcommand)]
pub enum SessionsAction {
    /// Every session, most recently updated first (the default).
    List,
    /// One session with its transcript.
    Show { id: String },
    /// Delete a session and its transcript.
    Rm { id: String },
    /// A new session with this one's transcript up to a message (all of it by default).
    Fork {
        id: String,
        /// The last message the fork keeps.
        #[arg(long, value_name = "MESSAGE_ID")]
        message: Option<String>,
        /// Work in a copy of the files as they were at that message, not in the same directory.
        #[arg(long)]
        copy: bool,
        /// Where the copy goes (a new directory); beside the session's workspace by default.
        #[arg(long, value_name = "DIR", requires = "copy")]
        path: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct SendArgs {
    pub session: String,
    pub message: String,
    /// Wait for the run to end and print the reply.
    #[arg(long)]
    pub wait: bool,
    /// Print JSON: `{runId}`, or with --wait the run's outcome and messages.
    #[arg(long)]
    pub json: bool,
    /// Ask for a final answer valid against the JSON Schema in this file (or a whole
    /// `responseFormat`); waits, and prints the answer's value (with --json, as `structured`).
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// One session's stream; every session's when left out.
    pub session: Option<String>,
    /// Replay the buffered events after this seq first.
    #[arg(long, value_name = "SEQ")]
    pub since: Option<u64>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// A PostgreSQL URL (postgres://user:password@host:port/database); the data dir's SQLite
    /// file when left out.
    #[arg(long, env = "KESTREL_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// The data dir whose SQLite file is migrated (or copied, with `--from sqlite`).
    #[arg(long, value_name = "DIR", env = "KESTREL_DATA_DIR", default_value = "./kestrel-data")]
    pub data_dir: PathBuf,
    /// `sqlite`: copy the data dir's SQLite store (stopped) into the empty PostgreSQL
    /// database of `--database-url`.
    #[arg(long, value_name = "STORE", value_parser = ["sqlite"])]
    pub from: Option<String>,
}

#[derive(Debug, Args)]
pub struct AcpArgs {
    /// A running server's base URL; without one, a server is started here on --data-dir.
    #[arg(long, env = "KESTREL_URL")]
    pub url: Option<String>,
    /// The running server's bearer token. Every local user can read a command line: prefer
    /// the KESTREL_TOKEN environment variable or --token-file.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// A file holding the running server's bearer token (its first line).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// The data dir of the server started here (when no --url is given).
    #[arg(long, value_name = "DIR", default_value = "./kestrel-data")]
    pub data_dir: PathBuf,
    /// A project directory sessions may work in (repeatable); the current directory when none
    /// is given. With --url, the server's own roots apply as well.
    #[arg(long = "root", value_name = "DIR")]
    pub roots: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Print the server's JSON answer.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: Remote,
}
