//! Each rule in each mode: the rule id, field and value a finding names.

use cella_skills::validate::{Mode, Severity, Source, validate};

use super::support::{md, skill, valid};

fn rules(dir: &std::path::Path, mode: Mode) -> Vec<&'static str> {
    validate(dir, mode)
        .findings
        .iter()
        .map(|f| f.rule)
        .collect()
}

#[test]
fn minimal_skill_is_valid_in_every_mode() {
    let t = tempfile::tempdir().unwrap();
    let d = valid(t.path(), "pdf-tools");
    for mode in [Mode::Strict, Mode::Reference, Mode::Lenient] {
        let r = validate(&d, mode);
        assert!(r.valid, "{mode:?}: {:?}", r.findings);
        assert!(r.findings.is_empty());
    }
}

#[test]
fn findings_name_rule_field_and_value() {
    let t = tempfile::tempdir().unwrap();
    let d = skill(
        t.path(),
        "Bad-Upper",
        &md("name: Bad-Upper\ndescription: x\n"),
    );
    let r = validate(&d, Mode::Strict);
    assert!(!r.valid);
    let f = r
        .findings
        .iter()
        .find(|f| f.rule == "name.lowercase")
        .unwrap();
    assert_eq!(f.field.as_deref(), Some("name"));
    assert_eq!(f.value.as_deref(), Some("Bad-Upper"));
    assert_eq!(f.message, "Skill name 'Bad-Upper' must be lowercase");
    assert_eq!(f.severity, Severity::Error);
}

#[test]
fn one_invalid_case_per_rule() {
    let t = tempfile::tempdir().unwrap();
    let long_name = "a".repeat(65);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "unk",
            md("name: unk\ndescription: x\nauthor: me\n"),
            "fields.unknown",
        ),
        ("nm", md("description: x\n"), "name.missing"),
        ("ne", md("name: ''\ndescription: x\n"), "name.empty"),
        (
            &long_name,
            md(&format!("name: {long_name}\ndescription: x\n")),
            "name.length",
        ),
        ("Up", md("name: Up\ndescription: x\n"), "name.lowercase"),
        ("-x", md("name: -x\ndescription: x\n"), "name.hyphen-edge"),
        (
            "a--b",
            md("name: a--b\ndescription: x\n"),
            "name.consecutive-hyphens",
        ),
        ("a_b", md("name: a_b\ndescription: x\n"), "name.characters"),
        (
            "other-dir",
            md("name: mine\ndescription: x\n"),
            "name.directory",
        ),
        ("dm", md("name: dm\n"), "description.missing"),
        (
            "de",
            md("name: de\ndescription: '  '\n"),
            "description.empty",
        ),
        (
            "dl",
            md(&format!("name: dl\ndescription: {}\n", "d".repeat(1025))),
            "description.length",
        ),
        (
            "ct",
            md("name: ct\ndescription: x\ncompatibility:\n  - a\n"),
            "compatibility.type",
        ),
        (
            "cl",
            md(&format!(
                "name: cl\ndescription: x\ncompatibility: {}\n",
                "c".repeat(501)
            )),
            "compatibility.length",
        ),
        ("fo", "name: fo\n".to_owned(), "frontmatter.opening"),
        (
            "fc",
            "---\nname: fc\ndescription: x\n".to_owned(),
            "frontmatter.closing",
        ),
        (
            "fy",
            md("name: fy\ndescription: {a: b}\n"),
            "frontmatter.yaml",
        ),
        ("fm", md("just a string\n"), "frontmatter.mapping"),
    ];
    for (dir, content, rule) in cases {
        let d = skill(t.path(), dir, &content);
        for mode in [Mode::Strict, Mode::Reference] {
            let r = validate(&d, mode);
            assert!(!r.valid, "{dir}: {mode:?} should be invalid");
            assert!(
                r.findings.iter().any(|f| f.rule == rule),
                "{dir}: expected {rule}, got {:?}",
                r.findings
            );
        }
    }
    let empty = t.path().join("no-skill-md");
    std::fs::create_dir_all(&empty).unwrap();
    assert_eq!(rules(&empty, Mode::Strict), ["file.missing"]);
    assert_eq!(
        rules(&t.path().join("nowhere"), Mode::Strict),
        ["path.missing"]
    );
}

