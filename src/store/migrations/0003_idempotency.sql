-- Answers to requests sent with an Idempotency-Key, per tenant, kept at least 24 hours. A row
-- is written in the same transaction as what the request created, so a request that was
-- acknowledged (or would have been, had the connection survived) is never done twice.

CREATE TABLE idempotency (
    tenant      TEXT NOT NULL,
    key         TEXT NOT NULL,
    -- SHA-256 of the method, the path and the body: the same key with another request is a conflict.
    fingerprint TEXT NOT NULL,
    status      INTEGER NOT NULL,
    body        BLOB NOT NULL,
    created_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) STRICT;

CREATE INDEX idempotency_by_age ON idempotency (created_ms);
