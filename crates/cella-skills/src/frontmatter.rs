//! Splitting SKILL.md text into frontmatter and body, and the lenient repair of unquoted values
//! that contain colons. Two splitters, because the reference validator's is not line-based:
//!
//! * [`split_reference`]: skills-ref's `content.split("---", 2)` — the frontmatter ends at the
//!   next `---` *anywhere*, even inside a value. Strict validation uses it so verdicts match.
//! * [`split_lines`]: the client guide's reading — an opening `---` line and the next `---` line.
//!   Lenient loading uses it.
//!
//! Text is first normalised like Python's universal-newline `read_text()` (`\r\n` and `\r`
//! become `\n`). This module knows text only; it knows nothing of fields or files.

use std::borrow::Cow;

/// Frontmatter and body borrowed from one SKILL.md text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split<'a> {
    /// The YAML between the delimiters.
    pub frontmatter: &'a str,
    /// The Markdown after the closing delimiter, trimmed of surrounding whitespace.
    pub body: &'a str,
}

/// Why a text has no usable frontmatter. Messages are skills-ref's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// The text does not start with `---`.
    #[error("SKILL.md must start with YAML frontmatter (---)")]
    MissingOpening,
    /// No closing `---`.
    #[error("SKILL.md frontmatter not properly closed with ---")]
    Unclosed,
}

/// Python's universal newlines: `\r\n` and lone `\r` become `\n`.
pub fn normalize_newlines(text: &str) -> Cow<'_, str> {
    if text.contains('\r') {
        Cow::Owned(text.replace("\r\n", "\n").replace('\r', "\n"))
    } else {
        Cow::Borrowed(text)
    }
}

/// skills-ref's splitter (see the module docs).
pub fn split_reference(content: &str) -> Result<Split<'_>, SplitError> {
    let rest = content
        .strip_prefix("---")
        .ok_or(SplitError::MissingOpening)?;
    let end = rest.find("---").ok_or(SplitError::Unclosed)?;
    Ok(Split {
        frontmatter: &rest[..end],
        body: crate::python_compat::strip(&rest[end + 3..]),
    })
}

/// The line-based splitter (see the module docs). A leading byte-order mark and trailing
/// whitespace on the delimiter lines are tolerated.
pub fn split_lines(content: &str) -> Result<Split<'_>, SplitError> {
    let content = content.strip_prefix('\u{feff}').unwrap_or(content);
    let (first, mut rest) = content.split_once('\n').unwrap_or((content, ""));
    if first.trim_end() != "---" {
        return Err(SplitError::MissingOpening);
    }
    let start = content.len() - rest.len();
    let mut offset = start;
    loop {
        if rest.is_empty() {
            return Err(SplitError::Unclosed);
        }
        let (line, next) = rest.split_once('\n').unwrap_or((rest, ""));
        if line.trim_end() == "---" {
            let body_start = offset + (rest.len() - next.len());
            let body = content.get(body_start..).unwrap_or("");
            return Ok(Split {
                frontmatter: &content[start..offset],
                body: body.trim(),
            });
        }
        offset += rest.len() - next.len();
        rest = next;
    }
}

/// The client guide's fallback for YAML that does not parse: wrap the value of each top-level
/// `key: value` line that contains `": "` (or ends in `:`) in double quotes. Returns `None` when
/// no line needed it.
pub fn quote_colon_values(frontmatter: &str) -> Option<String> {
    let mut changed = false;
    let mut out = String::with_capacity(frontmatter.len() + 16);
    for line in frontmatter.split_inclusive('\n') {
        let (text, newline) = match line.strip_suffix('\n') {
            Some(t) => (t, "\n"),
            None => (line, ""),
        };
        match repair_line(text) {
            Some(fixed) => {
                changed = true;
                out.push_str(&fixed);
            }
            None => out.push_str(text),
        }
        out.push_str(newline);
    }
    changed.then_some(out)
}

fn repair_line(line: &str) -> Option<String> {
    let indent = &line[..line.len() - line.trim_start_matches(' ').len()];
    let (key, value) = line[indent.len()..].split_once(": ")?;
    if key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return None;
    }
    let value = value.trim();
    let first = value.chars().next()?;
    if matches!(
        first,
        '"' | '\'' | '|' | '>' | '[' | '{' | '&' | '*' | '!' | '#'
    ) {
        return None;
    }
    if !(value.contains(": ") || value.ends_with(':')) {
        return None;
    }
    Some(format!("{indent}{key}: {}", crate::yaml::quote(value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_split_is_not_line_based() {
        let s = split_reference("---\nname: a---b\n---\nbody").unwrap();
        assert_eq!(s.frontmatter, "\nname: a");
        assert_eq!(s.body, "b\n---\nbody");
    }

    #[test]
    fn reference_split_errors() {
        assert_eq!(split_reference("name: x"), Err(SplitError::MissingOpening));
        assert_eq!(split_reference("---\nname: x\n"), Err(SplitError::Unclosed));
    }

    #[test]
    fn line_split() {
        let s = split_lines("---\nname: a---b\n---  \n\n# Body\n").unwrap();
        assert_eq!(s.frontmatter, "name: a---b\n");
        assert_eq!(s.body, "# Body");
        let s = split_lines("---\n---").unwrap();
        assert_eq!(s.frontmatter, "");
        assert_eq!(s.body, "");
        assert_eq!(split_lines("---x\n---\n"), Err(SplitError::MissingOpening));
        assert_eq!(split_lines("---\nname: x\n"), Err(SplitError::Unclosed));
    }

    #[test]
    fn colon_repair() {
        let fixed = quote_colon_values("name: x\ndescription: Use when: the user asks\n").unwrap();
        assert_eq!(fixed, "name: x\ndescription: \"Use when: the user asks\"\n");
        assert_eq!(quote_colon_values("name: x\n"), None);
        assert_eq!(
            quote_colon_values("metadata:\n  note: see: here\n").unwrap(),
            "metadata:\n  note: \"see: here\"\n"
        );
    }

    #[test]
    fn newlines() {
        assert_eq!(normalize_newlines("a\r\nb\rc"), "a\nb\nc");
    }
}
