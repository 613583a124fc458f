//! The `kestrel` binary: parse arguments, load the config, start the server, wait for a signal.

use std::path::PathBuf;
use std::process::ExitCode;

use kestrel::{Config, Server};

const USAGE: &str = "usage: kestrel [--config PATH] [--allow-unauthenticated] [BAE admin flags]

  --config PATH                       a TOML config file (or KESTREL_CONFIG)
  --allow-unauthenticated             serve a non-loopback address without a token
  --admin-key-file PATH               where the BAE admin key is written (or BAE_ADMIN_KEY_FILE)
  --rotate-admin-key                  revoke the BAE admin key and write a new one
  --dangerously-disable-admin-auth    serve the BAE admin API with no key (local development only)

Environment: KESTREL_ADDR (or BAE_ADDR), KESTREL_DATA_DIR, KESTREL_WORKSPACE, KESTREL_TOKEN,
KESTREL_DEFAULT_MODEL, KESTREL_BUILTIN_DELAY_MS, KESTREL_ADMIN_ADDR (or BAE_ADMIN_ADDR),
KESTREL_ADMIN_KEY_FILE (or BAE_ADMIN_KEY_FILE), BAE_CONFIG, BAE_TURN_TIMEOUT,
BAE_DANGEROUSLY_DISABLE_ADMIN_AUTH, RUST_LOG (or BAE_LOG; default info).";

fn main() -> ExitCode {
    // BAE's name for the log filter works too; RUST_LOG wins.
    let filter = std::env::var("RUST_LOG").or_else(|_| std::env::var("BAE_LOG")).unwrap_or_else(|_| "info".into());
    env_logger::Builder::new().parse_filters(&filter).init();
    let mut config_path = std::env::var_os("KESTREL_CONFIG").map(PathBuf::from);
    let mut allow_unauthenticated = false;
    let (mut admin_key_file, mut rotate_admin_key, mut disable_admin_auth) = (None, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" => match args.next() {
                Some(path) => config_path = Some(PathBuf::from(path)),
                None => return usage_error("--config needs a path"),
            },
            "--allow-unauthenticated" => allow_unauthenticated = true,
            "--admin-key-file" => match args.next() {
                Some(path) => admin_key_file = Some(PathBuf::from(path)),
                None => return usage_error("--admin-key-file needs a path"),
            },
            "--rotate-admin-key" => rotate_admin_key = true,
            "--dangerously-disable-admin-auth" => disable_admin_auth = true,
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
    config.bae.admin_key_file = admin_key_file.or(config.bae.admin_key_file.take());
    config.bae.rotate_admin_key = rotate_admin_key;
    config.bae.dangerously_disable_admin_auth |= disable_admin_auth;

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

fn usage_error(message: &str) -> ExitCode {
    eprintln!("kestrel: {message}\n\n{USAGE}");
    ExitCode::from(2)
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("kestrel: {error}");
    ExitCode::FAILURE
}
