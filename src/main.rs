//! The `kestrel` binary: parse arguments, load the config, start the server, wait for a signal.

use std::path::PathBuf;
use std::process::ExitCode;

use kestrel::{Config, Server};

const USAGE: &str = "usage: kestrel [--config PATH] [--allow-unauthenticated]

  --config PATH             a TOML config file (or KESTREL_CONFIG)
  --allow-unauthenticated   serve a non-loopback address without a token

Environment: KESTREL_ADDR, KESTREL_DATA_DIR, KESTREL_WORKSPACE, KESTREL_TOKEN,
KESTREL_DEFAULT_MODEL, KESTREL_BUILTIN_DELAY_MS, RUST_LOG (default info).";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let mut config_path = std::env::var_os("KESTREL_CONFIG").map(PathBuf::from);
    let mut allow_unauthenticated = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" => match args.next() {
                Some(path) => config_path = Some(PathBuf::from(path)),
                None => return usage_error("--config needs a path"),
            },
            "--allow-unauthenticated" => allow_unauthenticated = true,
            "--version" => {
                println!("kestrel {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage_error(&format!("unknown argument {other}")),
        }
    }

    let mut config = match Config::load(config_path.as_deref(), &|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(error) => return fail(&error),
    };
    config.server.allow_unauthenticated |= allow_unauthenticated;

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
    println!("kestrel listening on http://{}", server.addr());
    let _ = stop_rx.recv();
    log::info!("shutting down");
    server.shutdown();
    ExitCode::SUCCESS
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("kestrel: {message}\n\n{USAGE}");
    ExitCode::from(2)
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("kestrel: {error}");
    ExitCode::FAILURE
}
