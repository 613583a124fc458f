-- Migration 20: webhooks (`src/webhooks/`). An endpoint subscribes to event types
-- (`webhook_events`); every logged event of its tenant and of a subscribed type gets a row in
-- `webhook_deliveries`, the outbox, in the same transaction as the event itself. `body` is the
-- event as the log keeps it (stored form `form`), so a delivery does not depend on the log
-- still holding the event. Each attempt is kept in `webhook_attempts`.
CREATE TABLE webhooks (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL,
    url             TEXT NOT NULL,
    description     TEXT,
    secret          TEXT NOT NULL,
    source          TEXT NOT NULL,
    enabled         INTEGER NOT NULL DEFAULT 1,
    failures        INTEGER NOT NULL DEFAULT 0,
    disabled_reason TEXT,
    created_at      TEXT NOT NULL
) STRICT;

CREATE INDEX webhooks_by_tenant ON webhooks (tenant, created_at, id);

CREATE TABLE webhook_events (
    type       TEXT NOT NULL,
    webhook_id TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    PRIMARY KEY (type, webhook_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    webhook_id      TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    seq             INTEGER NOT NULL,
    type            TEXT NOT NULL,
    at              TEXT NOT NULL,
    session_id      TEXT,
    body            TEXT NOT NULL,
    form            INTEGER NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_at         INTEGER NOT NULL,
    created_ms      INTEGER NOT NULL,
    last_status     INTEGER,
    last_error      TEXT,
    last_latency_ms INTEGER,
    delivered_at    TEXT
) STRICT;

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_at);
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id, seq);

CREATE TABLE webhook_attempts (
    delivery_id TEXT NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    n           INTEGER NOT NULL,
    at          TEXT NOT NULL,
    status      INTEGER,
    error       TEXT,
    latency_ms  INTEGER NOT NULL,
    PRIMARY KEY (delivery_id, n)
) STRICT;
