//! The BAE client API v1 against the real server and the fake provider.

mod admin;
mod calls;
mod compaction;
mod conversation;
mod crash;
mod drivers;
mod hostile;
mod mcp;
pub mod sandbox;
mod sessions;
mod subagents;
pub mod support;
mod turns;
