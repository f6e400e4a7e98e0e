//! The `cella` command: sandboxes for AI agents' code.
//!
//! This binary is also its own sandbox helper: the hidden `__sandbox-spawner` subcommand runs
//! the single-threaded process that forks one helper per sandbox (nothing forks from a
//! multi-threaded runtime), and the sandbox's init then runs the guest agent (cella-envd) from
//! the same binary.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cella",
    version,
    about = "Run AI agents' code in sandboxes: fast, local, E2B-compatible",
    after_help = "Start with `cella doctor` to see what this host supports, then `cella exec -- python3 -c 'print(6*7)'`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const EXEC_ABOUT: &str =
    "Run one command in a fresh sandbox, stream its output, and exit with its exit code.";

/// `cella exec` on its own: the hot path parses only its own arguments (building the parser of
/// every command costs ~0.5 ms, a tenth of a whole sandbox). Same arguments, help and errors.
#[derive(Debug, Parser)]
#[command(name = "cella exec", bin_name = "cella exec", about = EXEC_ABOUT)]
struct ExecCli {
    #[command(flatten)]
    args: commands::exec::ExecArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the E2B-compatible control plane and envd gateway (the main job).
    Serve(commands::serve::ServeArgs),
    /// Agent jobs on a `cella serve`: submit, ls, get, watch, cancel, artifacts.
    Jobs(commands::jobs::JobsArgs),
    /// Manage API keys of `cella serve`.
    #[command(subcommand)]
    Keys(commands::serve::KeysCommand),
    /// Manage sandboxes of a running `cella serve`: create, ls, exec, cp, rm, pause, resume.
    Sandbox(commands::sandbox::SandboxArgs),
    #[command(about = EXEC_ABOUT)]
    Exec(commands::exec::ExecArgs),
    /// An agent does TASK in a fresh sandbox with a model (tool-calling loop or reflexion).
    Run(Box<commands::run::RunArgs>),
    /// An interactive shell (PTY) in a fresh sandbox.
    Shell(commands::shell::ShellArgs),
    /// What this host offers sandboxes, and which backends can run here.
    Doctor(commands::doctor::DoctorArgs),
    /// Benchmarks, each against a baseline measured in the same run.
    #[command(subcommand)]
    Bench(commands::bench::BenchCommand),
    /// Validate, inspect, render, scaffold, package and install Agent Skills.
    #[command(subcommand)]
    Skills(commands::skills::SkillsCommand),
    /// Build and list templates (root filesystems for sandboxes).
    #[command(subcommand)]
    Template(commands::template::TemplateCommand),
    /// Run the sandbox agent (envd) on a Unix socket, outside any sandbox (for debugging).
    #[command(hide = true)]
    Envd(commands::guest::EnvdArgs),
    /// Internal: forks the helpers that build sandboxes (started by cella itself).
    #[command(name = "__sandbox-spawner", hide = true)]
    SandboxSpawner,
}

fn main() -> ExitCode {
    // The spawner must not pay for argument parsing machinery it does not need.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == cella_sandbox::native::SPAWNER_SUBCOMMAND)
    {
        cella_sandbox::native::spawner::run(commands::guest::run_in_sandbox);
    }
    let command = if std::env::args_os().nth(1).is_some_and(|a| a == "exec") {
        let args = std::iter::once("cella exec".into()).chain(std::env::args_os().skip(2));
        Command::Exec(ExecCli::parse_from(args).args)
    } else {
        Cli::parse().command
    };
    let result = match command {
        Command::Serve(args) => commands::serve::serve(args),
        Command::Keys(cmd) => commands::serve::keys(cmd),
        Command::Sandbox(args) => commands::sandbox::run(args),
        Command::Jobs(args) => commands::jobs::run(args),
        Command::Exec(args) => commands::exec::run(args),
        Command::Run(args) => commands::run::run(*args),
        Command::Shell(args) => commands::shell::run(args),
        Command::Doctor(args) => commands::doctor::run(args),
        Command::Bench(cmd) => commands::bench::run(cmd),
        Command::Skills(cmd) => commands::skills::run(cmd),
        Command::Template(cmd) => commands::template::run(cmd),
        Command::Envd(args) => commands::guest::run_standalone(args),
        Command::SandboxSpawner => Ok(ExitCode::from(2)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cella: {e:#}");
            ExitCode::from(2)
        }
    }
}
