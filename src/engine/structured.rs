//! Structured answers (docs/structured-answers.md): a message may ask that the turn's final
//! answer be a JSON value valid against a schema. The format is kept in the user message's
//! `meta.responseFormat`, so the newest user message says what the turn must answer, a resumed
//! turn included. A wire with native structured output is sent the schema
//! (`CompletionRequest::response_format`); every other wire is instructed in its system prompt.
//! Each final answer is validated here either way: a valid one carries the parsed value in
//! `meta.structured`; an invalid one carries `meta.structuredErrors`, and the turn asks once
//! more with the problems named (a stored user message marked `structuredRepair`), then fails
//! with `structured_output_invalid`.

use serde_json::{Map, Value};

use crate::domain::{Event, Message, ResponseFormat, Role};

use super::{EngineError, Run};

/// Where a user message keeps the format its turn must answer in.
pub const FORMAT_KEY: &str = "responseFormat";
/// A final answer's parsed value, when it was valid.
pub const STRUCTURED_KEY: &str = "structured";
/// A final answer's validation errors, when it was not.
pub const ERRORS_KEY: &str = "structuredErrors";
/// Marks the user message a turn stored to ask for a repair.
pub const REPAIR_KEY: &str = "structuredRepair";
/// Repairs a turn asks for before it fails.
pub const REPAIRS: u32 = 1;
/// The validation errors kept and shown, at most.
const ERRORS_SHOWN: usize = 10;

/// Why a requested format cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// A `type` other than `json_schema`.
    Kind(String),
    /// The schema does not compile: why.
    Schema(String),
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::Kind(kind) => write!(f, "`responseFormat.type` must be \"json_schema\", not {kind:?}"),
            FormatError::Schema(why) => write!(f, "`responseFormat.schema` is not a usable JSON Schema: {why}"),
        }
    }
}

/// Checks a requested format before its message is stored.
pub fn check_format(format: &ResponseFormat) -> Result<(), FormatError> {
    if format.kind != "json_schema" {
        return Err(FormatError::Kind(format.kind.clone()));
    }
    jsonschema::validator_for(&format.schema).map(|_| ()).map_err(|error| FormatError::Schema(error.to_string()))
}

/// The format the turn's final answer must take: its newest user message's.
pub(crate) fn format_of(history: &[Message]) -> Option<ResponseFormat> {
    let user = history.iter().rev().find(|message| message.role == Role::User)?;
    let format = user.meta.as_ref()?.get(FORMAT_KEY)?;
    serde_json::from_value(format.clone()).ok()
}

/// A final answer's text judged against `format`: the value, or what is wrong with it.
pub(crate) fn judge(format: &ResponseFormat, text: &str) -> Result<Value, Vec<String>> {
    let value: Value = serde_json::from_str(unfenced(text)).map_err(|error| vec![format!("not JSON: {error}")])?;
    let validator = jsonschema::validator_for(&format.schema).map_err(|error| vec![error.to_string()])?;
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .take(ERRORS_SHOWN)
        .map(|error| match error.instance_path().to_string() {
            path if path.is_empty() => error.to_string(),
            path => format!("{path}: {error}"),
        })
        .collect();
    match errors.is_empty() {
        true => Ok(value),
        false => Err(errors),
    }
}

/// The text inside a Markdown code fence around the whole answer, if there is one.
fn unfenced(text: &str) -> &str {
    let trimmed = text.trim();
    let Some(inner) = trimmed.strip_prefix("```").and_then(|rest| rest.strip_suffix("```")) else { return trimmed };
    // The fence's info string (`json`) ends its first line.
    inner.split_once('\n').map_or(inner, |(_, body)| body).trim()
}

/// Records the verdict on a final answer in its `meta`.
pub(crate) fn mark(answer: &mut Message, format: &ResponseFormat) {
    let verdict = judge(format, &answer.text());
    let meta = answer.meta.get_or_insert_with(Map::new);
    match verdict {
        Ok(value) => meta.insert(STRUCTURED_KEY.into(), value),
        Err(errors) => meta.insert(ERRORS_KEY.into(), errors.into_iter().map(Value::String).collect()),
    };
}

/// A final answer's validation errors, if it was judged invalid.
pub(crate) fn errors_of(answer: &Message) -> Option<Vec<String>> {
    let errors = answer.meta.as_ref()?.get(ERRORS_KEY)?.as_array()?;
    Some(errors.iter().filter_map(Value::as_str).map(str::to_string).collect())
}

impl Run {
    /// Stores the user message that asks the model to answer again, with what was wrong; it
    /// carries the format on, so the next answer is judged the same way.
    pub(crate) fn ask_for_repair(&self, errors: &[String]) -> Result<(), EngineError> {
        let history = self.shared.store.readers().messages(&self.session_id)?;
        let format = format_of(&history).ok_or(EngineError::Internal("a repair with no format"))?;
        let problems: Vec<String> = errors.iter().map(|error| format!("- {error}")).collect();
        let text = format!(
            "Your answer is not valid: it must be only a JSON value valid against the JSON Schema \
             \"{}\". The problems:\n{}\nAnswer again with only the JSON value.",
            format.name(),
            problems.join("\n")
        );
        let mut repair = Message::text_of(Role::User, text);
        let meta = repair.meta.get_or_insert_with(Map::new);
        meta.insert(REPAIR_KEY.into(), Value::Bool(true));
        meta.insert(FORMAT_KEY.into(), serde_json::to_value(&format).unwrap_or_default());
        self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: repair.clone() });
        self.append(repair)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn format() -> ResponseFormat {
        let schema = json!({ "type": "object", "properties": { "n": { "type": "integer" } }, "required": ["n"] });
        ResponseFormat { kind: "json_schema".into(), schema, name: None }
    }

    #[test]
    fn answers_are_judged_inside_a_fence_or_bare_and_errors_name_their_place() {
        assert_eq!(judge(&format(), " {\"n\": 3} "), Ok(json!({ "n": 3 })));
        assert_eq!(judge(&format(), "```json\n{\"n\": 4}\n```"), Ok(json!({ "n": 4 })));
        assert_eq!(judge(&format(), "```\n{\"n\": 5}\n```"), Ok(json!({ "n": 5 })));
        let wrong = judge(&format(), "{\"n\": \"five\"}").unwrap_err();
        assert!(wrong[0].starts_with("/n: "), "{wrong:?}");
        assert!(judge(&format(), "{}").unwrap_err()[0].contains("\"n\" is a required property"));
        assert!(judge(&format(), "Sure! {\"n\": 1}").unwrap_err()[0].starts_with("not JSON"));
    }

    #[test]
    fn only_json_schema_formats_that_compile_are_taken() {
        assert_eq!(check_format(&format()), Ok(()));
        let other = ResponseFormat { kind: "json_object".into(), ..format() };
        assert!(matches!(check_format(&other), Err(FormatError::Kind(_))));
        let broken = ResponseFormat { schema: json!({ "type": 12 }), ..format() };
        assert!(matches!(check_format(&broken), Err(FormatError::Schema(_))));
    }
}
