//! The compactor: turns a run's full history into a prompt that fits the budget.
//!
//! The rules, in order, each applied only while the prompt is still over budget:
//! 1. Old tool outputs are elided, oldest first (the result becomes a stub saying what it was
//!    and that `recall` shows it again; long argument strings of the call likewise), until the
//!    prompt is down to `compact_to` of the budget. The newest turns (up to `recent_share` of
//!    the budget, at least the last one) are kept verbatim.
//! 2. If that is not enough, the older turns are summarised by the model: one call, whose
//!    answer replaces them (a previous summary is folded into the new one).
//! 3. Last resort: outputs of the newest turns are elided too, except the last turn's, which
//!    are cut from the middle to fit.
//!
//! Never touched: system messages, the user's messages, skill instructions (`activate_skill`
//! results). A turn (an assistant message and the results of its tool calls) is kept, shortened
//! inside or summarised as a whole, never split. Decisions persist across calls so prompts stay
//! stable from one turn to the next (and provider prompt caches keep working). The history
//! itself is never changed.
//!
//! Owns these rules and their state. Must not call the model (it hands back a [`SummaryJob`])
//! nor know events, stores or the loop.

use std::collections::{HashMap, HashSet};

use cella_llm::{ChatRequest, Message, ToolSpec};
use serde::{Deserialize, Serialize};

use super::budget::{Budget, ContextOptions};
use super::prune::{result_stub, shorten, shrink_arguments};
use super::summarize;
use super::tokens::{MESSAGE_OVERHEAD, TokenCounter};
use super::turns::{SKILL_TOOL, Unit, tool_name, units};

/// Why no prompt could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    #[error(
        "the prompt does not fit the context window of {model}: {tokens} tokens after compaction, \
         but the budget is {limit} (window {window}, {reserve} kept for the answer); what cannot \
         be shortened (system prompt, tool definitions, the user's messages, skill instructions) \
         takes {protected} tokens: raise the context window (cella run --context-window) or \
         attach fewer skills or tools"
    )]
    DoesNotFit {
        model: String,
        tokens: u32,
        limit: u32,
        window: u32,
        reserve: u32,
        protected: u32,
    },
}

/// What one prompt build did, when it had to compact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The whole history, verbatim, with the tool definitions.
    pub history_tokens: u32,
    /// The prompt as earlier decisions left it, before this compaction.
    pub tokens_before: u32,
    /// The prompt sent.
    pub tokens_after: u32,
    /// The prompt budget.
    pub limit: u32,
    /// Tool outputs elided by this compaction.
    pub elided: u32,
    /// Messages a summary made by this compaction stands for (0: no summary was made).
    pub summarized: u32,
    /// Newest tool outputs cut from the middle (last resort).
    pub shortened: u32,
}

/// A prompt under budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub request: ChatRequest,
    pub tokens: u32,
    /// Set when this build compacted something.
    pub compaction: Option<Compaction>,
}

/// A summary the caller must ask the model for, then hand back with
/// [`Compactor::accept_summary`].
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryJob {
    pub request: ChatRequest,
    /// Non-protected units ending at or before this message index are replaced.
    upto: usize,
    /// Messages the summary stands for (including those of the previous summary).
    folded: usize,
    /// Messages newly folded in.
    new: usize,
}

/// The outcome of one planning step.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Ready(Prompt),
    Summarize(SummaryJob),
}

#[derive(Debug, Clone, Default)]
struct Summary {
    upto: usize,
    folded: usize,
    /// The model's summary.
    text: String,
    /// The message standing for the folded units, and its tokens.
    message: Option<(Message, u32)>,
}

/// Compaction decisions and caches of one run.
#[derive(Debug, Clone)]
pub struct Compactor {
    counter: TokenCounter,
    budget: Budget,
    options: ContextOptions,
    model: String,
    /// Whether a `recall` tool is offered (stubs say so).
    recall: bool,
    /// `max_tokens` to set on prompts (when the client would ask for more than the reserve).
    output_cap: Option<u32>,
    /// Tool calls whose outputs (and long arguments) are elided.
    elided: HashSet<String>,
    summary: Option<Summary>,
    /// History length seen last; a shorter history resets every decision.
    seen: usize,
    /// Tokens of each history message as it is, with its content length as a check.
    verbatim: Vec<(usize, u32)>,
    /// Elided forms of messages, by history index.
    forms: HashMap<usize, (Message, u32)>,
    tools: Option<(Vec<String>, u32)>,
    /// This build's report.
    report: Compaction,
    /// This build's last-resort cuts, by history index.
    cuts: HashMap<usize, (Message, u32)>,
    /// This build's last-resort cut of the summary.
    summary_cut: Option<(Message, u32)>,
}

