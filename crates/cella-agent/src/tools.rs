//! The tools a model may call: the [`Tool`] trait, the [`Toolbox`] that dispatches a model's
//! tool call (argument parsing, unknown names) and the built-in tools, which all act inside the
//! sandbox through [`SandboxSession`] — `bash`, `run_code`, `read_file`, `write_file`,
//! `edit_file`, `list_files` and, when skills are attached, `activate_skill`.
//!
//! A tool never fails the run: every problem (bad arguments, a missing file, a sandbox error)
//! becomes a tool error the model reads. Must not know about the loop, limits or events.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cella_llm::{BoxFuture, ToolSpec};
use cella_proto::filesystem::FileType;
use serde_json::{Value, json};

use crate::output::{cap, first_line};
use crate::sandbox::{ProcessResult, SandboxSession};
use crate::skills::AttachedSkill;

/// What a tool call produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// What the model sees.
    pub content: String,
    pub is_error: bool,
    /// For tools that ran a process.
    pub exit_code: Option<i32>,
    /// Whether `content` was capped.
    pub truncated: bool,
    /// One line for people watching the run.
    pub summary: String,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>, summary: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
            exit_code: None,
            truncated: false,
            summary: summary.into(),
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        let content = message.into();
        Self {
            summary: format!("error: {}", first_line(&content, 120)),
            content,
            is_error: true,
            exit_code: None,
            truncated: false,
        }
    }
}

/// A tool the model can call.
pub trait Tool: Send + Sync {
    /// Name, description and JSON Schema of the arguments.
    fn spec(&self) -> ToolSpec;
    /// Runs the tool with parsed arguments (an object).
    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput>;
}

/// The tools of one run.
#[derive(Clone, Default)]
pub struct Toolbox {
    tools: Vec<Arc<dyn Tool>>,
    specs: Vec<ToolSpec>,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.specs.iter().map(|s| &s.name))
            .finish()
    }
}

/// Settings of the built-in tools.
#[derive(Debug, Clone)]
pub struct ToolOptions {
    /// Timeout of `bash` and `run_code` when the model gives none.
    pub default_timeout: Duration,
    /// The longest timeout a model may ask for.
    pub max_timeout: Duration,
    /// Bytes of a file `read_file` shows (head + tail); process output is capped per stream
    /// by the session (`SandboxSession::with_output_limit`).
    pub output_limit: usize,
}

impl Default for ToolOptions {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(3600),
            output_limit: 16 * 1024,
        }
    }
}

impl Toolbox {
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> Self {
        let specs = tools.iter().map(|t| t.spec()).collect();
        Self { tools, specs }
    }

    /// The built-in tools over `sandbox`; `activate_skill` only when `skills` is not empty.
    pub fn builtin(
        sandbox: SandboxSession,
        skills: &[AttachedSkill],
        options: ToolOptions,
    ) -> Self {
        let ctx = Arc::new(Ctx {
            sandbox,
            options,
            counter: AtomicU64::new(0),
        });
        let mut tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(Bash(ctx.clone())),
            Arc::new(RunCode(ctx.clone())),
            Arc::new(ReadFile(ctx.clone())),
            Arc::new(WriteFile(ctx.clone())),
            Arc::new(EditFile(ctx.clone())),
            Arc::new(ListFiles(ctx)),
        ];
        if !skills.is_empty() {
            tools.push(Arc::new(ActivateSkill {
                skills: skills.to_vec(),
                active: Mutex::new(HashSet::new()),
            }));
        }
        Self::new(tools)
    }

    /// This toolbox and one more tool.
    pub fn with_tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.specs.push(tool.spec());
        self.tools.push(tool);
        self
    }

    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    pub fn names(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.name.clone()).collect()
    }

    /// Runs the tool a model named with the arguments it wrote; anything wrong is a tool error.
    pub async fn call(&self, name: &str, arguments: &str) -> ToolOutput {
        let Some(index) = self.specs.iter().position(|s| s.name == name) else {
            return ToolOutput::error(format!(
                "unknown tool {name:?}: the tools are {}",
                self.names().join(", ")
            ));
        };
        let args = if arguments.trim().is_empty() {
            json!({})
        } else {
            match serde_json::from_str::<Value>(arguments) {
                Ok(v @ Value::Object(_)) => v,
                Ok(other) => {
                    return ToolOutput::error(format!(
                        "arguments of {name} must be a JSON object, got {}",
                        first_line(&other.to_string(), 80)
                    ));
                }
                Err(e) => {
                    return ToolOutput::error(format!(
                        "arguments of {name} are not valid JSON ({e}): resend the call with a JSON object"
                    ));
                }
            }
        };
        self.tools[index].call(&args).await
    }
}

