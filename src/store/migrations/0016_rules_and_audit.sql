-- Permission rules added through the API and remembered approvals (the config file's rules
-- are never stored), and the audit log of every permission decision.
--
-- A rule with a `session_id` holds for that session only and goes with it; one without holds
-- for its tenant. `arguments`: a remembered approval of one exact call of a tool that has no
-- command or path to match (`policy::Call::exact_pattern`).
CREATE TABLE rules (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    session_id TEXT REFERENCES sessions (id) ON DELETE CASCADE,
    tool       TEXT NOT NULL,
    pattern    TEXT,
    arguments  TEXT,
    outcome    TEXT NOT NULL CHECK (outcome IN ('allow', 'ask', 'deny')),
    source     TEXT NOT NULL CHECK (source IN ('api', 'remembered')),
    created_at TEXT NOT NULL,
    created_by TEXT
);

CREATE INDEX rules_by_scope ON rules (tenant, session_id);

-- Never cascades: a session's decisions outlive it. Kept for `[audit] retention_days`.
CREATE TABLE audit (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at         TEXT NOT NULL,
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
