-- Checkpoints: snapshots of a session's workspace. File contents live once each, by their
-- SHA-256, in <data_dir>/blobs; these tables are the manifests.
CREATE TABLE checkpoints (
    seq          INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    label        TEXT,
    kind         TEXT NOT NULL CHECK (kind IN ('manual', 'auto', 'safety')),
    created_at   TEXT NOT NULL,
    run_id       TEXT,
    file_count   INTEGER NOT NULL,
    total_bytes  INTEGER NOT NULL,
    -- The session's message count when it was taken: a rewind to the message at index i
    -- puts back the first automatic checkpoint taken after it (message_count > i).
    message_count INTEGER NOT NULL
) STRICT;

CREATE INDEX checkpoints_by_session ON checkpoints (session_id, seq);
CREATE INDEX checkpoints_by_run ON checkpoints (run_id) WHERE run_id IS NOT NULL;

-- One row per file or directory of a checkpoint; `digest` is NULL for a directory.
CREATE TABLE checkpoint_entries (
    checkpoint_seq INTEGER NOT NULL REFERENCES checkpoints (seq) ON DELETE CASCADE,
    path           TEXT NOT NULL,
    digest         TEXT,
    size           INTEGER NOT NULL,
    mode           INTEGER NOT NULL,
    PRIMARY KEY (checkpoint_seq, path)
) STRICT, WITHOUT ROWID;

CREATE INDEX checkpoint_entries_by_digest ON checkpoint_entries (digest) WHERE digest IS NOT NULL;
