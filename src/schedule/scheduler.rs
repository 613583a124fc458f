//! `Schedules`, what the API calls (create, list, pause, resume, run now, delete), and the
//! `kestrel-scheduler` thread that fires them: it keeps every active schedule's next fire in
//! order, sleeps until the first by the server's clock (or until a change wakes it), fires
//! what is due, and at start applies each schedule's `catch_up` to the fires it missed.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

use super::{fire, CatchUp, Fire, Schedule, Target, Timing, TimingError};
use crate::clock::Clock;
use crate::engine::{Engine, EngineError, TurnPlan};
use crate::store::{ScheduleWrite, StoreError, WriteOp};

/// The plan a fire's run takes (the Kestrel door's).
pub type PlanFactory = Arc<dyn Fn() -> Box<dyn TurnPlan> + Send + Sync>;

/// Schedules a tenant may have.
pub const MAX_PER_TENANT: usize = 100;
/// The longest message a schedule sends, in characters.
pub const MAX_MESSAGE_CHARS: usize = 100_000;
/// Fires shown with a schedule.
pub const FIRES_SHOWN: usize = 20;

pub(super) struct Context {
    pub(super) engine: Engine,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) plan: PlanFactory,
    /// The shortest time between two fires of one schedule (`schedules.min_interval_secs`).
    pub(super) min_interval_ms: i64,
}

/// The API's handle on the schedules.
#[derive(Clone)]
pub struct Schedules {
    context: Arc<Context>,
    wake: Sender<Msg>,
}

/// The scheduler thread, stopped and joined by `shutdown` (or when dropped).
pub struct SchedulerHandle {
    wake: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

enum Msg {
    /// A schedule changed: read it again.
    Reload(String),
    /// The clock moved by hand.
    Wake,
    Stop,
}

/// A new schedule, as asked for.
pub struct NewSchedule {
    pub cron: String,
    pub timezone: String,
    pub target: Target,
    pub message: String,
    pub catch_up: CatchUp,
}

#[derive(Debug)]
pub enum ScheduleError {
    Timing(TimingError),
    /// The cron fires more often than `schedules.min_interval_secs`: its shortest gap and the
    /// minimum, in seconds.
    TooFrequent {
        gap_secs: f64,
        min_secs: i64,
    },
    /// A message that is empty or too long: why.
    Message(String),
    NotFound,
    /// The tenant has `MAX_PER_TENANT` already.
    TooMany,
    Engine(EngineError),
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleError::Timing(error) => write!(f, "{error}"),
            ScheduleError::TooFrequent { gap_secs, min_secs } => write!(
                f,
                "`cron` fires twice within {gap_secs} s; on this server a schedule fires at most once every \
                 {min_secs} s (`schedules.min_interval_secs`)"
            ),
            ScheduleError::Message(why) => write!(f, "{why}"),
            ScheduleError::NotFound => write!(f, "no schedule with that id"),
            ScheduleError::TooMany => write!(f, "a tenant may have at most {MAX_PER_TENANT} schedules"),
            ScheduleError::Engine(error) => write!(f, "{error}"),
        }
    }
}

impl From<EngineError> for ScheduleError {
    fn from(error: EngineError) -> Self {
        ScheduleError::Engine(error)
    }
}

impl From<StoreError> for ScheduleError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound => ScheduleError::NotFound,
            error => ScheduleError::Engine(error.into()),
        }
    }
}

