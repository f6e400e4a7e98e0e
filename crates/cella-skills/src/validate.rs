//! Validation of a skill directory in three modes, each finding naming its rule, field and
//! offending value.
//!
//! * [`Mode::Strict`]: every rule of the agentskills.io specification plus every check of the
//!   reference validator (skills-ref 0.1.1), parsed the way skills-ref parses. Where the
//!   specification is stricter than skills-ref, the extra rules have [`Source::Spec`]:
//!   names must be ASCII `a-z0-9-` as written (skills-ref NFKC-normalises, strips and accepts any
//!   Unicode letter or digit); `compatibility`, when present, must not be empty; `metadata` must
//!   map strings to strings; `license` must be a string; `allowed-tools` a string or a list of
//!   strings.
//! * [`Mode::Reference`]: skills-ref's checks only — the same verdict as `agentskills validate`.
//! * [`Mode::Lenient`]: the client-implementation guide — load whenever possible, with warnings;
//!   errors only when the description is missing or empty, or the YAML cannot be parsed even
//!   after quoting values that contain colons.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::frontmatter;
use crate::python_compat as py;
use crate::skill::{self, Skill, SkillError};
use crate::yaml::{self, Dialect, Value};

/// Maximum `name` length (characters).
pub const MAX_NAME_LENGTH: usize = 64;
/// Maximum `description` length (characters).
pub const MAX_DESCRIPTION_LENGTH: usize = 1024;
/// Maximum `compatibility` length (characters).
pub const MAX_COMPATIBILITY_LENGTH: usize = 500;
/// The frontmatter fields the specification defines.
pub const ALLOWED_FIELDS: [&str; 6] = [
    "allowed-tools",
    "compatibility",
    "description",
    "license",
    "metadata",
    "name",
];

/// How strictly to judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Specification and skills-ref rules, all errors.
    Strict,
    /// skills-ref's rules only.
    Reference,
    /// Load with warnings (client guide).
    Lenient,
}

/// Where a rule comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The specification and skills-ref agree.
    Both,
    /// The specification only (skills-ref does not check it).
    Spec,
    /// skills-ref only (e.g. its parser's requirements).
    SkillsRef,
    /// The client-implementation guide (lenient loading).
    ClientGuide,
}

/// Whether a finding blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The skill is invalid (strict/reference) or skipped (lenient).
    Error,
    /// Reported; the skill still loads.
    Warning,
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable rule id, e.g. `name.lowercase`.
    pub rule: &'static str,
    /// The frontmatter field concerned, if any.
    pub field: Option<String>,
    /// The offending value, if any (as written).
    pub value: Option<String>,
    /// Human-readable message (skills-ref's wording for skills-ref's checks).
    pub message: String,
    /// Error or warning.
    pub severity: Severity,
    /// Where the rule comes from.
    pub source: Source,
}

/// The outcome of validating one path.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The skill directory judged (as given, or the parent of a given SKILL.md).
    pub path: PathBuf,
    /// The mode used.
    pub mode: Mode,
    /// Whether no finding is an error.
    pub valid: bool,
    /// Everything found, in rule order.
    pub findings: Vec<Finding>,
    /// The skill's name, when one was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The loaded skill (lenient mode only).
    #[serde(skip)]
    pub skill: Option<Skill>,
}

impl Report {
    /// Errors only.
    pub fn errors(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
    }

    /// Warnings only.
    pub fn warnings(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
    }
}

struct Collector {
    mode: Mode,
    findings: Vec<Finding>,
}

impl Collector {
    fn push(
        &mut self,
        rule: &'static str,
        source: Source,
        field: Option<&str>,
        value: Option<&str>,
        message: String,
    ) {
        // Lenient mode downgrades everything except what makes a skill unloadable.
        let blocking = matches!(
            rule,
            "path.missing"
                | "path.not-directory"
                | "file.missing"
                | "file.unreadable"
                | "frontmatter.opening"
                | "frontmatter.closing"
                | "frontmatter.yaml"
                | "frontmatter.mapping"
                | "description.missing"
                | "description.empty"
        );
        let severity = match self.mode {
            Mode::Lenient if !blocking => Severity::Warning,
            _ => Severity::Error,
        };
        if self.mode == Mode::Reference && source == Source::Spec {
            return;
        }
        self.findings.push(Finding {
            rule,
            field: field.map(str::to_owned),
            value: value.map(str::to_owned),
            message,
            severity,
            source,
        });
    }
}

