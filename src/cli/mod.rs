//! The terminal client: the `kestrel` binary's subcommands other than `serve`. They talk to a
//! server over the public protocol only (`/api/*`), like any other client.

mod acp;
pub mod args;
mod chat;
mod client;
mod commands;
mod token;

pub use client::CliError;

use args::Command;

/// Runs a client subcommand (`serve` is the binary's own business).
pub fn run(command: &Command) -> Result<(), CliError> {
    match command {
        Command::Serve(_) => Err(CliError::Usage("serve is not a client command".into())),
        Command::Chat(args) => chat::chat(args),
        Command::Sessions(args) => commands::sessions(args),
        Command::Send(args) => commands::send(args),
        Command::Events(args) => commands::events(args),
        Command::Health(args) => commands::health(args),
        Command::Acp(args) => acp::acp(args),
        Command::Migrate(args) => commands::migrate(args),
    }
}
