//! `template.toml`: the schema, and its validation into a [`Template`]. Unknown keys are refused
//! and every bad value is named with its key, so a typo never silently builds something else.
//!
//! Knows nothing about where templates are stored or how they are built.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::spec::{Limits, parse_size};

/// `template.toml` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    description: String,
    debian: Option<RawDebian>,
    pip: Option<RawPackages>,
    npm: Option<RawPackages>,
    #[serde(default)]
    files: Vec<RawFile>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    start: Option<String>,
    #[serde(default)]
    resources: RawResources,
    workdir: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDebian {
    suite: String,
    mirror: Option<String>,
    variant: Option<String>,
    #[serde(default)]
    components: Vec<String>,
    #[serde(default)]
    packages: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPackages {
    packages: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    content: Option<String>,
    source: Option<String>,
    mode: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResources {
    memory: Option<String>,
    cpus: Option<f64>,
    pids: Option<u32>,
    disk: Option<String>,
}

/// mmdebstrap's variants.
const VARIANTS: &[&str] = &[
    "extract",
    "custom",
    "essential",
    "apt",
    "required",
    "minbase",
    "buildd",
    "important",
    "debootstrap",
    "standard",
];

/// The mirror used when a template names none.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// A validated template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub name: String,
    pub description: String,
    /// How its root filesystem is built; `None`: the host's `/usr` (the `base` template).
    pub build: Option<Recipe>,
    pub env: BTreeMap<String, String>,
    /// Started in the background by envd when a sandbox of the template starts.
    pub start: Option<String>,
    /// Default resources; `None` fields fall back to the standard limits.
    pub limits: Limits,
    /// Default working directory of processes.
    pub workdir: Option<String>,
}

/// Everything that decides the content of a built root filesystem (and so its hash).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recipe {
    pub suite: String,
    pub mirror: String,
    pub variant: String,
    pub components: Vec<String>,
    pub debian_packages: Vec<String>,
    pub pip_packages: Vec<String>,
    pub npm_packages: Vec<String>,
    pub files: Vec<FileSpec>,
}

/// A file put into the root filesystem after the packages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileSpec {
    /// Absolute path inside the root.
    pub path: String,
    pub content: FileContent,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileContent {
    Inline(String),
    /// A file beside `template.toml` (host path, resolved at load time).
    Source(PathBuf),
}

/// Parses and validates `text`, the `template.toml` of template `name`. `dir` is the
/// template's directory (for `files.source`); `None` for templates embedded in the binary,
/// which may only carry inline files.
pub fn parse(name: &str, text: &str, dir: Option<&Path>) -> Result<Template, String> {
    validate_name(name)?;
    let raw: Raw = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
    if raw.description.trim().is_empty() {
        return Err("description: must not be empty".into());
    }
    for key in raw.env.keys() {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(format!("env: invalid variable name {key:?}"));
        }
    }
    if let Some((key, _)) = raw.env.iter().find(|(_, v)| v.contains('\0')) {
        return Err(format!("env.{key}: value contains a NUL byte"));
    }
    let start = match raw.start {
        Some(s) if s.trim().is_empty() => return Err("start: must not be empty".into()),
        other => other,
    };
    if let Some(w) = &raw.workdir {
        absolute_path("workdir", w)?;
    }
    let limits = resources(&raw.resources)?;

    let build = match raw.debian {
        None => {
            let extra = [
                ("pip", raw.pip.is_some()),
                ("npm", raw.npm.is_some()),
                ("files", !raw.files.is_empty()),
            ];
            if let Some((what, _)) = extra.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "{what}: needs a [debian] section (a template without one runs on the host's /usr and is not built)"
                ));
            }
            None
        }
        Some(deb) => Some(recipe(deb, raw.pip, raw.npm, raw.files, dir)?),
    };
    Ok(Template {
        name: name.to_string(),
        description: raw.description,
        build,
        env: raw.env,
        start,
        limits,
        workdir: raw.workdir,
    })
}