struct Ctx {
    sandbox: SandboxSession,
    options: ToolOptions,
    counter: AtomicU64,
}

impl Ctx {
    fn timeout(&self, args: &Value) -> Result<Duration, String> {
        match args.get("timeout_secs") {
            None | Some(Value::Null) => Ok(self.options.default_timeout),
            Some(v) => match v.as_f64() {
                Some(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(
                    s.min(self.options.max_timeout.as_secs_f64()),
                )),
                _ => Err(format!(
                    "timeout_secs must be a positive number of seconds, got {v}"
                )),
            },
        }
    }

    fn process_output(&self, result: &ProcessResult, timeout: Duration) -> ToolOutput {
        // Each stream is already capped head + tail by the session.
        let content = result.render(timeout);
        let truncated = result.truncated();
        let summary = match result.exit_code {
            None => format!("timed out after {} s", timeout.as_secs_f64()),
            Some(code) => {
                let stdout = result.stdout.render();
                let stderr = result.stderr.render();
                let detail = if code != 0 && !stderr.trim().is_empty() {
                    last_line(&stderr, 100)
                } else if !stdout.trim().is_empty() {
                    let n = stdout.lines().count();
                    format!("{n} line{} of output", if n == 1 { "" } else { "s" })
                } else {
                    "no output".to_owned()
                };
                format!("exit {code} · {detail}")
            }
        };
        ToolOutput {
            content,
            is_error: false,
            exit_code: result.exit_code,
            truncated,
            summary,
        }
    }
}

fn last_line(text: &str, max: usize) -> String {
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    first_line(line, max)
}

/// Other names models commonly use for an argument (accepted silently; the schema names the
/// first).
fn aliases(key: &str) -> &'static [&'static str] {
    match key {
        "command" => &["cmd", "script"],
        "path" => &["file_path", "filename", "file"],
        "content" => &["contents", "text"],
        "old_string" => &["old_str", "old_text", "old"],
        "new_string" => &["new_str", "new_text", "new"],
        _ => &[],
    }
}

fn str_arg<'a>(args: &'a Value, tool: &str, key: &str) -> Result<&'a str, String> {
    let value = args
        .get(key)
        .or_else(|| aliases(key).iter().find_map(|k| args.get(*k)));
    match value {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!(
            "{tool}: argument {key:?} must be a string, got {}",
            first_line(&other.to_string(), 60)
        )),
        None => Err(format!("{tool}: missing required argument {key:?}")),
    }
}

fn opt_u64(args: &Value, tool: &str, key: &str) -> Result<Option<u64>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            format!("{tool}: argument {key:?} must be a non-negative integer, got {v}")
        }),
    }
}

macro_rules! try_tool {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(message) => return ToolOutput::error(message),
        }
    };
}

struct Bash(Arc<Ctx>);

impl Tool for Bash {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "bash",
            "Run a shell command in the sandbox with `/bin/bash -l -c` in the working directory. \
             Returns the exit code, stdout and stderr (long output is cut in the middle). \
             Non-interactive: there is no stdin. The sandbox has no network.",
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the bash command line"},
                    "timeout_secs": {"type": "number", "description": "kill the command after this many seconds (default 120)"}
                },
                "required": ["command"]
            }),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let command = try_tool!(str_arg(args, "bash", "command"));
            let timeout = try_tool!(self.0.timeout(args));
            match self.0.sandbox.bash(command, timeout).await {
                Ok(result) => self.0.process_output(&result, timeout),
                Err(e) => ToolOutput::error(e.to_string()),
            }
        })
    }
}

struct RunCode(Arc<Ctx>);