/// Validates the skill at `path` (a skill directory, or its SKILL.md file).
pub fn validate(path: &Path, mode: Mode) -> Report {
    let dir = skill::skill_dir_of(path);
    let mut c = Collector {
        mode,
        findings: Vec::new(),
    };
    let loaded = check(&dir, &mut c);
    let valid = c.findings.iter().all(|f| f.severity != Severity::Error);
    let name = loaded
        .as_ref()
        .and_then(|(map, _)| map.get("name"))
        .and_then(Value::as_str)
        .map(|s| py::strip(s).to_owned());
    let skill = match (&loaded, mode) {
        (Some((map, body)), Mode::Lenient) if valid => build_skill(&dir, map, body),
        _ => None,
    };
    Report {
        path: dir,
        mode,
        valid,
        findings: c.findings,
        name,
        skill,
    }
}

/// Loads a skill leniently: `Ok` with the skill and its warnings, or `Err` with the report
/// saying why it was skipped.
pub fn load_lenient(path: &Path) -> Result<(Skill, Vec<Finding>), Box<Report>> {
    let mut report = validate(path, Mode::Lenient);
    match report.skill.take() {
        Some(skill) => Ok((skill, report.findings)),
        None => Err(Box::new(report)),
    }
}

fn build_skill(dir: &Path, map: &Value, body: &str) -> Option<Skill> {
    let description = map.get("description").and_then(Value::as_str)?;
    let abs = skill::absolute(dir);
    let name = map
        .get("name")
        .and_then(Value::as_str)
        .map(|s| py::strip(s).to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| skill::python_path_name(&abs));
    let location = skill::find_skill_md(&abs)?;
    Some(Skill {
        name,
        description: py::strip(description).to_owned(),
        dir: abs,
        location,
        body: body.to_owned(),
        frontmatter: map.clone(),
    })
}

