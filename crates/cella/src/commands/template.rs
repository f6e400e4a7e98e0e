//! `cella template build` and `cella template ls`: root filesystems for sandboxes, built from
//! Debian's packages plus pip and npm, content-addressed and cached in the data directory.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use cella_sandbox::native::NativeConfig;
use cella_sandbox::spec::Limits;
use cella_sandbox::template::build::{Outcome, Progress, build};
use cella_sandbox::template::{Catalog, Origin};

#[derive(Debug, clap::Subcommand)]
pub enum TemplateCommand {
    /// Build a template's root filesystem (a no-op when its current build exists).
    #[command(
        after_help = "Needs root and mmdebstrap (apt-get install mmdebstrap). Templates are the shipped ones (`base`, `code-interpreter`) and <data-dir>/templates/NAME/template.toml. The build is cached under <data-dir>/templates/NAME/<hash>/ by the hash of what decides its content, so an unchanged template rebuilds instantly."
    )]
    Build {
        /// The template's name (`cella template ls` lists them).
        name: String,
        /// Data directory holding templates and their builds.
        #[arg(long, env = "CELLA_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Print the result as JSON on stdout (progress still goes to stderr).
        #[arg(long)]
        json: bool,
    },
    /// List templates: where each comes from, and whether its current build exists.
    Ls {
        /// Data directory holding templates and their builds.
        #[arg(long, env = "CELLA_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn catalog(data_dir: Option<PathBuf>) -> Catalog {
    let config = NativeConfig::with_helper(PathBuf::new());
    Catalog::new(&data_dir.unwrap_or(config.data_dir), config.id_base)
}

/// The default resources of template `name` in the default data directory, for the commands
/// that create local sandboxes; unknown or unbuilt templates are an error saying what to do.
pub fn default_limits(name: &str) -> anyhow::Result<Limits> {
    let resolved = catalog(std::env::var_os("CELLA_DATA_DIR").map(PathBuf::from))
        .resolve(name)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(resolved.template.limits)
}

pub fn run(cmd: TemplateCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TemplateCommand::Build {
            name,
            data_dir,
            json,
        } => build_cmd(&catalog(data_dir), &name, json),
        TemplateCommand::Ls { data_dir, json } => ls_cmd(&catalog(data_dir), json),
    }
}

fn say(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

fn build_cmd(catalog: &Catalog, name: &str, json: bool) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let mut on_progress = |p: Progress| match p {
        Progress::Stage {
            index,
            total,
            name,
            detail,
        } => say(&format!("[{index}/{total}] {name}: {detail}")),
        Progress::StageDone { name, seconds } => {
            say(&format!("      {name} done in {seconds:.1} s"))
        }
    };
    let outcome = build(catalog, name, &mut on_progress).map_err(|e| anyhow::anyhow!("{e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    let (status, info) = match &outcome {
        Outcome::Built(info) => ("built", Some(info)),
        Outcome::Cached(info) => ("cached", Some(info)),
        Outcome::NothingToBuild => ("nothing-to-build", None),
    };
    if json {
        let doc = serde_json::json!({
            "name": name,
            "status": status,
            "seconds": seconds,
            "hash": info.map(|i| i.hash.clone()),
            "size_bytes": info.map(|i| i.size_bytes),
            "rootfs": info.map(|i| catalog.build_dir(name, &i.hash).join("rootfs")),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).context("encoding the result as JSON")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    match outcome {
        Outcome::Built(info) => println!(
            "built template {name} in {seconds:.1} s: {} ({}), hash {}",
            human_size(info.size_bytes),
            catalog.build_dir(name, &info.hash).join("rootfs").display(),
            short(&info.hash)
        ),
        Outcome::Cached(info) => println!(
            "template {name} is up to date (hash {}, built in {:.1} s): nothing to do",
            short(&info.hash),
            info.build_seconds
        ),
        Outcome::NothingToBuild => {
            println!("template {name} runs on the host's /usr: nothing to build")
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn ls_cmd(catalog: &Catalog, json: bool) -> anyhow::Result<ExitCode> {
    let mut rows = Vec::new();
    for name in catalog.names() {
        let (status, hash, size, origin, description) = match catalog.load(&name) {
            Ok(Some(loaded)) => {
                let built = catalog.built(&loaded);
                let status = match (&loaded.hash, &built) {
                    (None, _) => "host",
                    (Some(_), Some(_)) => "built",
                    (Some(_), None) => "not-built",
                };
                let origin = match &loaded.origin {
                    Origin::Shipped => "shipped".to_string(),
                    Origin::User(dir) => dir.display().to_string(),
                };
                (
                    status.to_string(),
                    loaded.hash.clone(),
                    built.map(|b| b.size_bytes),
                    origin,
                    loaded.template.description.clone(),
                )
            }
            Ok(None) => continue,
            Err(e) => (
                "invalid".to_string(),
                None,
                None,
                String::new(),
                e.to_string(),
            ),
        };
        rows.push((name, status, hash, size, origin, description));
    }
    if json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, status, hash, size, origin, description)| {
                serde_json::json!({
                    "name": name, "status": status, "hash": hash, "size_bytes": size,
                    "origin": origin, "description": description,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "templates": list }))
                .context("encoding the template list as JSON")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        bail!("no templates found");
    }
    println!(
        "{:<20} {:<10} {:<14} {:>9}  DESCRIPTION",
        "NAME", "STATUS", "HASH", "SIZE"
    );
    for (name, status, hash, size, _origin, description) in &rows {
        println!(
            "{:<20} {:<10} {:<14} {:>9}  {}",
            name,
            status,
            hash.as_deref().map(short).unwrap_or("-"),
            size.map(human_size).unwrap_or_else(|| "-".into()),
            description
        );
    }
    if rows.iter().any(|r| r.1 == "not-built") {
        println!("\nbuild one with: cella template build NAME");
    }
    Ok(ExitCode::SUCCESS)
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
