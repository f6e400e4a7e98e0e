//! YAML for SKILL.md frontmatter: one small tree type ([`Value`]) and two loaders over the
//! `granit-parser` event stream.
//!
//! * [`Dialect::Strict`] reproduces what the reference validator (skills-ref, which loads
//!   frontmatter with Python's `strictyaml`) accepts: every scalar is a string exactly as written
//!   (`yes`, `1.10`, `null` stay strings), and flow collections (`{…}`, `[…]`), anchors, aliases,
//!   tags, duplicate keys, more than one document, tab characters outside quoted/block scalars and
//!   comments, and non-printable characters are refused — the same inputs strictyaml refuses.
//! * [`Dialect::Permissive`] is plain YAML 1.2 for lenient loading: flow collections, anchors
//!   (expanded under a node budget), tags (ignored) and duplicate keys (last one wins) are fine.
//!
//! Why events and not serde (serde-saphyr): a typed deserializer resolves `1.10` to a float and
//! `yes` to a bool, losing the text strictyaml keeps, and hides the styles, anchors and tags that
//! decide strictyaml's verdict.
//!
//! This module knows YAML only; it knows nothing of skills.

use std::collections::HashMap;

use granit_parser::{Event, Parser, ScalarStyle, Span, StructureStyle};

/// A YAML node with strictyaml's data model: every scalar is a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A scalar, exactly as written after quoting/escape/folding rules (empty for `key:`).
    Str(String),
    /// A sequence.
    Seq(Vec<Value>),
    /// A mapping, in source order, keys unique.
    Map(Vec<(String, Value)>),
}

impl Value {
    /// The string, if this is a scalar.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The entries, if this is a mapping.
    pub fn as_map(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    /// Looks a key up in a mapping.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_map()?
            .iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// Python truthiness of the equivalent `str`/`list`/`dict`.
    pub fn is_truthy(&self) -> bool {
        match self {
            Value::Str(s) => !s.is_empty(),
            Value::Seq(v) => !v.is_empty(),
            Value::Map(m) => !m.is_empty(),
        }
    }

    /// A short name of the node kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Seq(_) => "sequence",
            Value::Map(_) => "mapping",
        }
    }

    /// JSON with the same shape (strings, arrays, objects in source order).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::Seq(v) => serde_json::Value::Array(v.iter().map(Value::to_json).collect()),
            Value::Map(m) => {
                serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
        }
    }
}

/// Which YAML the loader accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// What skills-ref's strictyaml accepts.
    Strict,
    /// Plain YAML 1.2, for lenient loading.
    Permissive,
}

