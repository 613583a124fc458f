-- A checkpoint whose files are exactly those of an earlier checkpoint of its session shares
-- that one's entries instead of copying them (an unchanged workspace of 20,000 files was
-- 20,000 rows and as many random inserts into `checkpoint_entries_by_digest` per run).
--
-- `manifest`: the seq of the checkpoint whose `checkpoint_entries` are this one's files; NULL
-- when they are its own. It is always a checkpoint of the same session, so the entries go
-- when the session goes (checkpoints are never deleted one by one).
-- `manifest_digest`: the SHA-256 of the entries (`store::checkpoints::Manifest`); NULL for a
-- checkpoint taken before this migration, which nothing shares.
ALTER TABLE checkpoints ADD COLUMN manifest INTEGER;
ALTER TABLE checkpoints ADD COLUMN manifest_digest TEXT;

CREATE INDEX checkpoints_by_manifest ON checkpoints (session_id, manifest_digest) WHERE manifest_digest IS NOT NULL;
