//! `cella skills …` end to end, and conformance with the reference validator.
//!
//! The conformance corpus (built in a temporary directory) is run through
//! `cella skills validate --strict` and skills-ref's `agentskills validate` (from the virtualenv
//! in `$CELLA_TEST_VENV`, which `scripts/test` creates from tests/python/requirements.txt).
//! Verdicts must be identical, except for the cases the specification makes stricter than
//! skills-ref, which are listed in [`SPEC_STRICTER`] and asserted as differences. Each case also
//! carries skills-ref's verdict, so the corpus is checked against it even without the venv.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn cella(args: &[&str]) -> Output {
    cella_in(args, None, &[])
}

fn cella_in(args: &[&str], cwd: Option<&Path>, env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cella"));
    c.arg("skills").args(args).stdin(Stdio::null());
    c.env_remove("CELLA_SKILLS_PATH");
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running cella skills")
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// skills-ref's `agentskills` command, or `None` (with the reason printed) when the test venv is
/// not there.
fn agentskills() -> Option<PathBuf> {
    let Some(venv) = std::env::var_os("CELLA_TEST_VENV") else {
        eprintln!(
            "SKIP (reference comparison): CELLA_TEST_VENV is not set; scripts/test sets it to a virtualenv with skills-ref==0.1.1 (tests/python/requirements.txt)"
        );
        return None;
    };
    let bin = PathBuf::from(venv).join("bin/agentskills");
    if !bin.is_file() {
        eprintln!(
            "SKIP (reference comparison): {} is missing; install tests/python/requirements.txt into the venv",
            bin.display()
        );
        return None;
    }
    Some(bin)
}

fn reference(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running agentskills")
}

fn write_skill(root: &Path, dir: &str, content: &[u8]) -> PathBuf {
    let d = root.join(dir);
    std::fs::create_dir_all(&d).expect("creating skill dir");
    std::fs::write(d.join("SKILL.md"), content).expect("writing SKILL.md");
    d
}

fn md(frontmatter: &str) -> String {
    format!("---\n{frontmatter}---\n\n# Instructions\n\nDo the thing.\n")
}

/// One corpus entry: directory name, SKILL.md bytes, skills-ref's verdict.
struct Case {
    dir: String,
    content: Vec<u8>,
    reference_valid: bool,
}

fn case(dir: &str, content: impl Into<Vec<u8>>, reference_valid: bool) -> Case {
    Case {
        dir: dir.to_owned(),
        content: content.into(),
        reference_valid,
    }
}

/// Cases where the specification is stricter than skills-ref: skills-ref accepts them, strict
/// mode refuses them (rule in the second column).
const SPEC_STRICTER: [(&str, &str); 7] = [
    // Names: the specification allows a-z, 0-9 and '-' only; skills-ref accepts any Unicode
    // letter or digit (after NFKC normalisation and stripping).
    ("café", "name.ascii"),
    ("日本語", "name.ascii"),
    ("straße", "name.ascii"),
    ("quoted-space-name", "name.ascii"),
    // compatibility: "Must be 1-500 characters if provided"; skills-ref accepts "".
    ("empty-compat", "compatibility.empty"),
    // metadata: "A map from string keys to string values"; skills-ref does not check its type.
    ("nested-metadata", "metadata.type"),
    // license: a license name or file reference (a string); skills-ref does not check its type.
    ("license-mapping", "license.type"),
];

fn corpus() -> Vec<Case> {
    let long = |c: char, n: usize| c.to_string().repeat(n);
    let name64 = format!("a{}", long('b', 63));
    let name65 = format!("a{}", long('b', 64));
    let mut v = vec![
        // Valid edge cases.
        case(
            "minimal",
            md("name: minimal\ndescription: Does one thing. Use when asked.\n"),
            true,
        ),
        case(
            "all-fields",
            md(
                "name: all-fields\ndescription: Everything set.\nlicense: Apache-2.0\ncompatibility: Requires git and network access\nmetadata:\n  author: example-org\n  version: \"1.0\"\nallowed-tools: Bash(git:*) Bash(jq:*) Read\n",
            ),
            true,
        ),
        case(
            "allowed-tools-list",
            md(
                "name: allowed-tools-list\ndescription: x\nallowed-tools:\n  - Read\n  - Bash(git:*)\n",
            ),
            true,
        ),
        case(
            &name64,
            md(&format!("name: {name64}\ndescription: x\n")),
            true,
        ),
        case(
            "desc-1024",
            md(&format!(
                "name: desc-1024\ndescription: {}\n",
                long('d', 1024)
            )),
            true,
        ),
        case(
            "compat-500",
            md(&format!(
                "name: compat-500\ndescription: x\ncompatibility: {}\n",
                long('c', 500)
            )),
            true,
        ),
        case("v2", md("name: v2\ndescription: digits are fine\n"), true),
        case(
            "quoted-values",
            md("name: \"quoted-values\"\ndescription: 'It''s quoted: with a colon'\n"),
            true,
        ),
        case(
            "block-description",
            md("name: block-description\ndescription: |\n  Line one.\n  Line two: with colon.\n"),
            true,
        ),
        case(
            "folded-description",
            md("name: folded-description\ndescription: >-\n  Folded\n  text.\n"),
            true,
        ),
        case(
            "yaml-literals",
            md("name: yaml-literals\ndescription: yes\nlicense: 1.10\ncompatibility: null\n"),
            true,
        ),
        case(
            "comments",
            md("# leading comment\nname: comments  # trailing\ndescription: x # not part of it\n"),
            true,
        ),
        case(
            "crlf",
            md("name: crlf\ndescription: Windows line endings\n").replace('\n', "\r\n"),
            true,
        ),
        case("no-body", "---\nname: no-body\ndescription: x\n---", true),
        case(
            "dashes-in-body",
            "---\nname: dashes-in-body\ndescription: x\n---\nbody\n---\nmore\n",
            true,
        ),
        case(
            "unicode-description",
            md("name: unicode-description\ndescription: 処理します — émojis 😀 fine\n"),
            true,
        ),
        case(
            "description-colon-no-space",
            md("name: description-colon-no-space\ndescription: ratio 1:2 and a:b\n"),
            true,
        ),
        case(
            "metadata-empty",
            md("name: metadata-empty\ndescription: x\nmetadata:\n"),
            true,
        ),
        case(
            "wrapped-quoted",
            md(
                "name: wrapped-quoted\ndescription: \"A long description\nwrapped at column zero\"\n",
            ),
            true,
        ),
        case(
            "wrapped-plain",
            md(
                "name: wrapped-plain\ndescription: A long description\n  continued on the next line\n",
            ),
            true,
        ),
        case(
            "license-sentence",
            md(
                "name: license-sentence\ndescription: x\nlicense: Proprietary. LICENSE.txt has complete terms\n",
            ),
            true,
        ),
        // One invalid case per rule.
        case("no-frontmatter", "# Just markdown\n", false),
        case("unclosed", "---\nname: unclosed\ndescription: x\n", false),
        case("not-mapping", md("- a list\n"), false),
        case("empty-frontmatter", md(""), false),
        case(
            "bad-yaml-colon",
            md("name: bad-yaml-colon\ndescription: Use when: the user asks\n"),
            false,
        ),
        case(
            "flow-mapping",
            md("name: flow-mapping\ndescription: x\nmetadata: {a: b}\n"),
            false,
        ),
        case(
            "anchor-alias",
            md("name: anchor-alias\ndescription: &d x\nlicense: *d\n"),
            false,
        ),
        case("tag", md("name: tag\ndescription: !!str x\n"), false),
        case(
            "duplicate-key",
            md("name: duplicate-key\ndescription: x\ndescription: y\n"),
            false,
        ),
        case(
            "tab-separator",
            md("name: tab-separator\ndescription:\tx\n"),
            false,
        ),
        case(
            "unknown-field",
            md("name: unknown-field\ndescription: x\nauthor: me\n"),
            false,
        ),
        case("missing-name", md("description: x\n"), false),
        case("empty-name", md("name: ''\ndescription: x\n"), false),
        case("list-name", md("name:\n  - a\ndescription: x\n"), false),
        case(
            &name65,
            md(&format!("name: {name65}\ndescription: x\n")),
            false,
        ),
        case(
            "Upper-Case",
            md("name: Upper-Case\ndescription: x\n"),
            false,
        ),
        case("-leading", md("name: -leading\ndescription: x\n"), false),
        case("trailing-", md("name: trailing-\ndescription: x\n"), false),
        case(
            "double--hyphen",
            md("name: double--hyphen\ndescription: x\n"),
            false,
        ),
        case(
            "under_score",
            md("name: under_score\ndescription: x\n"),
            false,
        ),
        case(
            "dir-mismatch",
            md("name: other-name\ndescription: x\n"),
            false,
        ),
        case(
            "missing-description",
            md("name: missing-description\n"),
            false,
        ),
        case(
            "blank-description",
            md("name: blank-description\ndescription: '   '\n"),
            false,
        ),
        case(
            "desc-1025",
            md(&format!(
                "name: desc-1025\ndescription: {}\n",
                long('d', 1025)
            )),
            false,
        ),
        case(
            "compat-501",
            md(&format!(
                "name: compat-501\ndescription: x\ncompatibility: {}\n",
                long('c', 501)
            )),
            false,
        ),
        case(
            "compat-list",
            md("name: compat-list\ndescription: x\ncompatibility:\n  - linux\n"),
            false,
        ),
        case(
            "bom",
            format!("\u{feff}{}", md("name: bom\ndescription: x\n")),
            false,
        ),
        case(
            "control-char",
            md("name: control-char\ndescription: bell\u{7}\n"),
            false,
        ),
        case(
            "plain-wrap-column-zero",
            md(
                "name: plain-wrap-column-zero\ndescription: A long description\nwrapped at column zero\n",
            ),
            false,
        ),
        case(
            "indented-key",
            md("name: indented-key\n  description: x\n"),
            false,
        ),
        // Spec stricter than skills-ref (see SPEC_STRICTER).
        case("café", md("name: café\ndescription: x\n"), true),
        case("日本語", md("name: 日本語\ndescription: x\n"), true),
        case("straße", md("name: straße\ndescription: x\n"), true),
        case(
            "quoted-space-name",
            md("name: ' quoted-space-name '\ndescription: x\n"),
            true,
        ),
        case(
            "empty-compat",
            md("name: empty-compat\ndescription: x\ncompatibility: ''\n"),
            true,
        ),
        case(
            "nested-metadata",
            md("name: nested-metadata\ndescription: x\nmetadata:\n  tags:\n    - a\n    - b\n"),
            true,
        ),
        case(
            "license-mapping",
            md("name: license-mapping\ndescription: x\nlicense:\n  name: MIT\n"),
            true,
        ),
    ];
    let mut bad_utf8 = md("name: bad-utf8\ndescription: x\n").into_bytes();
    bad_utf8.extend_from_slice(b"\xff\xfe");
    bad_utf8.splice(20..20, b"\xc3".iter().copied());
    v.push(case("bad-utf8", bad_utf8, false));
    v
}

fn build_corpus(root: &Path) -> Vec<(Case, PathBuf)> {
    corpus()
        .into_iter()
        .map(|c| {
            let d = write_skill(root, &c.dir, &c.content);
            (c, d)
        })
        .collect()
}

fn strict_rule(dir: &str) -> Option<&'static str> {
    SPEC_STRICTER
        .iter()
        .find_map(|(d, rule)| (*d == dir).then_some(*rule))
}

