//! Reading JSON request bodies field by field, so a rejection names the field it is about.

use serde_json::{Map, Value};

use super::error::ApiError;
use crate::http::Request;

/// A request body that parsed as a JSON object.
pub struct JsonBody {
    fields: Map<String, Value>,
}

impl JsonBody {
    /// Reads and parses the body: 413 past the limit, `invalid_json`, or `invalid_body` when
    /// it is not an object. An empty body counts as `{}`.
    pub fn read(request: &mut Request) -> Result<JsonBody, ApiError> {
        JsonBody::parse(&request.read_body()?)
    }

    /// Parses a body already read.
    pub fn parse(bytes: &[u8]) -> Result<JsonBody, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonBody { fields: Map::new() });
        }
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|error| ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {error}")))?;
        match value {
            Value::Object(fields) => Ok(JsonBody { fields }),
            _ => Err(ApiError::invalid_body("the body must be a JSON object")),
        }
    }

    pub fn has(&self, field: &str) -> bool {
        self.fields.contains_key(field)
    }

    pub fn get(&self, field: &str) -> Option<&Value> {
        self.fields.get(field)
    }

    /// An optional string field; `null` counts as absent. A wrong type is `code`.
    pub fn optional_string(&self, field: &str, code: &'static str) -> Result<Option<String>, ApiError> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(ApiError::bad_request(code, format!("`{field}` must be a string"))),
        }
    }
}
