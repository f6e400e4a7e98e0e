//! Finding skills under skill roots, per the client-implementation guide: a skill is a
//! directory holding a file named exactly `SKILL.md`; `.git` and `node_modules` are skipped; the
//! walk is bounded in depth and in directories visited; skills load leniently; when two skills
//! share a name the earlier root wins (project before configured before user) and the loser is
//! reported as shadowed.
//!
//! Roots: project `.cella/skills`, `.agents/skills`, `.claude/skills` (in that order), then
//! configured roots, then user `~/.cella/skills`, `~/.agents/skills`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::skill::{self, Skill};
use crate::validate::{self, Finding};

/// Where a root comes from; earlier scopes take precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Under the project (working) directory.
    Project,
    /// Named in configuration (`--root`, `CELLA_SKILLS_PATH`).
    Configured,
    /// Under the user's home directory.
    User,
}

/// A directory scanned for skills.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkillRoot {
    /// The directory.
    pub path: PathBuf,
    /// Its scope.
    pub scope: Scope,
}

/// Project-relative skill directories, in precedence order.
pub const PROJECT_DIRS: [&str; 3] = [".cella/skills", ".agents/skills", ".claude/skills"];
/// Home-relative skill directories, in precedence order.
pub const USER_DIRS: [&str; 2] = [".cella/skills", ".agents/skills"];

/// The standard roots for a project directory, configured roots and a home directory.
pub fn default_roots(
    project: &Path,
    configured: &[PathBuf],
    home: Option<&Path>,
) -> Vec<SkillRoot> {
    let mut roots: Vec<SkillRoot> = PROJECT_DIRS
        .iter()
        .map(|d| SkillRoot {
            path: project.join(d),
            scope: Scope::Project,
        })
        .collect();
    roots.extend(configured.iter().map(|p| SkillRoot {
        path: p.clone(),
        scope: Scope::Configured,
    }));
    if let Some(home) = home {
        roots.extend(USER_DIRS.iter().map(|d| SkillRoot {
            path: home.join(d),
            scope: Scope::User,
        }));
    }
    roots
}

/// Walk bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Deepest directory level below a root that is looked at (a root's children are level 1).
    pub max_depth: usize,
    /// Most directories visited over all roots.
    pub max_dirs: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 5,
            max_dirs: 2000,
        }
    }
}

/// A discovered skill.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// The skill.
    pub skill: Skill,
    /// Its root's scope.
    pub scope: Scope,
    /// Its root.
    pub root: PathBuf,
    /// Lenient-mode warnings.
    pub warnings: Vec<Finding>,
}

/// Something worth telling the user about a discovery run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Diagnostic {
    /// A skill was hidden by an earlier one with the same name.
    Shadowed {
        /// The name.
        name: String,
        /// The SKILL.md that wins.
        kept: PathBuf,
        /// The SKILL.md hidden.
        shadowed: PathBuf,
    },
    /// A skill directory could not be loaded.
    Skipped {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A bound stopped the walk early.
    LimitReached {
        /// Which bound.
        limit: String,
        /// Where.
        path: PathBuf,
    },
}

/// The outcome of [`discover`].
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// The skills, in root order then path order, names unique.
    pub skills: Vec<Discovered>,
    /// Shadowing, skipped skills, limits.
    pub diagnostics: Vec<Diagnostic>,
}

impl Discovery {
    /// Looks a skill up by name.
    pub fn get(&self, name: &str) -> Option<&Discovered> {
        self.skills.iter().find(|d| d.skill.name == name)
    }
}

/// Scans `roots` in order. Missing roots are ignored.
pub fn discover(roots: &[SkillRoot], limits: Limits) -> Discovery {
    let mut out = Discovery::default();
    let mut visited_dirs = 0usize;
    let mut seen_real: HashSet<PathBuf> = HashSet::new();
    for root in roots {
        if !root.path.is_dir() {
            continue;
        }
        let mut found = Vec::new();
        let mut stack = vec![(root.path.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            if visited_dirs >= limits.max_dirs {
                out.diagnostics.push(Diagnostic::LimitReached {
                    limit: format!("{} directories", limits.max_dirs),
                    path: dir,
                });
                break;
            }
            visited_dirs += 1;
            // Symlinked directories are followed once each (loops are cut).
            let real = skill::absolute(&dir);
            if !seen_real.insert(real) {
                continue;
            }
            if depth > 0 && dir.join(skill::SKILL_FILE).is_file() {
                found.push(dir);
                continue;
            }
            if depth >= limits.max_depth {
                continue;
            }
            let Ok(read) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut children: Vec<PathBuf> = read
                .filter_map(Result::ok)
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    // `.cella-install-*` is an installer's staging directory.
                    n != ".git" && n != "node_modules" && !n.starts_with(".cella-install-")
                })
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            children.sort();
            // Depth-first in name order: push in reverse.
            for c in children.into_iter().rev() {
                stack.push((c, depth + 1));
            }
        }
        found.sort();
        for dir in found {
            match validate::load_lenient(&dir) {
                Ok((skill, warnings)) => add(&mut out, skill, root, warnings),
                Err(report) => {
                    let reason = report
                        .errors()
                        .map(|f| f.message.clone())
                        .collect::<Vec<_>>()
                        .join("; ");
                    out.diagnostics
                        .push(Diagnostic::Skipped { path: dir, reason });
                }
            }
        }
    }
    out
}

fn add(out: &mut Discovery, skill: Skill, root: &SkillRoot, warnings: Vec<Finding>) {
    if let Some(existing) = out.skills.iter().find(|d| d.skill.name == skill.name) {
        out.diagnostics.push(Diagnostic::Shadowed {
            name: skill.name.clone(),
            kept: existing.skill.location.clone(),
            shadowed: skill.location,
        });
        return;
    }
    out.skills.push(Discovered {
        skill,
        scope: root.scope,
        root: root.path.clone(),
        warnings,
    });
}
