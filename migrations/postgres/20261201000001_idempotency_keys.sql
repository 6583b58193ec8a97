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

-- A claim's first statement: wait (at most p_wait_ms) for the transaction-scoped
-- advisory lock on the key, then read its record. Each statement of a volatile
-- function takes a fresh snapshot, so the read sees what a previous holder of
-- the lock committed. A lock timeout raises lock_not_available (55P03) and
-- aborts the transaction, which the caller rolls back.
CREATE OR REPLACE FUNCTION idem_lock_and_read(p_lock bigint, p_wait_ms int, p_scope text, p_key text)
RETURNS TABLE (status text, fingerprint bytea, response_status int8, response_content_type text,
               response_body bytea, expired boolean, lock_left_ms int8)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    previous_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms::text, true);
    PERFORM pg_advisory_xact_lock(p_lock);
    PERFORM set_config('lock_timeout', previous_timeout, true);
    RETURN QUERY
        SELECT k.status, k.fingerprint, k.response_status::int8, k.response_content_type, k.response_body,
               k.expires_at <= statement_timestamp(),
               (EXTRACT(EPOCH FROM (k.locked_until - statement_timestamp())) * 1000)::int8
          FROM idempotency_keys k
         WHERE k.scope = p_scope AND k.key = p_key;
END
$$;
