-- The BAE client API's state: profiles, keys (client, session, admin) and what a BAE session
-- has beyond an engine session. Each table's INTEGER PRIMARY KEY `seq` is the opaque cursor
-- of its admin list. Nothing here is ever deleted: profiles and keys are soft-deleted.

CREATE TABLE bae_profiles (
    seq                 INTEGER PRIMARY KEY,
    id                  TEXT NOT NULL UNIQUE,
    -- Unique across deleted rows too, as BAE has it.
    name                TEXT NOT NULL UNIQUE,
    primary_provider    TEXT NOT NULL,
    -- JSON arrays, as the admin wrote them.
    fallback_providers  TEXT NOT NULL,
    mcp_servers         TEXT NOT NULL,
    allowed_tools       TEXT NOT NULL,
    available_sandboxes TEXT NOT NULL,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL,
    deleted_at          TEXT
) STRICT;

CREATE TABLE bae_keys (
    seq          INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    name         TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('client', 'session', 'admin')),
    -- HMAC-SHA256 of the key under the data dir's key secret (see auth/keys.rs).
    digest       TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    profile_id   TEXT,
    -- A session key's client key and session.
    client_id    TEXT,
    session_id   TEXT,
    created_at   TEXT NOT NULL,
    last_used_at TEXT,
    deleted_at   TEXT
) STRICT;

CREATE INDEX bae_keys_by_client ON bae_keys (client_id);
CREATE INDEX bae_keys_by_session ON bae_keys (session_id);

-- A BAE session is an engine session (`sessions`, tenant '@bae') plus this row.
CREATE TABLE bae_sessions (
    seq            INTEGER PRIMARY KEY,
    id             TEXT NOT NULL UNIQUE REFERENCES sessions (id) ON DELETE CASCADE,
    creator_key_id TEXT NOT NULL,
    profile_id     TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('open', 'closed', 'error')),
    client_version TEXT,
    -- JSON objects keyed by client key id: each client's declared tools.
    client_tools   TEXT NOT NULL,
    sandbox_tools  TEXT NOT NULL,
    subagent_tools TEXT NOT NULL,
    -- The session's compaction setting, fixed at creation; NULL: client mode, no prompt.
    compaction     TEXT,
    created_at     TEXT NOT NULL,
    closed_at      TEXT
) STRICT;

CREATE INDEX bae_sessions_by_state ON bae_sessions (state, seq);

-- Who an event is attributed to: a BAE client key id.
ALTER TABLE events ADD COLUMN actor TEXT;
