//! `cella skills …`: validate, inspect, render, scaffold, package and install Agent Skills.

use std::process::ExitCode;

/// Agent Skills commands.
#[derive(Debug, clap::Subcommand)]
pub enum SkillsCommand {}

pub fn run(cmd: SkillsCommand) -> anyhow::Result<ExitCode> {
    match cmd {}
}
