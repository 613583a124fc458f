//! A BAE client's turn, as the steps of the one turn loop (`run.rs`) take it: the profile's
//! provider chain tried one attempt at a time, each attempt recorded (`provider.request`,
//! `provider.response`), the acting client's tools advertised, and its calls pausing the turn.
//!
//! Runs on the turn's `kestrel-run` worker.

use super::bae;
use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::domain::{
    Block, Dispatch, Event, Fault, Message, ProviderRequest, ProviderResponse, Role, ToolCall, ToolResult, ToolSchema,
    Usage,
};
use crate::engine::run::{Run, Step, Stop};
use crate::engine::EngineError;
use crate::providers::{CallFailed, CompletionRequest, Refusal, Route, Target, Watch};
use crate::store::{BaeState, BaeWrite, WriteOp};

/// What the turn loop needs to run a BAE client's turn.
pub(crate) struct BaeTurn {
    /// The acting client key: every event of the turn is attributed to it.
    pub actor: Arc<str>,
    pub primary: String,
    pub fallbacks: Vec<String>,
    /// The acting client's tools, as the model sees them.
    pub tools: Vec<ToolSchema>,
    pub client_tools: HashSet<String>,
    /// The acting client's auto-mode sandbox tools: the server runs them in the session's
    /// remote sandbox.
    pub sandbox_tools: HashSet<String>,
    /// The acting client's remote subagent declarations: the server launches them in the
    /// session's remote sandbox.
    pub subagent_tools: Vec<super::sessions::SubagentDecl>,
    /// Results in the opening message that the server produced (stashed across a pause):
    /// not recorded again as the client's.
    pub server_result_ids: HashSet<String>,
    /// `auto` compaction's threshold in tokens, if the session has one.
    pub auto_compaction: Option<u64>,
    /// Provider calls the turn may make.
    pub loop_limit: u32,
    /// The session's profile's budget (`None`: the server's, under BAE's own tenant).
    pub allowance: Option<crate::engine::Allowance>,
}

impl BaeTurn {
    /// Who runs a call, as BAE classifies it: the acting client's tool, its sandbox tool, its
    /// subagent tool or the status tool; `None` for the rest (MCP).
    fn classify(&self, name: &str) -> Option<Dispatch> {
        if self.client_tools.contains(name) {
            Some(Dispatch::Client)
        } else if self.sandbox_tools.contains(name) {
            Some(Dispatch::Sandbox)
        } else if name == super::RESERVED_TOOL || self.subagent_tools.iter().any(|decl| decl.name == name) {
            Some(Dispatch::Subagent)
        } else {
            None
        }
    }
}

/// A turn paused for the client: the tool calls it waits on, in order, and what the server
/// already answered.
#[derive(Debug, Clone)]
pub(crate) struct PausedTurn {
    pub owner: String,
    /// Every tool call id of the paused answer, in order.
    pub expected: Vec<String>,
    pub names: Vec<String>,
    pub server_results: Vec<ToolResult>,
}

impl PausedTurn {
    /// The turn a stored answer paused, if it called a client's tools: after a restart, the
    /// last message of a session's history is all that is left of a paused turn. The server's
    /// own results are made again (no MCP server is configured: each is the same error).
    pub(crate) fn of_answer(answer: &Message, owner: String) -> Option<PausedTurn> {
        if answer.role != Role::Assistant {
            return None;
        }
        let calls: Vec<&ToolCall> = answer
            .blocks
            .iter()
            .filter_map(|block| match block {
                Block::ToolCall(call) => Some(call),
                _ => None,
            })
            .collect();
        if !calls.iter().any(|call| call.dispatch == Dispatch::Client) {
            return None;
        }
        Some(PausedTurn {
            owner,
            expected: calls.iter().map(|call| call.id.clone()).collect(),
            names: calls.iter().map(|call| call.name.clone()).collect(),
            server_results: calls
                .iter()
                .filter(|call| call.dispatch != Dispatch::Client)
                .map(|c| unroutable(c))
                .collect(),
        })
    }
}

/// A stored message that starts the history the provider sees (a compaction's preamble).
pub(crate) const HISTORY_START: &str = "historyStart";

/// The messages the provider sees: from the last compaction on.
pub(crate) fn effective_history(mut messages: Vec<Message>) -> Vec<Message> {
    if let Some(start) = messages.iter().rposition(|m| m.flag(HISTORY_START)) {
        messages.drain(..start);
    }
    messages
}

