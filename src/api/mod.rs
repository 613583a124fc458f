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

/// Whether a door takes a request from its caller's rate limit as it admits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// The request came here from its client: it is counted here.
    Count,
    /// Another node of the cluster forwarded it, and counted it there: one request costs its
    /// caller once, at the node it reached.
    Counted,
}

/// A front door of the main port, in two steps: `admit` matches the route, authenticates
/// the request as the route asks (with the caller's rate limit) and, for a route that names
/// a session, finds the session the caller's; `serve` does what it asks. In a cluster the
/// node looks at a session's lease, claims it or forwards the request only in between, so a
/// caller the door does not know, or a session that is not the caller's, moves no lease and
/// is sent nowhere (docs/cluster.md).
pub trait Door {
    /// The route, who called, and the session it names, as far as the route needs.
    type Admitted;
    /// Why a request was not admitted, in the door's error shape.
    type Refusal;
    /// The request admitted, or the door's answer to it. A session the route names that does
    /// not exist or is not the caller's is refused here as the door answers it anywhere
    /// (Kestrel's 404; BAE's 401 for a session key, its join's 404, 409 or 403).
    fn admit(&self, request: &mut Request, rate: Rate) -> Result<Self::Admitted, Self::Refusal>;
    /// The session an admitted request names, which `admit` found the caller's: the one a
    /// cluster's node routes it by. `None` for a route that names no session.
    fn session<'a>(&self, admitted: &'a Self::Admitted) -> Option<&'a str>;
    /// The answer to a request that was not admitted.
    fn refuse(&self, refusal: Self::Refusal) -> Reply;
    fn serve(&self, request: &mut Request, admitted: Self::Admitted) -> Reply;

    /// The request as a server on its own answers it: admitted (counted here), then served.
    fn answer(&self, request: &mut Request) -> Reply {
        match self.admit(request, Rate::Count) {
            Ok(admitted) => self.serve(request, admitted),
            Err(refusal) => self.refuse(refusal),
        }
    }
}

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

    /// `request` through `door`: admitted first, then, in a cluster, served here or at the
    /// session's holder. A call from another node must carry the cluster's secret (403
    /// before anything else otherwise); it is still admitted as its client, by the client's
    /// own credentials, so no node acts for a caller its door does not know, nor for a
    /// session that is not the caller's.
    fn through<D: Door>(&self, door: &D, request: &mut Request) -> Reply {
        let Some(node) = &self.cluster else { return door.answer(request) };
        let path = request.path().to_string();
        let from_a_node = match node.from_a_node(request) {
            Ok(from_a_node) => from_a_node,
            Err(error) => return self.refuse(&path, &error),
        };
        let rate = if from_a_node { Rate::Counted } else { Rate::Count };
        let admitted = match door.admit(request, rate) {
            Ok(admitted) => admitted,
            Err(refusal) => return door.refuse(refusal),
        };
        let session = door.session(&admitted).map(str::to_string);
        match node.route(request, session.as_deref(), from_a_node) {
            Ok(Route::Here) if from_a_node => node.to_relay(door.serve(request, admitted)),
            Ok(Route::Here) => door.serve(request, admitted),
            Ok(Route::There(url)) => {
                node.forward(request, session.as_deref(), &url).unwrap_or_else(|error| self.refuse(&path, &error))
            }
            Err(error) => self.refuse(&path, &error),
        }
    }
}

impl Handler for MainDoor {
    fn handle(&self, request: &mut Request) -> Reply {
        match bae::owns(request.path()) {
            true => self.through(self.bae.as_ref(), request),
            false => self.through(self.kestrel.as_ref(), request),
        }
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