impl Tool for RunCode {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "run_code",
            "Run a snippet of code in the sandbox and return its exit code, stdout and stderr. \
             The code is saved as a script file under /tmp and run with python3, node or bash \
             (a fresh process each time: no state is kept between calls).",
            json!({
                "type": "object",
                "properties": {
                    "language": {"type": "string", "enum": ["python", "javascript", "bash"]},
                    "code": {"type": "string", "description": "the whole program"},
                    "timeout_secs": {"type": "number", "description": "kill it after this many seconds (default 120)"}
                },
                "required": ["language", "code"]
            }),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let language = try_tool!(str_arg(args, "run_code", "language"));
            let code = try_tool!(str_arg(args, "run_code", "code"));
            let timeout = try_tool!(self.0.timeout(args));
            let Some(lang) = Language::parse(language) else {
                return ToolOutput::error(format!(
                    "run_code: unsupported language {language:?}: use python, javascript or bash"
                ));
            };
            let n = self.0.counter.fetch_add(1, Ordering::Relaxed);
            let path = format!("/tmp/cella-run-code-{n}.{}", lang.extension());
            if let Err(e) = self.0.sandbox.write(&path, code.as_bytes()).await {
                return ToolOutput::error(e.to_string());
            }
            match self
                .0
                .sandbox
                .run(lang.interpreter(), &[path], timeout)
                .await
            {
                Ok(result) => self.0.process_output(&result, timeout),
                Err(e) => ToolOutput::error(e.to_string()),
            }
        })
    }
}

/// A language code can be run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    JavaScript,
    Bash,
}

impl Language {
    /// From a name or a code fence tag (`python`, `py`, `js`, `node`, `sh`…).
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => Some(Self::Python),
            "javascript" | "js" | "node" | "nodejs" => Some(Self::JavaScript),
            "bash" | "sh" | "shell" => Some(Self::Bash),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::JavaScript => "javascript",
            Self::Bash => "bash",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Self::Python => "py",
            Self::JavaScript => "js",
            Self::Bash => "sh",
        }
    }

    pub fn interpreter(self) -> &'static str {
        match self {
            Self::Python => "python3",
            Self::JavaScript => "node",
            Self::Bash => "/bin/bash",
        }
    }
}

struct ReadFile(Arc<Ctx>);

impl Tool for ReadFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "read_file",
            "Read a text file in the sandbox, optionally only lines start_line..=end_line \
             (1-based). Relative paths are relative to the working directory.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "start_line": {"type": "integer", "minimum": 1},
                    "end_line": {"type": "integer", "minimum": 1}
                },
                "required": ["path"]
            }),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let path = try_tool!(str_arg(args, "read_file", "path"));
            let start = try_tool!(opt_u64(args, "read_file", "start_line"));
            let end = try_tool!(opt_u64(args, "read_file", "end_line"));
            let bytes = match self.0.sandbox.read(path).await {
                Ok(b) => b,
                Err(e) => return ToolOutput::error(e.to_string()),
            };
            let text = String::from_utf8_lossy(&bytes);
            let total = text.lines().count();
            let (body, range) = if start.is_some() || end.is_some() {
                let from = start.unwrap_or(1).max(1);
                let to = end.unwrap_or(u64::MAX);
                if to < from {
                    return ToolOutput::error(format!(
                        "read_file: end_line {to} is before start_line {from}"
                    ));
                }
                let lines: Vec<&str> = text
                    .lines()
                    .skip(usize::try_from(from - 1).unwrap_or(usize::MAX))
                    .take(usize::try_from(to - from + 1).unwrap_or(usize::MAX))
                    .collect();
                let shown_to = from.saturating_add(lines.len() as u64).saturating_sub(1);
                (
                    lines.join("\n") + if lines.is_empty() { "" } else { "\n" },
                    format!(" (lines {from}-{shown_to} of {total})"),
                )
            } else {
                (text.into_owned(), String::new())
            };
            let (content, truncated) = cap(&body, self.0.options.output_limit);
            ToolOutput {
                summary: format!("{} bytes, {total} lines{range}", bytes.len()),
                content,
                is_error: false,
                exit_code: None,
                truncated,
            }
        })
    }
}

struct WriteFile(Arc<Ctx>);

impl Tool for WriteFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "write_file",
            "Create or overwrite a file in the sandbox with the given content (parent \
             directories are created). Relative paths are relative to the working directory.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"}
                },
                "required": ["path", "content"]
            }),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let path = try_tool!(str_arg(args, "write_file", "path"));
            let content = try_tool!(str_arg(args, "write_file", "content"));
            match self.0.sandbox.write(path, content.as_bytes()).await {
                Ok(()) => {
                    let shown = self.0.sandbox.resolve(path);
                    ToolOutput::ok(
                        format!("wrote {} bytes to {shown}", content.len()),
                        format!("wrote {} bytes to {shown}", content.len()),
                    )
                }
                Err(e) => ToolOutput::error(e.to_string()),
            }
        })
    }
}