impl BaeRun<'_> {
    /// Stores and announces the client's message, then the tool results it carries.
    pub(crate) fn open_bae_turn(&self, turn: &BaeTurn) -> Result<(), EngineError> {
        let Some(user) = &self.user else { return Ok(()) };
        // It is stored with the turn's next event (the provider request, usually), and that
        // commit overlaps the provider call; the turn settles before it stores more.
        self.hold_message(user.clone());
        for block in &user.blocks {
            if let Block::ToolResult(result) = block {
                if !turn.server_result_ids.contains(&result.call_id) {
                    self.publish(Event::ToolFinished {
                        session_id: self.session_id.clone(),
                        result: result.clone(),
                        dispatch: Dispatch::Client,
                    });
                }
            }
        }
        Ok(())
    }

    /// The profile's providers: the primary (which must resolve, else a `provider_config`
    /// fault ends the turn), then each fallback that resolves (the others are logged).
    pub(crate) fn bae_chain(&self, primary: &str, fallbacks: &[String]) -> Option<Route> {
        match self.resolve_chain(primary, fallbacks) {
            Ok(chain) => Some(chain),
            Err(detail) => {
                self.fault(Fault::ProviderConfig { detail: detail.to_string() });
                None
            }
        }
    }

    /// The route of a profile's chain: its primary's (with that provider's own fallbacks),
    /// then each fallback's that resolves.
    pub(crate) fn resolve_chain(&self, primary: &str, fallbacks: &[String]) -> Result<Route, Unconfigured> {
        let models = &self.shared.models;
        let mut chain = models.route_named(primary).ok_or_else(|| Unconfigured(primary.to_string()))?;
        for name in fallbacks {
            match models.route_named(name) {
                Some(fallback) => chain = chain.then(&fallback),
                None => {
                    log::error!("session {}: fallback provider {name:?} is not configured; skipped", self.session_id)
                }
            }
        }
        Ok(chain)
    }

    /// One model call through the chain, each attempt recorded. A failing first attempt and
    /// a chain that all fails are recorded as faults.
    pub(crate) fn ask_chain(
        &self,
        turn: &BaeTurn,
        chain: &Route,
        usage: &mut Usage,
        tail: &[Message],
    ) -> Result<Step, EngineError> {
        let mut history = effective_history(self.shared.store.readers().messages(&self.session_id)?);
        // The turn's own message may not be committed yet: it is the last one either way.
        if let Some(user) = self.user.as_ref().filter(|user| !history.iter().any(|m| m.id == user.id)) {
            history.push(user.clone());
        }
        // The session's stored messages (the turn's own is stored with the request's event):
        // the log keeps them by id.
        let stored = history.len();
        history.extend_from_slice(tail);
        // The status tool is offered while the session tracks a subagent, which can change
        // from one model call to the next.
        let mut tools = std::borrow::Cow::Borrowed(&turn.tools);
        if bae(&self.shared).subagents.tracks(&self.session_id) {
            tools.to_mut().push(super::subagent::status_tool());
        }
        let request =
            CompletionRequest { system_prompt: None, messages: &history, tools: &tools, response_format: None };
        // The profile's budget first (`engine/meter.rs`): a spent one ends the turn.
        let Some(reservation) = self.reserve_call(chain, &request)? else { return Ok(Step::Cancelled) };
        let mut recorded = Recorded { run: self.run, stored, fault_first: true };
        let called = chain.call(&request, &mut recorded, &self.cancel);
        self.settle_call(reservation, &request, &called);
        match called {
            Ok(answered) => {
                usage.add(&answered.completion.usage);
                let completion = answered.completion;
                let mut answer = Message::new(Role::Assistant);
                answer.model = Some(answered.target.model.clone());
                answer.blocks =
                    crate::engine::run::answer_blocks(completion.reasoning, completion.text, completion.tool_calls);
                let meta = answer.meta.get_or_insert_with(Default::default);
                meta.insert("usage".into(), json!(completion.usage));
                Ok(Step::Answered(Box::new(answer)))
            }
            Err(CallFailed::Cancelled { .. }) => Ok(Step::Cancelled),
            Err(CallFailed::Failed { attempts, .. }) => {
                self.fault(Fault::AllProvidersFailed { attempts });
                Ok(Step::Failed)
            }
        }
    }

    /// Stores the final answer (`server.message.send`), then compacts if the session asks to.
    pub(crate) fn keep_bae_answer(&self, turn: &BaeTurn, answer: Message, _usage: &Usage) -> Result<(), EngineError> {
        let reported = answer_usage(&answer);
        self.settle()?;
        if reported.is_some() && turn.auto_compaction.is_some() {
            // A compaction reads the stored history: the answer must be in it.
            self.append(answer)?;
        } else {
            // Its commit overlaps the turn's end; `execute` settles before the next turn.
            self.append_later(answer)?;
        }
        if let (Some(size), Some(reported)) = (turn.auto_compaction, reported) {
            if reported.input_tokens + reported.output_tokens > size {
                self.auto_compact(turn);
            }
        }
        Ok(())
    }

    /// Records the answer's calls (`tool.call`, each with who runs it), answers the ones no
    /// server tool can run, then pauses for the client's calls or goes round again.
    pub(crate) fn dispatch_bae(
        &self,
        turn: &BaeTurn,
        mut answer: Message,
        tail: &mut Vec<Message>,
    ) -> Result<Option<Stop>, EngineError> {
        let mut calls = Vec::new();
        let mut routes = Vec::new();
        for block in &mut answer.blocks {
            if let Block::ToolCall(call) = block {
                let mut route = None;
                call.dispatch = match turn.classify(&call.name) {
                    Some(dispatch) => dispatch,
                    None => {
                        route = bae(&self.shared).mcp.route(&self.session_id, &call.name);
                        let server = route.as_ref().map(|(server, _)| server.clone());
                        Dispatch::Mcp { server: server.unwrap_or_default() }
                    }
                };
                calls.push(call.clone());
                routes.push(route);
            }
        }
        // Every call is announced before any runs.
        for call in &calls {
            let started =
                Event::ToolStarted { session_id: self.session_id.clone(), call: call.clone(), permission: None };
            self.publish(started);
        }
        let mut server_results: Vec<ToolResult> = Vec::new();
        for (call, route) in calls.iter().zip(routes).filter(|(c, _)| c.dispatch != Dispatch::Client) {
            // No call starts once the turn is cancelled: the ones left have no start mark, so
            // they provably never ran.
            if self.cancel.is_cancelled() {
                return Ok(Some(Stop::Cancelled));
            }
            // Decided and audited first (`calls.rs`): a denial is the call's result.
            if let Some(denied) = self.refusal(call) {
                server_results.push(denied);
                continue;
            }
            // Durable before the call runs: after a crash it is recorded, never run again.
            self.mark_started(call)?;
            let result = match call.dispatch {
                Dispatch::Sandbox => self.call_sandbox(call),
                Dispatch::Subagent => Some(self.call_subagent(turn, call)),
                // A call no MCP server routes is answered so by `call_mcp` too.
                Dispatch::Mcp { .. } | Dispatch::Server => self.call_mcp(call, route),
                Dispatch::Client => unreachable!("the client's calls are left out of this loop"),
            };
            // `None`: a shutdown cut the call. Its mark stays unsettled, and the next start
            // records it as a killed server's call (`recovery.rs`), never run again.
            let Some(result) = result else { return Ok(Some(Stop::Cancelled)) };
            server_results.push(result);
        }
        if calls.iter().any(|c| c.dispatch == Dispatch::Client) {
            self.settle()?;
            self.append_later(answer)?;
            let paused = PausedTurn {
                owner: turn.actor.to_string(),
                expected: calls.iter().map(|c| c.id.clone()).collect(),
                names: calls.iter().map(|c| c.name.clone()).collect(),
                server_results,
            };
            return Ok(Some(Stop::Paused(Box::new(paused))));
        }
        // Every call was the server's: round again, these rounds in memory only.
        let mut results = Message::new(Role::User);
        results.blocks = server_results.into_iter().map(Block::ToolResult).collect();
        tail.push(answer);
        tail.push(results);
        Ok(None)
    }

    /// One call on its MCP server (or the unroutable answer), with `mcp.request`,
    /// `mcp.response` and `tool.result` around it. The turn's cancel ends the call at once
    /// (the server is told): a cancel by a person or a close answers it with an error
    /// result; a shutdown's answers nothing (`None`), leaving the call to `recovery.rs`.
    fn call_mcp(&self, call: &ToolCall, route: Option<(String, Arc<crate::mcp::McpClient>)>) -> Option<ToolResult> {
        let server_name = route.as_ref().map(|(name, _)| name.clone());
        let session_id = self.session_id.clone();
        self.publish(Event::McpRequest {
            session_id: session_id.clone(),
            server_name: server_name.clone(),
            tool: call.name.clone(),
            input: Value::Object(call.arguments.clone()),
        });
        let answered = match &route {
            Some((_, client)) => super::mcp::call(client, call, self.cancel.receiver()),
            None => {
                let result = unroutable(call);
                Ok((false, None, Some(result.content.clone()), result))
            }
        };
        let (ok, result, error, tool_result) = match answered {
            Ok(parts) => parts,
            Err(_) if self.stopping() => return None,
            Err(cancelled) => super::mcp::failed(call, &cancelled),
        };
        self.publish(Event::McpResponse {
            session_id: session_id.clone(),
            server_name: server_name.clone(),
            ok,
            result,
            error,
        });
        let dispatch = Dispatch::Mcp { server: server_name.unwrap_or_default() };
        self.publish_settled(Event::ToolFinished { session_id, result: tool_result.clone(), dispatch }, &call.id);
        Some(tool_result)
    }

    /// Whether the turn was cancelled because the server is stopping (or this node lost the
    /// session): a call it cut is left for the next holder to record, as a killed server's.
    pub(crate) fn stopping(&self) -> bool {
        self.cancel.reason() == Some(crate::cancel::CancelReason::Shutdown)
    }

    /// The turn asked the model more often than a turn may: the session ends in error.
    pub(crate) fn bae_loop_limit(&self) -> Result<Stop, EngineError> {
        self.fault(Fault::LoopLimit { max_iterations: bae(&self.shared).settings.loop_limit });
        Ok(Stop::Faulted)
    }

    /// Records a fault; a terminal one moves the session to `error`.
    pub(crate) fn fault(&self, fault: Fault) {
        let terminal = fault.is_terminal();
        self.publish(Event::SessionFault { session_id: self.session_id.clone(), fault });
        if terminal {
            let end = BaeWrite::EndSession {
                id: self.session_id.clone(),
                state: BaeState::Error,
                at: crate::time::now_rfc3339(),
            };
            if let Err(error) = self.shared.store.write(vec![WriteOp::Bae(end)]) {
                log::debug!("session {}: not moved to error: {error}", self.session_id);
            }
        }
    }
}

