//! The 17 public skills of anthropics/skills (frontmatter carried in tests/data): every one
//! loads leniently; strict mode flags claude-api's 1075-character description and nothing else.

use cella_skills::validate::{Mode, validate};

use super::support::data_dir;

const NAMES: [&str; 17] = [
    "algorithmic-art",
    "brand-guidelines",
    "canvas-design",
    "claude-api",
    "doc-coauthoring",
    "docx",
    "frontend-design",
    "internal-comms",
    "mcp-builder",
    "pdf",
    "pptx",
    "skill-creator",
    "slack-gif-creator",
    "theme-factory",
    "web-artifacts-builder",
    "webapp-testing",
    "xlsx",
];

#[test]
fn all_seventeen_load_in_lenient_mode() {
    let root = data_dir().join("anthropic-skills");
    for name in NAMES {
        let r = validate(&root.join(name), Mode::Lenient);
        assert!(r.valid, "{name}: {:?}", r.findings);
        let skill = r.skill.unwrap();
        assert_eq!(skill.name, name);
        assert!(!skill.description.is_empty());
    }
}

#[test]
fn strict_flags_only_claude_api() {
    let root = data_dir().join("anthropic-skills");
    for name in NAMES {
        let r = validate(&root.join(name), Mode::Strict);
        if name == "claude-api" {
            assert!(!r.valid);
            let rules: Vec<_> = r.findings.iter().map(|f| f.rule).collect();
            assert_eq!(rules, ["description.length"]);
            assert_eq!(
                r.findings[0].message,
                "Description exceeds 1024 character limit (1075 chars)"
            );
            // Lenient mode keeps it, with the same finding as a warning.
            let l = validate(&root.join(name), Mode::Lenient);
            assert!(l.valid);
            assert_eq!(l.findings.len(), 1);
        } else {
            assert!(r.valid, "{name}: {:?}", r.findings);
        }
    }
}
