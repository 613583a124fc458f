//! A BAE session's one remote sandbox, as state of the session's actor: start (from an image
//! in the session's own profile's `available_sandboxes`), stop, and the handle an exec uses.
//! The actor checks and keeps the state; the image pull, the container start and the stop run
//! on `kestrel-slow` workers, so a slow registry or engine never holds up the session's other
//! operations (a close cancels a start under way). An exec runs on the caller's thread with
//! the handle the actor gave it, so a long command never holds the session up, and is killed
//! when the sandbox stops (a token the stop cancels). Close stops the sandbox (`reason:
//! session_close`). A turn's auto-mode sandbox tool asks the actor for the handle and runs
//! its command the same way, killed by the turn's cancel (`call_sandbox`).

use super::bae;
use super::turn::BaeRun;
use super::Bae;
use std::sync::Arc;

use crossbeam_channel::Sender;

use super::runtime::BaeSession;
use super::runtime::{BaeDone, RpcError};
use crate::domain::{Event, ImageStatus};
use crate::engine::session::Done;
use crate::sandbox::{Driver, Running};
use crate::store::BaeState;

/// The engine's sandbox driver (its `Debug` names it only).
#[derive(Clone)]
pub struct SandboxDriver(pub Arc<dyn Driver>);

impl std::fmt::Debug for SandboxDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SandboxDriver(isolated: {})", self.0.isolated())
    }
}

impl Bae {
    /// Queues every live profile's images for provisioning (at start).
    pub fn provision_profiles(&self) -> Result<(), super::BaeError> {
        let mut after = 0;
        loop {
            let page = self.engine.shared.store.readers().bae_profiles(after, 200)?;
            for profile in &page.items {
                bae(&self.engine.shared).images.provision(&profile.available_sandboxes);
            }
            match page.next {
                Some(next) => after = next,
                None => return Ok(()),
            }
        }
    }

    /// Each image's provisioning status, in the order given.
    pub fn image_statuses(&self, images: &[String]) -> Vec<ImageStatus> {
        images.iter().map(|name| image_status(&bae(&self.engine.shared).images, name)).collect()
    }

    /// Runs `command` in the session's sandbox on the caller's thread, killed (exit code -1)
    /// once `stopped` fires (the sandbox stopped, or its session closed); a driver failure is
    /// logged as `session.sandbox.error` (phase exec) and answered -32000.
    pub fn sandbox_exec(
        &self,
        session_id: &str,
        key: &str,
        sandbox: &Running,
        command: &str,
        stopped: &crossbeam_channel::Receiver<()>,
    ) -> Result<crate::sandbox::ExecOutput, RpcError> {
        let settings = &bae(&self.engine.shared).settings;
        match crate::sandbox::exec_until(settings.sandbox.0.as_ref(), sandbox, command, settings.sandbox_exec, stopped)
        {
            Ok(output) => Ok(output),
            Err(error) => {
                let event = exec_failed(session_id, sandbox, &error.0, settings.sandbox.0.isolated());
                let origin = crate::bus::Origin { actor: Some(Arc::from(key)), turn: None };
                let tenant = Some(Arc::from(crate::store::BAE_TENANT));
                let _ = self.engine.shared.bus.publish_durable(tenant, origin, event);
                Err(RpcError::SandboxExecFailed(error.0))
            }
        }
    }
}

/// Who waits for a start, and the caller's reply.
pub(crate) type StartReply = Sender<Result<(Running, String), RpcError>>;

/// A sandbox start under way on a worker.
pub(crate) struct Starting {
    key: String,
    image: String,
    reply: StartReply,
    /// Dropped to cancel: the driver's command is killed.
    _cancel: Sender<()>,
}

/// A sandbox's stop, for a worker: the driver's stop, then `stopped` (or the error) recorded.
pub(crate) struct StopJob {
    shared: Arc<crate::engine::Shared>,
    key: String,
    running: Running,
    stopped: Event,
    failed: Event,
}

