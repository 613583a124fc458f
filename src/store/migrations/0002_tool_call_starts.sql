-- A row per tool call that began executing. Written and committed before the tool runs: on
-- resume, a call with a row but no result may have had side effects (the model is told to
-- verify), while a call without a row provably never ran and is dispatched again.

CREATE TABLE tool_call_starts (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    call_id    TEXT NOT NULL,
    started_at TEXT NOT NULL,
    PRIMARY KEY (session_id, call_id)
) STRICT;
