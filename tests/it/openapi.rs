//! The OpenAPI documents against the code: every row of the route tables is documented and
//! every documented operation is served; both documents are served, publicly; and `check`,
//! which the tests' HTTP clients call on every response they receive, validates the response
//! against the schema its document gives for that operation and status.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use kestrel::api::{route_table, Port};
use serde_json::{json, Value};

use crate::support::TestServer;

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

fn document(port: Port) -> &'static Value {
    static MAIN: OnceLock<Value> = OnceLock::new();
    static ADMIN: OnceLock<Value> = OnceLock::new();
    let (cell, text) = match port {
        Port::Main => (&MAIN, kestrel::api::openapi::MAIN),
        Port::Admin => (&ADMIN, kestrel::api::openapi::ADMIN),
    };
    cell.get_or_init(|| serde_json::from_str(text).expect("the document is JSON"))
}

/// The documented path template `path` falls under, preferring literal segments.
fn template_of(port: Port, path: &str) -> Option<String> {
    let paths = document(port)["paths"].as_object()?;
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut best: Option<(usize, &String)> = None;
    for template in paths.keys() {
        let parts: Vec<&str> = template.split('/').collect();
        // A plugin file's path may hold slashes: its `{path}` takes the rest.
        let rest = template.starts_with("/plugins/") && template.ends_with("{path}");
        let fits = match rest {
            true => segments.len() >= parts.len(),
            false => segments.len() == parts.len(),
        };
        if !fits || !parts.iter().zip(&segments).all(|(p, s)| p.starts_with('{') || p == s) {
            continue;
        }
        let literal = parts.iter().filter(|p| !p.starts_with('{')).count();
        if best.is_none_or(|(score, _)| literal > score) {
            best = Some((literal, template));
        }
    }
    best.map(|(_, template)| template.clone())
}

type Validators = Mutex<HashMap<String, Arc<jsonschema::Validator>>>;

/// A validator for the schema at `pointer` in the document of `port`; built once.
fn validator(port: Port, pointer: &str) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Validators> = OnceLock::new();
    let key = format!("{port:?}{pointer}");
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry(key)
        .or_insert_with(|| {
            // The whole document as the root, so its `#/components/...` references resolve;
            // its own keywords are not JSON Schema and are ignored.
            let mut root = document(port).clone();
            root["$ref"] = json!(format!("#{pointer}"));
            let built = jsonschema::options().with_draft(jsonschema::Draft::Draft202012).build(&root);
            Arc::new(built.unwrap_or_else(|e| panic!("the schema at {pointer} does not compile: {e}")))
        })
        .clone()
}

fn escape(segment: &str) -> String {
    // A JSON pointer segment, percent-encoded for a URI fragment.
    segment.replace('~', "~0").replace('/', "~1").replace('{', "%7B").replace('}', "%7D")
}

fn admin_bases() -> &'static Mutex<BTreeSet<String>> {
    static BASES: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    BASES.get_or_init(Default::default)
}

/// Says that `base` is a test server's admin port, whose document `check` then uses.
pub fn admin_port_at(base: &str) {
    admin_bases().lock().unwrap_or_else(|e| e.into_inner()).insert(base.to_string());
}

/// Says that `base` is no longer an admin port (its port number may be reused).
pub fn admin_port_gone(base: &str) {
    admin_bases().lock().unwrap_or_else(|e| e.into_inner()).remove(base);
}