/// Why a YAML text was refused. Lines and columns are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    /// The YAML grammar was violated.
    #[error("{message} (line {line}, column {column})")]
    Syntax {
        /// The parser's message.
        message: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
    /// A YAML feature strictyaml refuses.
    #[error("{feature} are not allowed (line {line}, column {column})")]
    Disallowed {
        /// What was found, e.g. "flow collections".
        feature: &'static str,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
    /// A key appeared twice in one mapping.
    #[error("duplicate key '{key}' (line {line})")]
    DuplicateKey {
        /// The key.
        key: String,
        /// 1-based line of the second occurrence.
        line: usize,
    },
    /// A tab where strictyaml's scanner cannot start a token.
    #[error("tab character where a token is expected (line {line}, column {column})")]
    Tab {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
    /// A character YAML readers refuse.
    #[error("non-printable character U+{code:04X} (line {line})")]
    NonPrintable {
        /// The code point.
        code: u32,
        /// 1-based line.
        line: usize,
    },
    /// More than one document in the frontmatter.
    #[error("expected a single document but found another (line {line})")]
    MultipleDocuments {
        /// 1-based line of the second document.
        line: usize,
    },
    /// A sequence or mapping used as a mapping key.
    #[error("a {kind} cannot be a mapping key (line {line})")]
    ComplexKey {
        /// "sequence" or "mapping".
        kind: &'static str,
        /// 1-based line.
        line: usize,
    },
    /// A `<<` merge key whose value is not a mapping.
    #[error("merge key '<<' needs a mapping (line {line})")]
    BadMerge {
        /// 1-based line.
        line: usize,
    },
    /// Nesting or alias expansion beyond the loader's budget.
    #[error("document too large or too deeply nested (more than {limit} {what})")]
    Budget {
        /// "levels" or "nodes".
        what: &'static str,
        /// The limit.
        limit: usize,
    },
}

/// Maximum nesting of collections.
pub const MAX_DEPTH: usize = 64;
/// Maximum nodes built, including alias expansions (billion-laughs guard).
pub const MAX_NODES: usize = 100_000;

/// Parses one YAML document.
///
/// An empty document (nothing but comments and blanks) and a document that is a single scalar
/// load as [`Value::Str`] holding the source text, like strictyaml; callers that need a mapping
/// reject both alike.
pub fn load(text: &str, dialect: Dialect) -> Result<Value, YamlError> {
    if dialect == Dialect::Strict {
        check_printable(text)?;
    }
    // strictyaml drops a leading byte-order mark and keeps any other as text; the parser refuses
    // a BOM inside a document, so interior ones travel as a stand-in character and come back.
    let body = text.strip_prefix(BOM).unwrap_or(text);
    if body.contains(BOM) && !body.contains(BOM_STAND_IN) {
        let swapped = body.replace(BOM, "\u{fdd0}");
        let mut value = load_text(&swapped, dialect)?;
        restore_bom(&mut value);
        return Ok(match value {
            Value::Str(_) => Value::Str(text.to_owned()),
            v => v,
        });
    }
    load_text(body, dialect).map(|v| match v {
        Value::Str(_) => Value::Str(text.to_owned()),
        v => v,
    })
}

const BOM: char = '\u{feff}';
/// A noncharacter used in place of interior byte-order marks while parsing.
const BOM_STAND_IN: char = '\u{fdd0}';

fn restore_bom(v: &mut Value) {
    let fix = |s: &mut String| {
        if s.contains(BOM_STAND_IN) {
            *s = s.replace(BOM_STAND_IN, "\u{feff}");
        }
    };
    match v {
        Value::Str(s) => fix(s),
        Value::Seq(items) => items.iter_mut().for_each(restore_bom),
        Value::Map(m) => {
            for (k, val) in m.iter_mut() {
                fix(k);
                restore_bom(val);
            }
        }
    }
}

/// Most continuation lines re-indented by [`load_text`].
const MAX_REINDENTS: usize = 256;
/// Largest text [`load_text`] re-parses to re-indent (frontmatter is normally a few KiB).
const MAX_REINDENT_TEXT: usize = 256 * 1024;

/// Parses, accepting what PyYAML-family parsers accept and YAML 1.2 does not: continuation
/// lines of a multi-line quoted scalar indented no deeper than its parent. Leading white space
/// of such lines is folded away, so indenting the offending line by one space changes nothing
/// in the value; the parser is re-run until it passes or fails otherwise.
fn load_text(text: &str, dialect: Dialect) -> Result<Value, YamlError> {
    let mut owned: Option<String> = None;
    for _ in 0..MAX_REINDENTS {
        let current = owned.as_deref().unwrap_or(text);
        match load_once(current, dialect) {
            Err(Reject::Quoted { line, error }) => {
                if current.len() > MAX_REINDENT_TEXT {
                    return Err(error);
                }
                let Some(fixed) = indent_line(current, line) else {
                    return Err(error);
                };
                owned = Some(fixed);
            }
            Err(Reject::Other(e)) => return Err(e),
            Ok(v) => return Ok(v),
        }
    }
    load_once(owned.as_deref().unwrap_or(text), dialect).map_err(|r| match r {
        Reject::Quoted { error, .. } | Reject::Other(error) => error,
    })
}

enum Reject {
    /// A quoted scalar's continuation line (1-based) is under-indented.
    Quoted {
        line: usize,
        error: YamlError,
    },
    Other(YamlError),
}

impl From<YamlError> for Reject {
    fn from(e: YamlError) -> Self {
        Reject::Other(e)
    }
}

fn indent_line(text: &str, line: usize) -> Option<String> {
    let start = if line <= 1 {
        0
    } else {
        text.match_indices('\n').nth(line - 2).map(|(i, _)| i + 1)?
    };
    let mut out = String::with_capacity(text.len() + 1);
    out.push_str(&text[..start]);
    out.push(' ');
    out.push_str(&text[start..]);
    Some(out)
}

fn load_once(text: &str, dialect: Dialect) -> Result<Value, Reject> {
    let mut builder = Builder {
        text,
        dialect,
        stack: Vec::new(),
        anchors: Vec::new(),
        root: None,
        documents: 0,
        nodes: 0,
        allowed_tab_ranges: Vec::new(),
    };
    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| {
            let error = YamlError::Syntax {
                message: e.info(),
                line: e.marker().line(),
                column: e.marker().col() + 1,
            };
            if matches!(
                e.kind(),
                granit_parser::ErrorKind::InvalidQuotedScalarIndent
            ) {
                Reject::Quoted {
                    line: e.marker().line(),
                    error,
                }
            } else {
                Reject::Other(error)
            }
        })?;
        builder.event(event, span)?;
    }
    if dialect == Dialect::Strict {
        check_tabs(text, &builder.allowed_tab_ranges)?;
    }
    Ok(match builder.root {
        Some(Value::Str(_)) | None => Value::Str(text.to_owned()),
        Some(v) => v,
    })
}

