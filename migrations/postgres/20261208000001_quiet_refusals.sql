-- A replay or a conflict is answered by idem_lock_if_fresh refusing the key
-- with SQLSTATE IDEMK: expected control flow, not a failure. Left alone, the
-- server would log every refusal as an ERROR, with the stored response in
-- its DETAIL and the key in its STATEMENT. Setting log_min_messages on the
-- function keeps them out of the server log; it takes a superuser (or, from
-- Postgres 15, SET privilege on log_min_messages), and a role without it
-- leaves the function as it is: docs/OPERATIONS.md has the statement for an
-- administrator to run.
DO $$
BEGIN
    ALTER FUNCTION idem_lock_if_fresh(bigint, int, text, text) SET log_min_messages = 'log';
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'idem: replays will be logged as errors by the server until an administrator runs: ALTER FUNCTION idem_lock_if_fresh(bigint, int, text, text) SET log_min_messages = ''log''';
END
$$;
