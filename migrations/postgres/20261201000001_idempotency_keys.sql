-- The key record: one row per (scope, key). See DESIGN.md's state table.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope                 text        NOT NULL,
    key                   text        NOT NULL,
    step                  text        NOT NULL,
    fingerprint           bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    status                text        NOT NULL CHECK (status IN ('in_progress', 'completed')),
    response_status       smallint,
    response_content_type text,
    response_body         bytea,
    claim_token           bigint,
    created_at            timestamptz NOT NULL DEFAULT now(),
    locked_until          timestamptz NOT NULL,
    expires_at            timestamptz NOT NULL,
    PRIMARY KEY (scope, key),
    CHECK (status = 'in_progress' OR response_status IS NOT NULL)
);

-- The purger deletes expired rows in batches, oldest first.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);