impl StopJob {
    pub(crate) fn run(self) -> Result<Running, RpcError> {
        match bae(&self.shared).settings.sandbox.0.stop(&self.running) {
            Ok(()) => {
                publish_as(&self.shared, &self.key, self.stopped);
                Ok(self.running)
            }
            Err(error) => {
                publish_as(&self.shared, &self.key, with_detail(self.failed, &error.0));
                Err(RpcError::SandboxStopFailed(error.0))
            }
        }
    }
}

/// A sandbox nobody holds any more (its start outlived a close), stopped on a worker.
fn stop_detached(shared: &Arc<crate::engine::Shared>, running: Running) {
    let shared = Arc::clone(shared);
    let stop = move || {
        if let Err(error) = bae(&shared).settings.sandbox.0.stop(&running) {
            log::warn!("sandbox {} started after its session closed did not stop: {error}", running.id);
        }
    };
    if let Err(error) = crate::workers::SLOW.spawn(stop) {
        log::error!("no worker to stop a sandbox: {error}");
    }
}

/// Publishes a BAE event attributed to `actor`, from any thread, and waits for it to be durable.
fn publish_as(shared: &crate::engine::Shared, actor: &str, event: Event) {
    let origin = crate::bus::Origin { actor: Some(Arc::from(actor)), turn: None };
    if shared.bus.publish_durable(Some(Arc::from(crate::store::BAE_TENANT)), origin, event).is_none() {
        log::warn!("a sandbox event could not be recorded");
    }
}

/// A `session.sandbox.error` event with its detail.
fn with_detail(event: Event, text: &str) -> Event {
    match event {
        Event::RemoteSandbox { session_id, step, image, sandbox_id, reason, phase, unsandboxed, .. } => {
            Event::RemoteSandbox {
                session_id,
                step,
                image,
                sandbox_id,
                reason,
                phase,
                detail: Some(text.into()),
                unsandboxed,
            }
        }
        other => other,
    }
}

/// `session.sandbox.error` for a command the driver could not run (phase exec).
fn exec_failed(session_id: &str, sandbox: &Running, detail: &str, isolated: bool) -> Event {
    Event::RemoteSandbox {
        session_id: session_id.to_string(),
        step: "error".into(),
        image: sandbox.image.clone(),
        sandbox_id: Some(sandbox.id.clone()),
        reason: None,
        phase: Some("exec".into()),
        detail: Some(detail.to_string()),
        unsandboxed: !isolated,
    }
}

fn image_status(images: &crate::sandbox::provision::Images, name: &str) -> ImageStatus {
    let state = images.state(name);
    ImageStatus { name: name.to_string(), status: state.name().into(), detail: state.detail().map(str::to_string) }
}

