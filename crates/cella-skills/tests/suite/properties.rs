//! Property and fuzz-style tests: the parsers never panic on any input, and valid frontmatter
//! round-trips (emit → parse gives the same properties, and serde-saphyr reads the same strings).

use cella_skills::frontmatter::{split_lines, split_reference};
use cella_skills::skill::{parse_reference, properties_from};
use cella_skills::yaml::{Dialect, Value, emit, load};
use proptest::prelude::*;

/// YAML-ish text built from the characters that matter to YAML.
fn yamlish() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(vec![
        "---",
        "\n",
        " ",
        "  ",
        "\t",
        ":",
        ": ",
        "- ",
        "#",
        "'",
        "\"",
        "|",
        ">",
        "{",
        "}",
        "[",
        "]",
        ",",
        "&a",
        "*a",
        "!",
        "!!str",
        "?",
        "%YAML 1.2",
        "...",
        "<<",
        "name",
        "description",
        "é",
        "\\",
        "\\u00e9",
        "\r\n",
        "\u{feff}",
        "\u{0}",
        "x",
        "1.0",
        "yes",
        "~",
    ]);
    prop::collection::vec(atoms, 0..60).prop_map(|v| v.concat())
}

fn safe_string() -> impl Strategy<Value = String> {
    // Any printable text, including quotes, colons, hashes, tabs, newlines and non-ASCII.
    "[ -~\t\né中😀]{0,80}"
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn parsers_never_panic(text in yamlish()) {
        let _ = load(&text, Dialect::Strict);
        let _ = load(&text, Dialect::Permissive);
        let _ = split_reference(&text);
        let _ = split_lines(&text);
        let _ = parse_reference(&text);
        let _ = cella_skills::frontmatter::quote_colon_values(&text);
    }

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        let _ = load(&text, Dialect::Strict);
        let _ = load(&text, Dialect::Permissive);
        let _ = parse_reference(&format!("---\n{text}\n---\n"));
    }

    #[test]
    fn valid_frontmatter_round_trips(
        name in "[a-z0-9]{1,20}(-[a-z0-9]{1,10}){0,3}",
        description in safe_string().prop_filter("non-empty", |s| !s.trim().is_empty()),
        license in proptest::option::of(safe_string()),
        metadata in prop::collection::vec(("[a-z][a-z0-9-]{0,10}", safe_string()), 0..4),
    ) {
        let mut map = vec![
            ("name".to_owned(), Value::Str(name.clone())),
            ("description".to_owned(), Value::Str(description.clone())),
        ];
        if let Some(l) = &license {
            map.push(("license".to_owned(), Value::Str(l.clone())));
        }
        let mut md: Vec<(String, Value)> = Vec::new();
        for (k, v) in &metadata {
            if !md.iter().any(|(e, _)| e == k) {
                md.push((k.clone(), Value::Str(v.clone())));
            }
        }
        if !md.is_empty() {
            map.push(("metadata".to_owned(), Value::Map(md.clone())));
        }
        let value = Value::Map(map);
        let yaml = emit(&value);
        // Both dialects read back exactly what was written.
        prop_assert_eq!(&load(&yaml, Dialect::Strict).unwrap(), &value);
        prop_assert_eq!(&load(&yaml, Dialect::Permissive).unwrap(), &value);
        // Through a whole SKILL.md and skills-ref's property reading.
        let text = format!("---\n{yaml}---\nbody\n");
        if !yaml.contains("---") {
            let (parsed, _) = parse_reference(&text).unwrap();
            let props = properties_from(&parsed).unwrap();
            prop_assert_eq!(&props.name, &name);
            prop_assert_eq!(props.description.as_str(), cella_skills::python_compat::strip(&description));
        }
        // An independent YAML implementation agrees on the strings.
        let other: std::collections::BTreeMap<String, serde_saphyr_value::Any> =
            serde_saphyr::from_str(&yaml).unwrap();
        prop_assert_eq!(other.get("name").and_then(|v| v.as_str()), Some(name.as_str()));
        prop_assert_eq!(other.get("description").and_then(|v| v.as_str()), Some(description.as_str()));
    }
}

/// A minimal "any YAML value" for serde-saphyr: strings and nested maps (what `emit` writes).
mod serde_saphyr_value {
    use std::collections::BTreeMap;

    #[derive(Debug, serde::Deserialize)]
    #[serde(untagged)]
    #[allow(dead_code)] // The map arm is only matched, never read.
    pub enum Any {
        Str(String),
        Map(BTreeMap<String, Any>),
    }

    impl Any {
        pub fn as_str(&self) -> Option<&str> {
            match self {
                Any::Str(s) => Some(s),
                Any::Map(_) => None,
            }
        }
    }
}

/// Fuzz-style: mutate a valid SKILL.md byte by byte (insertions, deletions, flips, invalid
/// UTF-8) and run every entry point on the file; none may panic.
#[test]
fn whole_pipeline_never_panics_on_mutated_files() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("fuzz");
    std::fs::create_dir_all(&dir).unwrap();
    let seed = b"---\nname: fuzz\ndescription: \"Use when: fuzzing\"\nmetadata:\n  k: v\nallowed-tools:\n  - Read\n---\n# Body\n".to_vec();
    let alphabet: &[u8] = b"-:#'\"|>{}[],&*!?%@ \t\n\r\\\x00\xff\xc3\xa9abc";
    let mut state: u64 = 0x0123_4567_89ab_cdef;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..1500 {
        let mut bytes = seed.clone();
        for _ in 0..=(next() % 6) {
            let pos = usize::try_from(next() % (bytes.len() as u64 + 1)).unwrap();
            match next() % 3 {
                0 => bytes.insert(
                    pos,
                    alphabet[usize::try_from(next() % alphabet.len() as u64).unwrap()],
                ),
                1 if pos < bytes.len() => {
                    bytes.remove(pos);
                }
                _ if pos < bytes.len() => {
                    bytes[pos] = alphabet[usize::try_from(next() % alphabet.len() as u64).unwrap()]
                }
                _ => {}
            }
        }
        std::fs::write(dir.join("SKILL.md"), &bytes).unwrap();
        for mode in [
            cella_skills::Mode::Strict,
            cella_skills::Mode::Reference,
            cella_skills::Mode::Lenient,
        ] {
            let report = cella_skills::validate(&dir, mode);
            if let Some(skill) = &report.skill {
                let _ = cella_skills::activation::render(skill);
            }
        }
        let _ = cella_skills::skill::read_properties(&dir);
        let _ = cella_skills::catalog::to_prompt(&[dir.as_path()]);
    }
}
