//! Run routes: send a message, cancel, resume. Message validation follows the protocol's
//! limits exactly; the engine receives only a well-formed message.

use base64::Engine as _;
use serde_json::{json, Value};

use super::body::JsonBody;
use super::idempotency;
use super::turn::KestrelTurn;
use super::{json, ApiError, Caller, KestrelApi};
use crate::domain::{ImageAttachment, ResponseFormat};
use crate::engine::idempotency::Render;
use crate::engine::{Created, NewMessage};
use crate::http::{Reply, Request};

const MAX_CONTENT_CHARS: usize = 200_000;
const MAX_IMAGES: usize = 6;
// Decimal megabytes: 12 MB of images is 16 million base64 characters, which fits the default
// 16 MiB body limit, so the image limit (not the body limit) is what a client runs into.
const MAX_IMAGE_BYTES: usize = 4_000_000;
const MAX_TOTAL_IMAGE_BYTES: usize = 12_000_000;
const MAX_IMAGE_NAME_CHARS: usize = 120;
const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/webp", "image/gif"];

pub fn send(api: &KestrelApi, caller: &Caller, id: &str, request: &mut Request) -> Result<Reply, ApiError> {
    let bytes = request.read_body()?;
    let key = idempotency::key(request)?;
    let render: Render = Box::new(|created| match created {
        Created::Run(run_id) => (202, json!({ "runId": run_id }).to_string().into_bytes()),
        Created::Session(_) => unreachable!("a message starts a run"),
    });
    idempotency::once(api, caller, key, ("POST", request.path(), &bytes), render, |idempotent| {
        let message = validate_message(&JsonBody::parse(&bytes)?)?;
        let run_id = api.engine.send_message(&caller.tenant, id, message, idempotent, Box::new(KestrelTurn))?;
        Ok(json(202, &json!({ "runId": run_id })))
    })
}

pub fn cancel(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    let cancelled = api.engine.cancel(&caller.tenant, id)?;
    Ok(json(200, &json!({ "cancelled": cancelled })))
}

pub fn resume(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    let run_id = api.engine.resume(&caller.tenant, id, Box::new(KestrelTurn))?;
    Ok(json(202, &json!({ "runId": run_id })))
}

fn validate_message(body: &JsonBody) -> Result<NewMessage, ApiError> {
    let content = match body.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(content)) => content.clone(),
        Some(_) => return Err(ApiError::bad_request("invalid_message", "`content` must be a string")),
    };
    if content.chars().count() > MAX_CONTENT_CHARS {
        return Err(ApiError::new(
            413,
            "message_too_large",
            format!("`content` is longer than {MAX_CONTENT_CHARS} characters"),
        ));
    }
    let images = match body.get("images") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(images)) => validate_images(images)?,
        Some(_) => return Err(invalid_images("`images` must be an array")),
    };
    if content.trim().is_empty() && images.is_empty() {
        return Err(ApiError::bad_request("invalid_message", "a message needs text, images or both"));
    }
    let response_format = match body.get("responseFormat") {
        None | Some(Value::Null) => None,
        Some(format) => Some(response_format(format)?),
    };
    Ok(NewMessage { content, images, response_format })
}

/// `responseFormat: {type: "json_schema", schema, name?}`; the schema is compiled by the
/// engine, which refuses one that does not compile with the same code.
fn response_format(format: &Value) -> Result<ResponseFormat, ApiError> {
    let invalid = |why: &str| ApiError::bad_request("invalid_response_format", format!("`responseFormat` {why}"));
    let Value::Object(fields) = format else { return Err(invalid("must be an object")) };
    let kind = match fields.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        _ => return Err(invalid("needs `type`: \"json_schema\"")),
    };
    let schema = match fields.get("schema") {
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => schema.clone(),
        _ => return Err(invalid("needs `schema`, a JSON Schema (an object)")),
    };
    let name = match fields.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if is_format_name(name) => Some(name.clone()),
        Some(_) => return Err(invalid("`name` must be 1 to 64 letters, digits, `_` or `-`")),
    };
    Ok(ResponseFormat { kind, schema, name })
}

/// A name every provider's native structured output takes.
fn is_format_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn validate_images(images: &[Value]) -> Result<Vec<ImageAttachment>, ApiError> {
    if images.len() > MAX_IMAGES {
        return Err(too_large(format!("at most {MAX_IMAGES} images per message")));
    }
    let mut total = 0;
    let mut attachments = Vec::with_capacity(images.len());
    for (index, image) in images.iter().enumerate() {
        let field = |name: &str| image.get(name).and_then(Value::as_str);
        let mime_type =
            field("mimeType").ok_or_else(|| invalid_images(format!("`images[{index}].mimeType` is missing")))?;
        if !IMAGE_TYPES.contains(&mime_type) {
            return Err(invalid_images(format!(
                "`images[{index}].mimeType` {mime_type:?} is not one of {IMAGE_TYPES:?}"
            )));
        }
        let data = field("data").ok_or_else(|| invalid_images(format!("`images[{index}].data` is missing")))?;
        // A browser's FileReader output (`data:image/png;base64,...`) is accepted unchanged.
        let data = match data.strip_prefix("data:") {
            Some(rest) => rest.split_once(',').map(|(_, payload)| payload).unwrap_or(""),
            None => data,
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|_| invalid_images(format!("`images[{index}].data` is not valid base64")))?;
        if decoded.len() > MAX_IMAGE_BYTES {
            return Err(too_large(format!("`images[{index}]` is larger than 4 MB")));
        }
        total += decoded.len();
        if total > MAX_TOTAL_IMAGE_BYTES {
            return Err(too_large("the images are larger than 12 MB in total".to_string()));
        }
        let name = match image.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(name)) if name.chars().count() <= MAX_IMAGE_NAME_CHARS => Some(name.clone()),
            Some(_) => {
                return Err(invalid_images(format!(
                    "`images[{index}].name` must be a string of at most {MAX_IMAGE_NAME_CHARS} characters"
                )))
            }
        };
        attachments.push(ImageAttachment { mime_type: mime_type.to_string(), data: data.to_string(), name });
    }
    Ok(attachments)
}

fn invalid_images(message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_images", message)
}

fn too_large(message: String) -> ApiError {
    ApiError::new(413, "message_too_large", message)
}
