//! A skill on disk: finding its SKILL.md, reading it, the loaded [`Skill`], and the reference
//! validator's `read_properties` ([`SkillProperties`], whose JSON is shaped like skills-ref's).
//! Validation rules live in `validate`; this module only reads.

use std::path::{Component, Path, PathBuf};

use crate::frontmatter::{self, SplitError};
use crate::python_compat;
use crate::yaml::{self, Dialect, Value, YamlError};

/// The file that makes a directory a skill.
pub const SKILL_FILE: &str = "SKILL.md";

/// Largest SKILL.md read (10 MiB); larger files are refused rather than loaded.
pub const MAX_SKILL_MD_BYTES: u64 = 10 * 1024 * 1024;

/// Reading a skill failed.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// Neither SKILL.md nor skill.md in the directory.
    #[error("SKILL.md not found in {}", dir.display())]
    NotFound {
        /// The directory searched.
        dir: PathBuf,
    },
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_SKILL_MD_BYTES`].
    #[error("{} is {size} bytes, more than the {limit}-byte limit", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The file is not UTF-8.
    #[error("{} is not valid UTF-8 (byte {offset})", path.display())]
    Encoding {
        /// The file.
        path: PathBuf,
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// No frontmatter delimiters.
    #[error(transparent)]
    Split(#[from] SplitError),
    /// The frontmatter is not YAML the reader accepts.
    #[error("invalid YAML in frontmatter: {0}")]
    Yaml(#[from] YamlError),
    /// The frontmatter is YAML but not a mapping.
    #[error("SKILL.md frontmatter must be a YAML mapping (found a {found})")]
    NotMapping {
        /// What it is instead.
        found: &'static str,
    },
    /// A required field is absent.
    #[error("missing required field in frontmatter: {field}")]
    MissingField {
        /// `name` or `description`.
        field: &'static str,
    },
    /// A required field is not a non-empty string.
    #[error("field '{field}' must be a non-empty string (found {found})")]
    EmptyField {
        /// `name` or `description`.
        field: &'static str,
        /// A short description of the value found.
        found: String,
    },
}

/// Finds the skill file in `dir`: `SKILL.md`, else the lower-case `skill.md` (as skills-ref).
pub fn find_skill_md(dir: &Path) -> Option<PathBuf> {
    ["SKILL.md", "skill.md"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.exists())
}

/// A command-line PATH that names a SKILL.md file (any case) stands for its directory.
pub fn skill_dir_of(path: &Path) -> PathBuf {
    let is_skill_md = path.is_file()
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.eq_ignore_ascii_case("skill.md"));
    if !is_skill_md {
        return path.to_path_buf();
    }
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The last component of `path` as Python's `PurePath.name` computes it: `""` for `.` or `/`,
/// `".."` for a trailing `..`.
pub fn python_path_name(path: &Path) -> String {
    match path.components().next_back() {
        Some(Component::Normal(s)) => s.to_string_lossy().into_owned(),
        Some(Component::ParentDir) => "..".to_owned(),
        _ => String::new(),
    }
}

/// An absolute form of `path`: canonical when it exists, else joined to the current directory.
pub fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Reads a SKILL.md as text: size-limited, UTF-8 checked, newlines normalised.
pub fn read_text(path: &Path) -> Result<String, SkillError> {
    let io = |source| SkillError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.len() > MAX_SKILL_MD_BYTES {
        return Err(SkillError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            limit: MAX_SKILL_MD_BYTES,
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let text = String::from_utf8(bytes).map_err(|e| SkillError::Encoding {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    Ok(frontmatter::normalize_newlines(&text).into_owned())
}

/// Parses frontmatter the way skills-ref does: its splitter, strictyaml's YAML, and a mapping.
/// Returns the mapping as written (see [`properties_from`] for the `metadata` coercion) and the
/// stripped body.
pub fn parse_reference(text: &str) -> Result<(Value, String), SkillError> {
    let split = frontmatter::split_reference(text)?;
    let value = yaml::load(split.frontmatter, Dialect::Strict)?;
    if !matches!(value, Value::Map(_)) {
        return Err(SkillError::NotMapping {
            found: "scalar or empty document",
        });
    }
    Ok((value, split.body.to_owned()))
}

/// Properties from a SKILL.md frontmatter, as skills-ref's `SkillProperties`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillProperties {
    /// `name`, stripped.
    pub name: String,
    /// `description`, stripped.
    pub description: String,
    /// `license`, any YAML node.
    pub license: Option<Value>,
    /// `compatibility`, any YAML node.
    pub compatibility: Option<Value>,
    /// `allowed-tools`, any YAML node.
    pub allowed_tools: Option<Value>,
    /// `metadata` (a mapping's values are strings).
    pub metadata: Option<Value>,
}

impl SkillProperties {
    /// The dict skills-ref's `to_dict()` builds: name, description, then license,
    /// compatibility and allowed-tools when present, metadata when non-empty.
    pub fn to_value(&self) -> Value {
        let mut m = vec![
            ("name".to_owned(), Value::Str(self.name.clone())),
            (
                "description".to_owned(),
                Value::Str(self.description.clone()),
            ),
        ];
        let optional = [
            ("license", &self.license),
            ("compatibility", &self.compatibility),
            ("allowed-tools", &self.allowed_tools),
        ];
        for (k, v) in optional {
            if let Some(v) = v {
                m.push((k.to_owned(), v.clone()));
            }
        }
        if let Some(md) = &self.metadata
            && md.is_truthy()
        {
            m.push(("metadata".to_owned(), md.clone()));
        }
        Value::Map(m)
    }

    /// `json.dumps(props.to_dict(), indent=2)`: byte-identical to `agentskills read-properties`.
    pub fn to_json_string(&self) -> String {
        python_compat::json_dumps_indent2(&self.to_value())
    }
}

fn required_string(map: &Value, field: &'static str) -> Result<String, SkillError> {
    let v = map.get(field).ok_or(SkillError::MissingField { field })?;
    match v {
        Value::Str(s) if !python_compat::strip(s).is_empty() => {
            Ok(python_compat::strip(s).to_owned())
        }
        Value::Str(_) => Err(SkillError::EmptyField {
            field,
            found: "an empty string".to_owned(),
        }),
        other => Err(SkillError::EmptyField {
            field,
            found: format!("a {}", other.kind()),
        }),
    }
}

/// skills-ref's `read_properties(skill_dir)`: no validation beyond name and description being
/// non-empty strings.
pub fn read_properties(dir: &Path) -> Result<SkillProperties, SkillError> {
    let skill_md = find_skill_md(dir).ok_or_else(|| SkillError::NotFound {
        dir: dir.to_path_buf(),
    })?;
    let text = read_text(&skill_md)?;
    let (map, _) = parse_reference(&text)?;
    properties_from(&map)
}

/// Builds [`SkillProperties`] from a parsed frontmatter mapping. Like skills-ref, a `metadata`
/// mapping's values are coerced with Python's `str()`.
pub fn properties_from(map: &Value) -> Result<SkillProperties, SkillError> {
    let name = required_string(map, "name")?;
    let description = required_string(map, "description")?;
    let metadata = map.get("metadata").map(|v| match v {
        Value::Map(m) => Value::Map(
            m.iter()
                .map(|(k, mv)| (k.clone(), Value::Str(python_compat::to_str(mv))))
                .collect(),
        ),
        other => other.clone(),
    });
    Ok(SkillProperties {
        name,
        description,
        license: map.get("license").cloned(),
        compatibility: map.get("compatibility").cloned(),
        allowed_tools: map.get("allowed-tools").cloned(),
        metadata,
    })
}

/// A skill loaded for use (discovery, catalog, activation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// `name` from the frontmatter (or the directory name when absent, in lenient mode).
    pub name: String,
    /// `description`, stripped.
    pub description: String,
    /// Absolute skill directory.
    pub dir: PathBuf,
    /// Absolute path of the SKILL.md file.
    pub location: PathBuf,
    /// The Markdown body, trimmed.
    pub body: String,
    /// The whole frontmatter mapping.
    pub frontmatter: Value,
}

impl Skill {
    /// A string field of the frontmatter.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.frontmatter.get(key).and_then(Value::as_str)
    }

    /// Whether the model may activate the skill on its own: false when the frontmatter sets the
    /// (Claude Code) extension `disable-model-invocation: true`. The client guide: hide such
    /// skills from the catalog; users can still activate them explicitly.
    pub fn model_invocable(&self) -> bool {
        !self.field("disable-model-invocation").is_some_and(|v| {
            matches!(
                python_compat::strip(v).to_ascii_lowercase().as_str(),
                "true" | "yes" | "on"
            )
        })
    }
}
