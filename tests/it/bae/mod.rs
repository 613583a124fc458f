//! The BAE client API v1 against the real server and the fake provider.

mod admin;
mod sessions;
mod turns;
pub mod support;
