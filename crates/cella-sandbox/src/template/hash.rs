//! The content address of a template build: SHA-256 over the normalized recipe (the parts of
//! `template.toml` that decide the root filesystem, in a fixed order, so comments, key order
//! and whitespace do not matter), the bytes of every file copied in, and the build format.
//!
//! Description, env, start command, resources and workdir apply when a sandbox starts, so they
//! are not part of it: changing them needs no rebuild.

use sha2::{Digest, Sha256};

use super::manifest::{FileContent, Recipe};

/// Bumped whenever the build steps change what they produce for the same recipe.
const BUILD_FORMAT: &str = "cella-template-build/1";

/// The hash of `recipe` (64 hex digits); reads the files it copies in.
pub fn recipe_hash(recipe: &Recipe, owner_base: u32) -> Result<String, String> {
    let mut files = Vec::new();
    for f in &recipe.files {
        let digest = match &f.content {
            FileContent::Inline(text) => hex(&Sha256::digest(text.as_bytes())),
            FileContent::Source(path) => {
                let bytes =
                    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
                hex(&Sha256::digest(&bytes))
            }
        };
        files.push(serde_json::json!({ "path": f.path, "mode": f.mode, "sha256": digest }));
    }
    let normalized = serde_json::json!({
        "format": BUILD_FORMAT,
        "owner_base": owner_base,
        "suite": recipe.suite,
        "mirror": recipe.mirror,
        "variant": recipe.variant,
        "components": recipe.components,
        "debian": recipe.debian_packages,
        "pip": recipe.pip_packages,
        "npm": recipe.npm_packages,
        "files": files,
    });
    Ok(hex(&Sha256::digest(normalized.to_string().as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::super::manifest::parse;
    use super::*;

    fn hash_of(text: &str) -> String {
        let t = parse("t", text, None).unwrap();
        recipe_hash(&t.build.unwrap(), 1_000_000).unwrap()
    }

    const A: &str = "description = \"a\"\n[debian]\nsuite = \"bookworm\"\npackages = [\"hello\"]\n";

    #[test]
    fn formatting_and_runtime_settings_do_not_change_the_hash() {
        let h = hash_of(A);
        assert_eq!(h.len(), 64);
        assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
        let reformatted = "# comment\ndescription   = \"other words\"\n\n[resources]\nmemory = \"2G\"\n[env]\nX = \"1\"\n[debian]\npackages = [ \"hello\" ]\nsuite = \"bookworm\"\n";
        assert_eq!(hash_of(reformatted), h);
        // Defaults spelled out are the same recipe.
        let explicit = format!(
            "description = \"a\"\n[debian]\nsuite = \"bookworm\"\nmirror = \"{}\"\nvariant = \"apt\"\ncomponents = [\"main\"]\npackages = [\"hello\"]\n",
            super::super::manifest::DEFAULT_MIRROR
        );
        assert_eq!(hash_of(&explicit), h);
    }

    #[test]
    fn every_build_input_changes_the_hash() {
        let h = hash_of(A);
        for changed in [
            A.replace("bookworm", "trixie"),
            A.replace("[\"hello\"]", "[\"hello\", \"curl\"]"),
            A.replace(
                "packages = [\"hello\"]",
                "packages = [\"hello\"]\nvariant = \"minbase\"",
            ),
            format!("{A}[[files]]\npath = \"/etc/x\"\ncontent = \"1\"\n"),
        ] {
            assert_ne!(hash_of(&changed), h, "{changed}");
        }
        let t = parse("t", A, None).unwrap().build.unwrap();
        assert_ne!(recipe_hash(&t, 2_000_000).unwrap(), h);
    }

    #[test]
    fn file_contents_are_hashed_not_their_host_path() {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        std::fs::write(one.path().join("f"), "same").unwrap();
        std::fs::write(two.path().join("f"), "same").unwrap();
        let text = format!("{A}[[files]]\npath = \"/etc/f\"\nsource = \"f\"\n");
        let h = |dir: &std::path::Path| {
            recipe_hash(
                &parse("t", &text, Some(dir)).unwrap().build.unwrap(),
                1_000_000,
            )
            .unwrap()
        };
        assert_eq!(h(one.path()), h(two.path()));
        std::fs::write(two.path().join("f"), "different").unwrap();
        assert_ne!(h(one.path()), h(two.path()));
    }
}
