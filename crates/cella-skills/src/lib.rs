//! Agent Skills (agentskills.io) for cella: parse SKILL.md, validate it (strict, reference and
//! lenient modes), discover skills under skill roots, render the `<available_skills>` catalog and
//! activation content, and package/install skills as zip archives.
//!
//! Module map (each owns one concern and knows nothing of the CLI or the server):
//!
//! * [`yaml`]: the frontmatter YAML loader (strictyaml-compatible and permissive dialects).
//! * [`frontmatter`]: splitting SKILL.md into frontmatter and body; the colon-quoting repair.
//! * [`skill`]: reading a skill from disk; skills-ref's `read_properties`.
//! * [`validate`]: the rules, their findings and reports.
//! * [`discovery`]: skill roots, bounded scanning, shadowing.
//! * [`catalog`]: the `<available_skills>` block (skills-ref's `to_prompt`).
//! * [`activation`]: the `<skill_content>` block.
//! * [`package`]: zip / `.skill` packaging and safe installation.
//! * [`python_compat`]: the Python string semantics the reference validator's verdicts rest on.
//!
//! The reference validator is the PyPI package `skills-ref` 0.1.1 (command `agentskills`);
//! where cella differs from it, the module that differs says so.

pub mod activation;
pub mod catalog;
pub mod discovery;
pub mod frontmatter;
pub mod package;
pub mod python_compat;
pub mod skill;
pub mod validate;
pub mod yaml;

pub use skill::{Skill, SkillError, SkillProperties};
pub use validate::{Finding, Mode, Report, Severity, validate};
