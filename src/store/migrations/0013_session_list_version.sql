-- The whole session list is cached per tenant while no session changed (`api/kestrel`), its
-- version the last move's tick. So every change of a field the list shows, and every
-- deletion, is now a move too (migration 12 recorded changes of `updated_at` only); a move
-- that leaves `updated_at` as it was keeps the session's place in a walk.
DROP TRIGGER sessions_moved;

CREATE TRIGGER sessions_moved AFTER UPDATE ON sessions
WHEN OLD.updated_at IS NOT NEW.updated_at OR OLD.title IS NOT NEW.title OR OLD.status IS NOT NEW.status
  OR OLD.model IS NOT NEW.model OR OLD.message_count IS NOT NEW.message_count
  OR OLD.workspace IS NOT NEW.workspace
BEGIN
    INSERT INTO session_moves (session_id, from_updated_at) VALUES (OLD.id, OLD.updated_at);
END;

CREATE TRIGGER sessions_gone AFTER DELETE ON sessions
BEGIN
    INSERT INTO session_moves (session_id, from_updated_at) VALUES (OLD.id, OLD.updated_at);
END;