/// A BAE turn's (or compaction's) run, with the door's steps on it; everything else is the
/// run's own (`Deref`).
pub(crate) struct BaeRun<'r> {
    pub run: &'r Run,
}

impl std::ops::Deref for BaeRun<'_> {
    type Target = Run;

    fn deref(&self) -> &Run {
        self.run
    }
}

/// A profile's primary provider that is not configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unconfigured(pub String);

impl std::fmt::Display for Unconfigured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "provider {:?} is not configured", self.0)
    }
}

/// A BAE call as BAE records it: each attempt's `provider.request` (the history sent, its
/// first `stored` messages the session's) and `provider.response`, a whole answer's held to
/// commit with what the turn makes of it; with `fault_first`, a failing first attempt is also
/// recorded as `provider_call_failed`.
pub(crate) struct Recorded<'r> {
    pub run: &'r Run,
    pub stored: usize,
    pub fault_first: bool,
}

impl Recorded<'_> {
    fn response(&self, attempt: u32, target: &Target, fallback: bool) -> ProviderResponse {
        ProviderResponse {
            session_id: self.run.session_id.clone(),
            attempt,
            fallback: Some(fallback),
            provider: target.wire.to_string(),
            ok: true,
            status: Some(200),
            error: None,
            body: None,
        }
    }
}

