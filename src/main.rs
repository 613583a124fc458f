//! The `kestrel` binary: serve (the default), or one of the client subcommands
//! (`kestrel --help`).

use std::process::ExitCode;

use clap::Parser;
use kestrel::cli::args::{Cli, Command, ServeArgs};
use kestrel::{Config, Server};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        None => serve(&cli.serve),
        Some(Command::Serve(args)) => serve(args),
        Some(command) => match kestrel::cli::run(command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                if !error.to_string().is_empty() {
                    eprintln!("kestrel: {error}");
                }
                ExitCode::from(error.exit_code())
            }
        },
    }
}

/// Loads the config, starts the server and waits for a signal.
fn serve(args: &ServeArgs) -> ExitCode {
    // BAE's name for the log filter works too; RUST_LOG wins.
    let filter = std::env::var("RUST_LOG").or_else(|_| std::env::var("BAE_LOG")).unwrap_or_else(|_| "info".into());
    let format = kestrel::logging::LogFormat::from_env(std::env::var("KESTREL_LOG_FORMAT").ok().as_deref());
    kestrel::logging::init(&filter, format);
    let mut config = match Config::load(args.config.as_deref(), &|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(error) => return fail(&error),
    };
    config.server.allow_unauthenticated |= args.allow_unauthenticated;
    config.bae.admin_key_file = args.admin_key_file.clone().or(config.bae.admin_key_file.take());
    config.bae.rotate_admin_key = args.rotate_admin_key;
    config.bae.dangerously_disable_admin_auth |= args.dangerously_disable_admin_auth;

    // Not dumpable: `/proc/<pid>/environ` (every API key) and ptrace are then closed to other
    // processes of the same user, such as the commands the agent runs. Commands are new
    // programs, which start dumpable again.
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        log::warn!("cannot mark the process non-dumpable: {error}");
    }
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    if let Err(error) = ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    }) {
        log::warn!("cannot install a signal handler ({error}); stop with SIGKILL");
    }
    let server = match Server::start(config) {
        Ok(server) => server,
        Err(error) => return fail(&error),
    };
    // Printed on stdout too, so a supervisor (or a test) can find the port when it asked for 0.
    // Whoever started us may have stopped reading stdout (a closed pipe): not an error.
    let mut ready = format!("kestrel listening on http://{}\n", server.addr());
    if let Some(admin) = server.admin_addr() {
        ready.push_str(&format!("kestrel admin API on http://{admin}\n"));
    }
    let mut stdout = std::io::stdout();
    let _ = std::io::Write::write_all(&mut stdout, ready.as_bytes()).and_then(|()| std::io::Write::flush(&mut stdout));
    let _ = stop_rx.recv();
    log::info!("shutting down");
    server.shutdown();
    ExitCode::SUCCESS
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("kestrel: {error}");
    ExitCode::FAILURE
}