struct EditFile(Arc<Ctx>);

impl Tool for EditFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "edit_file",
            "Replace an exact string in a file in the sandbox. old_string must occur exactly \
             once (include surrounding lines to make it unique) unless replace_all is true.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old_string": {"type": "string", "description": "the exact text to replace"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean", "description": "replace every occurrence"}
                },
                "required": ["path", "old_string", "new_string"]
            }),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let path = try_tool!(str_arg(args, "edit_file", "path"));
            let old = try_tool!(str_arg(args, "edit_file", "old_string"));
            let new = try_tool!(str_arg(args, "edit_file", "new_string"));
            let all = args
                .get("replace_all")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let shown = self.0.sandbox.resolve(path);
            if old.is_empty() {
                return ToolOutput::error(format!(
                    "edit_file {shown}: old_string is empty: use write_file to create a file"
                ));
            }
            let bytes = match self.0.sandbox.read(path).await {
                Ok(b) => b,
                Err(e) => return ToolOutput::error(e.to_string()),
            };
            let Ok(text) = String::from_utf8(bytes) else {
                return ToolOutput::error(format!("edit_file {shown}: the file is not UTF-8 text"));
            };
            let count = text.matches(old).count();
            if count == 0 {
                return ToolOutput::error(format!(
                    "edit_file {shown}: old_string not found (0 matches): read the file and copy the text exactly, whitespace included"
                ));
            }
            if count > 1 && !all {
                return ToolOutput::error(format!(
                    "edit_file {shown}: old_string is not unique ({count} matches): include more surrounding text, or set replace_all"
                ));
            }
            let edited = if all {
                text.replace(old, new)
            } else {
                text.replacen(old, new, 1)
            };
            match self.0.sandbox.write(path, edited.as_bytes()).await {
                Ok(()) => {
                    let msg = format!(
                        "replaced {count} occurrence{} in {shown}",
                        if count == 1 { "" } else { "s" }
                    );
                    ToolOutput::ok(msg.clone(), msg)
                }
                Err(e) => ToolOutput::error(e.to_string()),
            }
        })
    }
}

struct ListFiles(Arc<Ctx>);

/// Most entries `list_files` shows.
const MAX_ENTRIES: usize = 500;

impl Tool for ListFiles {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "list_files",
            "List a directory in the sandbox, recursing `depth` levels (default 2). Directories \
             end with `/`; files show their size.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "default: the working directory"},
                    "depth": {"type": "integer", "minimum": 1, "maximum": 10}
                }
            }),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let given = ["path", "dir", "directory"]
                .iter()
                .find_map(|k| args.get(*k).filter(|v| !v.is_null()));
            let path = match given {
                None => ".",
                Some(Value::String(p)) => p.as_str(),
                Some(other) => {
                    return ToolOutput::error(format!(
                        "list_files: argument \"path\" must be a string, got {}",
                        first_line(&other.to_string(), 60)
                    ));
                }
            };
            let depth = try_tool!(opt_u64(args, "list_files", "depth")).unwrap_or(2);
            let depth = u32::try_from(depth.clamp(1, 10)).unwrap_or(2);
            let mut entries = match self.0.sandbox.list(path, depth).await {
                Ok(e) => e,
                Err(e) => return ToolOutput::error(e.to_string()),
            };
            entries.sort_by(|a, b| a.path.cmp(&b.path));
            let total = entries.len();
            let mut out = String::new();
            for e in entries.iter().take(MAX_ENTRIES) {
                match e.file_type {
                    FileType::Directory => out.push_str(&format!("{}/\n", e.path)),
                    _ if e.is_symlink => out.push_str(&format!(
                        "{} -> {}\n",
                        e.path,
                        e.symlink_target.as_deref().unwrap_or("?")
                    )),
                    _ => out.push_str(&format!("{}  ({} bytes)\n", e.path, e.size)),
                }
            }
            let truncated = total > MAX_ENTRIES;
            if truncated {
                out.push_str(&format!(
                    "[... {} more entries not shown: list a subdirectory or lower depth ...]\n",
                    total - MAX_ENTRIES
                ));
            }
            if total == 0 {
                out.push_str("(empty directory)\n");
            }
            ToolOutput {
                summary: format!("{total} entries"),
                content: out,
                is_error: false,
                exit_code: None,
                truncated,
            }
        })
    }
}