impl Watch for Recorded<'_> {
    fn streamed(&self) -> bool {
        false
    }

    fn attempting(&mut self, attempt: u32, target: &Target, fallback: bool, request: &CompletionRequest<'_>) {
        self.run.publish(Event::ProviderRequest(Box::new(ProviderRequest {
            session_id: self.run.session_id.clone(),
            attempt,
            fallback: Some(fallback),
            provider: target.wire.to_string(),
            base_url: target.base_url.clone(),
            model: target.model.clone(),
            max_tokens: target.max_tokens,
            messages: request.messages.to_vec(),
            tools: request.tools.to_vec(),
            stored: self.stored,
            unresolved: false,
        })));
    }

    fn refused(&mut self, attempt: u32, target: &Target, fallback: bool, refusal: &Refusal) {
        let response = ProviderResponse {
            ok: false,
            status: refusal.status,
            error: Some(refusal.error.clone()),
            body: refusal.body.clone().map(Value::String),
            ..self.response(attempt, target, fallback)
        };
        self.run.publish(Event::ProviderResponse(Box::new(response)));
        if attempt == 0 && self.fault_first {
            let fault = Fault::ProviderCallFailed { provider: target.wire.to_string(), detail: refusal.error.clone() };
            BaeRun { run: self.run }.fault(fault);
        }
    }

    fn answered(&mut self, attempt: u32, target: &Target, fallback: bool, body: Option<&Value>) {
        // It goes out with what the turn makes of the answer, in one commit.
        let response = ProviderResponse { body: body.cloned(), ..self.response(attempt, target, fallback) };
        self.run.hold(Event::ProviderResponse(Box::new(response)));
    }
}

