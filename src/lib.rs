//! Kestrel: a self-hosted agent session server. One binary, one SQLite file, no async runtime.
//!
//! `Server::start(config)` runs a whole server on its own threads and returns a handle; there
//! is no global state, so one process may run many. See ARCHITECTURE.md for the code map.

#![forbid(unsafe_code)]

pub mod api;
mod app;
pub mod auth;
pub mod bus;
pub mod cancel;
pub mod checkpoints;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod console;
pub mod dirfd;
pub mod domain;
pub mod engine;
pub mod http;
pub mod logging;
pub mod mcp;
pub mod metrics;
pub mod plugins;
pub mod policy;
pub mod providers;
pub mod sandbox;
pub mod schedule;
pub mod store;
pub mod time;
pub mod tools;
pub mod webhooks;
pub mod workers;

pub use app::{Server, StartError, Stats};
pub use config::Config;
