//! The integration suite: every test starts a real server on 127.0.0.1:0 and talks HTTP.

mod auth;
mod bae;
mod checkpoints;
mod cli;
mod context;
mod edge;
mod events;
mod fake_provider;
mod files;
mod hammer;
mod hardening;
mod http;
mod idempotency;
mod mcp;
mod migrate;
mod plugins;
mod providers;
mod restart;
mod runs;
mod sessions;
mod streams;
mod support;
mod terminal;
mod tools;
mod workspaces;
