-- The walk's index holds what a list shows, so a page of sessions is read from the index
-- alone: before, each listed session cost a second search, of the table by rowid, the largest
-- single cost of a page after SQLite's own stepping (README, Performance). The writes that
-- change these columns also set `updated_at`, a key column, so they rewrite the index entry
-- already; the price is the bytes, about 200 a session.
DROP INDEX sessions_by_tenant_walk;
CREATE INDEX sessions_by_tenant_walk ON sessions
    (tenant, updated_at DESC, id DESC, title, model, workspace, status, created_at, message_count, forked_from);
