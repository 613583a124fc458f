-- Several Kestrel nodes on this database (docs/cluster.md, store/postgres/cluster.rs).

-- Each node's row, written at start and at every heartbeat. Times are the database's clock,
-- never a node's, so nodes whose clocks disagree still agree on who is alive.
CREATE TABLE cluster_nodes (
    id            TEXT COLLATE "C" PRIMARY KEY,
    advertise_url TEXT NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL,
    heartbeat_at  TIMESTAMPTZ NOT NULL
);

-- Which node owns a live session, until when. Every claim by another node takes a new epoch
-- from the sequence, so epochs never repeat: a node's writes name the epoch it holds, and a
-- write whose epoch is no longer the row's is refused (fencing).
CREATE SEQUENCE lease_epochs;

CREATE TABLE session_leases (
    session_id TEXT COLLATE "C" PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    node_id    TEXT COLLATE "C" NOT NULL,
    epoch      BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX session_leases_by_node ON session_leases (node_id);