/// Template names: lowercase letters, digits, `-` and `_`, starting with a letter or digit.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid template name {name:?}: use lowercase letters, digits, '-' and '_' (at most 64)"
        ))
    }
}

fn resources(raw: &RawResources) -> Result<Limits, String> {
    let size = |key: &str, v: &Option<String>| {
        v.as_deref()
            .map(|s| parse_size(s).map_err(|e| format!("resources.{key}: {e}")))
            .transpose()
    };
    if let Some(c) = raw.cpus
        && !(c > 0.0 && c <= 1024.0)
    {
        return Err(format!(
            "resources.cpus: must be a positive number of cores up to 1024, got {c}"
        ));
    }
    if raw.pids == Some(0) {
        return Err("resources.pids: must be at least 1".into());
    }
    Ok(Limits {
        memory_bytes: size("memory", &raw.memory)?,
        cpus: raw.cpus,
        pids: raw.pids,
        disk_bytes: size("disk", &raw.disk)?,
    })
}

fn recipe(
    deb: RawDebian,
    pip: Option<RawPackages>,
    npm: Option<RawPackages>,
    files: Vec<RawFile>,
    dir: Option<&Path>,
) -> Result<Recipe, String> {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~+".contains(&b))
    };
    if !token(&deb.suite) {
        return Err(format!(
            "debian.suite: invalid suite {:?} (like bookworm or trixie)",
            deb.suite
        ));
    }
    let mirror = deb.mirror.unwrap_or_else(|| DEFAULT_MIRROR.to_string());
    if !(mirror.starts_with("http://") || mirror.starts_with("https://"))
        || mirror.chars().any(|c| c.is_whitespace())
    {
        return Err(format!(
            "debian.mirror: {mirror:?} is not an http:// or https:// URL"
        ));
    }
    let variant = deb.variant.unwrap_or_else(|| "apt".to_string());
    if !VARIANTS.contains(&variant.as_str()) {
        return Err(format!(
            "debian.variant: unknown variant {variant:?}: use one of {}",
            VARIANTS.join(", ")
        ));
    }
    let components = if deb.components.is_empty() {
        vec!["main".to_string()]
    } else {
        deb.components
    };
    if let Some(c) = components.iter().find(|c| !token(c)) {
        return Err(format!("debian.components: invalid component {c:?}"));
    }
    for p in &deb.packages {
        if !debian_package(p) {
            return Err(format!(
                "debian.packages: invalid package {p:?} (a Debian package name, optionally name=version)"
            ));
        }
    }
    let pip_packages = pip.map(|p| p.packages).unwrap_or_default();
    for p in &pip_packages {
        registry_package("pip", p)?;
    }
    if !pip_packages.is_empty()
        && !deb
            .packages
            .iter()
            .any(|p| package_name(p) == "python3-pip")
    {
        return Err("pip: installing pip packages needs python3-pip in debian.packages".into());
    }
    let npm_packages = npm.map(|p| p.packages).unwrap_or_default();
    for p in &npm_packages {
        registry_package("npm", p)?;
    }
    if !npm_packages.is_empty() && !deb.packages.iter().any(|p| package_name(p) == "npm") {
        return Err("npm: installing npm packages needs npm in debian.packages".into());
    }
    let mut specs = Vec::new();
    for (i, f) in files.into_iter().enumerate() {
        let key = format!("files[{i}]");
        absolute_path(&format!("{key}.path"), &f.path)?;
        let content = match (f.content, f.source) {
            (Some(c), None) => FileContent::Inline(c),
            (None, Some(src)) => {
                let Some(dir) = dir else {
                    return Err(format!(
                        "{key}.source: templates built into cella carry inline content only"
                    ));
                };
                let rel = Path::new(&src);
                if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_)))
                {
                    return Err(format!(
                        "{key}.source: {src:?} must be a relative path inside the template's directory"
                    ));
                }
                let host = dir.join(rel);
                if !host.is_file() {
                    return Err(format!("{key}.source: {} is not a file", host.display()));
                }
                FileContent::Source(host)
            }
            _ => {
                return Err(format!(
                    "{key}: give exactly one of content (inline text) or source (a file beside template.toml)"
                ));
            }
        };
        let mode = match f.mode {
            None => 0o644,
            Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| {
                    format!("{key}.mode: {m:?} is not an octal file mode like \"0644\"")
                })?,
        };
        specs.push(FileSpec {
            path: f.path,
            content,
            mode,
        });
    }
    Ok(Recipe {
        suite: deb.suite,
        mirror,
        variant,
        components,
        debian_packages: deb.packages,
        pip_packages,
        npm_packages,
        files: specs,
    })
}

