//! Where templates come from and where their builds live.
//!
//! Templates shipped with cella are embedded in the binary (the repository's `templates/`
//! directory); users add their own as `<data-dir>/templates/<name>/template.toml`, which also
//! overrides a shipped one of the same name. A build of template `name` with recipe hash `h`
//! lives in `<data-dir>/templates/<name>/<h>/` (`rootfs/` and `build.json`); it is current when
//! `h` is the hash of the template as it is now.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::hash::recipe_hash;
use super::manifest::{self, Template};

/// Templates shipped in the binary: name and `template.toml`.
const SHIPPED: &[(&str, &str)] = &[
    (
        "base",
        include_str!("../../../../templates/base/template.toml"),
    ),
    (
        "code-interpreter",
        include_str!("../../../../templates/code-interpreter/template.toml"),
    ),
];

/// The manifest's file name inside a template directory.
pub const MANIFEST: &str = "template.toml";

/// Where a template was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "path")]
pub enum Origin {
    /// Embedded in the cella binary.
    Shipped,
    /// A directory under the data directory.
    User(PathBuf),
}

/// A template with what is known about its builds.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub template: Template,
    pub origin: Origin,
    /// The recipe hash; `None` for templates on the host's `/usr` (nothing to build).
    pub hash: Option<String>,
}

/// What `build.json` records beside a built root filesystem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildInfo {
    pub name: String,
    pub hash: String,
    pub suite: String,
    /// Seconds since the Unix epoch.
    pub built_at: u64,
    pub build_seconds: f64,
    pub size_bytes: u64,
    /// First host uid/gid the root's files are owned from (uid 0 inside the sandbox).
    pub owner_base: u32,
}

/// A template ready for a sandbox.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub template: Template,
    /// The built root filesystem; `None`: the host's `/usr` with the prepared base `/etc`.
    pub root: Option<PathBuf>,
}

/// Why a template cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("unknown template {name:?}: known templates are {known}")]
    Unknown { name: String, known: String },
    #[error(
        "template {name:?} is not built on this host: run `cella template build {name}` (known templates are {known})"
    )]
    NotBuilt { name: String, known: String },
    #[error("template {name:?} is invalid: {error}")]
    Invalid { name: String, error: String },
}

/// The templates of one data directory.
#[derive(Debug, Clone)]
pub struct Catalog {
    /// `<data-dir>/templates`.
    dir: PathBuf,
    owner_base: u32,
}

impl Catalog {
    /// `owner_base` is the first host id sandboxes map to (built roots are owned from there).
    pub fn new(data_dir: &Path, owner_base: u32) -> Self {
        Catalog {
            dir: data_dir.join("templates"),
            owner_base,
        }
    }

    pub fn owner_base(&self) -> u32 {
        self.owner_base
    }

