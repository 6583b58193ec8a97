-- The response headers a replay carries (Location, ETag, ...): a JSON array
-- of [name, value] pairs, NULL when the response kept none. Rows written
-- before this column existed replay without headers, as they were answered.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS response_headers text;

-- The claim's lock-and-read also returns the headers. A function's result
-- columns cannot be changed in place, so it is dropped and created again.
DROP FUNCTION IF EXISTS idem_lock_and_read(bigint, int, text, text);
CREATE FUNCTION idem_lock_and_read(p_lock bigint, p_wait_ms int, p_scope text, p_key text)
RETURNS TABLE (status text, fingerprint bytea, response_status int8, response_content_type text,
               response_body bytea, expired boolean, lock_left_ms int8, response_headers text)
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
               (EXTRACT(EPOCH FROM (k.locked_until - statement_timestamp())) * 1000)::int8,
               k.response_headers
          FROM idempotency_keys k
         WHERE k.scope = p_scope AND k.key = p_key;
END
$$;
