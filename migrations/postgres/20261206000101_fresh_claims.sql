-- A fresh key's claim in one round trip: the engine sends
-- `SELECT idem_lock_if_fresh(…); BEGIN` as one message, so the lock taken in
-- the message's implicit transaction is carried into the transaction BEGIN
-- opens. A key that has a record (completed, in progress or expired) is
-- refused with SQLSTATE IDEMK, which rolls the whole message back, lock
-- included; the error's DETAIL carries the record read under the lock as a
-- JSON object (binary columns in hex), so a replay or a conflict is answered
-- from it without another round trip.
-- The lock is taken as in idem_lock_and_read: at once when free, waiting at
-- most p_wait_ms when busy. The read is its own statement, so its snapshot is
-- taken after the lock: it sees what a previous holder committed.
CREATE OR REPLACE FUNCTION idem_lock_if_fresh(p_lock bigint, p_wait_ms int, p_scope text, p_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    previous_timeout text;
    found_record text;
BEGIN
    IF NOT pg_try_advisory_xact_lock(p_lock) THEN
        previous_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', p_wait_ms::text, true);
        PERFORM pg_advisory_xact_lock(p_lock);
        PERFORM set_config('lock_timeout', previous_timeout, true);
    END IF;
    SELECT json_build_object(
               'status', k.status,
               'fingerprint', encode(k.fingerprint, 'hex'),
               'response_status', k.response_status,
               'response_content_type', k.response_content_type,
               'response_body', encode(k.response_body, 'hex'),
               'expired', k.expires_at <= statement_timestamp(),
               'lock_left_ms', (EXTRACT(EPOCH FROM (k.locked_until - statement_timestamp())) * 1000)::int8,
               'response_headers', k.response_headers)::text
      INTO found_record
      FROM idempotency_keys k
     WHERE k.scope = p_scope AND k.key = p_key;
    IF found_record IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDEMK', MESSAGE = 'idem: the key already has a record',
            DETAIL = found_record;
    END IF;
END
$$;
