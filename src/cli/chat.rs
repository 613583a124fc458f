//! `kestrel chat`: a conversation in the terminal. A line sends a message; the reply streams as
//! it is written (reasoning dimmed on a terminal), tool calls and results show in a line each,
//! an approval is asked here (`[y]es / [n]o / [a]lways for this session / [e]dit`, then an
//! optional note), Ctrl-C cancels the run and a second
//! Ctrl-C leaves. An interrupted session offers to resume its run.
//!
//! Three inputs meet in one loop: the session's event stream and stdin each on a thread of
//! their own, and Ctrl-C. Lines typed while a run goes on wait in order for the next question
//! (an approval) or the next turn, so piped input works too. The end of the input is an
//! answer too, so no state waits for a line that cannot come: at a note it means no note, at
//! y/n a denial, at the resume offer no, and at the prompt leaving once the run has ended.

use std::collections::VecDeque;
use std::io::{BufRead, IsTerminal, Write};

use crossbeam_channel::{select, unbounded, Receiver};
use serde_json::{json, Value};

use super::args::ChatArgs;
use super::client::{CliError, Client};
use super::commands::{first_line, segment};

/// What the loop waits for.
enum State {
    /// For a message to send.
    Idle,
    /// For run `run_id` to end; `asking` is an approval waiting for y/n (then its note).
    Running { run_id: String, asking: Option<Asking>, cancelled: bool },
}

struct Asking {
    approval_id: String,
    /// The answer, once given; then the note is asked.
    approved: Option<bool>,
    /// `[a]lways`: remembered for the session.
    remember: bool,
    /// `[e]dit` was chosen and the arguments are asked (`None`), or were given.
    editing: Option<Option<Value>>,
}

/// The approval question.
const APPROVE: &str = "approve? [y]es / [n]o / [a]lways for this session / [e]dit ";

/// The edit's question.
const EDIT: &str = "arguments, as one line of JSON: ";

struct Chat {
    client: Client,
    session: String,
    events: Receiver<Option<Value>>,
    lines: Receiver<Option<String>>,
    interrupts: Receiver<()>,
    /// Lines typed before they were asked for.
    queued: VecDeque<String>,
    stdin_done: bool,
    tty: bool,
    /// stdin is not a terminal: each line read is echoed after its prompt, so a transcript
    /// reads as a conversation.
    echo_input: bool,
    /// The channel of the last delta printed, to break lines between channels.
    printing: Option<String>,
}

pub fn chat(args: &ChatArgs) -> Result<(), CliError> {
    let client = Client::new(&args.remote)?;
    let session = match &args.session {
        Some(id) => client.call("GET", &format!("/api/sessions/{}", segment(id)?), None)?["session"].clone(),
        None => create(&client, args)?,
    };
    let id = session["id"].as_str().unwrap_or_default().to_string();
    let frames = client.stream(&format!("/api/sessions/{id}/events"), None)?;
    let (interrupt_tx, interrupts) = unbounded();
    ctrlc::set_handler(move || {
        let _ = interrupt_tx.send(());
    })
    .map_err(|e| CliError::Failed(format!("cannot catch Ctrl-C: {e}")))?;
    let mut chat = Chat {
        client,
        session: id.clone(),
        events: spawn_events(frames),
        lines: spawn_lines(),
        interrupts,
        queued: VecDeque::new(),
        stdin_done: false,
        tty: std::io::stdout().is_terminal(),
        echo_input: !std::io::stdin().is_terminal(),
        printing: None,
    };
    eprintln!(
        "session {id} · model {} · workspace {}",
        session["model"].as_str().unwrap_or("?"),
        session["workspace"].as_str().unwrap_or("?")
    );
    eprintln!("Enter sends; Ctrl-C cancels a run, twice leaves; Ctrl-D leaves.");
    let status = session["status"].as_str().unwrap_or("");
    let mut state = State::Idle;
    if matches!(status, "interrupted" | "error") {
        if let Some(run_id) = chat.offer_resume(status)? {
            state = State::Running { run_id, asking: None, cancelled: false };
        }
    }
    chat.run(state)
}

fn create(client: &Client, args: &ChatArgs) -> Result<Value, CliError> {
    let mut body = json!({});
    if let Some(model) = &args.model {
        body["model"] = json!(model);
    }
    if let Some(dir) = &args.workspace {
        let dir = dir.canonicalize().map_err(|e| CliError::Usage(format!("--workspace {}: {e}", dir.display())))?;
        body["workspace"] = json!(dir.to_string_lossy());
    }
    Ok(client.call("POST", "/api/sessions", Some(&body))?["session"].clone())
}

