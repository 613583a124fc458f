-- Migration 19: scheduled runs (`src/schedule/`). `target` and `message` are JSON; `next_at`
-- is milliseconds since the epoch, NULL while paused. Each schedule keeps its last fires.
CREATE TABLE schedules (
    id            TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    cron          TEXT NOT NULL,
    timezone      TEXT NOT NULL,
    target        TEXT NOT NULL,
    message       TEXT NOT NULL,
    catch_up      TEXT NOT NULL,
    paused        INTEGER NOT NULL DEFAULT 0,
    next_at       INTEGER,
    last_fired_at TEXT,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL
) STRICT;

CREATE INDEX schedules_by_tenant ON schedules (tenant, created_at, id);

CREATE TABLE schedule_fires (
    seq         INTEGER PRIMARY KEY,
    schedule_id TEXT NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    due_at      TEXT NOT NULL,
    at          TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    reason      TEXT,
    session_id  TEXT,
    run_id      TEXT
) STRICT;

CREATE INDEX schedule_fires_by_schedule ON schedule_fires (schedule_id, seq);
