-- Version 1 of the PostgreSQL schema: the SQLite store's tables as they stand after its
-- migration 20, in PostgreSQL's types, plus `blobs` (checkpoint contents live in the database,
-- so every node reads them). Timestamps stay RFC 3339 text, as the engine writes them, so the
-- two stores hold the same values; seqs the log allocates are BIGINT, row orders that SQLite
-- took from rowids are identity columns. Text that is ordered or compared by range (ids,
-- times, paths) is `COLLATE "C"`: byte order, as in SQLite and in the engine, whatever the
-- database's own collation.

-- Counters, each one row: `seq_last`, the log's last seq allocated, and `session_moves`, the
-- last tick of the session list. A transaction that takes the next value holds the row's lock
-- until it commits, so values are taken in commit order, whichever process takes them.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO meta (key, value) VALUES ('seq_last', 0), ('session_moves', 0);

CREATE TABLE sessions (
    id            TEXT COLLATE "C" PRIMARY KEY,
    tenant        TEXT NOT NULL,
    title         TEXT NOT NULL,
    model         TEXT NOT NULL,
    system_prompt TEXT,
    workspace     TEXT NOT NULL,
    status        TEXT NOT NULL,
    created_at    TEXT COLLATE "C" NOT NULL,
    updated_at    TEXT COLLATE "C" NOT NULL,
    message_count BIGINT NOT NULL DEFAULT 0,
    run_id        TEXT,
    node          TEXT,
    forked_from   TEXT
);
CREATE INDEX sessions_by_tenant_walk ON sessions (tenant, updated_at DESC, id DESC);

-- What moved in the session list since a walk began (see the SQLite store's migration 11).
-- A move's tick is the next `session_moves` counter, taken in commit order.
CREATE TABLE session_moves (
    tick            BIGINT PRIMARY KEY,
    session_id      TEXT COLLATE "C" NOT NULL,
    from_updated_at TEXT COLLATE "C"
);

CREATE FUNCTION session_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_tick BIGINT;
BEGIN
    IF TG_OP = 'UPDATE' AND (OLD.updated_at, OLD.title, OLD.status, OLD.model, OLD.message_count, OLD.workspace,
                             OLD.system_prompt)
          IS NOT DISTINCT FROM
          (NEW.updated_at, NEW.title, NEW.status, NEW.model, NEW.message_count, NEW.workspace, NEW.system_prompt) THEN
        RETURN NULL;
    END IF;
    UPDATE meta SET value = value + 1 WHERE key = 'session_moves' RETURNING value INTO next_tick;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO session_moves (tick, session_id, from_updated_at) VALUES (next_tick, NEW.id, NULL);
    ELSE
        INSERT INTO session_moves (tick, session_id, from_updated_at) VALUES (next_tick, OLD.id, OLD.updated_at);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER sessions_moved AFTER INSERT OR UPDATE OR DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION session_moved();

CREATE TABLE messages (
    ord        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role       TEXT NOT NULL,
    body       TEXT NOT NULL,
    form       BIGINT NOT NULL DEFAULT 1
);
CREATE INDEX messages_by_session ON messages (session_id, ord);

CREATE TABLE events (
    seq        BIGINT PRIMARY KEY,
    tenant     TEXT,
    session_id TEXT,
    type       TEXT NOT NULL,
    at         TEXT NOT NULL,
    body       TEXT NOT NULL,
    actor      TEXT,
    form       BIGINT NOT NULL DEFAULT 1
);
CREATE INDEX events_by_session ON events (session_id, seq);
CREATE INDEX events_by_tenant ON events (tenant, seq);

CREATE TABLE tool_call_starts (
    ord        BIGINT GENERATED ALWAYS AS IDENTITY,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    call_id    TEXT NOT NULL,
    started_at TEXT NOT NULL,
    call       TEXT,
    actor      TEXT,
    settled    BIGINT NOT NULL DEFAULT 1,
    PRIMARY KEY (session_id, call_id)
);
CREATE INDEX tool_call_starts_unsettled ON tool_call_starts (session_id) WHERE settled = 0;

CREATE TABLE idempotency (
    tenant      TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status      BIGINT NOT NULL,
    body        BYTEA NOT NULL,
    created_ms  BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_by_age ON idempotency (created_ms);

CREATE TABLE bae_profiles (
    seq                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                  TEXT NOT NULL UNIQUE,
    name                TEXT NOT NULL UNIQUE,
    primary_provider    TEXT NOT NULL,
    fallback_providers  TEXT NOT NULL,
    mcp_servers         TEXT NOT NULL,
    allowed_tools       TEXT NOT NULL,
    available_sandboxes TEXT NOT NULL,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL,
    deleted_at          TEXT,
    budget              TEXT
);

CREATE TABLE bae_keys (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    name         TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('client', 'session', 'admin')),
    digest       TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    profile_id   TEXT,
    client_id    TEXT,
    session_id   TEXT COLLATE "C",
    created_at   TEXT NOT NULL,
    last_used_at TEXT,
    deleted_at   TEXT
);
CREATE INDEX bae_keys_by_client ON bae_keys (client_id);
CREATE INDEX bae_keys_by_session ON bae_keys (session_id);

CREATE TABLE bae_sessions (
    seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id             TEXT NOT NULL UNIQUE REFERENCES sessions (id) ON DELETE CASCADE,
    creator_key_id TEXT NOT NULL,
    profile_id     TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('open', 'closed', 'error')),
    client_version TEXT,
    client_tools   TEXT NOT NULL,
    sandbox_tools  TEXT NOT NULL,
    subagent_tools TEXT NOT NULL,
    compaction     TEXT,
    created_at     TEXT NOT NULL,
    closed_at      TEXT
);
CREATE INDEX bae_sessions_by_state ON bae_sessions (state, seq);