/// The session's events, parsed; `None` once the stream ends.
fn spawn_events(mut frames: super::client::Frames) -> Receiver<Option<Value>> {
    let (tx, rx) = unbounded();
    std::thread::spawn(move || {
        while let Some(frame) = frames.next_frame() {
            if let Ok(envelope) = serde_json::from_str::<Value>(&frame.data) {
                if tx.send(Some(envelope["event"].clone())).is_err() {
                    return;
                }
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// stdin's lines; `None` at its end.
fn spawn_lines() -> Receiver<Option<String>> {
    let (tx, rx) = unbounded();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// What one wait of the loop brought.
enum Input {
    Line(String),
    Eof,
    Event(Value),
    StreamEnded,
    Interrupt,
}

impl Chat {
    fn run(&mut self, mut state: State) -> Result<(), CliError> {
        loop {
            state = match state {
                State::Idle => match self.idle()? {
                    Some(run_id) => State::Running { run_id, asking: None, cancelled: false },
                    None => return Ok(()),
                },
                State::Running { run_id, asking, cancelled } => match self.running(run_id, asking, cancelled)? {
                    Some(next) => next,
                    None => return Ok(()),
                },
            };
        }
    }

    /// Waits for a line to send; the run it started, or `None` to leave.
    fn idle(&mut self) -> Result<Option<String>, CliError> {
        loop {
            self.prompt("> ");
            let line = match self.queued.pop_front() {
                Some(line) => line,
                None => match self.wait(false)? {
                    Input::Line(line) => line,
                    Input::Eof | Input::Interrupt => return Ok(None),
                    Input::Event(event) => {
                        self.show_outside_run(&event);
                        continue;
                    }
                    Input::StreamEnded => return Err(CliError::Failed("the server closed the event stream".into())),
                },
            };
            self.echo(&line);
            let text = line.trim();
            if text.is_empty() {
                continue;
            }
            if matches!(text, "/quit" | "/exit") {
                return Ok(None);
            }
            let path = format!("/api/sessions/{}/messages", self.session);
            match self.client.call("POST", &path, Some(&json!({ "content": text }))) {
                Ok(sent) => return Ok(sent["runId"].as_str().map(str::to_string)),
                Err(error) => eprintln!("kestrel: {error}"),
            }
        }
    }

    /// One input while run `run_id` goes on; the next state, or `None` to leave.
    fn running(
        &mut self,
        run_id: String,
        mut asking: Option<Asking>,
        cancelled: bool,
    ) -> Result<Option<State>, CliError> {
        // A line typed earlier answers a pending question first; once the input has ended,
        // its end is the answer (no note, or a denial), so the run never waits for a line
        // that cannot come.
        if let Some(ask) = asking.as_mut() {
            if let Some(line) = self.queued.pop_front() {
                self.answer(ask, &line)?;
                return Ok(Some(State::Running { run_id, asking: asking.filter(|a| !a.done()), cancelled }));
            }
            if self.stdin_done {
                self.answer_at_end_of_input(ask);
                return Ok(Some(State::Running { run_id, asking: None, cancelled }));
            }
        }
        let same = |asking, cancelled| Ok(Some(State::Running { run_id: run_id.clone(), asking, cancelled }));
        match self.wait(true)? {
            Input::Line(line) => {
                self.queued.push_back(line);
                same(asking, cancelled)
            }
            Input::Eof => same(asking, cancelled),
            Input::StreamEnded => Err(CliError::Failed("the server closed the event stream".into())),
            Input::Interrupt if cancelled => {
                eprintln!();
                Ok(None)
            }
            Input::Interrupt => {
                eprintln!("\ncancelling (Ctrl-C again leaves)");
                let path = format!("/api/sessions/{}/cancel", self.session);
                if let Err(error) = self.client.call("POST", &path, None) {
                    eprintln!("kestrel: {error}");
                }
                same(asking, true)
            }
            Input::Event(event) => {
                let ended = event["runId"] == run_id.as_str()
                    && matches!(event["type"].as_str(), Some("run.finished" | "run.failed"));
                if let Some(approval) = self.show(&event) {
                    self.prompt(APPROVE);
                    let asking = Asking { approval_id: approval, approved: None, remember: false, editing: None };
                    return same(Some(asking), cancelled);
                }
                match ended {
                    true => Ok(Some(State::Idle)),
                    false => same(asking, cancelled),
                }
            }
        }
    }

    /// Waits for the next input. While a run goes on (`running`), stdin's end is remembered
    /// and the run is still followed.
    fn wait(&mut self, running: bool) -> Result<Input, CliError> {
        if self.stdin_done && !running {
            return Ok(Input::Eof);
        }
        let lines = match self.stdin_done {
            true => crossbeam_channel::never(),
            false => self.lines.clone(),
        };
        Ok(select! {
            recv(lines) -> line => match line.ok().flatten() {
                Some(line) => Input::Line(line),
                None => {
                    self.stdin_done = true;
                    if running { return self.wait(running); }
                    Input::Eof
                }
            },
            recv(self.events) -> event => match event.ok().flatten() {
                Some(event) => Input::Event(event),
                None => Input::StreamEnded,
            },
            recv(self.interrupts) -> _ => Input::Interrupt,
        })
    }

    fn prompt(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{text}").and_then(|()| out.flush());
    }

    /// An answer to the approval asked: first y/n/a/e (after `e`, the arguments), then the
    /// note, then the decision is sent. A decision the server refuses (an edit the tool's
    /// schema or the rules refuse) is said, and the question is asked again.
    fn answer(&mut self, ask: &mut Asking, line: &str) -> Result<(), CliError> {
        self.echo(line);
        if let Some(None) = ask.editing {
            match serde_json::from_str::<Value>(line.trim()) {
                Ok(arguments) if arguments.is_object() => ask.editing = Some(Some(arguments)),
                _ => {
                    self.prompt(&format!("not a JSON object; {EDIT}"));
                    return Ok(());
                }
            }
            self.prompt("note (optional, Enter for none): ");
            return Ok(());
        }
        let Some(approved) = ask.approved else {
            match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => ask.approved = Some(true),
                "n" | "no" => ask.approved = Some(false),
                "a" | "always" => (ask.approved, ask.remember) = (Some(true), true),
                "e" | "edit" => {
                    (ask.approved, ask.editing) = (Some(true), Some(None));
                    self.prompt(EDIT);
                    return Ok(());
                }
                _ => {
                    self.prompt("please answer y, n, a or e: ");
                    return Ok(());
                }
            }
            self.prompt("note (optional, Enter for none): ");
            return Ok(());
        };
        let mut decision = json!({ "approved": approved });
        if !line.trim().is_empty() {
            decision["note"] = json!(line.trim());
        }
        if ask.remember {
            decision["remember"] = json!("session");
        }
        if let Some(Some(arguments)) = ask.editing.take() {
            decision["arguments"] = arguments;
        }
        let path = format!("/api/sessions/{}/approvals/{}", self.session, ask.approval_id);
        match self.client.call("POST", &path, Some(&decision)) {
            Ok(_) => ask.approval_id.clear(),
            Err(error) => {
                eprintln!("kestrel: {error}");
                (ask.approved, ask.remember) = (None, false);
                self.prompt(APPROVE);
            }
        }
        Ok(())
    }

    /// The input ended while an approval was asked: after a y/n/a (or a whole edit), the
    /// decision goes without a note; before one, or in the middle of an edit, the call is
    /// denied (nobody can approve it any more).
    fn answer_at_end_of_input(&mut self, ask: &mut Asking) {
        let decision = match (ask.approved, ask.editing.take()) {
            (None, _) | (Some(_), Some(None)) => {
                self.line("(no answer: the input ended; denied)");
                json!({ "approved": false, "note": "no answer: the terminal's input ended" })
            }
            (Some(approved), edit) => {
                let mut decision = json!({ "approved": approved });
                if ask.remember {
                    decision["remember"] = json!("session");
                }
                if let Some(Some(arguments)) = edit {
                    decision["arguments"] = arguments;
                }
                decision
            }
        };
        let path = format!("/api/sessions/{}/approvals/{}", self.session, ask.approval_id);
        if let Err(error) = self.client.call("POST", &path, Some(&decision)) {
            eprintln!("kestrel: {error}");
        }
        ask.approval_id.clear();
    }

    /// Offers to resume an interrupted (or failed) run; the resumed run's id.
    fn offer_resume(&mut self, status: &str) -> Result<Option<String>, CliError> {
        self.prompt(&format!(
            "The last run {}. Resume it? [y/N] ",
            if status == "error" { "failed" } else { "was interrupted" }
        ));
        let line = match self.queued.pop_front() {
            Some(line) => Some(line),
            None => loop {
                match self.wait(false)? {
                    Input::Line(line) => break Some(line),
                    Input::Event(_) => continue,
                    _ => break None,
                }
            },
        };
        if !matches!(line.as_deref().map(str::trim), Some("y" | "Y" | "yes")) {
            return Ok(None);
        }
        let resumed = self.client.call("POST", &format!("/api/sessions/{}/resume", self.session), None)?;
        Ok(resumed["runId"].as_str().map(str::to_string))
    }

    /// Prints an event of the run; the approval id when it asks for one.
    fn show(&mut self, event: &Value) -> Option<String> {
        let text = |value: &Value| value.as_str().unwrap_or("").to_string();
        match event["type"].as_str().unwrap_or("") {
            "message.delta" => {
                let channel = text(&event["channel"]);
                if self.printing.as_deref().is_some_and(|c| c != channel) {
                    self.line("");
                }
                let delta = text(&event["delta"]);
                let shown = match (channel.as_str(), self.tty) {
                    ("reasoning", true) => format!("\x1b[2m{delta}\x1b[0m"),
                    ("reasoning", false) if self.printing.as_deref() != Some("reasoning") => {
                        format!("(thinking) {delta}")
                    }
                    _ => delta,
                };
                self.prompt(&shown);
                self.printing = Some(channel);
            }
            "message.completed" if self.printing.is_some() => self.line(""),
            "tool.started" => {
                let call = &event["call"];
                let arguments = first_line(&call["arguments"].to_string());
                let rule = &event["permission"]["rule"];
                let decided = match (event["permission"]["outcome"].as_str(), rule.is_object()) {
                    (Some(outcome), true) => {
                        let pattern = rule["match"].as_str().map(|p| format!(" {p}")).unwrap_or_default();
                        format!("  [{outcome}: rule {} {}{pattern}]", text(&rule["outcome"]), text(&rule["tool"]))
                    }
                    _ => String::new(),
                };
                self.line(&format!("⚙ {}({arguments}){decided}", text(&call["name"])));
            }
            "tool.finished" => {
                let result = &event["result"];
                let mark = if result["ok"] == true { "✓" } else { "✗" };
                self.line(&format!("  {mark} {}: {}", text(&result["name"]), first_line(&text(&result["content"]))));
            }
            "approval.requested" => {
                let approval = &event["approval"];
                match approval["withheld"].as_array() {
                    // Paths the call's walk withheld: y runs it again with them (no a, no e).
                    Some(paths) => self.line(&format!(
                        "? {} withheld paths a rule asks about; run it again with {}",
                        text(&approval["toolName"]),
                        paths.iter().map(text).collect::<Vec<_>>().join(", ")
                    )),
                    None => self.line(&format!(
                        "? {} wants to run with {}",
                        text(&approval["toolName"]),
                        approval["arguments"]
                    )),
                }
                return Some(text(&approval["id"]));
            }
            "run.finished" => {
                let usage = &event["usage"];
                self.dim(&format!(
                    "({} · {} in, {} out tokens)",
                    text(&event["status"]),
                    usage["inputTokens"].as_u64().unwrap_or(0),
                    usage["outputTokens"].as_u64().unwrap_or(0)
                ));
            }
            "run.failed" => self.line(&format!("run failed: {}", text(&event["error"]))),
            "notice" => self.line(&format!("[{}] {}", text(&event["level"]), text(&event["message"]))),
            _ => {}
        }
        None
    }

    /// Events between runs (another client's run, a notice): shown as they come.
    fn show_outside_run(&mut self, event: &Value) {
        if event["type"] == "notice" {
            self.show(event);
        }
    }

    /// A line read from a stdin that is not a terminal, shown after its prompt.
    fn echo(&mut self, line: &str) {
        if self.echo_input {
            self.line(line);
        }
    }

    fn line(&mut self, text: &str) {
        self.printing = None;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}").and_then(|()| out.flush());
    }

    fn dim(&mut self, text: &str) {
        match self.tty {
            true => self.line(&format!("\x1b[2m{text}\x1b[0m")),
            false => self.line(text),
        }
    }
}

impl Asking {
    /// The decision has been sent.
    fn done(&self) -> bool {
        self.approval_id.is_empty()
    }
}
