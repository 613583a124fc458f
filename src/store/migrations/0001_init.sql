-- Sessions, their transcripts, and the counters that must survive a restart.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) STRICT;

CREATE TABLE sessions (
    id            TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    title         TEXT NOT NULL,
    model         TEXT NOT NULL,
    system_prompt TEXT,
    workspace     TEXT NOT NULL,
    status        TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    -- RFC 3339 UTC with fixed width, so text order is time order.
    updated_at    TEXT NOT NULL,
    message_count INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE INDEX sessions_by_tenant_updated ON sessions (tenant, updated_at DESC);

-- One row per ChatMessage; `body` is the message's JSON in the protocol shape.
-- The rowid orders a transcript.
CREATE TABLE messages (
    rowid      INTEGER PRIMARY KEY,
    id         TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role       TEXT NOT NULL,
    body       TEXT NOT NULL
) STRICT;

CREATE INDEX messages_by_session ON messages (session_id, rowid);
