//! `recall`: full-text search over a run's whole history (every tool call and output, also
//! those compaction elided from the prompt) and the text files of the sandbox's working
//! directory, behind the [`Recall`] trait, plus the tool the model calls.
//!
//! [`MemoryRecall`] keeps the history in memory and reads the workspace through envd at search
//! time (`cella run`, tests); a job store implements [`Recall`] over its own full-text index
//! (SQLite FTS5 / Postgres tsvector) of the stored events.
//!
//! Owns the trait, the in-memory index (BM25 over chunks of ~40 lines) and the tool's wording.
//! Must not know stores, budgets or the loop.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use cella_llm::{BoxFuture, ToolSpec};
use cella_proto::filesystem::FileType;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::output::cap;
use crate::sandbox::SandboxSession;
use crate::tools::{Tool, ToolOutput};

/// One entry of a run's history: a tool call with its output, or the model's text of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The tool call's id (`call_3`), or `step-<n>` for the model's text.
    pub id: String,
    /// The model call it belongs to (from 1).
    pub step: u32,
    /// One line saying what it is (`step 3 · bash`).
    pub label: String,
    /// The call and its whole output, or the text.
    pub text: String,
}

/// Where a hit was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HitSource {
    History,
    File,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    pub source: HitSource,
    /// The history entry's id, or the file's path.
    pub id: String,
    pub label: String,
    /// The best-matching part (about 40 lines at most).
    pub excerpt: String,
    /// Higher is better; comparable within one search only.
    pub score: f64,
}

/// A recall backend failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("recall failed: {0}")]
pub struct RecallError(pub String);

/// Full-text search over a run's history and workspace.
pub trait Recall: Send + Sync {
    /// Called by the loop with every history entry as it happens. A store-backed recall that
    /// indexes stored events anyway may ignore it (the default).
    fn remember(&self, _entry: HistoryEntry) {}

    /// The best `limit` hits for `query` (words; case-insensitive), best first.
    fn search<'a>(
        &'a self,
        query: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Hit>, RecallError>>;

    /// The history entry with this id (a tool call id, or `step-<n>`).
    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<HistoryEntry>, RecallError>>;
}

impl std::fmt::Debug for dyn Recall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dyn Recall")
    }
}

/// Workspace files larger than this are not searched.
const MAX_FILE_BYTES: i64 = 512 * 1024;
/// Most workspace files searched.
const MAX_FILES: usize = 300;
/// Directories never searched.
const SKIPPED_DIRS: &[&str] = &[
    ".git",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    "target",
];

/// The in-memory [`Recall`]: history entries as remembered, workspace files read through envd
/// when a search runs.
#[derive(Debug, Default)]
pub struct MemoryRecall {
    entries: Mutex<Vec<HistoryEntry>>,
    workspace: Option<SandboxSession>,
}

impl MemoryRecall {
    pub fn new() -> Self {
        Self::default()
    }

    /// Also searches the text files under the session's working directory.
    pub fn with_workspace(mut self, session: SandboxSession) -> Self {
        self.workspace = Some(session);
        self
    }