fn package_name(spec: &str) -> &str {
    spec.split(['=', ':']).next().unwrap_or(spec)
}

fn debian_package(spec: &str) -> bool {
    let (name, version) = match spec.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (spec, None),
    };
    let name = name.split_once(':').map_or(name, |(n, _arch)| n);
    let name_ok = name.len() >= 2
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
    let version_ok = version.is_none_or(|v| {
        !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".+-~:".contains(&b))
    });
    name_ok && version_ok
}

/// pip and npm specifiers: anything their tools accept, except what could be read as an option
/// or split by a shell.
fn registry_package(tool: &str, spec: &str) -> Result<(), String> {
    if spec.is_empty() || spec.starts_with('-') || spec.chars().any(|c| c.is_whitespace()) {
        return Err(format!(
            "{tool}.packages: invalid package {spec:?} (no spaces, must not start with '-')"
        ));
    }
    Ok(())
}

fn absolute_path(key: &str, path: &str) -> Result<(), String> {
    let p = Path::new(path);
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!(
            "{key}: {path:?} must be an absolute path without '..'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
description = "python"
workdir = "/home/user"
start = "sleep infinity"

[debian]
suite = "bookworm"
variant = "minbase"
packages = ["python3", "python3-pip", "npm", "libc6=2.36-9"]

[pip]
packages = ["jupyter_client==8.6.3"]

[npm]
packages = ["left-pad@1.3.0"]

[[files]]
path = "/etc/motd"
content = "hi\n"
mode = "0600"

[env]
PYTHONUNBUFFERED = "1"

[resources]
memory = "1G"
cpus = 2
pids = 512
disk = "2G"
"#;

    #[test]
    fn full_manifest_parses() {
        let t = parse("py", FULL, None).unwrap();
        assert_eq!(t.limits.memory_bytes, Some(1 << 30));
        assert_eq!(t.limits.cpus, Some(2.0));
        assert_eq!(t.limits.pids, Some(512));
        assert_eq!(t.limits.disk_bytes, Some(2 << 30));
        assert_eq!(t.workdir.as_deref(), Some("/home/user"));
        assert_eq!(t.start.as_deref(), Some("sleep infinity"));
        let r = t.build.unwrap();
        assert_eq!(r.mirror, DEFAULT_MIRROR);
        assert_eq!(r.variant, "minbase");
        assert_eq!(r.components, vec!["main"]);
        assert_eq!(r.files[0].mode, 0o600);
        assert_eq!(r.pip_packages, vec!["jupyter_client==8.6.3"]);
    }

    #[test]
    fn host_template_has_no_recipe() {
        let t = parse("base", "description = \"host /usr\"\n", None).unwrap();
        assert!(t.build.is_none());
        assert_eq!(t.limits, Limits::default());
    }

    fn err(text: &str) -> String {
        parse("t", text, None).unwrap_err()
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let e = err("description = \"x\"\nmemroy = \"1G\"\n");
        assert!(e.contains("unknown field `memroy`"), "{e}");
        let e = err("description = \"x\"\n[debian]\nsuite = \"bookworm\"\npackage = []\n");
        assert!(e.contains("unknown field `package`"), "{e}");
        let e = err("description = \"x\"\n[resources]\nram = \"1G\"\n");
        assert!(e.contains("unknown field `ram`"), "{e}");
    }

    #[test]
    fn bad_sizes_are_named() {
        let e = err("description = \"x\"\n[resources]\nmemory = \"12X\"\n");
        assert!(e.starts_with("resources.memory: invalid size unit"), "{e}");
        let e = err("description = \"x\"\n[resources]\ndisk = \"lots\"\n");
        assert!(
            e.starts_with("resources.disk: invalid size \"lots\""),
            "{e}"
        );
        let e = err("description = \"x\"\n[resources]\ncpus = 0\n");
        assert!(e.starts_with("resources.cpus:"), "{e}");
        let e = err("description = \"x\"\n[resources]\npids = 0\n");
        assert!(e.starts_with("resources.pids:"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            ("description = \"\"\n", "description: must not be empty"),
            ("description = \"x\"\nworkdir = \"rel\"\n", "workdir:"),
            (
                "description = \"x\"\nstart = \" \"\n",
                "start: must not be empty",
            ),
            (
                "description = \"x\"\n[env]\n\"A=B\" = \"1\"\n",
                "env: invalid",
            ),
            (
                "description = \"x\"\n[pip]\npackages = [\"numpy\"]\n",
                "pip: needs a [debian] section",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"book worm\"\n",
                "debian.suite:",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\nmirror = \"ftp://x\"\n",
                "debian.mirror:",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\nvariant = \"tiny\"\n",
                "debian.variant: unknown variant \"tiny\"",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\npackages = [\"Bad Name\"]\n",
                "debian.packages: invalid package \"Bad Name\"",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\n[pip]\npackages = [\"numpy\"]\n",
                "pip: installing pip packages needs python3-pip",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\npackages = [\"python3-pip\"]\n[pip]\npackages = [\"--index-url=x\"]\n",
                "pip.packages: invalid package",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\n[npm]\npackages = [\"x\"]\n",
                "npm: installing npm packages needs npm",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\n[[files]]\npath = \"etc/x\"\ncontent = \"\"\n",
                "files[0].path:",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\n[[files]]\npath = \"/etc/x\"\n",
                "files[0]: give exactly one of",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\n[[files]]\npath = \"/etc/x\"\ncontent = \"\"\nmode = \"rw\"\n",
                "files[0].mode:",
            ),
            (
                "description = \"x\"\n[debian]\nsuite = \"bookworm\"\n[[files]]\npath = \"/etc/x\"\nsource = \"x\"\n",
                "files[0].source: templates built into cella",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.starts_with(want), "{text:?}: got {e:?}, want {want:?}");
        }
    }

    #[test]
    fn file_sources_stay_inside_the_template_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("motd"), "hello").unwrap();
        let text = "description = \"x\"\n[debian]\nsuite = \"bookworm\"\n[[files]]\npath = \"/etc/motd\"\nsource = \"motd\"\n";
        let t = parse("t", text, Some(dir.path())).unwrap();
        assert_eq!(
            t.build.unwrap().files[0].content,
            FileContent::Source(dir.path().join("motd"))
        );
        let escape = text.replace("\"motd\"", "\"../motd\"");
        let e = parse("t", &escape, Some(dir.path())).unwrap_err();
        assert!(e.contains("relative path inside"), "{e}");
        let missing = text.replace("\"motd\"", "\"nope\"");
        let e = parse("t", &missing, Some(dir.path())).unwrap_err();
        assert!(e.contains("is not a file"), "{e}");
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("code-interpreter").is_ok());
        assert!(validate_name("../etc").is_err());
        assert!(validate_name("Base").is_err());
        assert!(validate_name("").is_err());
        assert!(validate_name("-x").is_err());
    }
}
