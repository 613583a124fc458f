//! The OpenAPI 3.1 documents of the two ports, written by hand beside the code they describe
//! and served as they are: the main port's (Kestrel protocol and BAE's client routes) at
//! `/api/openapi.json`, the admin port's at `/admin/openapi.json`. Both are public.
//!
//! They cannot drift from the code unnoticed: `tests/it/openapi.rs` fails when a row of a
//! route table (`api::route_table`) is missing from its document or a documented operation is
//! not served, and the integration tests' client validates every response it receives
//! against the schema its document gives for that route and status.

use crate::http::Reply;

/// The main port's document.
pub const MAIN: &str = include_str!("main.json");
/// The admin port's document.
pub const ADMIN: &str = include_str!("admin.json");

pub fn main_document() -> Reply {
    document(MAIN)
}

pub fn admin_document() -> Reply {
    document(ADMIN)
}

fn document(text: &'static str) -> Reply {
    Reply::File {
        content_type: "application/json",
        body: text.as_bytes().to_vec(),
        cache_control: "no-cache",
        policy: &[],
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_documents_are_json_of_openapi_3_1() {
        for text in [super::MAIN, super::ADMIN] {
            let document: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
            assert_eq!(document["openapi"], "3.1.0");
            assert!(document["paths"].as_object().is_some_and(|paths| !paths.is_empty()));
        }
    }
}