impl BaeSession<'_> {
    /// `session.sandbox.available`, when the session's profile (still) declares images.
    pub(crate) fn images_event(&self, profile_id: &str) -> Option<Event> {
        let profile = self.actor.shared.store.readers().bae_profile(profile_id).ok().flatten()?;
        if profile.available_sandboxes.is_empty() {
            return None;
        }
        let images = profile
            .available_sandboxes
            .iter()
            .map(|name| image_status(&bae(&self.actor.shared).images, name))
            .collect();
        Some(Event::SandboxImages { session_id: self.actor.id.clone(), images })
    }

    fn sandbox_event(&self, step: &str, image: &str, sandbox_id: Option<&str>) -> Event {
        Event::RemoteSandbox {
            session_id: self.actor.id.clone(),
            step: step.into(),
            image: image.into(),
            sandbox_id: sandbox_id.map(str::to_string),
            reason: None,
            phase: None,
            detail: None,
            unsandboxed: !bae(&self.actor.shared).settings.sandbox.0.isolated(),
        }
    }

    fn sandbox_error(&self, image: &str, sandbox_id: Option<&str>, phase: &str, detail: &str) -> Event {
        match self.sandbox_event("error", image, sandbox_id) {
            Event::RemoteSandbox { session_id, step, image, sandbox_id, unsandboxed, .. } => Event::RemoteSandbox {
                session_id,
                step,
                image,
                sandbox_id,
                reason: None,
                phase: Some(phase.into()),
                detail: Some(detail.into()),
                unsandboxed,
            },
            other => other,
        }
    }

    /// `session.startRemoteSandbox`: checks here, then the image pull and the container
    /// start on a worker (`sandbox_started` finishes), so the session answers everything
    /// else meanwhile. The reply is the sandbox and its `started_at`.
    pub(crate) fn start_sandbox(&mut self, key: String, image: String, reply: StartReply) {
        if let Err(error) = self.may_start_sandbox(&key, &image) {
            let _ = reply.send(Err(error));
            return;
        }
        if let Err(error) = self.publish_bae(&key, self.sandbox_event("start", &image, None)) {
            let _ = reply.send(Err(error));
            return;
        }
        let driver = Arc::clone(&bae(&self.actor.shared).settings.sandbox.0);
        let (cancel, cancelled) = crossbeam_channel::bounded::<()>(1);
        let pulled = image.clone();
        let started = self.actor.work(move || {
            let started = driver.ensure_image(&pulled, &cancelled).and_then(|()| driver.start(&pulled, &cancelled));
            Done::Door(Box::new(BaeDone::SandboxStarted(started)))
        });
        match started {
            true => self.state.starting = Some(Starting { key, image, reply, _cancel: cancel }),
            false => {
                let _ = reply.send(Err(RpcError::Internal));
            }
        }
    }

    /// Who may start a sandbox from which image, in BAE's order of checks.
    fn may_start_sandbox(&self, key: &str, image: &str) -> Result<(), RpcError> {
        if !self.state.drivers.contains(key) {
            return Err(RpcError::NotDriver);
        }
        let record = self.bae_record_open()?;
        let profile = match self.actor.shared.store.readers().bae_profile(&record.profile_id) {
            Ok(Some(profile)) => profile,
            Ok(None) => return Err(RpcError::ProfileUnavailable),
            Err(_) => return Err(RpcError::Internal),
        };
        if !profile.available_sandboxes.iter().any(|allowed| allowed == image) {
            return Err(RpcError::SandboxImageNotAllowed(image.to_string()));
        }
        if self.state.sandbox.is_some() || self.state.starting.is_some() {
            return Err(RpcError::SandboxAlreadyRunning);
        }
        Ok(())
    }

    /// A start's worker is done: the sandbox becomes the session's, or the start failed. A
    /// start the session's close cancelled meanwhile was answered then; a sandbox it still
    /// made is stopped.
    pub(crate) fn sandbox_started(&mut self, started: Result<Running, crate::sandbox::DriverError>) {
        let Some(Starting { key, image, reply, .. }) = self.state.starting.take() else {
            if let Ok(running) = started {
                stop_detached(&self.actor.shared, running);
            }
            return;
        };
        match started {
            Ok(mut running) => {
                // Every process run in it is the session's, for the orphan sweep.
                running.marker = Some(crate::tools::orphans::marker_value(&self.actor.id, &running.id));
                self.state.sandbox = Some(running.clone());
                self.state.sandbox_execs = Some(crate::cancel::Canceller::new());
                let outcome = self.publish_bae(&key, self.sandbox_event("running", &image, Some(&running.id)));
                let _ = reply.send(outcome.map(|()| (running, crate::time::now_rfc3339())));
            }
            Err(error) => {
                let _ = self.publish_bae(&key, self.sandbox_error(&image, None, "start", &error.0));
                let _ = reply.send(Err(RpcError::SandboxStartFailed(error.0)));
            }
        }
    }

    /// Another node holds the session now: a start under way is cancelled and a running
    /// sandbox stopped, with nothing announced (this node may no longer write the session).
    pub(crate) fn drop_sandbox_here(&mut self) {
        if let Some(Starting { reply, .. }) = self.state.starting.take() {
            let why = "the session moved to another node before its sandbox started";
            let _ = reply.send(Err(RpcError::SandboxStartFailed(why.into())));
        }
        if let Some(running) = self.state.sandbox.take() {
            self.end_execs();
            stop_detached(&self.actor.shared, running);
        }
    }

    /// The sandbox is going: the commands `execRemoteSandbox` runs in it are killed now, not
    /// when (or if) the driver's stop reaches them.
    fn end_execs(&mut self) {
        if let Some(execs) = self.state.sandbox_execs.take() {
            execs.cancel(crate::cancel::CancelReason::User);
        }
    }

    /// Close cancels a start under way: its command is killed and its caller answered.
    pub(crate) fn cancel_sandbox_start(&mut self, actor: &str) {
        let Some(Starting { image, reply, .. }) = self.state.starting.take() else { return };
        let why = "the session was closed before its sandbox started";
        let _ = self.publish_bae(actor, self.sandbox_error(&image, None, "start", why));
        let _ = reply.send(Err(RpcError::SandboxStartFailed(why.into())));
    }

    /// `session.stopRemoteSandbox` (`reason: explicit`) and close (`session_close`): the handle
    /// goes first, so a failed stop leaves no sandbox anything could still use, and `stop` is
    /// recorded; the stop itself is the returned job's, to run on a worker. `None`: no
    /// sandbox runs.
    pub(crate) fn stop_sandbox(&mut self, key: &str, reason: &str) -> Option<StopJob> {
        let running = self.state.sandbox.take()?;
        self.end_execs();
        let stop = self.with_reason(self.sandbox_event("stop", &running.image, Some(&running.id)), reason);
        let _ = self.publish_bae(key, stop);
        Some(StopJob {
            shared: Arc::clone(&self.actor.shared),
            key: key.to_string(),
            stopped: self.with_reason(self.sandbox_event("stopped", &running.image, Some(&running.id)), reason),
            failed: self.sandbox_error(&running.image, Some(&running.id), "stop", ""),
            running,
        })
    }

    fn with_reason(&self, event: Event, reason: &str) -> Event {
        match event {
            Event::RemoteSandbox { session_id, step, image, sandbox_id, unsandboxed, .. } => Event::RemoteSandbox {
                session_id,
                step,
                image,
                sandbox_id,
                reason: Some(reason.into()),
                phase: None,
                detail: None,
                unsandboxed,
            },
            other => other,
        }
    }

    /// `session.execRemoteSandbox`'s handle (no state check, as in BAE), and the token the
    /// sandbox's stop cancels.
    pub(crate) fn sandbox_handle(&self, key: &str) -> Result<(Running, crate::cancel::CancelToken), RpcError> {
        if !self.state.drivers.contains(key) {
            return Err(RpcError::NotDriver);
        }
        match (&self.state.sandbox, &self.state.sandbox_execs) {
            (Some(running), Some(execs)) => Ok((running.clone(), execs.token())),
            _ => Err(RpcError::SandboxNotRunning),
        }
    }

    fn bae_record_open(&self) -> Result<crate::store::BaeSessionRecord, RpcError> {
        match self.actor.shared.store.readers().bae_session(&self.actor.id) {
            Ok(Some(record)) if record.state == BaeState::Open => Ok(record),
            Ok(Some(record)) => Err(RpcError::NotOpen(record.state)),
            Ok(None) => Err(RpcError::Gone),
            Err(_) => Err(RpcError::Internal),
        }
    }
}