CREATE TABLE checkpoints (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    session_id      TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    label           TEXT,
    kind            TEXT NOT NULL CHECK (kind IN ('manual', 'auto', 'safety')),
    created_at      TEXT NOT NULL,
    run_id          TEXT,
    file_count      BIGINT NOT NULL,
    total_bytes     BIGINT NOT NULL,
    message_count   BIGINT NOT NULL,
    manifest        BIGINT,
    manifest_digest TEXT
);
CREATE INDEX checkpoints_by_session ON checkpoints (session_id, seq);
CREATE INDEX checkpoints_by_run ON checkpoints (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX checkpoints_by_manifest ON checkpoints (session_id, manifest_digest) WHERE manifest_digest IS NOT NULL;

CREATE TABLE checkpoint_entries (
    checkpoint_seq BIGINT NOT NULL REFERENCES checkpoints (seq) ON DELETE CASCADE,
    path           TEXT COLLATE "C" NOT NULL,
    digest         TEXT,
    size           BIGINT NOT NULL,
    mode           BIGINT NOT NULL,
    PRIMARY KEY (checkpoint_seq, path)
);
CREATE INDEX checkpoint_entries_by_digest ON checkpoint_entries (digest) WHERE digest IS NOT NULL;

-- Checkpoint contents by their SHA-256, written once however many checkpoints name them.
CREATE TABLE blobs (
    digest  TEXT PRIMARY KEY,
    size    BIGINT NOT NULL,
    content BYTEA NOT NULL
);

CREATE TABLE rules (
    id         TEXT COLLATE "C" PRIMARY KEY,
    tenant     TEXT NOT NULL,
    session_id TEXT REFERENCES sessions (id) ON DELETE CASCADE,
    tool       TEXT NOT NULL,
    pattern    TEXT,
    arguments  TEXT,
    outcome    TEXT NOT NULL CHECK (outcome IN ('allow', 'ask', 'deny')),
    source     TEXT NOT NULL CHECK (source IN ('api', 'remembered')),
    created_at TEXT COLLATE "C" NOT NULL,
    created_by TEXT
);
CREATE INDEX rules_by_scope ON rules (tenant, session_id);

CREATE TABLE audit (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         TEXT COLLATE "C" NOT NULL,
    tenant     TEXT NOT NULL,
    session_id TEXT,
    run_id     TEXT,
    call_id    TEXT,
    tool       TEXT NOT NULL,
    decision   TEXT NOT NULL,
    decided_by TEXT NOT NULL,
    rule_id    TEXT,
    actor      TEXT,
    note       TEXT,
    arguments  TEXT NOT NULL,
    edited     TEXT
);
CREATE INDEX audit_by_tenant ON audit (tenant, seq);
CREATE INDEX audit_by_time ON audit (at);

CREATE TABLE usage (
    scope  TEXT NOT NULL,
    period TEXT NOT NULL,
    tokens BIGINT NOT NULL DEFAULT 0,
    cost   DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, period)
);

CREATE TABLE schedules (
    id            TEXT COLLATE "C" PRIMARY KEY,
    tenant        TEXT NOT NULL,
    cron          TEXT NOT NULL,
    timezone      TEXT NOT NULL,
    target        TEXT NOT NULL,
    message       TEXT NOT NULL,
    catch_up      TEXT NOT NULL,
    paused        BIGINT NOT NULL DEFAULT 0,
    next_at       BIGINT,
    last_fired_at TEXT,
    created_at    TEXT COLLATE "C" NOT NULL,
    updated_at    TEXT NOT NULL
);
CREATE INDEX schedules_by_tenant ON schedules (tenant, created_at, id);

CREATE TABLE schedule_fires (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id TEXT NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    due_at      TEXT NOT NULL,
    at          TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    reason      TEXT,
    session_id  TEXT,
    run_id      TEXT
);
CREATE INDEX schedule_fires_by_schedule ON schedule_fires (schedule_id, seq);

CREATE TABLE webhooks (
    id              TEXT COLLATE "C" PRIMARY KEY,
    tenant          TEXT NOT NULL,
    url             TEXT NOT NULL,
    description     TEXT,
    secret          TEXT NOT NULL,
    source          TEXT NOT NULL,
    enabled         BIGINT NOT NULL DEFAULT 1,
    failures        BIGINT NOT NULL DEFAULT 0,
    disabled_reason TEXT,
    created_at      TEXT COLLATE "C" NOT NULL
);
CREATE INDEX webhooks_by_tenant ON webhooks (tenant, created_at, id);

CREATE TABLE webhook_events (
    type       TEXT NOT NULL,
    webhook_id TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    PRIMARY KEY (type, webhook_id)
);

CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    webhook_id      TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    seq             BIGINT NOT NULL,
    type            TEXT NOT NULL,
    at              TEXT NOT NULL,
    session_id      TEXT,
    body            TEXT NOT NULL,
    form            BIGINT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending',
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_at         BIGINT NOT NULL,
    created_ms      BIGINT NOT NULL,
    last_status     BIGINT,
    last_error      TEXT,
    last_latency_ms BIGINT,
    delivered_at    TEXT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_at);
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id, seq);

CREATE TABLE webhook_attempts (
    delivery_id TEXT NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    n           BIGINT NOT NULL,
    at          TEXT NOT NULL,
    status      BIGINT,
    error       TEXT,
    latency_ms  BIGINT NOT NULL,
    PRIMARY KEY (delivery_id, n)
);
