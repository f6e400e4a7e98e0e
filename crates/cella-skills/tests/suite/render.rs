//! The `<available_skills>` catalog and the `<skill_content>` activation block.

use cella_skills::activation;
use cella_skills::catalog::{self, CatalogEntry};
use cella_skills::validate::load_lenient;

use super::support::{md, skill};

#[test]
fn catalog_is_omitted_without_skills() {
    assert_eq!(catalog::render(&[]), "");
}

#[test]
fn catalog_matches_reference_format() {
    let t = tempfile::tempdir().unwrap();
    let d = skill(
        t.path(),
        "pdf-reader",
        &md("name: pdf-reader\ndescription: Read & extract <text> from \"PDF\" files\n"),
    );
    let (s, _) = load_lenient(&d).unwrap();
    let got = catalog::render(&[CatalogEntry::from(&s)]);
    let loc = d.canonicalize().unwrap().join("SKILL.md");
    assert_eq!(
        got,
        format!(
            "<available_skills>\n<skill>\n<name>\npdf-reader\n</name>\n<description>\nRead &amp; extract &lt;text&gt; from &quot;PDF&quot; files\n</description>\n<location>\n{}\n</location>\n</skill>\n</available_skills>",
            loc.display()
        )
    );
    // The reference function gives the same bytes for the same skill.
    assert_eq!(catalog::to_prompt(&[d.as_path()]).unwrap(), got);
}

#[test]
fn activation_lists_resources_without_reading_them() {
    let t = tempfile::tempdir().unwrap();
    let d = skill(
        t.path(),
        "pdf-processing",
        &md("name: pdf-processing\ndescription: PDFs\n"),
    );
    std::fs::create_dir_all(d.join("scripts")).unwrap();
    std::fs::create_dir_all(d.join("references")).unwrap();
    std::fs::create_dir_all(d.join(".git")).unwrap();
    std::fs::write(d.join("scripts/extract.py"), "SECRET-CONTENT").unwrap();
    std::fs::write(d.join("references/REFERENCE.md"), "more").unwrap();
    std::fs::write(d.join(".git/HEAD"), "x").unwrap();
    let (s, _) = load_lenient(&d).unwrap();
    let out = activation::render(&s);
    let dir = d.canonicalize().unwrap();
    assert_eq!(
        out,
        format!(
            "<skill_content name=\"pdf-processing\">\n# Body\n\nDo the thing.\n\nSkill directory: {}\nRelative paths in this skill are relative to the skill directory.\n\n<skill_resources>\n  <file>references/REFERENCE.md</file>\n  <file>scripts/extract.py</file>\n</skill_resources>\n</skill_content>",
            dir.display()
        )
    );
    assert!(!out.contains("SECRET-CONTENT"));
}

#[test]
fn activation_without_resources_has_no_resource_block() {
    let t = tempfile::tempdir().unwrap();
    let d = skill(t.path(), "bare", &md("name: bare\ndescription: x\n"));
    let (s, _) = load_lenient(&d).unwrap();
    assert!(!activation::render(&s).contains("<skill_resources>"));
}

#[test]
fn catalog_for_model_hides_disabled_skills() {
    let t = tempfile::tempdir().unwrap();
    let a = skill(t.path(), "auto", &md("name: auto\ndescription: x\n"));
    let m = skill(
        t.path(),
        "manual",
        &md("name: manual\ndescription: y\ndisable-model-invocation: true\n"),
    );
    let (a, _) = load_lenient(&a).unwrap();
    let (m, _) = load_lenient(&m).unwrap();
    assert!(!m.model_invocable());
    let text = catalog::render_for_model([&a, &m]);
    assert!(text.contains("<name>\nauto\n</name>"));
    assert!(!text.contains("manual"));
    assert_eq!(catalog::render_for_model([&m]), "");
}