impl Compactor {
    pub fn new(
        counter: TokenCounter,
        budget: Budget,
        options: ContextOptions,
        model: impl Into<String>,
    ) -> Self {
        Self {
            counter,
            budget,
            options,
            model: model.into(),
            recall: false,
            output_cap: None,
            elided: HashSet::new(),
            summary: None,
            seen: 0,
            verbatim: Vec::new(),
            forms: HashMap::new(),
            tools: None,
            report: Compaction::default(),
            cuts: HashMap::new(),
            summary_cut: None,
        }
    }

    /// Stubs tell the model that `recall` shows elided outputs again.
    pub fn with_recall(mut self, recall: bool) -> Self {
        self.recall = recall;
        self
    }

    /// Sets `max_tokens` on every prompt.
    pub fn with_output_cap(mut self, cap: Option<u32>) -> Self {
        self.output_cap = cap;
        self
    }

    pub fn budget(&self) -> Budget {
        self.budget
    }

    pub fn counter(&self) -> &TokenCounter {
        &self.counter
    }

    /// Starts building the prompt for `history`: either it is ready, or a summary is needed
    /// first (then call [`Compactor::accept_summary`] and [`Compactor::resume`]).
    pub fn plan(&mut self, history: &[Message], tools: &[ToolSpec]) -> Result<Plan, ContextError> {
        self.report = Compaction::default();
        self.build(history, tools, true)
    }

    /// Finishes the build a [`SummaryJob`] interrupted (no second summary).
    pub fn resume(
        &mut self,
        history: &[Message],
        tools: &[ToolSpec],
    ) -> Result<Plan, ContextError> {
        self.build(history, tools, false)
    }

    /// Takes the model's summary for `job`; it is cut to its token allowance if longer.
    pub fn accept_summary(&mut self, job: SummaryJob, text: &str) {
        let allowance = self.summary_allowance();
        let text = shorten(text.trim(), allowance, &self.counter);
        let message = summarize::message(&text, job.folded, self.recall);
        let tokens = self.counter.message(&message);
        self.summary = Some(Summary {
            upto: job.upto,
            folded: job.folded,
            text,
            message: Some((message, tokens)),
        });
        self.report.summarized = u32::try_from(job.new).unwrap_or(u32::MAX);
    }

    /// Most tokens a summary may have.
    pub fn summary_allowance(&self) -> u32 {
        (self.budget.limit / 8)
            .max(128)
            .min(self.budget.reserve.max(128))
    }

