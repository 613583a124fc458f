//! `/api/schedules`: scheduled runs of the caller's tenant (docs/schedules.md).
//!
//! A schedule on the wire: `{id, cron, timezone, sessionId? | session?, message, catchUp,
//! paused, nextFireAt, lastFiredAt, createdAt, updatedAt}`; a fire: `{dueAt, at, outcome:
//! "fired" | "skipped", reason?, sessionId?, runId?}`.

use serde_json::{json, Map, Value};

use super::body::JsonBody;
use super::{json, ApiError, Caller, KestrelApi};
use crate::http::{Reply, Request};
use crate::schedule::{CatchUp, Fire, NewSchedule, Schedule, ScheduleError, Target};

/// Kestrel's extension's error codes for schedules.
impl From<ScheduleError> for ApiError {
    fn from(error: ScheduleError) -> ApiError {
        let message = error.to_string();
        match error {
            ScheduleError::Timing(_) | ScheduleError::TooFrequent { .. } | ScheduleError::Message(_) => {
                ApiError::bad_request("invalid_schedule", message)
            }
            ScheduleError::NotFound => ApiError::new(404, "schedule_not_found", message),
            ScheduleError::TooMany => ApiError::new(409, "schedule_limit", message),
            ScheduleError::Engine(error) => ApiError::from(error),
        }
    }
}

pub fn list(api: &KestrelApi, caller: &Caller) -> Result<Reply, ApiError> {
    let schedules = api.schedules.list(&caller.tenant)?;
    Ok(json(200, &json!({ "schedules": schedules.iter().map(schedule_json).collect::<Vec<_>>() })))
}

pub fn create(api: &KestrelApi, caller: &Caller, request: &mut Request) -> Result<Reply, ApiError> {
    let body = JsonBody::read(request)?;
    let new = new_schedule(&body)?;
    let schedule = api.schedules.create(&caller.tenant, new)?;
    Ok(json(201, &json!({ "schedule": schedule_json(&schedule) })))
}

pub fn get(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    let (schedule, fires) = api.schedules.get(&caller.tenant, id)?;
    let fires: Vec<Value> = fires.iter().map(fire_json).collect();
    Ok(json(200, &json!({ "schedule": schedule_json(&schedule), "fires": fires })))
}

pub fn delete(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    api.schedules.delete(&caller.tenant, id)?;
    Ok(json(200, &json!({ "deleted": true })))
}

pub fn set_paused(api: &KestrelApi, caller: &Caller, id: &str, paused: bool) -> Result<Reply, ApiError> {
    let schedule = api.schedules.set_paused(&caller.tenant, id, paused)?;
    Ok(json(200, &json!({ "schedule": schedule_json(&schedule) })))
}

/// Fires it now: `200 {fire}` (a skip is a fire too, with its reason).
pub fn run_now(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    let fire = api.schedules.run_now(&caller.tenant, id)?;
    Ok(json(200, &json!({ "fire": fire_json(&fire) })))
}

fn new_schedule(body: &JsonBody) -> Result<NewSchedule, ApiError> {
    let invalid = |why: &str| ApiError::bad_request("invalid_schedule", why.to_string());
    let text = |name: &str| match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(invalid(&format!("`{name}` must be a string"))),
    };
    let cron = text("cron")?.ok_or_else(|| invalid("`cron` is required"))?;
    let timezone = text("timezone")?.unwrap_or_else(|| "UTC".to_string());
    let target = match (body.get("sessionId"), body.get("session")) {
        (Some(Value::String(id)), None) => Target::SessionId(id.clone()),
        (None, Some(Value::Object(spec))) => Target::Session(session_spec(spec)?),
        _ => return Err(invalid("give either `sessionId` (a string) or `session` (an object)")),
    };
    let message = match body.get("message") {
        Some(Value::String(content)) => content.clone(),
        Some(Value::Object(message)) => match message.get("content") {
            Some(Value::String(content)) => content.clone(),
            _ => return Err(invalid("`message.content` must be a string")),
        },
        _ => return Err(invalid("`message` is required: a string, or `{content}`")),
    };
    let catch_up = match text("catchUp")? {
        None => CatchUp::None,
        Some(text) => CatchUp::parse(&text).ok_or_else(|| invalid("`catchUp` must be \"none\" or \"latest\""))?,
    };
    Ok(NewSchedule { cron, timezone, target, message, catch_up })
}

fn session_spec(spec: &Map<String, Value>) -> Result<crate::schedule::NewSessionSpec, ApiError> {
    let field = |name: &str| match spec.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(ApiError::bad_request("invalid_schedule", format!("`session.{name}` must be a string"))),
    };
    if let Some(unknown) = spec.keys().find(|key| !["title", "model", "workspace"].contains(&key.as_str())) {
        return Err(ApiError::bad_request("invalid_schedule", format!("`session.{unknown}` is not a field")));
    }
    Ok(crate::schedule::NewSessionSpec {
        title: field("title")?,
        model: field("model")?,
        workspace: field("workspace")?,
    })
}

fn schedule_json(schedule: &Schedule) -> Value {
    let mut object = Map::new();
    object.insert("id".into(), json!(schedule.id));
    object.insert("cron".into(), json!(schedule.cron));
    object.insert("timezone".into(), json!(schedule.timezone));
    match &schedule.target {
        Target::SessionId(id) => object.insert("sessionId".into(), json!(id)),
        Target::Session(spec) => object.insert("session".into(), json!(spec)),
    };
    object.insert("message".into(), json!({ "content": schedule.message }));
    object.insert("catchUp".into(), json!(schedule.catch_up.as_str()));
    object.insert("paused".into(), json!(schedule.paused));
    let next = schedule.next_at.map(crate::time::rfc3339_from_millis);
    object.insert("nextFireAt".into(), json!(next));
    object.insert("lastFiredAt".into(), json!(schedule.last_fired_at));
    object.insert("createdAt".into(), json!(schedule.created_at));
    object.insert("updatedAt".into(), json!(schedule.updated_at));
    Value::Object(object)
}

fn fire_json(fire: &Fire) -> Value {
    let mut object = Map::new();
    object.insert("dueAt".into(), json!(fire.due_at));
    object.insert("at".into(), json!(fire.at));
    object.insert("outcome".into(), json!(fire.outcome.as_str()));
    for (name, value) in [("reason", &fire.reason), ("sessionId", &fire.session_id), ("runId", &fire.run_id)] {
        if let Some(value) = value {
            object.insert(name.into(), json!(value));
        }
    }
    Value::Object(object)
}