/// Characters strictyaml's reader refuses (ruamel's `NON_PRINTABLE`).
fn is_yaml_printable(c: char) -> bool {
    matches!(c,
        '\t' | '\n' | '\r' | '\u{20}'..='\u{7E}' | '\u{85}' | '\u{A0}'..='\u{D7FF}'
        | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

fn check_printable(text: &str) -> Result<(), YamlError> {
    let mut line = 1;
    for c in text.chars() {
        if c == '\n' {
            line += 1;
        }
        if !is_yaml_printable(c) {
            return Err(YamlError::NonPrintable {
                code: u32::from(c),
                line,
            });
        }
    }
    Ok(())
}

/// strictyaml's scanner only skips spaces between tokens; a tab is fine only inside quoted
/// scalars, block scalar content and comments.
fn check_tabs(text: &str, allowed: &[(usize, usize)]) -> Result<(), YamlError> {
    let mut ranges = allowed.to_vec();
    ranges.sort_unstable();
    for (pos, _) in text.match_indices('\t') {
        // The last range starting at or before `pos` is the only one that can hold it once
        // ranges are sorted, because ranges never overlap (they are distinct tokens).
        let idx = ranges.partition_point(|&(s, _)| s <= pos);
        if idx > 0 && pos < ranges[idx - 1].1 {
            continue;
        }
        let before = &text[..pos];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        return Err(YamlError::Tab { line, column });
    }
    Ok(())
}

enum Frame {
    Seq(Vec<Value>),
    Map {
        entries: Vec<(String, Value)>,
        pending_key: Option<(String, usize, bool)>,
        /// Entries merged in through `<<` (permissive only), applied at the end.
        merged: Vec<(String, Value)>,
        /// Whether a `<<` key was seen (a second one is a duplicate key).
        merge_seen: bool,
        /// Index of each key in `entries` (duplicate detection without a scan).
        index: HashMap<String, usize>,
    },
}

struct Builder<'t> {
    text: &'t str,
    dialect: Dialect,
    stack: Vec<(Frame, usize)>,
    anchors: Vec<(usize, Value)>,
    root: Option<Value>,
    documents: usize,
    nodes: usize,
    allowed_tab_ranges: Vec<(usize, usize)>,
}

impl Builder<'_> {
    fn byte(&self, m: &granit_parser::Marker) -> usize {
        m.byte_offset().unwrap_or_else(|| {
            self.text
                .char_indices()
                .nth(m.index())
                .map_or(self.text.len(), |(b, _)| b)
        })
    }

    fn disallowed(&self, feature: &'static str, span: &Span) -> YamlError {
        YamlError::Disallowed {
            feature,
            line: span.start.line(),
            column: span.start.col() + 1,
        }
    }

    fn event(&mut self, event: Event<'_>, span: Span) -> Result<(), YamlError> {
        let strict = self.dialect == Dialect::Strict;
        match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
            Event::Anchor(..) | Event::UnresolvedAlias(_) if strict => {
                return Err(self.disallowed("anchors and aliases", &span));
            }
            Event::Anchor(..) | Event::UnresolvedAlias(_) => {}
            Event::Comment(..) => {
                // A tab anywhere after the '#' belongs to the comment.
                let start = self.byte(&span.start);
                let end = self.byte(&span.end);
                self.allowed_tab_ranges
                    .push((start + 1, end.max(start + 1)));
            }
            Event::DocumentStart(..) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(YamlError::MultipleDocuments {
                        line: span.start.line(),
                    });
                }
            }
            Event::Alias(id) => {
                if strict {
                    return Err(self.disallowed("anchors and aliases", &span));
                }
                let value = self
                    .anchors
                    .iter()
                    .rev()
                    .find_map(|(a, v)| (*a == id).then(|| v.clone()))
                    .unwrap_or(Value::Str(String::new()));
                self.count(count_nodes(&value))?;
                self.push_value(value, &span)?;
            }
            Event::Scalar(text, style, anchor, tag) => {
                if strict && anchor != 0 {
                    return Err(self.disallowed("anchors and aliases", &span));
                }
                if strict && tag.is_some() {
                    return Err(self.disallowed("tags", &span));
                }
                let start = self.byte(&span.start);
                let end = self.byte(&span.end);
                let value = match style {
                    ScalarStyle::Plain if start >= end => String::new(),
                    _ => text.into_owned(),
                };
                // Quoted and block scalar spans cover their content (a block scalar's span starts
                // after its header line and first indentation), where tabs are text.
                if !matches!(style, ScalarStyle::Plain) {
                    self.allowed_tab_ranges.push((start, end));
                }
                let quoted = !matches!(style, ScalarStyle::Plain);
                self.count(1)?;
                if anchor != 0 {
                    self.anchors.push((anchor, Value::Str(value.clone())));
                }
                self.push_scalar(value, quoted, &span)?;
            }
            Event::SequenceStart(style, anchor, tag) => {
                self.start_collection(false, style, anchor, tag.is_some(), &span)?;
            }
            Event::MappingStart(style, anchor, tag) => {
                self.start_collection(true, style, anchor, tag.is_some(), &span)?;
            }
            Event::SequenceEnd => {
                let value = self.pop()?;
                self.push_value(value, &span)?;
            }
            Event::MappingEnd => {
                let value = self.pop()?;
                self.push_value(value, &span)?;
            }
            // Presentation-only events added in later parser versions.
            _ => {}
        }
        Ok(())
    }

    fn start_collection(
        &mut self,
        is_map: bool,
        style: StructureStyle,
        anchor: usize,
        tagged: bool,
        span: &Span,
    ) -> Result<(), YamlError> {
        let strict = self.dialect == Dialect::Strict;
        if strict && style == StructureStyle::Flow {
            return Err(self.disallowed("flow collections ({...} and [...])", span));
        }
        if strict && anchor != 0 {
            return Err(self.disallowed("anchors and aliases", span));
        }
        if strict && tagged {
            return Err(self.disallowed("tags", span));
        }
        if self.stack.len() >= MAX_DEPTH {
            return Err(YamlError::Budget {
                what: "levels",
                limit: MAX_DEPTH,
            });
        }
        self.count(1)?;
        let frame = if is_map {
            Frame::Map {
                entries: Vec::new(),
                pending_key: None,
                merged: Vec::new(),
                merge_seen: false,
                index: HashMap::new(),
            }
        } else {
            Frame::Seq(Vec::new())
        };
        self.stack.push((frame, anchor));
        Ok(())
    }

    fn count(&mut self, n: usize) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > MAX_NODES {
            return Err(YamlError::Budget {
                what: "nodes",
                limit: MAX_NODES,
            });
        }
        Ok(())
    }

    fn pop(&mut self) -> Result<Value, YamlError> {
        let Some((frame, anchor)) = self.stack.pop() else {
            return Ok(Value::Str(String::new()));
        };
        let value = match frame {
            Frame::Seq(items) => Value::Seq(items),
            Frame::Map {
                mut entries,
                merged,
                mut index,
                ..
            } => {
                for (k, v) in merged {
                    if !index.contains_key(&k) {
                        index.insert(k.clone(), entries.len());
                        entries.push((k, v));
                    }
                }
                Value::Map(entries)
            }
        };
        if anchor != 0 {
            self.anchors.push((anchor, value.clone()));
        }
        Ok(value)
    }

    fn push_scalar(&mut self, value: String, quoted: bool, span: &Span) -> Result<(), YamlError> {
        if let Some((Frame::Map { pending_key, .. }, _)) = self.stack.last_mut()
            && pending_key.is_none()
        {
            *pending_key = Some((value, span.start.line(), quoted));
            return Ok(());
        }
        self.push_value(Value::Str(value), span)
    }

    fn push_value(&mut self, value: Value, span: &Span) -> Result<(), YamlError> {
        let strict = self.dialect == Dialect::Strict;
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(value);
                }
                Ok(())
            }
            Some((Frame::Seq(items), _)) => {
                items.push(value);
                Ok(())
            }
            Some((
                Frame::Map {
                    entries,
                    pending_key,
                    merged,
                    merge_seen,
                    index,
                },
                _,
            )) => match pending_key.take() {
                None => Err(YamlError::ComplexKey {
                    kind: value.kind(),
                    line: span.start.line(),
                }),
                Some((key, line, quoted)) => {
                    if key == "<<" && !quoted {
                        if strict && *merge_seen {
                            return Err(YamlError::DuplicateKey { key, line });
                        }
                        *merge_seen = true;
                        // strictyaml keeps nothing from a merge of a mapping and refuses others.
                        return match value {
                            Value::Map(m) => {
                                if !strict {
                                    merged.extend(m);
                                }
                                Ok(())
                            }
                            _ if strict => Err(YamlError::BadMerge { line }),
                            _ => Ok(()),
                        };
                    }
                    if let Some(&i) = index.get(&key) {
                        if strict {
                            return Err(YamlError::DuplicateKey { key, line });
                        }
                        if let Some(slot) = entries.get_mut(i) {
                            slot.1 = value;
                        }
                    } else {
                        index.insert(key.clone(), entries.len());
                        entries.push((key, value));
                    }
                    Ok(())
                }
            },
        }
    }
}

