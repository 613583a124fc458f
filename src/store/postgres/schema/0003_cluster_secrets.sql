-- Values every node of a cluster must share, proposed by the first node to start and used by
-- all (store/postgres/cluster.rs, `Membership::agree`): the secret BAE keys are hashed under,
-- so that a key minted at one node is known at every other.
CREATE TABLE cluster_values (
    name  TEXT COLLATE "C" PRIMARY KEY,
    value TEXT NOT NULL
);