    pub fn entries(&self) -> Vec<HistoryEntry> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn workspace_documents(&self) -> Vec<Document> {
        let Some(session) = &self.workspace else {
            return Vec::new();
        };
        let Ok(mut entries) = session.list(session.workdir(), 6).await else {
            return Vec::new();
        };
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        let mut docs = Vec::new();
        for e in entries {
            if docs.len() >= MAX_FILES {
                break;
            }
            let skipped = e.path.split('/').any(|part| SKIPPED_DIRS.contains(&part));
            if e.file_type != FileType::File || e.is_symlink || e.size > MAX_FILE_BYTES || skipped {
                continue;
            }
            let Ok(bytes) = session.read(&e.path).await else {
                continue;
            };
            // Text files only.
            if bytes.contains(&0) {
                continue;
            }
            docs.push(Document {
                source: HitSource::File,
                id: e.path.clone(),
                label: format!("file {}", e.path),
                text: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        docs
    }
}

impl Recall for MemoryRecall {
    fn remember(&self, entry: HistoryEntry) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
    }

    fn search<'a>(
        &'a self,
        query: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Hit>, RecallError>> {
        Box::pin(async move {
            let mut docs: Vec<Document> = self
                .entries()
                .into_iter()
                .map(|e| Document {
                    source: HitSource::History,
                    id: e.id,
                    label: e.label,
                    text: e.text,
                })
                .collect();
            docs.extend(self.workspace_documents().await);
            Ok(search(&docs, query, limit))
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<HistoryEntry>, RecallError>> {
        Box::pin(async move {
            Ok(self
                .entries
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .find(|e| e.id == id)
                .cloned())
        })
    }
}

/// A searchable text.
#[derive(Debug, Clone)]
pub struct Document {
    pub source: HitSource,
    pub id: String,
    pub label: String,
    pub text: String,
}

/// Lines per chunk (documents are searched in chunks so a hit points at the right part).
const CHUNK_LINES: usize = 40;
/// Bytes per chunk at most (long lines).
const CHUNK_BYTES: usize = 2_000;

/// Lower-case words of letters, digits and `_`.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

fn chunks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut lines = 0;
    for (i, c) in text.char_indices() {
        let end = i + c.len_utf8();
        if c == '\n' {
            lines += 1;
        }
        if lines >= CHUNK_LINES || (end - start >= CHUNK_BYTES && text.is_char_boundary(end)) {
            out.push(&text[start..end]);
            start = end;
            lines = 0;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// BM25 over the chunks of `docs`; at most one hit per document (its best chunk). A chunk
/// holding the whole query as written scores half as much again.
pub fn search(docs: &[Document], query: &str, limit: usize) -> Vec<Hit> {
    let terms: Vec<String> = {
        let mut seen = HashSet::new();
        words(query).filter(|w| seen.insert(w.clone())).collect()
    };
    if terms.is_empty() || limit == 0 {
        return Vec::new();
    }
    let phrase = query.trim().to_lowercase();
    struct Chunk<'a> {
        doc: usize,
        text: &'a str,
        phrase: bool,
        len: usize,
        /// Occurrences of each term, by index in `terms`.
        tf: Vec<u32>,
    }
    let mut all: Vec<Chunk<'_>> = Vec::new();
    for (doc, d) in docs.iter().enumerate() {
        for text in chunks(&d.text) {
            let mut tf = vec![0u32; terms.len()];
            let mut len = 0;
            for w in words(text) {
                len += 1;
                if let Some(k) = terms.iter().position(|t| *t == w) {
                    tf[k] += 1;
                }
            }
            let phrase = terms.len() > 1 && text.to_lowercase().contains(&phrase);
            all.push(Chunk {
                doc,
                text,
                phrase,
                len,
                tf,
            });
        }
    }
    let n = all.len() as f64;
    let avg = (all.iter().map(|c| c.len).sum::<usize>() as f64 / n.max(1.0)).max(1.0);
    let idf: Vec<f64> = (0..terms.len())
        .map(|k| {
            let df = all.iter().filter(|c| c.tf[k] > 0).count() as f64;
            ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
        })
        .collect();
    let (k1, b) = (1.2, 0.75);
    let mut best: HashMap<usize, (f64, &str)> = HashMap::new();
    for c in &all {
        let norm = k1 * (1.0 - b + b * c.len as f64 / avg);
        let mut score: f64 =
            c.tf.iter()
                .zip(&idf)
                .filter(|(f, _)| **f > 0)
                .map(|(f, idf)| {
                    let f = f64::from(*f);
                    idf * f * (k1 + 1.0) / (f + norm)
                })
                .sum();
        if score <= 0.0 {
            continue;
        }
        if c.phrase {
            score *= 1.5;
        }
        let entry = best.entry(c.doc).or_insert((0.0, c.text));
        if score > entry.0 {
            *entry = (score, c.text);
        }
    }
    let mut hits: Vec<Hit> = best
        .into_iter()
        .map(|(d, (score, text))| Hit {
            source: docs[d].source,
            id: docs[d].id.clone(),
            label: docs[d].label.clone(),
            excerpt: text.to_owned(),
            score,
        })
        .collect();
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
    hits.truncate(limit);
    hits
}

/// The `recall` tool over a [`Recall`].
pub struct RecallTool {
    recall: Arc<dyn Recall>,
    /// Most bytes of one answer.
    max_bytes: usize,
}

impl RecallTool {
    pub fn new(recall: Arc<dyn Recall>, max_bytes: usize) -> Self {
        Self {
            recall,
            max_bytes: max_bytes.max(512),
        }
    }
}

impl Tool for RecallTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "recall",
            "Search this task's full history — every earlier tool call and its whole output, \
             also those elided from the conversation to save context — and the text files of \
             the working directory. Give `query` (words to look for) to search, or `id` (a tool \
             call id from an elision note) to see that call and its output again; `offset` \
             pages through a long one.",
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "words to search for"},
                    "id": {"type": "string", "description": "a tool call id, e.g. call_3"},
                    "offset": {"type": "integer", "minimum": 0, "description": "with id: the byte to start at"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "with query: most hits (default 5)"}
                }
            }),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let text = |k: &str| args.get(k).and_then(Value::as_str).map(str::trim);
            if let Some(id) = text("id").filter(|s| !s.is_empty()) {
                let offset = args.get("offset").and_then(Value::as_u64).unwrap_or(0);
                return self
                    .show(id, usize::try_from(offset).unwrap_or(usize::MAX))
                    .await;
            }
            let Some(query) = text("query").filter(|s| !s.is_empty()) else {
                return ToolOutput::error(
                    "recall: give \"query\" (words to search for) or \"id\" (a tool call id)",
                );
            };
            let limit = args
                .get("limit")
                .and_then(Value::as_u64)
                .unwrap_or(5)
                .clamp(1, 20) as usize;
            match self.recall.search(query, limit).await {
                Ok(hits) => self.render_hits(query, &hits),
                Err(e) => ToolOutput::error(e.to_string()),
            }
        })
    }
}