    /// `<data-dir>/templates/<name>`: user manifest, builds, and temporary build directories.
    pub fn template_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Every template name, shipped and user-added, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = SHIPPED.iter().map(|(n, _)| n.to_string()).collect();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if manifest::validate_name(&name).is_ok() && entry.path().join(MANIFEST).is_file() {
                    names.push(name);
                }
            }
        }
        names.sort();
        names.dedup();
        names
    }

    /// Loads template `name`: `Ok(None)` when there is no such template.
    pub fn load(&self, name: &str) -> Result<Option<Loaded>, CatalogError> {
        let invalid = |error: String| CatalogError::Invalid {
            name: name.to_string(),
            error,
        };
        if manifest::validate_name(name).is_err() {
            return Ok(None);
        }
        let user_dir = self.template_dir(name);
        let user_manifest = user_dir.join(MANIFEST);
        let (template, origin) = if user_manifest.is_file() {
            let text = std::fs::read_to_string(&user_manifest)
                .map_err(|e| invalid(format!("reading {}: {e}", user_manifest.display())))?;
            let t = manifest::parse(name, &text, Some(&user_dir))
                .map_err(|e| invalid(format!("{}: {e}", user_manifest.display())))?;
            (t, Origin::User(user_dir))
        } else if let Some((_, text)) = SHIPPED.iter().find(|(n, _)| *n == name) {
            let t = manifest::parse(name, text, None).map_err(invalid)?;
            (t, Origin::Shipped)
        } else {
            return Ok(None);
        };
        let hash = template
            .build
            .as_ref()
            .map(|r| recipe_hash(r, self.owner_base))
            .transpose()
            .map_err(invalid)?;
        Ok(Some(Loaded {
            template,
            origin,
            hash,
        }))
    }

    /// Loads template `name`, or says which ones exist.
    pub fn require(&self, name: &str) -> Result<Loaded, CatalogError> {
        self.load(name)?.ok_or_else(|| CatalogError::Unknown {
            name: name.to_string(),
            known: self.names().join(", "),
        })
    }

    /// The directory of the build with `hash`.
    pub fn build_dir(&self, name: &str, hash: &str) -> PathBuf {
        self.template_dir(name).join(hash)
    }

    /// The current build of a loaded template, if it is built.
    pub fn built(&self, loaded: &Loaded) -> Option<BuildInfo> {
        let hash = loaded.hash.as_deref()?;
        let dir = self.build_dir(&loaded.template.name, hash);
        if !dir.join("rootfs").is_dir() {
            return None;
        }
        let text = std::fs::read_to_string(dir.join("build.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Template `name` ready for a sandbox: known, valid and (when it has a recipe) built.
    pub fn resolve(&self, name: &str) -> Result<Resolved, CatalogError> {
        let loaded = self.require(name)?;
        let root = match &loaded.hash {
            None => None,
            Some(hash) => {
                if self.built(&loaded).is_none() {
                    return Err(CatalogError::NotBuilt {
                        name: name.to_string(),
                        known: self.names().join(", "),
                    });
                }
                Some(self.build_dir(name, hash).join("rootfs"))
            }
        };
        Ok(Resolved {
            template: loaded.template,
            root,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_templates_are_valid() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(dir.path(), 1_000_000);
        assert_eq!(catalog.names(), vec!["base", "code-interpreter"]);
        let base = catalog.require("base").unwrap();
        assert!(base.hash.is_none());
        assert!(catalog.resolve("base").unwrap().root.is_none());
        let ci = catalog.require("code-interpreter").unwrap();
        assert_eq!(ci.origin, Origin::Shipped);
        let recipe = ci.template.build.unwrap();
        for p in ["python3", "python3-numpy", "python3-pandas", "nodejs"] {
            assert!(recipe.debian_packages.iter().any(|d| d == p), "{p}");
        }
    }

    #[test]
    fn unknown_and_unbuilt_templates_say_what_exists_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(dir.path(), 1_000_000);
        let e = catalog.resolve("nope").unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown template \"nope\": known templates are base, code-interpreter"
        );
        let e = catalog.resolve("code-interpreter").unwrap_err().to_string();
        assert!(
            e.contains("run `cella template build code-interpreter`"),
            "{e}"
        );
        assert!(catalog.resolve("../etc").is_err());
    }

    #[test]
    fn user_templates_are_found_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(dir.path(), 1_000_000);
        let t = dir.path().join("templates/tiny");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(
            t.join(MANIFEST),
            "description = \"tiny\"\n[debian]\nsuite = \"bookworm\"\n",
        )
        .unwrap();
        assert_eq!(catalog.names(), vec!["base", "code-interpreter", "tiny"]);
        let loaded = catalog.require("tiny").unwrap();
        assert_eq!(loaded.origin, Origin::User(t.clone()));
        assert!(catalog.built(&loaded).is_none());

        // A build directory with the current hash makes it built.
        let hash = loaded.hash.clone().unwrap();
        let build = catalog.build_dir("tiny", &hash);
        std::fs::create_dir_all(build.join("rootfs")).unwrap();
        let info = BuildInfo {
            name: "tiny".into(),
            hash: hash.clone(),
            suite: "bookworm".into(),
            built_at: 1,
            build_seconds: 2.0,
            size_bytes: 3,
            owner_base: 1_000_000,
        };
        std::fs::write(
            build.join("build.json"),
            serde_json::to_string(&info).unwrap(),
        )
        .unwrap();
        assert_eq!(catalog.built(&loaded), Some(info));
        assert_eq!(
            catalog.resolve("tiny").unwrap().root,
            Some(build.join("rootfs"))
        );

        std::fs::write(t.join(MANIFEST), "description = \"tiny\"\nsize = 1\n").unwrap();
        let e = catalog.resolve("tiny").unwrap_err().to_string();
        assert!(e.contains("unknown field `size`"), "{e}");
        assert!(e.contains("template.toml"), "{e}");
    }
}
