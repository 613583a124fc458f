//! Route tables: each door lists its routes as rows of a path template and the methods it
//! serves, and matches requests against that list. The same rows are what the OpenAPI
//! documents are checked against (`route_table` in `api/mod.rs`), so a route cannot be served
//! without being documented, nor documented without being served.
//!
//! A template is a path whose `{name}` segments match any one non-empty segment; a last
//! segment `{name*}` matches the rest of the path, whatever it holds. A trailing slash on
//! the request is ignored, and an empty segment (`//`) matches nothing.

/// One route of a door.
pub struct RouteDef<K> {
    pub template: &'static str,
    /// The methods served (HEAD is implied by GET where a door says so).
    pub methods: &'static [&'static str],
    pub kind: K,
}

/// A request path matched to a row, with the values of its `{…}` segments in order.
pub struct Matched<'t, 'p, K> {
    pub route: &'t RouteDef<K>,
    params: Vec<&'p str>,
}

impl<K: Copy> Matched<'_, '_, K> {
    pub fn kind(&self) -> K {
        self.route.kind
    }
}

impl<'p, K> Matched<'_, 'p, K> {
    /// The `n`th parameter (from 0); every row of a kind has as many as its handler reads.
    pub fn param(&self, n: usize) -> &'p str {
        self.params.get(n).copied().unwrap_or_default()
    }
}

/// The first row of `table` whose template matches `path`.
pub fn find<'t, 'p, K>(table: &'t [RouteDef<K>], path: &'p str) -> Option<Matched<'t, 'p, K>> {
    // One trailing slash is ignored: `/api/sessions/` is `/api/sessions`, `//` is nothing.
    let trimmed = path.strip_suffix('/').filter(|t| !t.is_empty() && !t.ends_with('/')).unwrap_or(path);
    table.iter().find_map(|route| {
        let params = match_template(route.template, trimmed)?;
        Some(Matched { route, params })
    })
}

fn match_template<'p>(template: &str, path: &'p str) -> Option<Vec<&'p str>> {
    if template == "/" {
        return (path == "/").then(Vec::new);
    }
    let mut wanted = template.strip_prefix('/')?.split('/').peekable();
    let mut rest = path.strip_prefix('/')?;
    let mut params = Vec::new();
    while let Some(part) = wanted.next() {
        if part.ends_with("*}") && wanted.peek().is_none() {
            // The handler judges what is inside (a plugin refuses `..` and `//` itself).
            if rest.is_empty() {
                return None;
            }
            params.push(rest);
            return Some(params);
        }
        let (segment, after) = rest.split_once('/').unwrap_or((rest, ""));
        if segment.is_empty() {
            return None;
        }
        match part.starts_with('{') {
            true => params.push(segment),
            false if part == segment => {}
            false => return None,
        }
        let last = !rest.contains('/');
        rest = after;
        if last != wanted.peek().is_none() {
            return None;
        }
    }
    Some(params)
}

/// A template as OpenAPI writes it: `{name*}` becomes `{name}`.
pub fn openapi_path(template: &str) -> String {
    template.replace("*}", "}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[RouteDef<u8>] = &[
        RouteDef { template: "/", methods: &["GET"], kind: 0 },
        RouteDef { template: "/api/sessions", methods: &["GET"], kind: 1 },
        RouteDef { template: "/api/sessions/{id}", methods: &["GET"], kind: 2 },
        RouteDef { template: "/api/sessions/{id}/approvals/{approval}", methods: &["POST"], kind: 3 },
        RouteDef { template: "/plugins/{plugin}/web/{path*}", methods: &["GET"], kind: 4 },
    ];

    fn found(path: &str) -> Option<(u8, Vec<&str>)> {
        find(TABLE, path).map(|m| (m.kind(), m.params.clone()))
    }

    #[test]
    fn templates_match_whole_segments_only() {
        assert_eq!(found("/"), Some((0, vec![])));
        assert_eq!(found("/api/sessions"), Some((1, vec![])));
        assert_eq!(found("/api/sessions/"), Some((1, vec![])));
        assert_eq!(found("/api/sessions/abc"), Some((2, vec!["abc"])));
        assert_eq!(found("/api/sessions/a/approvals/b"), Some((3, vec!["a", "b"])));
        assert_eq!(found("/plugins/p/web/css/a.css"), Some((4, vec!["p", "css/a.css"])));
        assert_eq!(found("/plugins/p/web//etc/passwd"), Some((4, vec!["p", "/etc/passwd"])));
        for missing in [
            "",
            "//",
            "/api",
            "/api/sessionsx",
            "/api/sessions//",
            "/api/sessions//approvals/b",
            "/api/sessions/a/approvals",
            "/api/sessions/a/approvals/b/c",
            "/plugins/p/web/",
            "api/sessions",
        ] {
            assert!(found(missing).is_none(), "{missing}");
        }
    }

    #[test]
    fn openapi_paths_drop_the_rest_marker() {
        assert_eq!(openapi_path("/plugins/{plugin}/web/{path*}"), "/plugins/{plugin}/web/{path}");
    }
}
