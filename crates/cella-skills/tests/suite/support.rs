//! Helpers: build skill directories in temporary directories.

use std::path::{Path, PathBuf};

/// Writes `<parent>/<dir>/SKILL.md` with `content` and returns the skill directory.
pub fn skill(parent: &Path, dir: &str, content: &str) -> PathBuf {
    let d = parent.join(dir);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("SKILL.md"), content).unwrap();
    d
}

/// A SKILL.md with the given frontmatter lines and a short body.
pub fn md(frontmatter: &str) -> String {
    format!("---\n{frontmatter}---\n\n# Body\n\nDo the thing.\n")
}

/// A valid minimal skill named `name` in a directory of the same name.
pub fn valid(parent: &Path, name: &str) -> PathBuf {
    skill(
        parent,
        name,
        &md(&format!(
            "name: {name}\ndescription: Does {name} things. Use when asked.\n"
        )),
    )
}

/// The repository's test data directory.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}
