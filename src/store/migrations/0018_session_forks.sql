-- Migration 18: a forked session records where it came from (`POST /api/sessions/:id/fork`):
-- `{"sessionId": …, "messageId": …}` as JSON, NULL for every other session.
ALTER TABLE sessions ADD COLUMN forked_from TEXT;
