//! A history cut into the pieces compaction may move as wholes: system and user messages, and
//! turns — an assistant message together with the results of all its tool calls. OpenAI and
//! Anthropic both reject a tool call without its result and a result without its call, so a
//! turn is never split: it is kept, shortened inside, or summarised as one.
//!
//! Owns the partition and what is protected. Must not know tokens or budgets.

use std::ops::Range;

use cella_llm::Message;

/// The tool whose results are skill instructions: never pruned, never summarised.
pub const SKILL_TOOL: &str = "activate_skill";

/// One piece of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// The messages of the piece, as indexes into the history.
    pub range: Range<usize>,
    pub kind: UnitKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// Instructions: kept as they are.
    System,
    /// What the user said: kept as it is, always.
    User,
    /// An assistant message and the tool results answering it (or tool results with no call
    /// before them, which a well-formed history does not have).
    Turn {
        /// Some tool call of this turn activated a skill: the turn is kept whole, its skill
        /// content verbatim.
        skill: bool,
    },
}

impl Unit {
    /// Never summarised away.
    pub fn is_protected(&self) -> bool {
        match self.kind {
            UnitKind::System | UnitKind::User => true,
            UnitKind::Turn { skill } => skill,
        }
    }

    pub fn is_turn(&self) -> bool {
        matches!(self.kind, UnitKind::Turn { .. })
    }
}

/// Cuts `history` into units, in order; every message belongs to exactly one.
pub fn units(history: &[Message]) -> Vec<Unit> {
    let mut out: Vec<Unit> = Vec::new();
    let mut i = 0;
    while i < history.len() {
        let start = i;
        let kind = match &history[i] {
            Message::System { .. } => UnitKind::System,
            Message::User { .. } => UnitKind::User,
            Message::Assistant { tool_calls, .. } => {
                i += 1;
                while i < history.len() && matches!(history[i], Message::Tool { .. }) {
                    i += 1;
                }
                out.push(Unit {
                    range: start..i,
                    kind: UnitKind::Turn {
                        skill: tool_calls.iter().any(|c| c.name == SKILL_TOOL),
                    },
                });
                continue;
            }
            Message::Tool { .. } => {
                while i < history.len() && matches!(history[i], Message::Tool { .. }) {
                    i += 1;
                }
                out.push(Unit {
                    range: start..i,
                    kind: UnitKind::Turn { skill: false },
                });
                continue;
            }
        };
        i += 1;
        out.push(Unit {
            range: start..i,
            kind,
        });
    }
    out
}

/// The name of the tool a result answers, from the calls of the turn it belongs to.
pub fn tool_name<'a>(history: &'a [Message], unit: &Unit, tool_call_id: &str) -> Option<&'a str> {
    match history.get(unit.range.start) {
        Some(Message::Assistant { tool_calls, .. }) => tool_calls
            .iter()
            .find(|c| c.id == tool_call_id)
            .map(|c| c.name.as_str()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cella_llm::ToolCall;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: "{}".into(),
        }
    }

    #[test]
    fn a_turn_holds_its_call_and_all_its_results() {
        let history = vec![
            Message::system("s"),
            Message::user("task"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![call("a", "bash"), call("b", "bash")],
            },
            Message::tool_result("a", "1"),
            Message::tool_result("b", "2"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![call("c", SKILL_TOOL)],
            },
            Message::tool_result("c", "skill"),
            Message::assistant("done"),
            Message::user("more"),
        ];
        let u = units(&history);
        let ranges: Vec<_> = u.iter().map(|u| u.range.clone()).collect();
        assert_eq!(ranges, [0..1, 1..2, 2..5, 5..7, 7..8, 8..9]);
        assert_eq!(u[2].kind, UnitKind::Turn { skill: false });
        assert!(u[3].is_protected() && !u[2].is_protected() && u[5].is_protected());
        assert_eq!(tool_name(&history, &u[2], "b"), Some("bash"));
        assert_eq!(tool_name(&history, &u[2], "z"), None);
    }
}
