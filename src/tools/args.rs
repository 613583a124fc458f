//! Reading a tool call's arguments with messages the model can act on.

use serde_json::{Map, Value};

use crate::engine::tools::ToolError;

pub struct Args<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    pub fn new(map: &'a Map<String, Value>) -> Args<'a> {
        Args { map }
    }

    pub fn string(&self, name: &str) -> Result<&'a str, ToolError> {
        match self.map.get(name) {
            Some(Value::String(text)) => Ok(text),
            Some(_) => Err(ToolError::Arguments(format!("`{name}` must be a string"))),
            None => Err(ToolError::Arguments(self.missing(name))),
        }
    }

    pub fn optional_string(&self, name: &str) -> Result<Option<&'a str>, ToolError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(ToolError::Arguments(format!("`{name}` must be a string"))),
        }
    }

    pub fn optional_u64(&self, name: &str) -> Result<Option<u64>, ToolError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_u64()
                .map(Some)
                .ok_or_else(|| ToolError::Arguments(format!("`{name}` must be a non-negative integer"))),
        }
    }

    pub fn flag(&self, name: &str) -> Result<bool, ToolError> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(_) => Err(ToolError::Arguments(format!("`{name}` must be true or false"))),
        }
    }

    /// A string or an array of strings.
    pub fn strings(&self, name: &str) -> Result<Vec<&'a str>, ToolError> {
        match self.map.get(name) {
            Some(Value::String(text)) => Ok(vec![text]),
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .map(|item| item.as_str().ok_or_else(|| ToolError::Arguments(format!("`{name}` must hold strings"))))
                .collect(),
            Some(_) => Err(ToolError::Arguments(format!("`{name}` must be a string or a non-empty array of strings"))),
            None => Err(ToolError::Arguments(self.missing(name))),
        }
    }

    fn missing(&self, name: &str) -> String {
        if let Some(Value::String(raw)) = self.map.get("_raw") {
            return format!("the arguments were not a JSON object ({raw:?}); `{name}` is required");
        }
        format!("`{name}` is required")
    }
}
