//! `cella doctor`: what this host offers sandboxes and which backends can run here.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = cella_sandbox::host::probe();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "kernel {} ({})",
            report.kernel,
            if report.running_as_root {
                "running as root"
            } else {
                "running unprivileged"
            }
        );
        println!();
        for c in &report.checks {
            println!(
                "  {} {:<32} {}",
                if c.ok { "ok  " } else { "no  " },
                c.name,
                c.detail
            );
        }
        println!("\nbackends:");
        for b in &report.backends {
            println!(
                "  {} {:<10} {}",
                if b.usable { "ok  " } else { "no  " },
                b.name,
                b.detail
            );
        }
    }
    Ok(if report.backends.iter().any(|b| b.usable) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
