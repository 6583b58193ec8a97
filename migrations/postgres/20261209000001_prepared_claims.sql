-- A fresh key's claim and its completion as session-prepared statements, so
-- the messages the engine sends on the fresh path are planned once per
-- connection instead of parsed and planned on every call:
--   EXECUTE idem_v1_lock(lock, wait); EXECUTE idem_v1_check(scope, key); BEGIN
--   EXECUTE idem_v1_insert_completed(…); COMMIT; BEGIN
-- The lock and the check are two statements so that the check's snapshot is
-- taken after the lock: it sees what a previous holder committed. A free
-- lock is taken with pg_try_advisory_xact_lock; only a busy one calls
-- idem_wait_for_lock, which waits at most p_wait_ms. A key with any record is
-- refused with SQLSTATE IDEMK (as by idem_lock_if_fresh), the record as JSON
-- in the error's DETAIL; the whole message rolls back, lock included.
--
-- Prepared statements belong to a session and outlive any transaction.
-- idem's pools call idem_prepare_claims() as each connection opens. A
-- connection without them answers the fresh message with SQLSTATE 26000
-- before anything runs; the engine then claims the key the full way, whose
-- transaction starts with idem_prepare_claims(), and completes it with the
-- statement itself. Only a claim whose fresh message ran completes with
-- idem_v1_insert_completed. idem_lock_if_fresh stays for engines of earlier
-- releases still running during a rolling deploy.

CREATE OR REPLACE FUNCTION idem_wait_for_lock(p_lock bigint, p_wait_ms int)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    previous_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms::text, true);
    PERFORM pg_advisory_xact_lock(p_lock);
    PERFORM set_config('lock_timeout', previous_timeout, true);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION idem_refuse(p_record text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'IDEMK', MESSAGE = 'idem: the key already has a record',
        DETAIL = p_record;
END
$$;

CREATE OR REPLACE FUNCTION idem_prepare_claims()
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    present text[];
    statement text;
BEGIN
    SELECT coalesce(array_agg(name::text), '{}') INTO present
      FROM pg_prepared_statements WHERE name LIKE 'idem\_v1\_%';
    IF cardinality(present) = 3 THEN
        RETURN;
    END IF;
    FOREACH statement IN ARRAY ARRAY[
        $s$PREPARE idem_v1_lock(bigint, int) AS
           SELECT CASE WHEN pg_try_advisory_xact_lock($1) THEN true ELSE idem_wait_for_lock($1, $2) END$s$,
        $s$PREPARE idem_v1_check(text, text) AS
           SELECT idem_refuse(json_build_object(
                      'status', k.status,
                      'fingerprint', encode(k.fingerprint, 'hex'),
                      'response_status', k.response_status,
                      'response_content_type', k.response_content_type,
                      'response_body', encode(k.response_body, 'hex'),
                      'expired', k.expires_at <= statement_timestamp(),
                      'lock_left_ms', (EXTRACT(EPOCH FROM (k.locked_until - statement_timestamp())) * 1000)::int8,
                      'response_headers', k.response_headers)::text)
             FROM idempotency_keys k
            WHERE k.scope = $1 AND k.key = $2$s$,
        -- The parameters of the engine's bound completed-record statements:
        -- scope, key, step, fingerprint, status, content type, body,
        -- retention in milliseconds, headers.
        $s$PREPARE idem_v1_insert_completed(text, text, text, bytea, smallint, text, bytea, float8, text) AS
           INSERT INTO idempotency_keys
             (scope, key, step, fingerprint, status, response_status, response_content_type, response_body,
              response_headers, claim_token, created_at, locked_until, expires_at)
           VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $9, NULL, now(), now(),
                   now() + $8 * interval '1 millisecond')$s$
    ] LOOP
        IF NOT substring(statement FROM 'PREPARE (\w+)') = ANY (present) THEN
            EXECUTE statement;
        END IF;
    END LOOP;
END
$$;

-- As for idem_lock_if_fresh: a refusal is control flow, kept out of the
-- server log where the migrating role may say so.
DO $$
BEGIN
    ALTER FUNCTION idem_refuse(text) SET log_min_messages = 'log';
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'idem: replays will be logged as errors by the server until an administrator runs: ALTER FUNCTION idem_refuse(text) SET log_min_messages = ''log''';
END
$$;