fn short(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

/// Reads and parses; pushes findings; returns the frontmatter mapping and body when parsed.
fn check(dir: &Path, c: &mut Collector) -> Option<(Value, String)> {
    let shown = dir.display().to_string();
    if !dir.exists() {
        c.push(
            "path.missing",
            Source::SkillsRef,
            None,
            Some(&shown),
            format!("Path does not exist: {shown}"),
        );
        return None;
    }
    if !dir.is_dir() {
        c.push(
            "path.not-directory",
            Source::SkillsRef,
            None,
            Some(&shown),
            format!("Not a directory: {shown}"),
        );
        return None;
    }
    let Some(skill_md) = skill::find_skill_md(dir) else {
        c.push(
            "file.missing",
            Source::Both,
            None,
            None,
            "Missing required file: SKILL.md".to_owned(),
        );
        return None;
    };
    let text = match skill::read_text(&skill_md) {
        Ok(t) => t,
        Err(e) => {
            c.push(
                "file.unreadable",
                Source::SkillsRef,
                None,
                Some(&skill_md.display().to_string()),
                format!("Cannot read SKILL.md: {e}"),
            );
            return None;
        }
    };
    let (map, body) = match c.mode {
        Mode::Strict | Mode::Reference => parse_strict(&text, c)?,
        Mode::Lenient => parse_lenient(&text, c)?,
    };
    check_fields(&map, dir, c);
    Some((map, body))
}

fn split_finding(e: frontmatter::SplitError, c: &mut Collector) {
    let rule = match e {
        frontmatter::SplitError::MissingOpening => "frontmatter.opening",
        frontmatter::SplitError::Unclosed => "frontmatter.closing",
    };
    c.push(rule, Source::Both, None, None, e.to_string());
}

fn parse_strict(text: &str, c: &mut Collector) -> Option<(Value, String)> {
    match skill::parse_reference(text) {
        Ok(parsed) => Some(parsed),
        Err(SkillError::Split(e)) => {
            split_finding(e, c);
            None
        }
        Err(SkillError::Yaml(e)) => {
            c.push(
                "frontmatter.yaml",
                Source::SkillsRef,
                None,
                None,
                format!("Invalid YAML in frontmatter: {e}"),
            );
            None
        }
        Err(_) => {
            c.push(
                "frontmatter.mapping",
                Source::Both,
                None,
                None,
                "SKILL.md frontmatter must be a YAML mapping".to_owned(),
            );
            None
        }
    }
}

fn parse_lenient(text: &str, c: &mut Collector) -> Option<(Value, String)> {
    let split = match frontmatter::split_lines(text) {
        Ok(s) => s,
        Err(e) => {
            split_finding(e, c);
            return None;
        }
    };
    let value = match yaml::load(split.frontmatter, Dialect::Permissive) {
        Ok(v) => v,
        Err(first) => {
            let repaired = frontmatter::quote_colon_values(split.frontmatter)
                .and_then(|fixed| yaml::load(&fixed, Dialect::Permissive).ok());
            match repaired {
                Some(v) => {
                    c.push(
                        "frontmatter.repaired",
                        Source::ClientGuide,
                        None,
                        None,
                        format!(
                            "YAML does not parse as written ({first}); loaded after quoting values that contain ': '"
                        ),
                    );
                    v
                }
                None => {
                    c.push(
                        "frontmatter.yaml",
                        Source::ClientGuide,
                        None,
                        None,
                        format!("Invalid YAML in frontmatter: {first}"),
                    );
                    return None;
                }
            }
        }
    };
    if !matches!(value, Value::Map(_)) {
        c.push(
            "frontmatter.mapping",
            Source::Both,
            None,
            None,
            "SKILL.md frontmatter must be a YAML mapping".to_owned(),
        );
        return None;
    }
    Some((value, split.body.to_owned()))
}

/// The directory name compared with `name`. skills-ref uses the lexical last component of the
/// path as given (so `.` compares as ""); strict and lenient modes fall back to the real
/// directory's name when the lexical one is `""` or `..`.
fn dir_name(dir: &Path, mode: Mode) -> String {
    let lexical = skill::python_path_name(dir);
    if mode == Mode::Reference || !(lexical.is_empty() || lexical == "..") {
        return lexical;
    }
    let abs = skill::absolute(dir);
    skill::python_path_name(&abs)
}

fn check_fields(map: &Value, dir: &Path, c: &mut Collector) {
    let entries = map.as_map().unwrap_or_default();

    // 1. Unknown fields.
    let mut extra: Vec<&str> = entries
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !ALLOWED_FIELDS.contains(k))
        .collect();
    if !extra.is_empty() {
        extra.sort_unstable();
        let allowed: Vec<String> = ALLOWED_FIELDS.iter().map(|f| format!("'{f}'")).collect();
        c.push(
            "fields.unknown",
            Source::SkillsRef,
            Some(&extra.join(", ")),
            Some(&extra.join(", ")),
            format!(
                "Unexpected fields in frontmatter: {}. Only [{}] are allowed.",
                extra.join(", "),
                allowed.join(", ")
            ),
        );
    }

    // 2. name.
    match map.get("name") {
        None => c.push(
            "name.missing",
            Source::Both,
            Some("name"),
            None,
            "Missing required field in frontmatter: name".to_owned(),
        ),
        Some(v) => check_name(v, dir, c),
    }

    // 3. description.
    match map.get("description") {
        None => c.push(
            "description.missing",
            Source::Both,
            Some("description"),
            None,
            "Missing required field in frontmatter: description".to_owned(),
        ),
        Some(Value::Str(s)) if !py::strip(s).is_empty() => {
            let n = py::len(s);
            if n > MAX_DESCRIPTION_LENGTH {
                c.push(
                    "description.length",
                    Source::Both,
                    Some("description"),
                    Some(&short(s)),
                    format!(
                        "Description exceeds {MAX_DESCRIPTION_LENGTH} character limit ({n} chars)"
                    ),
                );
            }
        }
        Some(v) => c.push(
            "description.empty",
            Source::Both,
            Some("description"),
            Some(&short(&py::to_str(v))),
            "Field 'description' must be a non-empty string".to_owned(),
        ),
    }

    // 4. compatibility.
    if let Some(v) = map.get("compatibility") {
        match v {
            Value::Str(s) => {
                let n = py::len(s);
                if n > MAX_COMPATIBILITY_LENGTH {
                    c.push(
                        "compatibility.length",
                        Source::Both,
                        Some("compatibility"),
                        Some(&short(s)),
                        format!(
                            "Compatibility exceeds {MAX_COMPATIBILITY_LENGTH} character limit ({n} chars)"
                        ),
                    );
                } else if n == 0 {
                    c.push(
                        "compatibility.empty",
                        Source::Spec,
                        Some("compatibility"),
                        Some(""),
                        "Field 'compatibility' must be 1-500 characters when present (it is empty)"
                            .to_owned(),
                    );
                }
            }
            other => c.push(
                "compatibility.type",
                Source::Both,
                Some("compatibility"),
                Some(&short(&py::to_str(other))),
                "Field 'compatibility' must be a string".to_owned(),
            ),
        }
    }

    // 5. The specification's types for the other optional fields.
    check_optional_types(map, c);
}

