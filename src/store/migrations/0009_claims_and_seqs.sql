-- A turn is claimed by compare-and-set: `run_id` and `node` say which run holds a `running`
-- session and which process runs it, so a node's recovery ends only its own turns. Rows
-- running before this migration have no node: the next start ends them, as it always did.
ALTER TABLE sessions ADD COLUMN run_id TEXT;
ALTER TABLE sessions ADD COLUMN node TEXT;

-- Seqs are allocated in the transaction that commits their events, from `seq_last`; it
-- starts above everything the block reservations of earlier versions could have handed out.
INSERT INTO meta (key, value)
SELECT 'seq_last', max(
    coalesce((SELECT value FROM meta WHERE key = 'seq_ceiling'), 0),
    coalesce((SELECT max(seq) FROM events), 0))
WHERE NOT EXISTS (SELECT 1 FROM meta WHERE key = 'seq_last');
DELETE FROM meta WHERE key = 'seq_ceiling';
