-- The durable event log: every event but a token delta, with the seq it was streamed with,
-- written before it is streamed. `Last-Event-ID` replays from here when the in-memory ring
-- no longer has the id, across restarts too. `body` is the event as its wire JSON.

CREATE TABLE events (
    seq        INTEGER PRIMARY KEY,
    -- NULL: an event every tenant may see (a notice).
    tenant     TEXT,
    -- NULL: an event about no session.
    session_id TEXT,
    type       TEXT NOT NULL,
    at         TEXT NOT NULL,
    body       TEXT NOT NULL
) STRICT;

CREATE INDEX events_by_session ON events (session_id, seq);
CREATE INDEX events_by_tenant ON events (tenant, seq);
