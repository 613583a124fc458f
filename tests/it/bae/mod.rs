//! The BAE client API v1 against the real server and the fake provider.

mod admin;
mod drivers;
mod sessions;
mod turns;
pub mod support;