/// Checks one response against the document: its status must be documented for the
/// operation (or by a `4XX`/`5XX` range), and a JSON body must match the schema. Routes
/// that are not in the document are 404s and methods that are not are 405s.
pub fn check(base: &str, method: &str, url_path: &str, status: u16, content_type: Option<&str>, body: &str) {
    let path = url_path.split('?').next().unwrap_or(url_path);
    // Which port answered: a registered admin port, or (for servers started elsewhere) any
    // answer but a 404 to an admin path, which only the admin port serves.
    let admin = admin_bases().lock().unwrap_or_else(|e| e.into_inner()).contains(base)
        || (path.starts_with("/admin/") && status != 404);
    let port = if admin { Port::Admin } else { Port::Main };
    let Some(template) = template_of(port, path) else {
        assert!(status == 404 || status >= 400, "{method} {path}: {status} from a route the document does not have");
        return;
    };
    let method = method.to_ascii_lowercase();
    let operation = &document(port)["paths"][&template][&method];
    if operation.is_null() {
        assert!(status == 405 || method == "head" || status >= 400, "{method} {path}: {status}, not documented");
        return;
    }
    let responses = &operation["responses"];
    let code = status.to_string();
    let range = format!("{}XX", status / 100);
    let Some(key) = [code.as_str(), range.as_str(), "default"].into_iter().find(|k| !responses[*k].is_null()) else {
        panic!("{method} {template}: status {status} is not documented; body: {body}");
    };
    let mut response = &responses[key];
    let mut pointer_base = format!("/paths/{}/{method}/responses/{key}", escape(&template));
    if let Some(reference) = response["$ref"].as_str() {
        let name = reference.trim_start_matches("#/components/responses/");
        response = &document(port)["components"]["responses"][name];
        pointer_base = format!("/components/responses/{name}");
    }
    let is_json = content_type.is_some_and(|c| c.starts_with("application/json"));
    if !is_json || response["content"]["application/json"]["schema"].is_null() {
        return;
    }
    let instance: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{method} {path}: {status} with a body that is not JSON ({e}): {body}"));
    let pointer = format!("{pointer_base}/content/application~1json/schema");
    let validator = validator(port, &pointer);
    let errors: Vec<String> =
        validator.iter_errors(&instance).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "{method} {path} -> {status} does not match {template}: {errors:#?}\nbody: {body}");
}

#[test]
fn every_route_is_documented_and_everything_documented_is_served() {
    let served: BTreeSet<(String, String, String)> = route_table()
        .into_iter()
        .map(|(port, method, path)| (format!("{port:?}"), method.to_ascii_lowercase(), path))
        .collect();
    let mut documented = BTreeSet::new();
    for port in [Port::Main, Port::Admin] {
        for (path, item) in document(port)["paths"].as_object().unwrap() {
            for method in METHODS.iter().filter(|m| item.get(**m).is_some()) {
                documented.insert((format!("{port:?}"), method.to_string(), path.clone()));
            }
        }
    }
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(undocumented.is_empty(), "served but not in the OpenAPI documents: {undocumented:#?}");
    assert!(unserved.is_empty(), "documented but not served: {unserved:#?}");
}

#[test]
fn both_documents_are_served_publicly_and_name_their_schemes() {
    let server = TestServer::start_with(|config| config.auth.token = Some("secret-token".into()));
    let anonymous = server.client().with_token(None);
    let main = anonymous.get("/api/openapi.json");
    assert_eq!(main.status, 200, "{}", main.text);
    assert_eq!(main.header("content-type"), Some("application/json"));
    assert_eq!(main.json, *document(Port::Main));
    let schemes = main.json["components"]["securitySchemes"].as_object().unwrap();
    assert!(["bearer", "queryToken", "baeClientKey", "baeSessionKey"].iter().all(|s| schemes.contains_key(*s)));
    assert_eq!(anonymous.get("/api/sessions").status, 401, "the API itself still needs the token");

    let admin_base = format!("http://{}", server.admin_addr().expect("an admin port"));
    let admin = ureq::get(&format!("{admin_base}/admin/openapi.json")).call().expect("served without a key");
    let admin: Value = admin.into_json().unwrap();
    assert_eq!(admin, *document(Port::Admin));
    let refused = ureq::get(&format!("{admin_base}/admin/v1/profiles")).call();
    assert!(matches!(refused, Err(ureq::Error::Status(401, _))), "the admin API itself still needs the key");
}

#[test]
fn a_response_that_breaks_its_schema_is_caught() {
    let result = std::panic::catch_unwind(|| {
        check("http://main", "GET", "/api/health", 200, Some("application/json"), r#"{"status":"ok","name":"kestrel"}"#)
    });
    assert!(result.is_err(), "a health body without its required fields must fail the check");
    let undocumented = std::panic::catch_unwind(|| check("http://main", "GET", "/api/health", 302, None, ""));
    assert!(undocumented.is_err(), "an undocumented status must fail the check");
    check(
        "http://main",
        "GET",
        "/api/sessions/ses_1/files?path=.",
        404,
        Some("application/json"),
        r#"{"error":{"code":"session_not_found","message":"no such session"}}"#,
    );
}
