-- The relay's claim walks pending messages in id order. Marking a message
-- sent leaves a dead entry in every index over pending rows until VACUUM
-- removes it. A plain index scan marks such entries dead the first time it
-- meets them and skips them afterwards; a bitmap scan, which the planner
-- prefers for the few rows it expects a claim to find, visits every one of
-- them on every claim, so the claim grew slower with each message sent since
-- the last VACUUM (milliseconds per claim after some tens of thousands).
-- Hence an index in the claim's order and the claim as a function that rules
-- bitmap scans out. Messages waiting out a backoff are skipped by the scan.
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (id) WHERE state = 'pending';
DROP INDEX IF EXISTS idem_outbox_due;

-- Leases up to p_batch due messages of the given sinks, oldest first, to
-- p_owner for p_lease_ms; none whose ordering key has an older message that
-- is not sent yet. Rows leased by another claim are skipped, not waited for.
CREATE OR REPLACE FUNCTION idem_outbox_claim(p_sinks text[], p_batch bigint, p_lease_ms float8, p_owner text)
RETURNS SETOF idem_outbox
LANGUAGE sql VOLATILE
SET enable_bitmapscan = off
AS $$
    WITH picked AS (
        SELECT o.id FROM idem_outbox o
         WHERE o.state = 'pending' AND o.available_at <= now()
           AND (o.lease_until IS NULL OR o.lease_until <= now())
           AND o.sink = ANY(p_sinks)
           AND (o.ordering_key IS NULL OR NOT EXISTS (
                 SELECT 1 FROM idem_outbox p
                  WHERE p.ordering_key = o.ordering_key AND p.state <> 'sent' AND p.id < o.id))
         ORDER BY o.id
         LIMIT p_batch
           FOR UPDATE SKIP LOCKED)
    UPDATE idem_outbox t
       SET lease_until = now() + p_lease_ms * interval '1 millisecond',
           lease_owner = p_owner,
           lease_token = t.lease_token + 1,
           attempts = t.attempts + 1
      FROM picked
     WHERE t.id = picked.id
    RETURNING t.*
$$;
