//! `cella sandbox …`: a client of a running `cella serve`. Lifecycle commands speak the E2B
//! control plane (`api.rs`); `exec` and `cp` reach the sandbox's envd through the server's
//! gateway on the same port. One module per command; none of them knows the server's insides.

pub(crate) mod api;
mod cp;
mod create;
mod exec;
mod inspect;
mod lifecycle;
mod list;

use std::process::ExitCode;

use api::{Server, ServerOptions};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "The server is CELLA_URL (default http://127.0.0.1:3000). The API key is --api-key or CELLA_API_KEY; without one, the server's admin key is read from <data-dir>/admin.key if readable (as root: /var/lib/cella/admin.key). More keys: `cella keys create --tenant NAME`.\n\nExit status: 0 on success, 1 when the request failed (server unreachable, key refused, sandbox not found, …); `exec` exits with the command's own status, or 125 when it could not be started."
)]
pub struct SandboxArgs {
    #[command(flatten)]
    server: ServerOptions,
    /// Print JSON (exec: one JSON object per output chunk and one for the exit).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: SandboxCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SandboxCommand {
    /// Create a sandbox and print its id.
    Create(create::CreateArgs),
    /// List running and paused sandboxes.
    #[command(alias = "list")]
    Ls(list::ListArgs),
    /// Show one sandbox's details.
    #[command(alias = "get")]
    Inspect(inspect::InspectArgs),
    /// Show a sandbox's lifecycle log (created, paused, resumed, …).
    Logs(inspect::InspectArgs),
    /// Run a command in a sandbox: output streams live, the exit status is the command's.
    Exec(exec::ExecArgs),
    /// Copy a file into a sandbox (`cp ./f ID:/path`) or out of it (`cp ID:/path ./f`).
    Cp(cp::CpArgs),
    /// Kill sandboxes.
    #[command(alias = "kill")]
    Rm(lifecycle::RmArgs),
    /// Pause a sandbox (its processes are frozen, its files kept).
    Pause(lifecycle::IdArgs),
    /// Resume a paused sandbox.
    Resume(lifecycle::ResumeArgs),
}

/// Exit status of a client command that failed before doing its job.
const FAILED: u8 = 1;

pub fn run(args: SandboxArgs) -> anyhow::Result<ExitCode> {
    let server = Server::new(&args.server)?;
    let rt = super::local::runtime()?;
    let json = args.json;
    let (result, failure) = rt.block_on(async {
        match args.command {
            SandboxCommand::Create(a) => (create::run(&server, a, json).await, FAILED),
            SandboxCommand::Ls(a) => (list::run(&server, a, json).await, FAILED),
            SandboxCommand::Inspect(a) => (inspect::show(&server, a, json).await, FAILED),
            SandboxCommand::Logs(a) => (inspect::logs(&server, a, json).await, FAILED),
            SandboxCommand::Exec(a) => (exec::run(&server, a, json).await, exec::NOT_STARTED),
            SandboxCommand::Cp(a) => (cp::run(&server, a, json).await, FAILED),
            SandboxCommand::Rm(a) => (lifecycle::rm(&server, a, json).await, FAILED),
            SandboxCommand::Pause(a) => (lifecycle::pause(&server, a, json).await, FAILED),
            SandboxCommand::Resume(a) => (lifecycle::resume(&server, a, json).await, FAILED),
        }
    });
    Ok(match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("cella: {e:#}");
            ExitCode::from(failure)
        }
    })
}

/// Prints a JSON value (pretty, for people and `jq` alike).
fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// `--metadata K=V`.
fn parse_metadata(s: &str) -> Result<(String, String), String> {
    super::exec::key_value(s, "--metadata", "KEY=VALUE")
}