impl BaeRun<'_> {
    /// An auto-mode sandbox tool's call: `input.command` runs in the session's remote sandbox,
    /// with `sandbox.request`, `sandbox.response` and `tool.result` (BAE's content format).
    /// The turn's cancel kills the command at once: a cancel by a person or a close answers
    /// it with an error result; a shutdown's answers nothing (`None`), leaving the call to
    /// `recovery.rs`.
    pub(crate) fn call_sandbox(&self, call: &crate::domain::ToolCall) -> Option<crate::domain::ToolResult> {
        let command = call.arguments.get("command").and_then(serde_json::Value::as_str).map(str::to_string);
        let session_id = self.session_id.clone();
        self.publish(Event::SandboxRequest {
            session_id: session_id.clone(),
            tool: call.name.clone(),
            input: serde_json::Value::Object(call.arguments.clone()),
            command: command.clone(),
        });
        let (sandbox_id, outcome) = self.run_sandbox_command(call, command.as_deref());
        let (ok, result, error, text, failed) = match outcome {
            // Killed by the turn's cancel (a timeout kills with -1 too, but leaves it uncancelled).
            Ok(output) if output.exit_code == -1 && self.cancel.is_cancelled() => {
                if self.stopping() {
                    return None;
                }
                let why = "the command was cancelled with its turn".to_string();
                (false, None, Some(why.clone()), format!("sandbox error: {why}"), true)
            }
            Ok(output) => {
                let text = output_text(&output);
                let result = serde_json::json!({ "stdout": output.stdout, "stderr": output.stderr, "exit_code": output.exit_code, "truncated": output.truncated });
                (output.exit_code == 0, Some(result), None, text, output.exit_code != 0)
            }
            Err(why) => (false, None, Some(why.clone()), format!("sandbox error: {why}"), true),
        };
        self.publish(Event::SandboxResponse { session_id: session_id.clone(), sandbox_id, ok, result, error });
        let result = crate::domain::ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            ok: !failed,
            content: text.clone(),
            duration_ms: None,
            error: failed.then(|| text.clone()),
            data: None,
            blocks: Some(vec![serde_json::json!({ "type": "text", "text": text })]),
        };
        let dispatch = crate::domain::Dispatch::Sandbox;
        self.publish_settled(Event::ToolFinished { session_id, result: result.clone(), dispatch }, &call.id);
        Some(result)
    }

    /// The command's output, or why it did not run; and the sandbox it ran in. The turn's
    /// cancel kills it (and reaps what it started).
    fn run_sandbox_command(
        &self,
        call: &crate::domain::ToolCall,
        command: Option<&str>,
    ) -> (Option<String>, Result<crate::sandbox::ExecOutput, String>) {
        let Some(command) = command else {
            return (
                None,
                Err(format!("sandbox tool '{}' input is missing the required string \"command\"", call.name)),
            );
        };
        let Some(sandbox) = self.session_sandbox() else {
            let why =
                format!("no remote sandbox is running for tool '{}'; call session.startRemoteSandbox first", call.name);
            return (None, Err(why));
        };
        let settings = &bae(&self.shared).settings;
        let cancel = self.cancel.receiver();
        match crate::sandbox::exec_until(settings.sandbox.0.as_ref(), &sandbox, command, settings.sandbox_exec, cancel)
        {
            Ok(output) => (Some(sandbox.id), Ok(output)),
            Err(error) => {
                self.publish(exec_failed(&self.session_id, &sandbox, &error.0, settings.sandbox.0.isolated()));
                (Some(sandbox.id), Err(error.0))
            }
        }
    }
}

/// BAE's text of a sandbox command's output: stdout, then `[stderr]` and stderr if there is
/// any, then `[exit_code: N]` if it failed, then `[output truncated]` if a stream was cut at
/// the output limit, each on a line of its own.
fn output_text(output: &crate::sandbox::ExecOutput) -> String {
    let mut text = output.stdout.clone();
    let section = |text: &mut String, piece: &str| {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(piece);
    };
    if !output.stderr.trim().is_empty() {
        section(&mut text, &format!("[stderr]\n{}", output.stderr));
    }
    if output.exit_code != 0 {
        section(&mut text, &format!("[exit_code: {}]", output.exit_code));
    }
    if output.truncated {
        section(&mut text, "[output truncated]");
    }
    text
}
