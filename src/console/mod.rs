//! The console: a browser UI on the public protocol, its files compiled into the binary
//! (`assets/`), served at `/` and `/assets/<hash>/<file>`, never authenticated (the spec says
//! static assets are not; the API behind them is).
//!
//! `<hash>` is a fingerprint of every asset together, so a new binary's files have new URLs
//! and are never served from a stale cache: the page (`/`) is revalidated every time, the
//! assets under it are cached for a year. The modules import each other by relative URL, so
//! they all carry the same fingerprint.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// One file of the console.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const ASSETS: &[Asset] = &[
    Asset { name: "app.js", content_type: "text/javascript; charset=utf-8", body: include_str!("assets/app.js") },
    Asset { name: "api.js", content_type: "text/javascript; charset=utf-8", body: include_str!("assets/api.js") },
    Asset { name: "dom.js", content_type: "text/javascript; charset=utf-8", body: include_str!("assets/dom.js") },
    Asset {
        name: "commonmark.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/commonmark.js"),
    },
    Asset {
        name: "markdown.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/markdown.js"),
    },
    Asset {
        name: "session.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/session.js"),
    },
    Asset {
        name: "transcript.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/transcript.js"),
    },
    Asset {
        name: "workspace.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/workspace.js"),
    },
    Asset {
        name: "checkpoints.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/checkpoints.js"),
    },
    Asset { name: "rules.js", content_type: "text/javascript; charset=utf-8", body: include_str!("assets/rules.js") },
    Asset {
        name: "schedules.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/schedules.js"),
    },
    Asset {
        name: "plugins.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/plugins.js"),
    },
    Asset { name: "style.css", content_type: "text/css; charset=utf-8", body: include_str!("assets/style.css") },
    Asset { name: "icon.svg", content_type: "image/svg+xml", body: include_str!("assets/icon.svg") },
];

const INDEX: &str = include_str!("assets/index.html");

/// Where the page's assets live: `/assets/<fingerprint>`.
const PLACEHOLDER: &str = "{{ASSETS}}";

/// The fingerprint of every asset and the page, 16 hex digits.
pub fn fingerprint() -> &'static str {
    static FINGERPRINT: OnceLock<String> = OnceLock::new();
    FINGERPRINT.get_or_init(|| {
        let mut hash = Sha256::new();
        for asset in ASSETS {
            hash.update(asset.name.as_bytes());
            hash.update([0]);
            hash.update(asset.body.as_bytes());
        }
        hash.update(INDEX.as_bytes());
        hash.finalize().iter().take(8).map(|byte| format!("{byte:02x}")).collect()
    })
}

/// What the console serves for a path, if the path is the console's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// The file: its body, content type and `Cache-Control`.
    File { body: Vec<u8>, content_type: &'static str, cache_control: &'static str },
    /// A console path with nothing there (an old fingerprint, an unknown file).
    NotFound,
}

/// What the console's page and files may do: scripts, styles and requests only from this
/// origin (no inline script, no `eval`), images also as `data:` (attachments and previews),
/// nothing framed and never framed itself.
pub const POLICY: &[(&str, &str)] = &[
    (
        "Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
         font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-src 'none'; \
         frame-ancestors 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
];

/// The page is revalidated on every load; the fingerprinted assets never change.
const PAGE_CACHE: &str = "no-cache";
const ASSET_CACHE: &str = "public, max-age=31536000, immutable";

/// The console's answer for `path`, or `None` when the path is not the console's.
pub fn serve(path: &str) -> Option<Served> {
    if path == "/" || path == "/index.html" {
        let page = INDEX.replace(PLACEHOLDER, &format!("/assets/{}", fingerprint()));
        return Some(Served::File {
            body: page.into_bytes(),
            content_type: "text/html; charset=utf-8",
            cache_control: PAGE_CACHE,
        });
    }
    let rest = path.strip_prefix("/assets/")?;
    let found = rest
        .split_once('/')
        .filter(|(hash, _)| *hash == fingerprint())
        .and_then(|(_, name)| ASSETS.iter().find(|asset| asset.name == name));
    Some(match found {
        Some(asset) => Served::File {
            body: asset.body.as_bytes().to_vec(),
            content_type: asset.content_type,
            cache_control: ASSET_CACHE,
        },
        None => Served::NotFound,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_points_at_fingerprinted_assets_and_only_those_are_served() {
        let Some(Served::File { body, cache_control, .. }) = serve("/") else { panic!("no page") };
        let page = String::from_utf8(body).unwrap();
        let prefix = format!("/assets/{}/", fingerprint());
        assert!(page.contains(&format!("{prefix}app.js")), "{page}");
        assert!(!page.contains(PLACEHOLDER));
        assert_eq!(cache_control, PAGE_CACHE);
        for asset in ASSETS {
            let Some(Served::File { content_type, cache_control, .. }) = serve(&format!("{prefix}{}", asset.name))
            else {
                panic!("{} is not served", asset.name)
            };
            assert_eq!((content_type, cache_control), (asset.content_type, ASSET_CACHE));
        }
        assert_eq!(serve("/assets/0000000000000000/app.js"), Some(Served::NotFound), "an old fingerprint");
        assert_eq!(serve(&format!("{prefix}../Cargo.toml")), Some(Served::NotFound));
        assert_eq!(serve(&prefix), Some(Served::NotFound));
        assert_eq!(serve("/api/health"), None);
    }

    #[test]
    fn every_relative_import_names_an_asset() {
        for asset in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            for line in asset.body.lines().filter(|l| l.starts_with("import ")) {
                let quoted = line.rsplit("from ").next().unwrap_or("").trim().trim_end_matches(';');
                let name = quoted.trim_matches(|c| c == '"' || c == '\'').trim_start_matches("./");
                assert!(ASSETS.iter().any(|a| a.name == name), "{}: {line}", asset.name);
            }
        }
    }
}
