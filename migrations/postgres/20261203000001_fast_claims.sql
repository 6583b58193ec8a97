-- Keys and scopes compare byte by byte whatever the database's default
-- collation: the primary key's comparisons stay cheap, and two keys are equal
-- exactly when their bytes are.
ALTER TABLE idempotency_keys
    ALTER COLUMN scope TYPE text COLLATE "C",
    ALTER COLUMN key TYPE text COLLATE "C";

-- A free key's lock is taken at once, without touching lock_timeout; only a
-- busy one waits (at most p_wait_ms). The read is its own statement, so its
-- snapshot is taken after the lock: it sees what a previous holder committed.
CREATE OR REPLACE FUNCTION idem_lock_and_read(p_lock bigint, p_wait_ms int, p_scope text, p_key text)
RETURNS TABLE (status text, fingerprint bytea, response_status int8, response_content_type text,
               response_body bytea, expired boolean, lock_left_ms int8)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    previous_timeout text;
BEGIN
    IF NOT pg_try_advisory_xact_lock(p_lock) THEN
        previous_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', p_wait_ms::text, true);
        PERFORM pg_advisory_xact_lock(p_lock);
        PERFORM set_config('lock_timeout', previous_timeout, true);
    END IF;
    RETURN QUERY
        SELECT k.status, k.fingerprint, k.response_status::int8, k.response_content_type, k.response_body,
               k.expires_at <= statement_timestamp(),
               (EXTRACT(EPOCH FROM (k.locked_until - statement_timestamp())) * 1000)::int8
          FROM idempotency_keys k
         WHERE k.scope = p_scope AND k.key = p_key;
END
$$;