    fn build(
        &mut self,
        history: &[Message],
        tools: &[ToolSpec],
        allow_summary: bool,
    ) -> Result<Plan, ContextError> {
        if history.len() < self.seen {
            self.elided.clear();
            self.summary = None;
            self.forms.clear();
        }
        self.seen = history.len();
        self.cuts.clear();
        self.summary_cut = None;
        self.refresh_verbatim(history);
        let fixed = 3 + self.tools_tokens(tools);
        let units = units(history);
        let limit = self.budget.limit;
        let history_tokens =
            fixed.saturating_add(self.verbatim.iter().map(|(_, t)| *t).sum::<u32>());
        let mut sizes: Vec<u32> = (0..units.len())
            .map(|i| self.unit_tokens(history, &units[i]))
            .collect();
        let mut total = self.total(fixed, &units, &sizes);
        if allow_summary {
            self.report.history_tokens = history_tokens;
            self.report.tokens_before = total;
        }
        if total > limit {
            let recent = self.recent_start(&units, &sizes);
            // 1. Elide old tool outputs, oldest first, down to the target.
            let target =
                ((f64::from(limit) * self.options.compact_to.clamp(0.1, 1.0)) as u32).min(limit);
            for i in 0..recent {
                if total <= target {
                    break;
                }
                if self.is_summarized(&units[i]) || !units[i].is_turn() {
                    continue;
                }
                self.elide_unit(history, &units[i], &mut sizes[i], &mut total, target);
            }
            // 2. Summarise the older turns.
            if total > limit
                && allow_summary
                && let Some(job) = self.summary_job(history, &units, recent)
            {
                return Ok(Plan::Summarize(job));
            }
            // 3. Last resort: the newest turns.
            if total > limit {
                let last_turn = (0..units.len()).rev().find(|&i| units[i].is_turn());
                for i in recent..units.len() {
                    if total <= limit {
                        break;
                    }
                    if Some(i) == last_turn || !units[i].is_turn() || self.is_summarized(&units[i])
                    {
                        continue;
                    }
                    self.elide_unit(history, &units[i], &mut sizes[i], &mut total, limit);
                }
                if let Some(i) = last_turn
                    && total > limit
                {
                    self.cut_unit(history, &units[i], &mut sizes[i], &mut total);
                }
                if total > limit && units.iter().any(|u| self.is_summarized(u)) {
                    self.cut_summary(&mut total);
                }
            }
            if total > limit {
                let protected = fixed.saturating_add(
                    units
                        .iter()
                        .zip(&sizes)
                        .filter(|(u, _)| u.is_protected())
                        .map(|(_, s)| *s)
                        .sum::<u32>(),
                );
                return Err(ContextError::DoesNotFit {
                    model: self.model.clone(),
                    tokens: total,
                    limit,
                    window: self.budget.window,
                    reserve: self.budget.reserve,
                    protected,
                });
            }
        }
        let compacted =
            self.report.elided > 0 || self.report.summarized > 0 || self.report.shortened > 0;
        self.report.tokens_after = total;
        self.report.limit = limit;
        Ok(Plan::Ready(Prompt {
            request: self.assemble(history, &units, tools),
            tokens: total,
            compaction: compacted.then_some(self.report),
        }))
    }

    fn refresh_verbatim(&mut self, history: &[Message]) {
        self.verbatim.truncate(history.len());
        for (i, m) in history.iter().enumerate() {
            let len = content_len(m);
            match self.verbatim.get(i) {
                Some((l, _)) if *l == len => {}
                Some(_) => {
                    self.verbatim[i] = (len, self.counter.message(m));
                    self.forms.remove(&i);
                }
                None => self.verbatim.push((len, self.counter.message(m))),
            }
        }
    }

    fn tools_tokens(&mut self, tools: &[ToolSpec]) -> u32 {
        let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
        match &self.tools {
            Some((n, t)) if *n == names => *t,
            _ => {
                let t = self.counter.tools(tools);
                self.tools = Some((names, t));
                t
            }
        }
    }

    fn is_summarized(&self, unit: &Unit) -> bool {
        !unit.is_protected()
            && self
                .summary
                .as_ref()
                .is_some_and(|s| unit.range.end <= s.upto)
    }

    fn total(&self, fixed: u32, units: &[Unit], sizes: &[u32]) -> u32 {
        let mut total = fixed;
        let mut summary_counted = false;
        for (unit, size) in units.iter().zip(sizes) {
            if self.is_summarized(unit) {
                if !summary_counted {
                    summary_counted = true;
                    total = total.saturating_add(self.summary_message().map_or(0, |(_, t)| *t));
                }
            } else {
                total = total.saturating_add(*size);
            }
        }
        total
    }

    /// The first unit of the newest ones kept verbatim: at most `recent_share` of the budget,
    /// at least the last unit.
    fn recent_start(&self, units: &[Unit], sizes: &[u32]) -> usize {
        let share =
            (f64::from(self.budget.limit) * self.options.recent_share.clamp(0.0, 1.0)) as u32;
        let mut acc = 0u32;
        let mut start = units.len();
        for i in (0..units.len()).rev() {
            if self.is_summarized(&units[i]) {
                break;
            }
            if start < units.len() && acc.saturating_add(sizes[i]) > share {
                break;
            }
            acc = acc.saturating_add(sizes[i]);
            start = i;
        }
        start
    }

    /// The message standing for the summarised units (as cut this build, if it was).
    fn summary_message(&self) -> Option<&(Message, u32)> {
        self.summary_cut
            .as_ref()
            .or_else(|| self.summary.as_ref().and_then(|s| s.message.as_ref()))
    }

