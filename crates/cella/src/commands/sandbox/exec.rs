//! `cella sandbox exec ID -- CMD ARGS`: `process.Process/Start` through the server's gateway,
//! attached to this terminal (output live, stdin piped when it is not a TTY); the exit status is
//! the command's.

use std::io::IsTerminal;

use cella_proto::process::{ProcessConfig, StartRequest};

use super::api::Server;
use crate::commands::exec::{Attach, Outcome, run_process};

/// Exit status when the command could not be started (as `docker exec`/`cella exec`).
pub const NOT_STARTED: u8 = 125;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: the command's own; 125 if it could not be started (server unreachable, key refused, sandbox not found or paused); 127 if the command does not exist; 126 if it is not executable; 130 after Ctrl-C (which kills the command)."
)]
pub struct ExecArgs {
    /// The sandbox's id.
    id: String,
    /// Environment variable for the command, NAME=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = crate::commands::exec::parse_env)]
    env: Vec<(String, String)>,
    /// Working directory in the sandbox (default: the user's home).
    #[arg(long)]
    cwd: Option<String>,
    /// User to run as (default: the sandbox's default user, `user`; `root` is root inside the
    /// sandbox only).
    #[arg(long, short = 'u')]
    user: Option<String>,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

pub async fn run(server: &Server, args: ExecArgs, json: bool) -> anyhow::Result<u8> {
    let client = server.running_envd(&args.id).await?;
    let Some((cmd, cmd_args)) = args.command.split_first() else {
        anyhow::bail!("no command given: cella sandbox exec ID -- CMD [ARGS…]");
    };
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: cmd.clone(),
            args: cmd_args.to_vec(),
            envs: args.env.into_iter().collect(),
            cwd: args.cwd,
        }),
        pty: None,
        tag: None,
        stdin: Some(!std::io::stdin().is_terminal()),
    };
    let attach = if json {
        Attach::JsonLines
    } else {
        Attach::Terminal
    };
    let outcome = run_process(&client, &req, args.user.as_deref(), None, attach).await?;
    Ok(match outcome {
        Outcome::Exited(code) => u8::try_from(code.clamp(0, 255)).unwrap_or(1),
        Outcome::TimedOut(_) => 124,
        Outcome::Interrupted => 130,
        Outcome::NotStarted(code, message) => {
            eprintln!("cella: {message}");
            code
        }
    })
}
