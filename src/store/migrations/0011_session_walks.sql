-- Walking a tenant's sessions a page at a time, most recently updated first, while they
-- change. A walk lists the sessions as they stood at its start, each at the place it had
-- then: a session updated meanwhile keeps that place and is listed once, one created
-- meanwhile is not listed.
--
-- "As they stood" is told by a clock that ticks at every commit that creates a session or
-- moves one (changes its `updated_at`), so it is exactly as ordered as the commits and does
-- not depend on when a timestamp was taken. A walk starts at the clock's value in the
-- snapshot its first page reads.
CREATE TABLE walk_clock (
    only INTEGER PRIMARY KEY CHECK (only = 0),
    tick INTEGER NOT NULL
) STRICT;
INSERT INTO walk_clock (only, tick) VALUES (0, 0);

ALTER TABLE sessions ADD COLUMN born_tick INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN moved_tick INTEGER NOT NULL DEFAULT 0;

-- Every move, with the place the session had before it. The writer prunes moves older than
-- the longest walk.
CREATE TABLE session_moves (
    session_id      TEXT NOT NULL,
    tick            INTEGER NOT NULL,
    from_updated_at TEXT NOT NULL,
    moved_at        TEXT NOT NULL
) STRICT;

CREATE INDEX session_moves_by_session ON session_moves (session_id, tick);
CREATE INDEX session_moves_by_time ON session_moves (moved_at);

CREATE TRIGGER sessions_born AFTER INSERT ON sessions
BEGIN
    UPDATE walk_clock SET tick = tick + 1;
    UPDATE sessions SET born_tick = (SELECT tick FROM walk_clock), moved_tick = (SELECT tick FROM walk_clock)
    WHERE id = NEW.id;
END;

CREATE TRIGGER sessions_moved AFTER UPDATE OF updated_at ON sessions
WHEN OLD.updated_at != NEW.updated_at
BEGIN
    UPDATE walk_clock SET tick = tick + 1;
    INSERT INTO session_moves (session_id, tick, from_updated_at, moved_at)
    VALUES (OLD.id, (SELECT tick FROM walk_clock), OLD.updated_at, NEW.updated_at);
    UPDATE sessions SET moved_tick = (SELECT tick FROM walk_clock) WHERE id = NEW.id;
END;

-- A page is a range of this index, ties broken by id; those moved since the walk's start
-- are found by the second.
CREATE INDEX sessions_by_tenant_walk ON sessions (tenant, updated_at DESC, id DESC);
CREATE INDEX sessions_by_tenant_moved ON sessions (tenant, moved_tick);