struct ActivateSkill {
    skills: Vec<AttachedSkill>,
    active: Mutex<HashSet<String>>,
}

impl Tool for ActivateSkill {
    fn spec(&self) -> ToolSpec {
        let names: Vec<&str> = self.skills.iter().map(AttachedSkill::name).collect();
        ToolSpec::new(
            "activate_skill",
            "Load the full instructions of one of the available skills (see \
             <available_skills>) when the task matches its description. Its files are under \
             /skills/<name> in the sandbox (read-only).",
            json!({
                "type": "object",
                "properties": {"name": {"type": "string", "enum": names}},
                "required": ["name"]
            }),
        )
    }

    fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let name = try_tool!(str_arg(args, "activate_skill", "name"));
            let Some(skill) = self.skills.iter().find(|s| s.name() == name) else {
                let names: Vec<&str> = self.skills.iter().map(AttachedSkill::name).collect();
                return ToolOutput::error(format!(
                    "activate_skill: no skill named {name:?}: the available skills are {}",
                    names.join(", ")
                ));
            };
            let first = self
                .active
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(name.to_owned());
            if !first {
                return ToolOutput::ok(
                    format!("skill {name:?} is already active: its instructions are above"),
                    format!("{name} already active"),
                );
            }
            let content = skill.activation();
            ToolOutput::ok(
                content,
                format!("activated {name} ({})", skill.sandbox_dir()),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;

    impl Tool for Echo {
        fn spec(&self) -> ToolSpec {
            ToolSpec::new("echo", "echo", json!({"type": "object"}))
        }
        fn call<'a>(&'a self, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
            Box::pin(async move { ToolOutput::ok(args.to_string(), "echoed") })
        }
    }

    #[tokio::test]
    async fn bad_calls_become_tool_errors() {
        let tb = Toolbox::new(vec![Arc::new(Echo)]);
        let out = tb.call("nope", "{}").await;
        assert!(out.is_error);
        assert!(
            out.content.contains("unknown tool \"nope\""),
            "{}",
            out.content
        );
        let out = tb.call("echo", "{\"a\": ").await;
        assert!(out.is_error);
        assert!(out.content.contains("not valid JSON"), "{}", out.content);
        let out = tb.call("echo", "[1]").await;
        assert!(
            out.content.contains("must be a JSON object"),
            "{}",
            out.content
        );
        let out = tb.call("echo", "").await;
        assert_eq!(out.content, "{}");
    }

    #[test]
    fn absurd_timeouts_are_clamped_or_refused() {
        let ctx = Ctx {
            sandbox: SandboxSession::new(cella_sandbox::EnvdClient::unix("/nonexistent")),
            options: ToolOptions::default(),
            counter: AtomicU64::new(0),
        };
        let t = |v: Value| ctx.timeout(&json!({ "timeout_secs": v }));
        assert_eq!(t(json!(1e300)), Ok(Duration::from_secs(3600)));
        assert_eq!(t(json!(0.5)), Ok(Duration::from_millis(500)));
        assert!(t(json!(-1)).is_err());
        assert!(t(json!("10")).is_err());
        assert_eq!(ctx.timeout(&json!({})), Ok(Duration::from_secs(120)));
    }

    #[test]
    fn common_argument_names_are_accepted() {
        let args = json!({"file_path": "a.py", "cmd": "ls", "old_str": "x"});
        assert_eq!(str_arg(&args, "read_file", "path"), Ok("a.py"));
        assert_eq!(str_arg(&args, "bash", "command"), Ok("ls"));
        assert_eq!(str_arg(&args, "edit_file", "old_string"), Ok("x"));
    }

    #[test]
    fn argument_errors_name_the_argument() {
        let args = json!({"command": 5});
        let e = str_arg(&args, "bash", "command").expect_err("not a string");
        assert!(e.contains("\"command\" must be a string"), "{e}");
        let e = str_arg(&args, "bash", "path").expect_err("missing");
        assert_eq!(e, "bash: missing required argument \"path\"");
    }
}