#[test]
fn conformance_corpus_verdicts() {
    let t = tempfile::tempdir().expect("tempdir");
    let cases = build_corpus(t.path());
    assert!(cases.len() >= 40, "corpus has {} skills", cases.len());
    let agentskills = agentskills();
    let (mut agree, mut documented, mut compared) = (0, 0, 0);
    for (c, dir) in &cases {
        let path = dir.to_str().expect("utf-8 temp path");
        let strict = cella(&["validate", "--strict", path]);
        let refmode = cella(&["validate", "--reference", path]);
        let strict_valid = strict.status.code() == Some(0);
        let ref_valid = refmode.status.code() == Some(0);
        assert!(
            matches!(strict.status.code(), Some(0 | 1)),
            "{}: {strict:?}",
            c.dir
        );
        // --reference reproduces skills-ref's verdict on every case.
        assert_eq!(
            ref_valid,
            c.reference_valid,
            "--reference on {}: {}",
            c.dir,
            err(&refmode)
        );
        if let Some(rule) = strict_rule(&c.dir) {
            assert!(
                c.reference_valid && !strict_valid,
                "{} should differ",
                c.dir
            );
            assert!(
                err(&strict).contains(&format!("rule {rule}")),
                "{}: {}",
                c.dir,
                err(&strict)
            );
            documented += 1;
        } else {
            assert_eq!(
                strict_valid,
                c.reference_valid,
                "--strict on {}: {}",
                c.dir,
                err(&strict)
            );
            agree += 1;
        }
        if let Some(bin) = &agentskills {
            let r = reference(bin, &["validate", path]);
            let r_valid = r.status.code() == Some(0);
            assert_eq!(
                r_valid,
                c.reference_valid,
                "skills-ref on {}: {}",
                c.dir,
                err(&r)
            );
            assert_eq!(
                r_valid, ref_valid,
                "cella --reference vs skills-ref on {}",
                c.dir
            );
            if strict_rule(&c.dir).is_none() {
                assert_eq!(
                    strict_valid, r_valid,
                    "cella --strict vs skills-ref on {}",
                    c.dir
                );
            }
            compared += 1;
        }
    }
    eprintln!(
        "conformance: {} skills; strict verdict equals skills-ref's on {agree}, differs as documented (spec stricter) on {documented}; compared live with agentskills: {compared}",
        cases.len()
    );
    assert_eq!(agree + documented, cases.len());
    assert_eq!(documented, SPEC_STRICTER.len());
}

