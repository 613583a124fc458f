//! The front doors. Only `api/*` knows wire formats: request bodies, error bodies, routes.

pub mod bae;
pub mod kestrel;
pub mod openapi;
pub mod routes;

use std::sync::Arc;

use crate::cluster::forward::{ForwardError, Route};
use crate::http::{BodyError, EdgeError, Handler, Reply, Request};

/// How the bus renders envelopes for each format: Kestrel's SSE, BAE's NDJSON.
pub const RENDERERS: [Option<crate::bus::Render>; crate::bus::FORMATS] =
    [Some(kestrel::wire_sse_frame), Some(bae::wire::ndjson_frame), Some(kestrel::wire_plugins_frame)];

/// The main port: BAE's client routes (`/healthz`, `/api/v1/…`) beside the Kestrel routes.
pub struct MainDoor {
    pub kestrel: Arc<kestrel::KestrelApi>,
    pub bae: Arc<bae::ClientApi>,
    /// This node, when it is one of a cluster: a session's operations go to its lease's holder.
    pub cluster: Option<Arc<crate::cluster::Node>>,
}

impl MainDoor {
    /// A request neither served here nor forwarded, in its door's error shape.
    fn refuse(&self, path: &str, error: &ForwardError) -> Reply {
        let edge = match error {
            ForwardError::Forbidden => EdgeError::Forbidden,
            ForwardError::Unavailable(_) => EdgeError::Unavailable,
            ForwardError::Body(BodyError::TooLarge { limit }) => EdgeError::BodyTooLarge { limit: *limit },
            ForwardError::Body(_) => EdgeError::Timeout,
        };
        log::warn!("{path}: {error}");
        let mut reply = self.door(Some(path)).edge_error(Some(path), &edge);
        if let (EdgeError::Unavailable, Reply::Json { headers, .. }) = (&edge, &mut reply) {
            headers.push(("Retry-After", crate::store::RETRY_AFTER_SECS.to_string()));
        }
        reply
    }

    fn door(&self, path: Option<&str>) -> &dyn Handler {
        match path {
            Some(path) if bae::owns(path) => self.bae.as_ref(),
            _ => self.kestrel.as_ref(),
        }
    }
}

impl Handler for MainDoor {
    fn handle(&self, request: &mut Request) -> Reply {
        let path = request.path().to_string();
        if let Some(node) = &self.cluster {
            let forwarded = match node.route(request) {
                Ok(Route::Here) => None,
                Ok(Route::There(url)) => Some(node.forward(request, &url)),
                Err(error) => Some(Err(error)),
            };
            match forwarded {
                Some(Ok(reply)) => return reply,
                Some(Err(error)) => return self.refuse(&path, &error),
                None => {}
            }
        }
        self.door(Some(&path)).handle(request)
    }

    fn internal_error(&self) -> Reply {
        self.kestrel.internal_error()
    }

    fn edge_error(&self, path: Option<&str>, error: &EdgeError) -> Reply {
        self.door(path).edge_error(path, error)
    }

    fn exposure(&self, method: &str, path: &str) -> crate::http::origin::Exposure {
        self.door(Some(path)).exposure(method, path)
    }
}

/// Which listener a route is served on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Main,
    Admin,
}

/// Every route the server serves, as `(port, method, OpenAPI path)`: the rows of the three
/// doors' tables. HEAD, which GET routes of the static files and of BAE's client door also
/// answer, is not listed.
pub fn route_table() -> Vec<(Port, &'static str, String)> {
    fn rows<K>(port: Port, table: &[routes::RouteDef<K>]) -> Vec<(Port, &'static str, String)> {
        let each = |route: &routes::RouteDef<K>| {
            let path = routes::openapi_path(route.template);
            route.methods.iter().filter(|m| **m != "HEAD").map(move |method| (port, *method, path.clone()))
        };
        table.iter().flat_map(each).collect()
    }
    let mut all = rows(Port::Main, kestrel::ROUTES);
    all.extend(rows(Port::Main, bae::ROUTES));
    all.extend(rows(Port::Admin, bae::admin::ROUTES));
    all
}
