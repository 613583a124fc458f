-- A start mark says which call it was, for whom, and whether its result was recorded, so a
-- door whose turns keep their server-run rounds in memory (BAE) can record, after a crash,
-- the calls that started and never finished. Marks written before this migration are
-- settled: their runs were resumed or recovered by the rules of their time.

ALTER TABLE tool_call_starts ADD COLUMN call TEXT;
ALTER TABLE tool_call_starts ADD COLUMN actor TEXT;
ALTER TABLE tool_call_starts ADD COLUMN settled INTEGER NOT NULL DEFAULT 1;
CREATE INDEX tool_call_starts_unsettled ON tool_call_starts (session_id) WHERE settled = 0;