#[test]
fn spec_only_rules_are_strict_only() {
    let t = tempfile::tempdir().unwrap();
    let cases = [
        ("café", md("name: café\ndescription: x\n"), "name.ascii"),
        (
            "ce",
            md("name: ce\ndescription: x\ncompatibility: ''\n"),
            "compatibility.empty",
        ),
        (
            "mt",
            md("name: mt\ndescription: x\nmetadata:\n  k:\n    - v\n"),
            "metadata.type",
        ),
        (
            "ms",
            md("name: ms\ndescription: x\nmetadata: just-a-string\n"),
            "metadata.type",
        ),
        (
            "lt",
            md("name: lt\ndescription: x\nlicense:\n  a: b\n"),
            "license.type",
        ),
        (
            "at",
            md("name: at\ndescription: x\nallowed-tools:\n  a: b\n"),
            "allowed-tools.type",
        ),
    ];
    for (dir, content, rule) in cases {
        let d = skill(t.path(), dir, &content);
        let strict = validate(&d, Mode::Strict);
        assert!(!strict.valid, "{dir}");
        let f = strict.findings.iter().find(|f| f.rule == rule).unwrap();
        assert_eq!(f.source, Source::Spec);
        assert!(
            validate(&d, Mode::Reference).valid,
            "{dir}: skills-ref accepts it"
        );
        let lenient = validate(&d, Mode::Lenient);
        assert!(lenient.valid, "{dir}: lenient loads it");
        assert!(
            lenient
                .findings
                .iter()
                .any(|f| f.rule == rule && f.severity == Severity::Warning)
        );
    }
}

#[test]
fn allowed_tools_list_and_string_metadata_are_fine() {
    let t = tempfile::tempdir().unwrap();
    let d = skill(
        t.path(),
        "tools",
        &md(
            "name: tools\ndescription: x\nallowed-tools:\n  - Read\n  - Bash(git:*)\nmetadata:\n  author: me\n  version: \"1.0\"\nlicense: MIT\ncompatibility: Needs git\n",
        ),
    );
    assert!(validate(&d, Mode::Strict).valid);
}

#[test]
fn lenient_warns_and_loads() {
    let t = tempfile::tempdir().unwrap();
    let long = "n".repeat(70);
    let d = skill(
        t.path(),
        "some-dir",
        &md(&format!(
            "name: {long}\ndescription: Use when: the user asks about PDFs\ndisable-model-invocation: true\n"
        )),
    );
    let r = validate(&d, Mode::Lenient);
    assert!(r.valid, "{:?}", r.findings);
    let rules: Vec<_> = r.findings.iter().map(|f| f.rule).collect();
    assert!(rules.contains(&"frontmatter.repaired"));
    assert!(rules.contains(&"name.length"));
    assert!(rules.contains(&"name.directory"));
    assert!(rules.contains(&"fields.unknown"));
    assert!(r.findings.iter().all(|f| f.severity == Severity::Warning));
    let skill = r.skill.unwrap();
    assert_eq!(skill.description, "Use when: the user asks about PDFs");
    assert!(skill.location.is_absolute());
}

#[test]
fn lenient_skips_without_description_or_yaml() {
    let t = tempfile::tempdir().unwrap();
    let no_desc = skill(t.path(), "nd", &md("name: nd\n"));
    let r = validate(&no_desc, Mode::Lenient);
    assert!(!r.valid);
    assert!(r.skill.is_none());
    let broken = skill(t.path(), "br", &md("name: br\ndescription: [unclosed\n"));
    assert!(!validate(&broken, Mode::Lenient).valid);
}

#[test]
fn lenient_uses_directory_name_when_name_missing() {
    let t = tempfile::tempdir().unwrap();
    let d = skill(t.path(), "fallback", &md("description: x\n"));
    let r = validate(&d, Mode::Lenient);
    assert!(r.valid);
    assert_eq!(r.skill.unwrap().name, "fallback");
}

#[test]
fn skill_md_path_and_lowercase_file() {
    let t = tempfile::tempdir().unwrap();
    let d = valid(t.path(), "by-file");
    assert!(validate(&d.join("SKILL.md"), Mode::Strict).valid);
    let low = t.path().join("low");
    std::fs::create_dir_all(&low).unwrap();
    std::fs::write(low.join("skill.md"), md("name: low\ndescription: x\n")).unwrap();
    assert!(validate(&low, Mode::Strict).valid);
}

#[test]
fn crlf_and_invalid_utf8() {
    let t = tempfile::tempdir().unwrap();
    let d = skill(
        t.path(),
        "crlf",
        &md("name: crlf\ndescription: x\n").replace('\n', "\r\n"),
    );
    assert!(validate(&d, Mode::Strict).valid);
    let bad = t.path().join("bad-utf8");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("SKILL.md"),
        b"---\nname: bad-utf8\ndescription: \xff\n---\n",
    )
    .unwrap();
    let r = validate(&bad, Mode::Strict);
    assert_eq!(r.findings[0].rule, "file.unreadable");
}
