-- A session's whole answer (`GET /api/sessions/:id`) is cached too, at the same version as
-- the list: so a change of its system prompt is a move as well. Its messages change only with
-- its `message_count` or `updated_at`, which migration 13 already counts.
DROP TRIGGER sessions_moved;

CREATE TRIGGER sessions_moved AFTER UPDATE ON sessions
WHEN OLD.updated_at IS NOT NEW.updated_at OR OLD.title IS NOT NEW.title OR OLD.status IS NOT NEW.status
  OR OLD.model IS NOT NEW.model OR OLD.message_count IS NOT NEW.message_count
  OR OLD.workspace IS NOT NEW.workspace OR OLD.system_prompt IS NOT NEW.system_prompt
BEGIN
    INSERT INTO session_moves (session_id, from_updated_at) VALUES (OLD.id, OLD.updated_at);
END;
