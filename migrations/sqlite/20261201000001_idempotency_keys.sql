-- The key record: one row per (scope, key). See DESIGN.md's state table.
-- Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope                 TEXT    NOT NULL,
    key                   TEXT    NOT NULL,
    step                  TEXT    NOT NULL,
    fingerprint           BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    status                TEXT    NOT NULL CHECK (status IN ('in_progress', 'completed')),
    response_status       INTEGER,
    response_content_type TEXT,
    response_body         BLOB,
    claim_token           INTEGER,
    created_at            INTEGER NOT NULL,
    locked_until          INTEGER NOT NULL,
    expires_at            INTEGER NOT NULL,
    PRIMARY KEY (scope, key),
    CHECK (status = 'in_progress' OR response_status IS NOT NULL)
) WITHOUT ROWID;

-- The purger deletes expired rows in batches, oldest first.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);
