//! The `<available_skills>` catalog shown to a model (tier 1 of progressive disclosure), in
//! skills-ref's `to_prompt` format: one element per line, values `html.escape`d, `<location>` the
//! absolute SKILL.md path.
//!
//! One deliberate difference: [`render`] returns an empty string when there are no skills (the
//! client guide: "omit the catalog entirely"), where skills-ref prints an empty
//! `<available_skills>` block. [`to_prompt`] is the byte-exact skills-ref function, empty block
//! included, for tools that want its output.

use std::path::{Path, PathBuf};

use crate::python_compat::html_escape;
use crate::skill::{self, Skill, SkillError};

/// One catalog entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// Skill name.
    pub name: String,
    /// Skill description.
    pub description: String,
    /// Absolute path of its SKILL.md.
    pub location: PathBuf,
}

impl From<&Skill> for CatalogEntry {
    fn from(s: &Skill) -> Self {
        CatalogEntry {
            name: s.name.clone(),
            description: s.description.clone(),
            location: s.location.clone(),
        }
    }
}

fn block(entries: &[CatalogEntry]) -> String {
    let mut lines = vec!["<available_skills>".to_owned()];
    for e in entries {
        lines.push("<skill>".to_owned());
        lines.push("<name>".to_owned());
        lines.push(html_escape(&e.name));
        lines.push("</name>".to_owned());
        lines.push("<description>".to_owned());
        lines.push(html_escape(&e.description));
        lines.push("</description>".to_owned());
        lines.push("<location>".to_owned());
        lines.push(e.location.display().to_string());
        lines.push("</location>".to_owned());
        lines.push("</skill>".to_owned());
    }
    lines.push("</available_skills>".to_owned());
    lines.join("\n")
}

/// The catalog for a model prompt, or `""` when there are no skills (see the module docs).
/// No trailing newline.
pub fn render(entries: &[CatalogEntry]) -> String {
    if entries.is_empty() {
        String::new()
    } else {
        block(entries)
    }
}

/// The catalog a model should see for `skills`: those it may invoke (see
/// [`Skill::model_invocable`]), or `""` when none remain.
pub fn render_for_model<'a>(skills: impl IntoIterator<Item = &'a Skill>) -> String {
    let entries: Vec<CatalogEntry> = skills
        .into_iter()
        .filter(|s| s.model_invocable())
        .map(CatalogEntry::from)
        .collect();
    render(&entries)
}

/// skills-ref's `to_prompt(skill_dirs)`: each directory resolved, its properties read with
/// skills-ref's parser (no validation beyond name and description), its SKILL.md located.
/// Byte-identical to skills-ref's return value (no trailing newline).
pub fn to_prompt(dirs: &[&Path]) -> Result<String, SkillError> {
    let mut entries = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let dir = skill::absolute(dir);
        let props = skill::read_properties(&dir)?;
        let location =
            skill::find_skill_md(&dir).ok_or_else(|| SkillError::NotFound { dir: dir.clone() })?;
        entries.push(CatalogEntry {
            name: props.name,
            description: props.description,
            location,
        });
    }
    Ok(block(&entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_catalog_is_omitted_but_reference_block_is_not() {
        assert_eq!(render(&[]), "");
        assert_eq!(
            to_prompt(&[]).unwrap(),
            "<available_skills>\n</available_skills>"
        );
    }

    #[test]
    fn entries_are_escaped() {
        let e = CatalogEntry {
            name: "a".into(),
            description: "x < y & \"z\"".into(),
            location: PathBuf::from("/s/a/SKILL.md"),
        };
        assert_eq!(
            render(&[e]),
            "<available_skills>\n<skill>\n<name>\na\n</name>\n<description>\nx &lt; y &amp; &quot;z&quot;\n</description>\n<location>\n/s/a/SKILL.md\n</location>\n</skill>\n</available_skills>"
        );
    }
}
