//! What a model receives when it activates a skill (tier 2 of progressive disclosure): the body
//! wrapped in `<skill_content name="…">`, the skill directory, and a `<skill_resources>` list of
//! the bundled files — listed, never read (tier 3 is loaded on demand).

use std::path::{Path, PathBuf};

use crate::python_compat::html_escape;
use crate::skill::Skill;

/// Most resources listed; the listing says when it stops short.
pub const MAX_RESOURCES: usize = 200;
/// Deepest directory level listed under the skill directory.
pub const MAX_RESOURCE_DEPTH: usize = 6;

/// Relative paths (with `/`) of the files bundled with a skill, sorted, excluding SKILL.md,
/// `.git` and `node_modules`, without following symlinks; and whether the list was cut.
pub fn list_resources(skill_dir: &Path) -> (Vec<String>, bool) {
    let mut files = Vec::new();
    let mut truncated = false;
    walk(skill_dir, PathBuf::new(), 0, &mut files, &mut truncated);
    files.sort();
    (files, truncated)
}

fn walk(root: &Path, rel: PathBuf, depth: usize, out: &mut Vec<String>, truncated: &mut bool) {
    let Ok(read) = std::fs::read_dir(root.join(&rel)) else {
        return;
    };
    let mut entries: Vec<_> = read.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if out.len() >= MAX_RESOURCES {
            *truncated = true;
            return;
        }
        let name = entry.file_name();
        let Some(name_str) = name.to_str() else {
            continue;
        };
        let Ok(ft) = entry.file_type() else { continue };
        let child = rel.join(name_str);
        if ft.is_dir() {
            if matches!(name_str, ".git" | "node_modules") {
                continue;
            }
            if depth + 1 >= MAX_RESOURCE_DEPTH {
                *truncated = true;
                continue;
            }
            walk(root, child, depth + 1, out, truncated);
        } else {
            if depth == 0 && (name_str == "SKILL.md" || name_str == "skill.md") {
                continue;
            }
            let parts: Vec<String> = child
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(parts.join("/"));
        }
    }
}

/// The activation text for `skill`:
///
/// ```text
/// <skill_content name="pdf-processing">
/// …body…
///
/// Skill directory: /home/user/.agents/skills/pdf-processing
/// Relative paths in this skill are relative to the skill directory.
///
/// <skill_resources>
///   <file>scripts/extract.py</file>
/// </skill_resources>
/// </skill_content>
/// ```
///
/// The resources block is left out when the skill bundles no other file.
pub fn render(skill: &Skill) -> String {
    let (files, truncated) = list_resources(&skill.dir);
    let mut out = format!("<skill_content name=\"{}\">\n", html_escape(&skill.name));
    if !skill.body.is_empty() {
        out.push_str(&skill.body);
        out.push_str("\n\n");
    }
    out.push_str(&format!("Skill directory: {}\n", skill.dir.display()));
    out.push_str("Relative paths in this skill are relative to the skill directory.\n");
    if !files.is_empty() {
        out.push_str("\n<skill_resources>\n");
        for f in &files {
            out.push_str(&format!("  <file>{}</file>\n", html_escape(f)));
        }
        if truncated {
            out.push_str("  <!-- listing incomplete: more files not shown -->\n");
        }
        out.push_str("</skill_resources>\n");
    }
    out.push_str("</skill_content>");
    out
}