impl Schedules {
    /// Starts the scheduler thread over the stored schedules.
    pub fn start(
        engine: Engine,
        clock: Arc<dyn Clock>,
        plan: PlanFactory,
        settings: &crate::config::SchedulesConfig,
    ) -> std::io::Result<(Schedules, SchedulerHandle)> {
        let (wake, inbox) = unbounded();
        let waker = wake.clone();
        clock.on_change(Box::new(move || {
            let _ = waker.send(Msg::Wake);
        }));
        let min_interval_ms = i64::try_from(settings.min_interval_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        let context = Arc::new(Context { engine, clock, plan, min_interval_ms });
        let scheduler = Scheduler { context: Arc::clone(&context), due: BTreeSet::new(), next: HashMap::new() };
        let thread =
            std::thread::Builder::new().name("kestrel-scheduler".into()).spawn(move || scheduler.run(inbox))?;
        let handle = SchedulerHandle { wake: wake.clone(), thread: Some(thread) };
        Ok((Schedules { context, wake }, handle))
    }

    pub fn create(&self, tenant: &str, new: NewSchedule) -> Result<Schedule, ScheduleError> {
        let timing = Timing::parse(&new.cron, &new.timezone).map_err(ScheduleError::Timing)?;
        check_message(&new.message)?;
        let engine = &self.context.engine;
        match &new.target {
            Target::SessionId(id) => engine.check_session(tenant, id)?,
            Target::Session(spec) => {
                engine.check_new_session(tenant, spec.model.clone(), spec.workspace.as_deref())?;
            }
        }
        if engine.store().readers().schedules_of(tenant)?.len() >= MAX_PER_TENANT {
            return Err(ScheduleError::TooMany);
        }
        let now_ms = self.context.clock.now_ms();
        let next_at = timing.next_after(now_ms).ok_or(ScheduleError::Timing(TimingError::Never))?;
        let min_interval = self.context.min_interval_ms;
        if let Some(gap) = timing.shortest_gap(now_ms).filter(|gap| *gap < min_interval) {
            return Err(ScheduleError::TooFrequent { gap_secs: gap as f64 / 1000.0, min_secs: min_interval / 1000 });
        }
        let now = crate::time::now_rfc3339();
        let schedule = Schedule {
            id: crate::domain::new_id("sch"),
            tenant: tenant.to_string(),
            cron: new.cron.split_whitespace().collect::<Vec<_>>().join(" "),
            timezone: new.timezone,
            target: new.target,
            message: new.message,
            catch_up: new.catch_up,
            paused: false,
            next_at: Some(next_at),
            last_fired_at: None,
            created_at: now.clone(),
            updated_at: now,
        };
        engine.store().write(vec![WriteOp::Schedule(ScheduleWrite::Insert(schedule.clone()))])?;
        self.changed(&schedule.id);
        Ok(schedule)
    }

    pub fn list(&self, tenant: &str) -> Result<Vec<Schedule>, ScheduleError> {
        Ok(self.context.engine.store().readers().schedules_of(tenant)?)
    }

    /// A tenant's schedule with its latest fires, newest first.
    pub fn get(&self, tenant: &str, id: &str) -> Result<(Schedule, Vec<Fire>), ScheduleError> {
        let schedule = self.owned(tenant, id)?;
        let fires = self.context.engine.store().readers().fires(id, FIRES_SHOWN)?;
        Ok((schedule, fires))
    }

    /// Pauses (no fires) or resumes (from now on: what it missed while paused is not fired).
    pub fn set_paused(&self, tenant: &str, id: &str, paused: bool) -> Result<Schedule, ScheduleError> {
        let schedule = self.owned(tenant, id)?;
        let next_at = match paused {
            true => None,
            false => Some(self.next_of(&schedule)?),
        };
        let updated_at = crate::time::now_rfc3339();
        let write = ScheduleWrite::SetPaused { tenant: tenant.into(), id: id.into(), paused, next_at, updated_at };
        self.context.engine.store().write(vec![WriteOp::Schedule(write)])?;
        self.changed(id);
        self.owned(tenant, id)
    }

    pub fn delete(&self, tenant: &str, id: &str) -> Result<(), ScheduleError> {
        let write = ScheduleWrite::Delete { tenant: tenant.into(), id: id.into() };
        self.context.engine.store().write(vec![WriteOp::Schedule(write)])?;
        self.changed(id);
        Ok(())
    }

    /// Fires a schedule now, paused or not, unless it fired less than the minimum interval
    /// ago (then the fire is skipped); its next fire stays as it was.
    pub fn run_now(&self, tenant: &str, id: &str) -> Result<Fire, ScheduleError> {
        let schedule = self.owned(tenant, id)?;
        let now = self.context.clock.now_ms();
        let done = match fire::too_soon(&self.context, &schedule, now) {
            Some(_) => fire::skip(&self.context, &schedule, now, fire::MIN_INTERVAL, schedule.next_at),
            None => fire::fire(&self.context, &schedule, now, schedule.next_at),
        };
        done.ok_or(ScheduleError::NotFound)
    }

    fn owned(&self, tenant: &str, id: &str) -> Result<Schedule, ScheduleError> {
        let found = self.context.engine.store().readers().schedule(id)?;
        found.filter(|schedule| schedule.tenant == tenant).ok_or(ScheduleError::NotFound)
    }

    fn next_of(&self, schedule: &Schedule) -> Result<i64, ScheduleError> {
        let timing = Timing::parse(&schedule.cron, &schedule.timezone).map_err(ScheduleError::Timing)?;
        timing.next_after(self.context.clock.now_ms()).ok_or(ScheduleError::Timing(TimingError::Never))
    }

    fn changed(&self, id: &str) {
        let _ = self.wake.send(Msg::Reload(id.to_string()));
    }
}

fn check_message(message: &str) -> Result<(), ScheduleError> {
    if message.trim().is_empty() {
        return Err(ScheduleError::Message("`message` must have text".into()));
    }
    if message.chars().count() > MAX_MESSAGE_CHARS {
        return Err(ScheduleError::Message(format!("`message` is longer than {MAX_MESSAGE_CHARS} characters")));
    }
    Ok(())
}

impl SchedulerHandle {
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.wake.send(Msg::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for SchedulerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread's state: every active schedule by its next fire.
struct Scheduler {
    context: Arc<Context>,
    due: BTreeSet<(i64, String)>,
    next: HashMap<String, i64>,
}

impl Scheduler {
    fn run(mut self, inbox: Receiver<Msg>) {
        self.start();
        loop {
            let message = match self.due.first().map(|(at, _)| *at) {
                None => inbox.recv().ok(),
                Some(at) if at <= self.context.clock.now_ms() => {
                    self.fire_due();
                    continue;
                }
                Some(at) => match self.context.clock.wait_hint(at) {
                    None => inbox.recv().ok(),
                    Some(wait) => match inbox.recv_timeout(wait) {
                        Ok(message) => Some(message),
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => None,
                    },
                },
            };
            match message {
                None | Some(Msg::Stop) => return,
                Some(Msg::Reload(id)) => self.reload(&id),
                Some(Msg::Wake) => {}
            }
        }
    }

    /// Loads the active schedules; those whose fire came while the server was down follow
    /// their `catch_up`.
    fn start(&mut self) {
        let active = match self.context.engine.store().readers().active_schedules() {
            Ok(active) => active,
            Err(error) => return log::error!("schedules were not loaded; none will fire: {error}"),
        };
        let now = self.context.clock.now_ms();
        for schedule in active {
            match schedule.next_at {
                Some(at) if at <= now => self.catch_up(&schedule, at, now),
                Some(at) => self.keep(&schedule.id, at),
                None => {}
            }
        }
    }

    /// A schedule whose fire at `missed` passed while the server was down.
    fn catch_up(&mut self, schedule: &Schedule, missed: i64, now: i64) {
        let Ok(timing) = Timing::parse(&schedule.cron, &schedule.timezone) else { return };
        let next = match schedule.catch_up {
            CatchUp::None => {
                let next = timing.next_after(now);
                fire::skip(&self.context, schedule, missed, "missed", next);
                next
            }
            CatchUp::Latest => {
                let latest = timing.last_at_or_before(now).unwrap_or(missed);
                self.fire_paced(schedule, &timing, latest, now)
            }
        };
        if let Some(next) = next {
            self.keep(&schedule.id, next);
        }
    }

    /// Fires `schedule`, due at `due`, unless it fired less than the minimum interval before
    /// `now`: then the fire is skipped, and its next fire is the first the interval allows
    /// (one skip recorded per interval, however often the cron says). The next fire.
    fn fire_paced(&self, schedule: &Schedule, timing: &Timing, due: i64, now: i64) -> Option<i64> {
        match fire::too_soon(&self.context, schedule, now) {
            Some(allowed_from) => {
                let next = timing.next_after(allowed_from - 1);
                fire::skip(&self.context, schedule, due, fire::MIN_INTERVAL, next).and(next)
            }
            None => {
                let next = timing.next_after(now);
                fire::fire(&self.context, schedule, due, next).and(next)
            }
        }
    }

    /// Fires every schedule due by now, each once, and keeps its next fire.
    fn fire_due(&mut self) {
        let now = self.context.clock.now_ms();
        while let Some((at, id)) = self.due.first().cloned().filter(|(at, _)| *at <= now) {
            self.forget(&id);
            let schedule = match self.context.engine.store().readers().schedule(&id) {
                Ok(Some(schedule)) if !schedule.paused => schedule,
                Ok(_) => continue,
                Err(error) => {
                    log::error!("schedule {id} was not read; it fires no more until a restart: {error}");
                    continue;
                }
            };
            let Ok(timing) = Timing::parse(&schedule.cron, &schedule.timezone) else {
                log::error!("schedule {id}'s cron no longer parses; it fires no more");
                continue;
            };
            if let Some(next) = self.fire_paced(&schedule, &timing, at, now) {
                self.keep(&id, next);
            }
        }
    }

    fn reload(&mut self, id: &str) {
        self.forget(id);
        match self.context.engine.store().readers().schedule(id) {
            Ok(Some(schedule)) if !schedule.paused => {
                if let Some(at) = schedule.next_at {
                    self.keep(id, at);
                }
            }
            Ok(_) => {}
            Err(error) => log::error!("schedule {id} was not read again: {error}"),
        }
    }

    fn keep(&mut self, id: &str, at: i64) {
        self.forget(id);
        self.due.insert((at, id.to_string()));
        self.next.insert(id.to_string(), at);
    }

    fn forget(&mut self, id: &str) {
        if let Some(at) = self.next.remove(id) {
            self.due.remove(&(at, id.to_string()));
        }
    }
}