impl RecallTool {
    async fn show(&self, id: &str, offset: usize) -> ToolOutput {
        let entry = match self.recall.get(id).await {
            Ok(Some(e)) => e,
            Ok(None) => {
                return ToolOutput::error(format!(
                    "recall: no history entry with id {id:?}: use an id from an elision note, or search with \"query\""
                ));
            }
            Err(e) => return ToolOutput::error(e.to_string()),
        };
        let total = entry.text.len();
        let mut start = offset.min(total);
        while !entry.text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (start + self.max_bytes).min(total);
        while !entry.text.is_char_boundary(end) {
            end -= 1;
        }
        let mut out = format!(
            "{} ({id}), bytes {start}-{end} of {total}:\n{}",
            entry.label,
            &entry.text[start..end]
        );
        if end < total {
            out.push_str(&format!(
                "\n[{} more bytes: recall {{\"id\": \"{id}\", \"offset\": {end}}}]",
                total - end
            ));
        }
        ToolOutput {
            summary: format!("{} bytes of {id}", end - start),
            content: out,
            is_error: false,
            exit_code: None,
            truncated: end < total || start > 0,
        }
    }

    fn render_hits(&self, query: &str, hits: &[Hit]) -> ToolOutput {
        if hits.is_empty() {
            return ToolOutput::ok(
                format!("no matches for {query:?} in the history or the workspace files"),
                "no matches",
            );
        }
        let per_hit = (self.max_bytes / hits.len()).max(200);
        let mut out = format!("{} matches for {query:?}, best first:\n", hits.len());
        for (n, hit) in hits.iter().enumerate() {
            let (excerpt, _) = cap(hit.excerpt.trim_end(), per_hit);
            let source = match hit.source {
                HitSource::History => format!("history {} ({})", hit.id, hit.label),
                HitSource::File => hit.label.clone(),
            };
            out.push_str(&format!("\n[{}] {source}\n{excerpt}\n", n + 1));
        }
        let (content, truncated) = cap(&out, self.max_bytes);
        ToolOutput {
            summary: format!("{} matches", hits.len()),
            content,
            is_error: false,
            exit_code: None,
            truncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(id: &str, text: &str) -> Document {
        Document {
            source: HitSource::History,
            id: id.into(),
            label: format!("entry {id}"),
            text: text.into(),
        }
    }

    #[test]
    fn search_ranks_by_relevance_and_points_at_the_matching_chunk() {
        let long: String = (0..200)
            .map(|i| {
                if i == 150 {
                    "error: ZeroDivisionError in compute_total\n".to_owned()
                } else {
                    format!("ok line {i}\n")
                }
            })
            .collect();
        let docs = [
            doc("a", "the build succeeded"),
            doc("b", &long),
            doc(
                "c",
                "ZeroDivisionError mentioned once; compute_total compute_total",
            ),
        ];
        let hits = search(&docs, "ZeroDivisionError compute_total", 5);
        assert_eq!(hits.len(), 2, "{hits:?}");
        assert!(hits.iter().all(|h| h.id != "a"));
        let b = hits.iter().find(|h| h.id == "b").expect("b");
        assert!(
            b.excerpt.contains("error: ZeroDivisionError"),
            "{}",
            b.excerpt
        );
        assert!(
            !b.excerpt.contains("ok line 10\n"),
            "the excerpt is the matching chunk"
        );
        assert!(search(&docs, "  ", 5).is_empty());
        assert!(search(&docs, "nothing-like-this", 5).is_empty());
        assert_eq!(search(&docs, "compute_total", 1).len(), 1);
    }

    #[tokio::test]
    async fn the_tool_searches_and_pages_through_entries() {
        let recall = Arc::new(MemoryRecall::new());
        let output: String = (0..500).map(|i| format!("row {i}\n")).collect();
        recall.remember(HistoryEntry {
            id: "call_1".into(),
            step: 1,
            label: "step 1 · bash".into(),
            text: format!("bash {{\"command\":\"seq\"}}\n\n{output}"),
        });
        let tool = RecallTool::new(recall.clone(), 1000);
        let out = tool.call(&json!({"query": "row 321"})).await;
        assert!(!out.is_error, "{}", out.content);
        assert!(
            out.content.contains("history call_1 (step 1 · bash)"),
            "{}",
            out.content
        );
        assert!(out.content.contains("row 321"), "{}", out.content);
        let out = tool.call(&json!({"id": "call_1"})).await;
        assert!(out.content.contains("bytes 0-1000 of"), "{}", out.content);
        assert!(
            out.content
                .contains(r#"recall {"id": "call_1", "offset": 1000}"#),
            "{}",
            out.content
        );
        let out = tool.call(&json!({"id": "call_1", "offset": 1000})).await;
        assert!(out.content.contains("bytes 1000-2000"), "{}", out.content);
        let out = tool.call(&json!({"id": "nope"})).await;
        assert!(
            out.is_error && out.content.contains("no history entry"),
            "{}",
            out.content
        );
        let out = tool.call(&json!({})).await;
        assert!(
            out.is_error && out.content.contains("give \"query\""),
            "{}",
            out.content
        );
        let out = tool.call(&json!({"query": "absent"})).await;
        assert!(out.content.starts_with("no matches"), "{}", out.content);
    }
}
