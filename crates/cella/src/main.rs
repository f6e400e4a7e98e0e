//! The `cella` command: sandboxes for AI agents' code.
//!
//! This binary is also its own helper: the hidden `__sandbox-init` subcommand is how sandboxes
//! are built (the server never forks from its multi-threaded runtime; it re-runs this binary).

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cella", version, about = "Run AI agents' code in sandboxes: fast, local, E2B-compatible")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate, inspect, render, scaffold, package and install Agent Skills.
    #[command(subcommand)]
    Skills(commands::skills::SkillsCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Skills(cmd) => commands::skills::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cella: {e:#}");
            ExitCode::from(2)
        }
    }
}
