-- Migration 11's walks, lighter to write. Its triggers ticked a clock row and updated the
-- moved session a second time at every move, and `moved_tick` kept an index of its own:
-- together they halved the writer's rate for message appends. Now a move is one append to
-- `session_moves`, whose rowid is the walk clock: rowids grow in commit order (one writer),
-- so "moved since a walk's start" is "a move with a larger tick than the largest when the
-- walk started". A session's creation is a move from nowhere (`from_updated_at` NULL), so a
-- session created since a walk began is left to the next walk. The writer prunes moves older
-- than the longest walk by tick, a range of the primary key.
DROP TRIGGER sessions_born;
DROP TRIGGER sessions_moved;
DROP INDEX sessions_by_tenant_moved;
DROP INDEX session_moves_by_session;
DROP INDEX session_moves_by_time;
DROP TABLE session_moves;
DROP TABLE walk_clock;
ALTER TABLE sessions DROP COLUMN born_tick;
ALTER TABLE sessions DROP COLUMN moved_tick;

CREATE TABLE session_moves (
    tick            INTEGER PRIMARY KEY,
    session_id      TEXT NOT NULL,
    from_updated_at TEXT
) STRICT;

CREATE TRIGGER sessions_born AFTER INSERT ON sessions
BEGIN
    INSERT INTO session_moves (session_id, from_updated_at) VALUES (NEW.id, NULL);
END;

CREATE TRIGGER sessions_moved AFTER UPDATE OF updated_at ON sessions
WHEN OLD.updated_at != NEW.updated_at
BEGIN
    INSERT INTO session_moves (session_id, from_updated_at) VALUES (OLD.id, OLD.updated_at);
END;
