//! `cella skills …`: validate, inspect, render, scaffold, package and install Agent Skills.
//!
//! A thin layer over the `cella-skills` library: argument parsing, output formatting and exit
//! codes. Output formats follow the reference validator (skills-ref's `agentskills` command)
//! where it has the same command: `validate` prints `Valid skill: PATH` or
//! `Validation failed for PATH:` and the errors to stderr, `read-properties` prints the same
//! JSON, `to-prompt` the same XML.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use cella_skills::discovery::{self, Diagnostic, Limits};
use cella_skills::validate::{Finding, Mode, Report};
use cella_skills::{activation, catalog, package, skill, validate};

/// Agent Skills commands.
#[derive(Debug, clap::Subcommand)]
pub enum SkillsCommand {
    /// Check skills against the Agent Skills specification
    ///
    /// Exit status 0 when every PATH is valid, 1 otherwise. Errors go to stderr, one per line,
    /// naming the rule, the field and the offending value.
    ///
    /// --strict (default): the specification's rules and every check of the reference
    /// validator (skills-ref). --reference: skills-ref's checks only (the same verdicts as
    /// `agentskills validate`). --lenient: load like a client would, with warnings; fails only
    /// when the description is missing or the YAML cannot be parsed.
    #[command(verbatim_doc_comment)]
    Validate {
        /// Skill directories or SKILL.md files.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Specification + skills-ref rules (default).
        #[arg(long, conflicts_with_all = ["lenient", "reference"])]
        strict: bool,
        /// Client-style loading: warn and load.
        #[arg(long, conflicts_with = "reference")]
        lenient: bool,
        /// skills-ref's checks only.
        #[arg(long)]
        reference: bool,
        /// Print one JSON report per path (an array) on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Print a skill's frontmatter properties as JSON (the same as skills-ref's
    /// `read-properties`).
    ReadProperties {
        /// A skill directory or SKILL.md file.
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
    /// Print the <available_skills> XML block for skills (the same as skills-ref's
    /// `to-prompt`).
    ToPrompt {
        /// Skill directories or SKILL.md files.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// List the skills cella discovers
    ///
    /// Roots, highest precedence first: ./.cella/skills, ./.agents/skills, ./.claude/skills,
    /// then --root and $CELLA_SKILLS_PATH (colon-separated), then ~/.cella/skills and
    /// ~/.agents/skills. A project skill shadows a user skill of the same name (with a warning).
    #[command(verbatim_doc_comment)]
    Ls {
        /// Project directory (default: the current directory).
        #[arg(long, value_name = "DIR")]
        project: Option<PathBuf>,
        /// Additional skill root (repeatable).
        #[arg(long = "root", value_name = "DIR")]
        roots: Vec<PathBuf>,
        /// Do not scan the home directory.
        #[arg(long)]
        no_user: bool,
        /// Print JSON on stdout.
        #[arg(long, conflicts_with = "catalog")]
        json: bool,
        /// Print the <available_skills> catalog a model would see instead: nothing when there
        /// are no skills; skills with `disable-model-invocation: true` are left out.
        #[arg(long)]
        catalog: bool,
    },
    /// Create a new skill directory with a SKILL.md that validates.
    New {
        /// Skill name: a-z, 0-9 and single hyphens, at most 64 characters.
        name: String,
        /// Directory to create the skill in (default: the current directory).
        #[arg(long, value_name = "D", default_value = ".")]
        dir: PathBuf,
        /// Description (what the skill does and when to use it).
        #[arg(long)]
        description: Option<String>,
    },
    /// Pack a skill directory into a zip archive (.skill or .zip).
    Package {
        /// The skill directory.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// Output file (default: ./<name>.skill).
        #[arg(short, long, value_name = "OUT")]
        output: Option<PathBuf>,
        /// Package even when strict validation fails.
        #[arg(long)]
        force: bool,
    },
    /// Install a skill from a directory or a .zip/.skill archive.
    ///
    /// Archive entries that are absolute, contain '..' or leave the skill, and symlinks that
    /// point outside the skill, are refused.
    Install {
        /// A skill directory, SKILL.md, or .zip/.skill archive.
        #[arg(value_name = "SRC")]
        src: PathBuf,
        /// Skills directory to install into (default: ./.agents/skills).
        #[arg(long, value_name = "D")]
        dest: Option<PathBuf>,
        /// Replace an installed skill of the same name.
        #[arg(long)]
        force: bool,
    },
    /// Print what a model receives when it activates a skill (<skill_content>).
    Activate {
        /// A skill directory or SKILL.md file.
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
}

/// Runs one `cella skills` command.
pub fn run(cmd: SkillsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SkillsCommand::Validate {
            paths,
            strict: _,
            lenient,
            reference,
            json,
        } => {
            let mode = if lenient {
                Mode::Lenient
            } else if reference {
                Mode::Reference
            } else {
                Mode::Strict
            };
            validate_cmd(&paths, mode, json)
        }
        SkillsCommand::ReadProperties { path } => read_properties_cmd(&path),
        SkillsCommand::ToPrompt { paths } => to_prompt_cmd(&paths),
        SkillsCommand::Ls {
            project,
            roots,
            no_user,
            json,
            catalog,
        } => ls_cmd(project, roots, no_user, json, catalog),
        SkillsCommand::New {
            name,
            dir,
            description,
        } => new_cmd(&name, &dir, description),
        SkillsCommand::Package { dir, output, force } => package_cmd(&dir, output, force),
        SkillsCommand::Install { src, dest, force } => install_cmd(&src, dest, force),
        SkillsCommand::Activate { path } => activate_cmd(&path),
    }
}

fn finding_line(f: &Finding) -> String {
    let mut line = format!("  - {}", f.message);
    let mut detail = vec![format!("rule {}", f.rule)];
    if let Some(field) = &f.field {
        detail.push(format!("field {field}"));
    }
    if let Some(value) = &f.value {
        detail.push(format!("value {value:?}"));
    }
    line.push_str(&format!(" [{}]", detail.join(", ")));
    line
}

fn print_report(
    report: &Report,
    err: &mut impl Write,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let shown = report.path.display();
    if report.valid {
        writeln!(out, "Valid skill: {shown}")?;
        let warnings: Vec<&Finding> = report.warnings().collect();
        if !warnings.is_empty() {
            writeln!(err, "Warnings for {shown}:")?;
            for w in warnings {
                writeln!(err, "{}", finding_line(w))?;
            }
        }
    } else {
        writeln!(err, "Validation failed for {shown}:")?;
        for f in &report.findings {
            writeln!(err, "{}", finding_line(f))?;
        }
    }
    Ok(())
}

fn validate_cmd(paths: &[PathBuf], mode: Mode, json: bool) -> anyhow::Result<ExitCode> {
    let reports: Vec<Report> = paths.iter().map(|p| validate::validate(p, mode)).collect();
    let all_valid = reports.iter().all(|r| r.valid);
    if json {
        let text = serde_json::to_string_pretty(&reports).context("encoding reports as JSON")?;
        println!("{text}");
    } else {
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        for r in &reports {
            print_report(r, &mut stderr.lock(), &mut stdout.lock())
                .context("writing the validation report")?;
        }
    }
    Ok(if all_valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn read_properties_cmd(path: &Path) -> anyhow::Result<ExitCode> {
    let dir = skill::skill_dir_of(path);
    match skill::read_properties(&dir) {
        Ok(props) => {
            println!("{}", props.to_json_string());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("Error: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn to_prompt_cmd(paths: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let dirs: Vec<PathBuf> = paths.iter().map(|p| skill::skill_dir_of(p)).collect();
    for d in &dirs {
        if !d.exists() {
            bail!("path does not exist: {}", d.display());
        }
    }
    let refs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    match catalog::to_prompt(&refs) {
        Ok(text) => {
            println!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("Error: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

fn ls_cmd(
    project: Option<PathBuf>,
    mut roots: Vec<PathBuf>,
    no_user: bool,
    json: bool,
    show_catalog: bool,
) -> anyhow::Result<ExitCode> {
    let project = match project {
        Some(p) => p,
        None => std::env::current_dir().context("finding the current directory")?,
    };
    if let Some(extra) = std::env::var_os("CELLA_SKILLS_PATH") {
        roots.extend(std::env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    }
    let home = if no_user { None } else { home_dir() };
    let all_roots = discovery::default_roots(&project, &roots, home.as_deref());
    let found = discovery::discover(&all_roots, Limits::default());
    for d in &found.diagnostics {
        match d {
            Diagnostic::Shadowed {
                name,
                kept,
                shadowed,
            } => eprintln!(
                "warning: skill '{name}' at {} is shadowed by {}",
                shadowed.display(),
                kept.display()
            ),
            Diagnostic::Skipped { path, reason } => {
                eprintln!("warning: skipped {}: {reason}", path.display());
            }
            Diagnostic::LimitReached { limit, path } => {
                eprintln!("warning: stopped scanning at {} ({limit})", path.display());
            }
        }
    }
    if show_catalog {
        let text = catalog::render_for_model(found.skills.iter().map(|d| &d.skill));
        if !text.is_empty() {
            println!("{text}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if json {
        let skills: Vec<serde_json::Value> = found
            .skills
            .iter()
            .map(|d| {
                serde_json::json!({
                    "name": d.skill.name,
                    "description": d.skill.description,
                    "location": d.skill.location,
                    "scope": d.scope,
                    "root": d.root,
                    "warnings": d.warnings,
                })
            })
            .collect();
        let doc = serde_json::json!({ "skills": skills, "diagnostics": found.diagnostics });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).context("encoding the skill list as JSON")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if found.skills.is_empty() {
        eprintln!("no skills found");
    }
    for d in &found.skills {
        let scope = match d.scope {
            discovery::Scope::Project => "project",
            discovery::Scope::Configured => "configured",
            discovery::Scope::User => "user",
        };
        let mut desc: String = d.skill.description.chars().take(70).collect();
        if d.skill.description.chars().count() > 70 {
            desc.push('…');
        }
        let desc = desc.replace('\n', " ");
        println!(
            "{:<28} {:<10} {}\n    {}",
            d.skill.name,
            scope,
            d.skill.location.display(),
            desc
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn new_cmd(name: &str, dir: &Path, description: Option<String>) -> anyhow::Result<ExitCode> {
    if !package::is_safe_name(name) || name.ends_with('-') || name.contains("--") {
        bail!(
            "invalid skill name '{name}': use 1-64 characters a-z, 0-9 and single hyphens, not at the start or end"
        );
    }
    let skill_dir = dir.join(name);
    if skill_dir.exists() {
        bail!("{} already exists", skill_dir.display());
    }
    let description = description.unwrap_or_else(|| {
        format!(
            "Describe what the {name} skill does and when to use it (the words a user would say)."
        )
    });
    let text = format!(
        "---\nname: {name}\ndescription: {}\n---\n\n# {name}\n\n## When to use this skill\n\nDescribe the tasks and requests this skill is for.\n\n## Instructions\n\n1. Step-by-step instructions for the agent.\n2. Put long reference material in `references/` and scripts in `scripts/`, and say here when to read or run them.\n",
        cella_skills::yaml::quote(&description)
    );
    std::fs::create_dir_all(&skill_dir)
        .with_context(|| format!("creating {}", skill_dir.display()))?;
    let skill_md = skill_dir.join(skill::SKILL_FILE);
    std::fs::write(&skill_md, text).with_context(|| format!("writing {}", skill_md.display()))?;
    let report = validate::validate(&skill_dir, Mode::Strict);
    if !report.valid {
        let stderr = std::io::stderr();
        print_report(&report, &mut stderr.lock(), &mut std::io::sink())
            .context("writing the validation report")?;
        return Ok(ExitCode::from(1));
    }
    println!("Created {}", skill_md.display());
    Ok(ExitCode::SUCCESS)
}

fn package_cmd(dir: &Path, output: Option<PathBuf>, force: bool) -> anyhow::Result<ExitCode> {
    let dir = skill::skill_dir_of(dir);
    let report = validate::validate(&dir, Mode::Strict);
    if !report.valid {
        let stderr = std::io::stderr();
        print_report(&report, &mut stderr.lock(), &mut std::io::sink())
            .context("writing the validation report")?;
        if !force {
            eprintln!("not packaged (use --force to package anyway)");
            return Ok(ExitCode::from(1));
        }
    }
    let out = match output {
        Some(o) => o,
        None => {
            let (skill, _) = validate::load_lenient(&dir).map_err(|r| {
                anyhow::anyhow!(
                    "{} is not a loadable skill: {}",
                    dir.display(),
                    r.errors()
                        .map(|f| f.message.clone())
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            })?;
            PathBuf::from(format!("{}.skill", skill.name))
        }
    };
    let packed =
        package::package(&dir, &out).with_context(|| format!("packaging {}", dir.display()))?;
    println!(
        "Packaged {} ({} files) into {}",
        packed.name,
        packed.files,
        packed.archive.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn install_cmd(src: &Path, dest: Option<PathBuf>, force: bool) -> anyhow::Result<ExitCode> {
    let dest = dest.unwrap_or_else(|| PathBuf::from(".agents/skills"));
    let installed = package::install(src, &dest, force)
        .with_context(|| format!("installing {}", src.display()))?;
    println!(
        "{} {} into {}",
        if installed.replaced {
            "Replaced"
        } else {
            "Installed"
        },
        installed.name,
        installed.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn activate_cmd(path: &Path) -> anyhow::Result<ExitCode> {
    match validate::load_lenient(path) {
        Ok((skill, _)) => {
            println!("{}", activation::render(&skill));
            Ok(ExitCode::SUCCESS)
        }
        Err(report) => {
            let stderr = std::io::stderr();
            print_report(&report, &mut stderr.lock(), &mut std::io::sink())
                .context("writing the validation report")?;
            Ok(ExitCode::from(1))
        }
    }
}
