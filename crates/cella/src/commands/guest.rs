//! The guest side: how the sandbox's init becomes envd, and `cella envd` for debugging.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;

use cella_envd::init::{Reaper, forward_termination};
use cella_envd::{Envd, EnvdConfig};
use cella_sandbox::native::init::GuestConfig;

/// Becomes PID 1 of a sandbox: the envd server on the inherited listener. Never returns.
pub fn run_in_sandbox(listener: UnixListener, guest: GuestConfig) -> ! {
    let code = match serve(listener, guest, true) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cella-envd: {e}");
            1
        }
    };
    std::process::exit(code)
}

fn serve(listener: UnixListener, guest: GuestConfig, pid1: bool) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        Reaper::global().start()?;
        if pid1 {
            forward_termination()?;
        }
        if let Some(bridge) = &guest.egress {
            // Bound before any process of the sandbox runs, so nothing else can take the port.
            let tcp = std::net::TcpListener::bind(("127.0.0.1", bridge.port))?;
            tcp.set_nonblocking(true)?;
            let tcp = tokio::net::TcpListener::from_std(tcp)?;
            tokio::spawn(cella_envd::egress::bridge(tcp, bridge.socket.clone()));
        }
        listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(listener)?;
        let config = EnvdConfig {
            default_user: guest.default_user,
            default_workdir: guest.default_workdir.map(PathBuf::from),
            envs: guest.envs,
        };
        let envd = Envd::new(config);
        if pid1 {
            cella_envd::interpreter::listen(&envd, cella_proto::INTERPRETER_PORT).await;
        }
        cella_envd::serve(listener, envd).await
    })
}

#[derive(Debug, clap::Args)]
pub struct EnvdArgs {
    /// Unix socket to listen on.
    #[arg(long)]
    socket: PathBuf,
    /// User requests run as when they name none.
    #[arg(long, default_value = "user")]
    default_user: String,
}

pub fn run_standalone(args: EnvdArgs) -> anyhow::Result<ExitCode> {
    let _ = std::fs::remove_file(&args.socket);
    let listener = UnixListener::bind(&args.socket)
        .map_err(|e| anyhow::anyhow!("binding {}: {e}", args.socket.display()))?;
    serve(
        listener,
        GuestConfig {
            default_user: args.default_user,
            ..Default::default()
        },
        false,
    )?;
    Ok(ExitCode::SUCCESS)
}
