//! The few Python string semantics skills-ref's verdicts and outputs depend on, written out in
//! Rust: `str.strip()`, `str.isalnum()`, `str.lower()`, `unicodedata.normalize("NFKC")`,
//! `repr()` of strings/lists/dicts (metadata values are coerced with `str()`), `html.escape()`
//! and `json.dumps(indent=2)` (ASCII-escaped). Nothing here knows about skills.

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

use crate::yaml::Value;

/// `c.isspace()`: Unicode White_Space plus the four ASCII separators Python also counts.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\u{1c}'..='\u{1f}')
}

/// `s.strip()`.
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// `c.isalnum()`: letters (L*) and numbers (N*).
pub fn is_alnum(c: char) -> bool {
    matches!(
        c.general_category_group(),
        GeneralCategoryGroup::Letter | GeneralCategoryGroup::Number
    )
}

/// `s.lower()`.
pub fn lower(s: &str) -> String {
    s.to_lowercase()
}

/// `unicodedata.normalize("NFKC", s)`.
pub fn nfkc(s: &str) -> String {
    s.nfkc().collect()
}

/// `len(s)`: code points.
pub fn len(s: &str) -> usize {
    s.chars().count()
}

/// `str(v)` of the Python object strictyaml would have produced.
pub fn to_str(v: &Value) -> String {
    match v {
        Value::Str(s) => s.clone(),
        other => repr(other),
    }
}

/// `repr(v)`.
pub fn repr(v: &Value) -> String {
    match v {
        Value::Str(s) => repr_str(s),
        Value::Seq(items) => {
            let inner: Vec<String> = items.iter().map(repr).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Map(m) => {
            let inner: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", repr_str(k), repr(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}

/// Whether Python's `str.isprintable()` holds for `c` (approximated by general category:
/// Other and Separator categories are non-printable, except the ASCII space).
fn is_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    !matches!(
        c.general_category_group(),
        GeneralCategoryGroup::Other | GeneralCategoryGroup::Separator
    )
}

/// `repr(s)` for a `str`.
pub fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c => {
                let code = u32::from(c);
                if code <= 0xFF {
                    out.push_str(&format!("\\x{code:02x}"));
                } else if code <= 0xFFFF {
                    out.push_str(&format!("\\u{code:04x}"));
                } else {
                    out.push_str(&format!("\\U{code:08x}"));
                }
            }
        }
    }
    out.push(quote);
    out
}

/// `html.escape(s)` (with `quote=True`).
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
    out
}

/// `json.dumps(value, indent=2)` of the dict/list/str tree (Python's default `ensure_ascii`
/// escapes every non-ASCII character; mappings keep their order).
pub fn json_dumps_indent2(value: &Value) -> String {
    let mut out = String::new();
    dump(value, 0, &mut out);
    out
}

fn dump(value: &Value, level: usize, out: &mut String) {
    match value {
        Value::Str(s) => dump_str(s, out),
        Value::Seq(items) if items.is_empty() => out.push_str("[]"),
        Value::Map(m) if m.is_empty() => out.push_str("{}"),
        Value::Seq(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(level + 1, out);
                dump(v, level + 1, out);
            }
            newline(level, out);
            out.push(']');
        }
        Value::Map(m) => {
            out.push('{');
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(level + 1, out);
                dump_str(k, out);
                out.push_str(": ");
                dump(v, level + 1, out);
            }
            newline(level, out);
            out.push('}');
        }
    }
}

fn newline(level: usize, out: &mut String) {
    out.push('\n');
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn dump_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c.is_ascii() && !c.is_ascii_control() || c == '\u{7f}' => out.push(c),
            c => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_matches_python() {
        assert_eq!(strip("\u{1f} a b\u{a0}\n"), "a b");
    }

    #[test]
    fn isalnum_follows_categories() {
        assert!(is_alnum('é'));
        assert!(is_alnum('²'));
        assert!(is_alnum('字'));
        assert!(!is_alnum('-'));
        // A combining vowel sign is alphabetic to Rust but not alnum to Python.
        assert!('\u{093E}'.is_alphabetic());
        assert!(!is_alnum('\u{093E}'));
    }

    #[test]
    fn repr_like_python() {
        let v = Value::Map(vec![
            ("a".into(), Value::Str("it's".into())),
            ("b".into(), Value::Seq(vec![Value::Str("x\ty".into())])),
        ]);
        assert_eq!(repr(&v), "{'a': \"it's\", 'b': ['x\\ty']}");
    }

    #[test]
    fn json_is_ascii_escaped() {
        let v = Value::Map(vec![("name".into(), Value::Str("café 😀\u{1b}".into()))]);
        assert_eq!(
            json_dumps_indent2(&v),
            "{\n  \"name\": \"caf\\u00e9 \\ud83d\\ude00\\u001b\"\n}"
        );
    }

    #[test]
    fn html_escape_quotes() {
        assert_eq!(
            html_escape("<a href=\"x\">'&'"),
            "&lt;a href=&quot;x&quot;&gt;&#x27;&amp;&#x27;"
        );
    }
}