fn check_name(v: &Value, dir: &Path, c: &mut Collector) {
    let raw = match v {
        Value::Str(s) if !py::strip(s).is_empty() => s.as_str(),
        other => {
            c.push(
                "name.empty",
                Source::Both,
                Some("name"),
                Some(&short(&py::to_str(other))),
                "Field 'name' must be a non-empty string".to_owned(),
            );
            return;
        }
    };
    let name = py::nfkc(py::strip(raw));
    let n = py::len(&name);
    let mut push = |rule, source, message: String| {
        c.push(rule, source, Some("name"), Some(&short(raw)), message);
    };
    if n > MAX_NAME_LENGTH {
        push(
            "name.length",
            Source::Both,
            format!("Skill name '{name}' exceeds {MAX_NAME_LENGTH} character limit ({n} chars)"),
        );
    }
    if name != py::lower(&name) {
        push(
            "name.lowercase",
            Source::Both,
            format!("Skill name '{name}' must be lowercase"),
        );
    }
    if name.starts_with('-') || name.ends_with('-') {
        push(
            "name.hyphen-edge",
            Source::Both,
            "Skill name cannot start or end with a hyphen".to_owned(),
        );
    }
    if name.contains("--") {
        push(
            "name.consecutive-hyphens",
            Source::Both,
            "Skill name cannot contain consecutive hyphens".to_owned(),
        );
    }
    if !name.chars().all(|ch| py::is_alnum(ch) || ch == '-') {
        push(
            "name.characters",
            Source::Both,
            format!(
                "Skill name '{name}' contains invalid characters. Only letters, digits, and hyphens are allowed."
            ),
        );
    }
    // The specification's character set is ASCII a-z, 0-9 and '-', judged as written.
    if !raw.is_ascii() || raw != py::strip(raw) {
        push(
            "name.ascii",
            Source::Spec,
            format!(
                "Skill name '{raw}' must use only a-z, 0-9 and '-' as written (the specification's character set)"
            ),
        );
    }
    let dir_name_raw = dir_name(dir, c.mode);
    let dir_name = py::nfkc(&dir_name_raw);
    if dir_name != name {
        c.push(
            "name.directory",
            Source::Both,
            Some("name"),
            Some(&short(raw)),
            format!("Directory name '{dir_name_raw}' must match skill name '{name}'"),
        );
    }
}

fn check_optional_types(map: &Value, c: &mut Collector) {
    if let Some(v) = map.get("license")
        && !matches!(v, Value::Str(_))
    {
        c.push(
            "license.type",
            Source::Spec,
            Some("license"),
            Some(&short(&py::to_str(v))),
            format!("Field 'license' must be a string (found a {})", v.kind()),
        );
    }
    if let Some(v) = map.get("allowed-tools") {
        let ok = match v {
            Value::Str(_) => true,
            Value::Seq(items) => items.iter().all(|i| matches!(i, Value::Str(_))),
            Value::Map(_) => false,
        };
        if !ok {
            c.push(
                "allowed-tools.type",
                Source::Spec,
                Some("allowed-tools"),
                Some(&short(&py::to_str(v))),
                format!(
                    "Field 'allowed-tools' must be a space-delimited string or a list of strings (found a {})",
                    v.kind()
                ),
            );
        }
    }
    if let Some(v) = map.get("metadata") {
        let problem = match v {
            Value::Str(s) if s.is_empty() => None,
            Value::Map(m) => m
                .iter()
                .find(|(_, mv)| !matches!(mv, Value::Str(_)))
                .map(|(k, mv)| format!("key '{k}' has a {} value", mv.kind())),
            other => Some(format!("found a {}", other.kind())),
        };
        if let Some(problem) = problem {
            c.push(
                "metadata.type",
                Source::Spec,
                Some("metadata"),
                Some(&short(&py::to_str(v))),
                format!("Field 'metadata' must map string keys to string values ({problem})"),
            );
        }
    }
}