fn count_nodes(v: &Value) -> usize {
    match v {
        Value::Str(_) => 1,
        Value::Seq(items) => 1 + items.iter().map(count_nodes).sum::<usize>(),
        Value::Map(m) => 1 + m.iter().map(|(_, v)| 1 + count_nodes(v)).sum::<usize>(),
    }
}

/// Renders a mapping of strings (and nested strings/sequences/mappings) as block-style YAML
/// that both dialects load back to the same [`Value`]. Scalars are always double-quoted.
pub fn emit(value: &Value) -> String {
    let mut out = String::new();
    emit_into(value, 0, &mut out);
    out
}

fn emit_into(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match value {
        Value::Str(s) => {
            out.push_str(&quote(s));
            out.push('\n');
        }
        Value::Map(m) => {
            for (k, v) in m {
                out.push_str(&pad);
                out.push_str(&quote(k));
                out.push(':');
                emit_child(v, indent, out);
            }
        }
        Value::Seq(items) => {
            for v in items {
                out.push_str(&pad);
                out.push('-');
                emit_child(v, indent, out);
            }
        }
    }
}

fn emit_child(v: &Value, indent: usize, out: &mut String) {
    match v {
        Value::Str(s) => {
            out.push(' ');
            out.push_str(&quote(s));
            out.push('\n');
        }
        Value::Map(m) if m.is_empty() => out.push_str(" \"\"\n"),
        Value::Seq(items) if items.is_empty() => out.push_str(" \"\"\n"),
        _ => {
            out.push('\n');
            emit_into(v, indent + 2, out);
        }
    }
}

/// A double-quoted YAML scalar for any string.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' || !is_yaml_printable(c) || c == '\u{85}' => {
                let code = u32::from(c);
                if code <= 0xFF {
                    out.push_str(&format!("\\x{code:02X}"));
                } else if code <= 0xFFFF {
                    out.push_str(&format!("\\u{code:04X}"));
                } else {
                    out.push_str(&format!("\\U{code:08X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