/// The usage an answer's provider reported, kept in its `meta`.
fn answer_usage(answer: &Message) -> Option<Usage> {
    let usage = answer.meta.as_ref()?.get("usage")?;
    serde_json::from_value(usage.clone()).ok()
}

/// The result of a call no server tool can run.
fn unroutable(call: &ToolCall) -> ToolResult {
    error_result(call, format!("no MCP server is configured for tool '{}'", call.name))
}

/// A server-run call's error result in BAE's shape: `text` as its one text block.
pub(super) fn error_result(call: &ToolCall, text: String) -> ToolResult {
    ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        ok: false,
        content: text.clone(),
        duration_ms: None,
        error: Some(text.clone()),
        data: None,
        blocks: Some(vec![json!({ "type": "text", "text": text })]),
    }
}

impl crate::engine::plan::TurnPlan for BaeTurn {
    fn actor(&self) -> Option<Arc<str>> {
        Some(Arc::clone(&self.actor))
    }

    fn lifecycle(&self) -> crate::engine::plan::Lifecycle {
        crate::engine::plan::Lifecycle::Quiet
    }

    fn open(&self, run: &Run) -> Result<crate::engine::plan::Opening, EngineError> {
        BaeRun { run }.open_bae_turn(self)?;
        Ok(Ok(Vec::new()))
    }

    fn route(&self, run: &Run, _: &crate::domain::SessionRecord) -> Result<Option<Route>, EngineError> {
        Ok(BaeRun { run }.bae_chain(&self.primary, &self.fallbacks))
    }

    fn step_limit(&self, _: &crate::engine::EngineConfig) -> u32 {
        self.loop_limit
    }

    fn limit_reached(&self, run: &Run) -> Result<Stop, EngineError> {
        BaeRun { run }.bae_loop_limit()
    }

    fn allowance(&self, config: &crate::engine::EngineConfig, tenant: &str) -> crate::engine::Allowance {
        self.allowance.clone().unwrap_or_else(|| config.tenant_allowance(tenant))
    }

    /// A spent budget ends the turn with a `session.error` (`budget_exceeded`); the session
    /// stays open for when the budget allows again.
    fn budget_spent(&self, run: &Run, reason: String) -> Result<Stop, EngineError> {
        BaeRun { run }.fault(crate::domain::Fault::BudgetExceeded { detail: reason });
        Ok(Stop::Faulted)
    }

    fn ask(
        &self,
        run: &Run,
        route: &Route,
        _: &crate::domain::SessionRecord,
        usage: &mut Usage,
        tail: &[Message],
    ) -> Result<Step, EngineError> {
        BaeRun { run }.ask_chain(self, route, usage, tail)
    }

    fn keep_answer(&self, run: &Run, answer: Message, usage: &Usage) -> Result<(), EngineError> {
        BaeRun { run }.keep_bae_answer(self, answer, usage)
    }

    fn dispatch(
        &self,
        run: &Run,
        answer: Message,
        _: &crate::domain::SessionRecord,
        tail: &mut Vec<Message>,
    ) -> Result<Option<Stop>, EngineError> {
        BaeRun { run }.dispatch_bae(self, answer, tail)
    }
}