    /// Last resort after the newest turn: the summary cut from the middle until `total` fits.
    fn cut_summary(&mut self, total: &mut u32) {
        let Some(summary) = &self.summary else {
            return;
        };
        let Some((_, tokens)) = self.summary_message() else {
            return;
        };
        let tokens = *tokens;
        let excess = total.saturating_sub(self.budget.limit);
        let keep = self.counter.text(&summary.text).saturating_sub(excess + 8);
        let text = shorten(&summary.text, keep, &self.counter);
        let message = summarize::message(&text, summary.folded, self.recall);
        let t = self.counter.message(&message);
        if t < tokens {
            *total = total.saturating_sub(tokens - t);
            self.summary_cut = Some((message, t));
            self.report.shortened += 1;
        }
    }

    /// The prompt form of history message `index` and its tokens.
    fn form<'a>(&'a self, history: &'a [Message], index: usize) -> (&'a Message, u32) {
        if let Some((m, t)) = self.cuts.get(&index).or_else(|| self.forms.get(&index)) {
            return (m, *t);
        }
        (&history[index], self.verbatim[index].1)
    }

    fn unit_tokens(&self, history: &[Message], unit: &Unit) -> u32 {
        unit.range
            .clone()
            .map(|i| self.form(history, i).1)
            .fold(0u32, u32::saturating_add)
    }

    /// Elides the tool outputs of one turn, call by call, while `total` is above `target`;
    /// skill instructions stay.
    fn elide_unit(
        &mut self,
        history: &[Message],
        unit: &Unit,
        size: &mut u32,
        total: &mut u32,
        target: u32,
    ) {
        let Some(Message::Assistant { tool_calls, .. }) = history.get(unit.range.start) else {
            return;
        };
        for call in tool_calls {
            if *total <= target {
                return;
            }
            if call.name == SKILL_TOOL || self.elided.contains(&call.id) {
                continue;
            }
            self.elided.insert(call.id.clone());
            self.refresh_forms(history, unit);
            let new = self.unit_tokens(history, unit);
            if new < *size {
                *total = total.saturating_sub(*size - new);
                *size = new;
                self.report.elided += 1;
            } else {
                self.elided.remove(&call.id);
                self.refresh_forms(history, unit);
            }
        }
    }

    /// Recomputes the elided forms of a unit's messages from `self.elided`.
    fn refresh_forms(&mut self, history: &[Message], unit: &Unit) {
        for i in unit.range.clone() {
            self.forms.remove(&i);
            let form = match &history[i] {
                Message::Assistant {
                    content,
                    tool_calls,
                } if tool_calls.iter().any(|c| self.elided.contains(&c.id)) => {
                    let mut calls = tool_calls.clone();
                    let mut changed = false;
                    for c in calls.iter_mut().filter(|c| self.elided.contains(&c.id)) {
                        if let Some(short) = shrink_arguments(&c.arguments, &c.id, self.recall) {
                            c.arguments = short;
                            changed = true;
                        }
                    }
                    changed.then(|| Message::Assistant {
                        content: content.clone(),
                        tool_calls: calls,
                    })
                }
                Message::Tool {
                    tool_call_id,
                    content,
                    is_error,
                } if self.elided.contains(tool_call_id) => {
                    let name = tool_name(history, unit, tool_call_id).unwrap_or("the tool");
                    let tokens = self.verbatim[i]
                        .1
                        .saturating_sub(MESSAGE_OVERHEAD + self.counter.text(tool_call_id));
                    let stub = result_stub(name, tool_call_id, content, tokens, self.recall);
                    // A stub longer than the output would not help.
                    (stub.len() < content.len()).then(|| Message::Tool {
                        tool_call_id: tool_call_id.clone(),
                        content: stub,
                        is_error: *is_error,
                    })
                }
                _ => None,
            };
            if let Some(m) = form {
                let t = self.counter.message(&m);
                self.forms.insert(i, (m, t));
            }
        }
    }

    /// Cuts the last turn's tool outputs (largest first) from the middle until `total` fits;
    /// then its long arguments and its text.
    fn cut_unit(&mut self, history: &[Message], unit: &Unit, size: &mut u32, total: &mut u32) {
        let limit = self.budget.limit;
        let mut results: Vec<(usize, u32)> = unit
            .range
            .clone()
            .filter(|&i| match &history[i] {
                Message::Tool { tool_call_id, .. } => {
                    tool_name(history, unit, tool_call_id) != Some(SKILL_TOOL)
                }
                _ => false,
            })
            .map(|i| (i, self.form(history, i).1))
            .collect();
        results.sort_by_key(|r| std::cmp::Reverse(r.1));
        for (i, tokens) in results {
            if *total <= limit {
                return;
            }
            let excess = *total - limit;
            let (message, _) = self.form(history, i);
            let Message::Tool {
                tool_call_id,
                content,
                is_error,
            } = message
            else {
                continue;
            };
            let content_tokens = self.counter.text(content);
            let keep = content_tokens.saturating_sub(excess + 8);
            let cut = Message::Tool {
                tool_call_id: tool_call_id.clone(),
                content: shorten(content, keep, &self.counter),
                is_error: *is_error,
            };
            let t = self.counter.message(&cut);
            if t < tokens {
                self.cuts.insert(i, (cut, t));
                *total = total.saturating_sub(tokens - t);
                *size = size.saturating_sub(tokens - t);
                self.report.shortened += 1;
            }
        }
        let i = unit.range.start;
        if *total <= limit {
            return;
        }
        let (message, tokens) = self.form(history, i);
        let Message::Assistant {
            content,
            tool_calls,
        } = message
        else {
            return;
        };
        let excess = *total - limit;
        let calls = tool_calls
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(short) = shrink_arguments(&c.arguments, &c.id, self.recall) {
                    c.arguments = short;
                }
                c
            })
            .collect();
        let keep = self.counter.text(content).saturating_sub(excess + 8);
        let cut = Message::Assistant {
            content: shorten(content, keep, &self.counter),
            tool_calls: calls,
        };
        let t = self.counter.message(&cut);
        if t < tokens {
            self.cuts.insert(i, (cut, t));
            *total = total.saturating_sub(tokens - t);
            *size = size.saturating_sub(tokens - t);
            self.report.shortened += 1;
        }
    }

    fn summary_job(
        &self,
        history: &[Message],
        units: &[Unit],
        recent: usize,
    ) -> Option<SummaryJob> {
        let fold: Vec<&Unit> = units[..recent]
            .iter()
            .filter(|u| !u.is_protected() && !self.is_summarized(u))
            .collect();
        if fold.is_empty() {
            return None;
        }
        let upto = fold.last().map_or(0, |u| u.range.end);
        let messages: Vec<Message> = fold
            .iter()
            .flat_map(|u| u.range.clone().map(|i| history[i].clone()))
            .collect();
        let task = history
            .iter()
            .find_map(|m| match m {
                Message::User { content } => Some(content.as_str()),
                _ => None,
            })
            .unwrap_or("");
        let previous = self.summary.as_ref().map(|s| s.text.as_str());
        let request = summarize::request(
            task,
            previous,
            &messages,
            self.budget.limit,
            self.summary_allowance(),
            &self.counter,
        );
        let before = self.summary.as_ref().map_or(0, |s| s.folded);
        Some(SummaryJob {
            request,
            upto,
            folded: before + messages.len(),
            new: messages.len(),
        })
    }

    fn assemble(&self, history: &[Message], units: &[Unit], tools: &[ToolSpec]) -> ChatRequest {
        let mut messages = Vec::with_capacity(history.len());
        let mut summary_placed = false;
        for unit in units {
            if self.is_summarized(unit) {
                if !summary_placed {
                    summary_placed = true;
                    if let Some((m, _)) = self.summary_message() {
                        messages.push(m.clone());
                    }
                }
                continue;
            }
            for i in unit.range.clone() {
                messages.push(self.form(history, i).0.clone());
            }
        }
        let mut request = ChatRequest::new(messages).with_tools(tools.to_vec());
        request.max_tokens = self.output_cap;
        request
    }
}

/// A cheap fingerprint of a message's size, to notice a history rewritten in place.
fn content_len(m: &Message) -> usize {
    match m {
        Message::System { content } | Message::User { content } => content.len(),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            content.len()
                + tool_calls
                    .iter()
                    .map(|c| c.arguments.len() + c.id.len())
                    .sum::<usize>()
        }
        Message::Tool { content, .. } => content.len(),
    }
}

#[cfg(test)]
#[path = "compactor_tests.rs"]
mod tests;
