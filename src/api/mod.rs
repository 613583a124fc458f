//! The front doors. Only `api/*` knows wire formats: request bodies, error bodies, routes.

pub mod kestrel;
