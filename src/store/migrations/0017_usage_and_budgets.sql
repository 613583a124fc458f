-- What each budget scope spent, per UTC day (`d:2026-12-01`) and month (`m:2026-12`): a
-- tenant's (`tenant:<name>`) or a BAE profile's (`profile:<id>`). Added to with each model
-- call's usage; read when a run starts and before each of its model calls.
CREATE TABLE usage (
    scope  TEXT NOT NULL,
    period TEXT NOT NULL,
    tokens INTEGER NOT NULL DEFAULT 0,
    cost   REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, period)
) WITHOUT ROWID;

-- A BAE profile's budget (`policy::Budget` as JSON), Kestrel's extension of the admin API;
-- NULL: the server's `[agent.budget]`.
ALTER TABLE bae_profiles ADD COLUMN budget TEXT;