#[test]
fn validate_output_like_skills_ref() {
    let t = tempfile::tempdir().expect("tempdir");
    let ok = write_skill(
        t.path(),
        "good",
        md("name: good\ndescription: x\n").as_bytes(),
    );
    let bad = write_skill(
        t.path(),
        "Bad-Upper",
        md("name: Bad-Upper\ndescription: x\n").as_bytes(),
    );
    let o = cella(&["validate", ok.to_str().unwrap_or_default()]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(out(&o), format!("Valid skill: {}\n", ok.display()));
    let o = cella(&["validate", bad.to_str().unwrap_or_default()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        err(&o),
        format!(
            "Validation failed for {}:\n  - Skill name 'Bad-Upper' must be lowercase [rule name.lowercase, field name, value \"Bad-Upper\"]\n",
            bad.display()
        )
    );
    if let Some(bin) = agentskills() {
        let r = reference(&bin, &["validate", bad.to_str().unwrap_or_default()]);
        assert!(err(&r).contains("  - Skill name 'Bad-Upper' must be lowercase"));
    }
    // Several paths: exit 1 when any is invalid; SKILL.md paths stand for their directory.
    let skill_md = ok.join("SKILL.md");
    let o = cella(&[
        "validate",
        skill_md.to_str().unwrap_or_default(),
        bad.to_str().unwrap_or_default(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(out(&o).contains(&format!("Valid skill: {}", ok.display())));
    // JSON reports.
    let o = cella(&["validate", "--json", bad.to_str().unwrap_or_default()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v[0]["valid"], false);
    assert_eq!(v[0]["findings"][0]["rule"], "name.lowercase");
    assert_eq!(v[0]["findings"][0]["field"], "name");
    assert_eq!(v[0]["findings"][0]["value"], "Bad-Upper");
    assert_eq!(v[0]["findings"][0]["source"], "both");
}

fn anthropic_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../cella-skills/tests/data/anthropic-skills")
        .join(name)
}

#[test]
fn lenient_loads_what_strict_flags() {
    let d = anthropic_dir("claude-api");
    let p = d.to_str().unwrap_or_default();
    let strict = cella(&["validate", p]);
    assert_eq!(strict.status.code(), Some(1));
    assert!(err(&strict).contains("Description exceeds 1024 character limit (1075 chars)"));
    let lenient = cella(&["validate", "--lenient", p]);
    assert_eq!(lenient.status.code(), Some(0));
    assert!(err(&lenient).starts_with("Warnings for "));
    // A colon-in-value skill: invalid strictly, repaired leniently.
    let t = tempfile::tempdir().expect("tempdir");
    let c = write_skill(
        t.path(),
        "colon",
        md("name: colon\ndescription: Use when: asked\n").as_bytes(),
    );
    let p = c.to_str().unwrap_or_default();
    assert_eq!(cella(&["validate", p]).status.code(), Some(1));
    let l = cella(&["validate", "--lenient", p]);
    assert_eq!(l.status.code(), Some(0));
    assert!(err(&l).contains("rule frontmatter.repaired"));
}

#[test]
fn read_properties_and_to_prompt_match_skills_ref() {
    let t = tempfile::tempdir().expect("tempdir");
    let skills = [
        write_skill(t.path(), "props-all", md("name: props-all\ndescription: \"Tags <b> & 'quotes' \\\"dq\\\"\"\nlicense: MIT\ncompatibility: git\nallowed-tools: Read Bash(git:*)\nmetadata:\n  author: me\n  version: \"1.0\"\n  nested:\n    k: v\n  list:\n    - a\n").as_bytes()),
        write_skill(t.path(), "props-min", md("name: props-min\ndescription: '  padded  '\n").as_bytes()),
        write_skill(t.path(), "props-unicode", md("name: props-unicode\ndescription: 処理 — é 😀\nlicense: ''\nmetadata: ''\nallowed-tools:\n  - Read\n").as_bytes()),
        write_skill(t.path(), "Invalid_But_Readable", md("name: Invalid_But_Readable\ndescription: x\nextra: field\n").as_bytes()),
    ];
    let paths: Vec<String> = skills.iter().map(|p| p.display().to_string()).collect();
    let ours: Vec<Output> = paths
        .iter()
        .map(|p| cella(&["read-properties", p]))
        .collect();
    for o in &ours {
        assert_eq!(o.status.code(), Some(0), "{}", err(o));
        let _: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    }
    assert!(
        out(&ours[2]).contains("\\u51e6\\u7406"),
        "non-ASCII is escaped like Python's json.dumps"
    );
    let mut args: Vec<&str> = vec!["to-prompt"];
    args.extend(paths.iter().map(String::as_str));
    let skill_md = skills[1].join("SKILL.md");
    let skill_md = skill_md.display().to_string();
    args.push(&skill_md);
    let prompt = cella(&args);
    assert_eq!(prompt.status.code(), Some(0), "{}", err(&prompt));
    assert!(out(&prompt).starts_with("<available_skills>\n<skill>\n<name>\nprops-all\n</name>"));
    assert!(out(&prompt).contains("Tags &lt;b&gt; &amp; &#x27;quotes&#x27; &quot;dq&quot;"));
    // Errors: missing description.
    let bad = write_skill(t.path(), "no-desc", md("name: no-desc\n").as_bytes());
    let o = cella(&["read-properties", bad.to_str().unwrap_or_default()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).starts_with("Error: "));

    let Some(bin) = agentskills() else { return };
    for (p, o) in paths.iter().zip(&ours) {
        let r = reference(&bin, &["read-properties", p]);
        assert_eq!(r.status.code(), Some(0));
        let a: serde_json::Value = serde_json::from_slice(&r.stdout).expect("reference json");
        let b: serde_json::Value = serde_json::from_slice(&o.stdout).expect("our json");
        assert_eq!(a, b, "read-properties {p}");
        assert_eq!(out(&r), out(o), "read-properties bytes {p}");
    }
    let r = reference(&bin, &args);
    assert_eq!(r.status.code(), Some(0));
    assert_eq!(out(&r), out(&prompt), "to-prompt bytes");
    let r = reference(&bin, &["read-properties", bad.to_str().unwrap_or_default()]);
    assert_eq!(r.status.code(), Some(1));
}

#[test]
fn anthropic_skills_through_the_cli() {
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../cella-skills/tests/data/anthropic-skills");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("anthropic data")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 17);
    let paths: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let mut args = vec!["validate", "--lenient"];
    args.extend(paths.iter().map(String::as_str));
    assert_eq!(cella(&args).status.code(), Some(0));
    let mut args = vec!["validate", "--json"];
    args.extend(paths.iter().map(String::as_str));
    let v: serde_json::Value = serde_json::from_slice(&cella(&args).stdout).expect("json");
    let invalid: Vec<&str> = v
        .as_array()
        .expect("array")
        .iter()
        .filter(|r| r["valid"] == false)
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(invalid, ["claude-api"]);
    if let Some(bin) = agentskills() {
        let mut args = vec!["to-prompt"];
        args.extend(paths.iter().map(String::as_str));
        assert_eq!(out(&reference(&bin, &args)), out(&cella(&args)));
    }
}

#[test]
fn ls_discovers_with_shadowing_and_catalog() {
    let t = tempfile::tempdir().expect("tempdir");
    let project = t.path().join("project");
    let home = t.path().join("home");
    std::fs::create_dir_all(&project).expect("mkdir");
    std::fs::create_dir_all(&home).expect("mkdir");
    // No skills: no catalog at all.
    let o = cella_in(&["ls", "--catalog"], Some(&project), &[("HOME", &home)]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(out(&o), "");
    write_skill(
        &project.join(".agents/skills"),
        "review",
        md("name: review\ndescription: project review\n").as_bytes(),
    );
    write_skill(
        &home.join(".agents/skills"),
        "review",
        md("name: review\ndescription: user review\n").as_bytes(),
    );
    write_skill(
        &home.join(".agents/skills"),
        "notes",
        md("name: notes\ndescription: user notes\n").as_bytes(),
    );
    let o = cella_in(&["ls", "--json"], Some(&project), &[("HOME", &home)]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let skills = v["skills"].as_array().expect("skills");
    assert_eq!(skills.len(), 2);
    assert_eq!(skills[0]["name"], "review");
    assert_eq!(skills[0]["scope"], "project");
    assert_eq!(skills[0]["description"], "project review");
    assert_eq!(skills[1]["scope"], "user");
    assert_eq!(v["diagnostics"][0]["kind"], "shadowed");
    let o = cella_in(&["ls"], Some(&project), &[("HOME", &home)]);
    assert!(err(&o).contains("warning: skill 'review'"), "{}", err(&o));
    assert!(out(&o).contains("review"));
    let o = cella_in(&["ls", "--catalog"], Some(&project), &[("HOME", &home)]);
    assert!(out(&o).starts_with(
        "<available_skills>\n<skill>\n<name>\nreview\n</name>\n<description>\nproject review\n"
    ));
    // Configured roots through the environment.
    let extra = t.path().join("extra");
    write_skill(
        &extra,
        "extra-skill",
        md("name: extra-skill\ndescription: x\n").as_bytes(),
    );
    let o = cella_in(
        &["ls", "--json", "--no-user"],
        Some(&project),
        &[("CELLA_SKILLS_PATH", &extra)],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let names: Vec<&str> = v["skills"]
        .as_array()
        .expect("skills")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["review", "extra-skill"]);
}

#[test]
fn new_package_install_activate() {
    let t = tempfile::tempdir().expect("tempdir");
    let base = t.path();
    let o = cella_in(&["new", "my-skill", "--dir", "."], Some(base), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let skill = base.join("my-skill");
    assert_eq!(
        cella(&["validate", skill.to_str().unwrap_or_default()])
            .status
            .code(),
        Some(0)
    );
    if let Some(bin) = agentskills() {
        assert_eq!(
            reference(&bin, &["validate", skill.to_str().unwrap_or_default()])
                .status
                .code(),
            Some(0)
        );
    }
    assert_ne!(
        cella_in(&["new", "Bad_Name"], Some(base), &[])
            .status
            .code(),
        Some(0)
    );
    assert_ne!(
        cella_in(&["new", "my-skill"], Some(base), &[])
            .status
            .code(),
        Some(0)
    );

    std::fs::create_dir_all(skill.join("scripts")).expect("mkdir");
    std::fs::write(skill.join("scripts/run.py"), "print('hi')\n").expect("write");
    let o = cella_in(&["package", "my-skill"], Some(base), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(base.join("my-skill.skill").is_file());
    let o = cella_in(
        &["install", "my-skill.skill", "--dest", "installed"],
        Some(base),
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(base.join("installed/my-skill/scripts/run.py").is_file());
    assert_ne!(
        cella_in(
            &["install", "my-skill.skill", "--dest", "installed"],
            Some(base),
            &[]
        )
        .status
        .code(),
        Some(0)
    );
    assert_eq!(
        cella_in(
            &[
                "install",
                "my-skill.skill",
                "--dest",
                "installed",
                "--force"
            ],
            Some(base),
            &[]
        )
        .status
        .code(),
        Some(0)
    );
    // Default destination: ./.agents/skills, which ls then finds.
    assert_eq!(
        cella_in(&["install", "my-skill"], Some(base), &[])
            .status
            .code(),
        Some(0)
    );
    let o = cella_in(&["ls", "--json", "--no-user"], Some(base), &[]);
    assert!(out(&o).contains("\"my-skill\""));

    let o = cella(&[
        "activate",
        base.join("installed/my-skill").to_str().unwrap_or_default(),
    ]);
    assert_eq!(o.status.code(), Some(0));
    let text = out(&o);
    assert!(text.starts_with("<skill_content name=\"my-skill\">\n# my-skill"));
    assert!(text.contains(
        "<skill_resources>\n  <file>scripts/run.py</file>\n</skill_resources>\n</skill_content>"
    ));
    assert!(!text.contains("print('hi')"));

    // Strictly invalid skills are not packaged without --force.
    let bad = write_skill(
        base,
        "bad-pkg",
        md("name: bad-pkg\ndescription: x\nextra: y\n").as_bytes(),
    );
    let b = bad.to_str().unwrap_or_default();
    assert_eq!(
        cella(&[
            "package",
            b,
            "-o",
            base.join("bad.zip").to_str().unwrap_or_default()
        ])
        .status
        .code(),
        Some(1)
    );
    assert_eq!(
        cella(&[
            "package",
            b,
            "--force",
            "-o",
            base.join("bad.zip").to_str().unwrap_or_default()
        ])
        .status
        .code(),
        Some(0)
    );
}

#[test]
fn install_refuses_zip_slip() {
    let t = tempfile::tempdir().expect("tempdir");
    let z = t.path().join("evil.zip");
    // A hand-built stored zip with a '../' entry, so this test needs no zip library.
    std::fs::write(
        &z,
        stored_zip(&[
            (
                "evil/SKILL.md",
                md("name: evil\ndescription: x\n").as_bytes(),
            ),
            ("evil/../../pwned", b"x"),
        ]),
    )
    .expect("write zip");
    let o = cella(&[
        "install",
        z.to_str().unwrap_or_default(),
        "--dest",
        t.path().join("dest").to_str().unwrap_or_default(),
    ]);
    assert_ne!(o.status.code(), Some(0));
    assert!(err(&o).contains("zip-slip"), "{}", err(&o));
    assert!(!t.path().join("pwned").exists());
}

/// A minimal zip (stored, no compression) with the given entries.
fn stored_zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    fn crc32(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    let mut body = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = u32::try_from(body.len()).expect("small zip");
        let crc = crc32(data);
        let size = u32::try_from(data.len()).expect("small entry");
        let nlen = u16::try_from(name.len()).expect("short name");
        body.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        body.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]);
        body.extend_from_slice(&crc.to_le_bytes());
        body.extend_from_slice(&size.to_le_bytes());
        body.extend_from_slice(&size.to_le_bytes());
        body.extend_from_slice(&nlen.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]);
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&nlen.to_le_bytes());
        central.extend_from_slice(&[0; 12]);
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let cd_offset = u32::try_from(body.len()).expect("small zip");
    let cd_size = u32::try_from(central.len()).expect("small zip");
    let n = u16::try_from(entries.len()).expect("few entries");
    body.extend_from_slice(&central);
    body.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    body.extend_from_slice(&[0, 0, 0, 0]);
    body.extend_from_slice(&n.to_le_bytes());
    body.extend_from_slice(&n.to_le_bytes());
    body.extend_from_slice(&cd_size.to_le_bytes());
    body.extend_from_slice(&cd_offset.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body
}

#[test]
fn help_texts_describe_the_commands() {
    let o = cella(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    for cmd in [
        "validate",
        "read-properties",
        "to-prompt",
        "ls",
        "new",
        "package",
        "install",
        "activate",
    ] {
        assert!(out(&o).contains(cmd), "{cmd} missing from help");
    }
    let o = cella(&["validate", "--help"]);
    assert!(out(&o).contains("--lenient"));
    assert!(out(&o).contains("skills-ref"));
}

/// Frontmatter fragments a random corpus is assembled from: valid and broken YAML, every field,
/// strictyaml's refusals, the spec's stricter cases.
const FRAGMENTS: &[&str] = &[
    "name: {n}\n",
    "description: Does things. Use when asked.\n",
    "license: MIT\n",
    "compatibility: needs git\n",
    "metadata:\n  author: me\n  version: \"1.0\"\n",
    "allowed-tools: Bash(git:*) Read\n",
    "# comment\n",
    "\n",
    "description: |\n  multi\n  line\n",
    "description: 'quoted: yes'\n",
    "description: \"dq \\u00e9\"\n",
    "description: Use when: colon\n",
    "extra: field\n",
    "name: Bad-Name\n",
    "name: -x\n",
    "name: a--b\n",
    "name: café\n",
    "compatibility: \"\"\n",
    "metadata: str\n",
    "metadata:\n  nested:\n    k: v\n",
    "allowed-tools:\n  - Read\n  - Bash\n",
    "license:\n  a: b\n",
    "description:\n",
    "name:\n",
    "  indented: x\n",
    "name: {n}   # trailing comment\n",
    "description: >\n  folded\n  text\n",
    "description: a\tb\n",
    "x: [1]\n",
    "name: \"{n}\"\n",
    "name: '{n}'\n",
    "? name\n: {n}\n",
    "description: - item\n",
    "description: @at\n",
    "description: \"unterminated\n",
    "description: 'it''s'\n",
    "metadata:\n  - a\n",
    "description: x\n  continued\n",
    "description: x\n continued less\n",
    "<<:\n  x: y\n",
    "description: \"a\\qb\"\n",
    "description: null\n",
    "description: 1.10\n",
    "description: '  '\n",
    "\"name\": {n}\n",
    "description: \"wrapped\nat column zero\"\n",
    "description: plain\nwrapped\n",
    "description: x # c\n# full line\n",
    "name : {n}\n",
    "description: ‘smart’ “quotes” ¿qué?\n",
    "description: x:\n",
    "description: &a x\n",
    "description: !!str x\n",
    "description: {x\n",
    "description: x,y\n",
    "description: \u{7}\n",
];

/// Fields added to an otherwise valid skill.
const OPTIONAL_FRAGMENTS: &[&str] = &[
    "license: MIT\n",
    "license: Proprietary. LICENSE.txt has complete terms\n",
    "compatibility: Requires git, docker, jq, and access to the internet\n",
    "compatibility: \"\"\n",
    "metadata:\n  author: example-org\n  version: \"1.0\"\n",
    "metadata:\n  tags:\n    - a\n",
    "metadata: {a: b}\n",
    "allowed-tools: Bash(git:*) Bash(jq:*) Read\n",
    "allowed-tools:\n  - Read\n",
    "# a comment\n",
    "\n",
    "disable-model-invocation: true\n",
    "license:\n  name: MIT\n",
    "compatibility:\n  - linux\n",
];

/// Deterministic xorshift64*, so the random corpus is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
}

/// Random frontmatter (fragments combined, then characters YAML cares about inserted), judged
/// by skills-ref in one Python process and by `cella skills validate --reference/--strict`.
/// `--reference` must agree on every skill; `--strict` too, except where its extra findings are
/// all specification rules.
#[test]
fn random_corpus_matches_skills_ref() {
    let Some(bin) = agentskills() else { return };
    let python = bin.with_file_name("python");
    let t = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng(0x5eed_cafe_f00d_0001);
    let inserts = [
        ":", " ", "\t", "#", "-", "\"", "'", "\n", "{", "[", "&", "*", "!", "|", ">", "?", "%",
        "@", "a", "\n  ", "...",
    ];
    let count = 1500;
    let mut dirs = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("r{i:04}");
        let mut fm = String::new();
        if i % 2 == 0 {
            // A valid skill plus optional fields (some of them broken).
            fm.push_str("name: {n}\ndescription: A skill. Use it when asked.\n");
            for _ in 0..rng.below(3) {
                fm.push_str(OPTIONAL_FRAGMENTS[rng.below(OPTIONAL_FRAGMENTS.len())]);
            }
        } else {
            for _ in 0..=rng.below(5) {
                fm.push_str(FRAGMENTS[rng.below(FRAGMENTS.len())]);
            }
        }
        if i % 3 == 1 || i % 6 == 0 {
            let mut chars: Vec<char> = fm.chars().collect();
            for _ in 0..=rng.below(3) {
                let at = rng.below(chars.len() + 1);
                let ins = inserts[rng.below(inserts.len())];
                for (k, c) in ins.chars().enumerate() {
                    chars.insert(at + k, c);
                }
            }
            fm = chars.into_iter().collect();
        }
        let content = format!("---\n{}---\n# body\n", fm.replace("{n}", &name));
        dirs.push(write_skill(t.path(), &name, content.as_bytes()));
    }
    let script = "import json, sys\nfrom pathlib import Path\nfrom skills_ref.validator import validate\nout = {}\nfor d in sys.argv[1:]:\n    try:\n        out[d] = not validate(Path(d))\n    except Exception:\n        out[d] = False\nprint(json.dumps(out))\n";
    let paths: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let py = Command::new(&python)
        .arg("-c")
        .arg(script)
        .args(&paths)
        .output()
        .expect("running skills-ref");
    assert!(py.status.success(), "{}", err(&py));
    let expected: std::collections::HashMap<String, bool> =
        serde_json::from_slice(&py.stdout).expect("skills-ref json");
    let mut args = vec!["validate", "--reference", "--json"];
    args.extend(paths.iter().map(String::as_str));
    let reference_reports: serde_json::Value =
        serde_json::from_slice(&cella(&args).stdout).expect("reference json");
    args[1] = "--strict";
    let strict_reports: serde_json::Value =
        serde_json::from_slice(&cella(&args).stdout).expect("strict json");
    let (mut valid, mut spec_only) = (0, 0);
    for (i, p) in paths.iter().enumerate() {
        let want = expected[p];
        let r = &reference_reports[i];
        assert_eq!(
            r["valid"],
            want,
            "--reference on {p}: {}",
            std::fs::read_to_string(dirs[i].join("SKILL.md")).unwrap_or_default()
        );
        let s = &strict_reports[i];
        if s["valid"] != want {
            let findings = s["findings"].as_array().expect("findings");
            let extra: Vec<&serde_json::Value> =
                findings.iter().filter(|f| f["source"] != "spec").collect();
            assert!(want && extra.is_empty(), "--strict on {p}: {findings:?}");
            spec_only += 1;
        }
        valid += usize::from(want);
    }
    eprintln!(
        "random corpus: {count} skills ({valid} valid per skills-ref); --reference agrees on all; --strict differs on {spec_only}, each only by specification rules"
    );
}
