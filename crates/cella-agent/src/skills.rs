//! Agent Skills attached to a run: the `<available_skills>` catalog for the system prompt and
//! the activation content `activate_skill` returns, both naming the skill's place inside the
//! sandbox (`/skills/<name>`), where the sandbox mounts it read-only.
//!
//! Owns the host-path → sandbox-path rewrite. Must not know how skills are found on the host
//! (the caller discovers them with cella-skills) nor how they are mounted.

use cella_sandbox::spec::SKILLS_DIR;
use cella_skills::Skill;
use cella_skills::catalog::{self, CatalogEntry};

/// A skill the sandbox has mounted at `/skills/<name>`.
#[derive(Debug, Clone)]
pub struct AttachedSkill {
    /// The skill as read on the host.
    pub skill: Skill,
}

impl AttachedSkill {
    pub fn new(skill: Skill) -> Self {
        Self { skill }
    }

    pub fn name(&self) -> &str {
        &self.skill.name
    }

    /// Its directory inside the sandbox.
    pub fn sandbox_dir(&self) -> String {
        format!("{SKILLS_DIR}/{}", self.skill.name)
    }

    /// The `<skill_content>` block, with the sandbox directory in place of the host's.
    pub fn activation(&self) -> String {
        let text = cella_skills::activation::render(&self.skill);
        let host = format!("Skill directory: {}\n", self.skill.dir.display());
        let inside = format!("Skill directory: {}\n", self.sandbox_dir());
        text.replacen(&host, &inside, 1)
    }
}

/// The catalog block for the system prompt (empty when no skill is attached).
pub fn catalog(skills: &[AttachedSkill]) -> String {
    let entries: Vec<CatalogEntry> = skills
        .iter()
        .map(|s| CatalogEntry {
            name: s.skill.name.clone(),
            description: s.skill.description.clone(),
            location: format!(
                "{}/{}",
                s.sandbox_dir(),
                s.skill
                    .location
                    .file_name()
                    .map_or("SKILL.md".into(), |n| n.to_string_lossy())
            )
            .into(),
        })
        .collect();
    catalog::render(&entries)
}
