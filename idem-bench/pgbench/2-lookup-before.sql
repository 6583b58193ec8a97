\set r random(1, 1000000000000000)
SELECT status, fingerprint FROM idempotency_keys WHERE scope = 't1' AND key = 'k-' || :client_id || '-' || :r;
BEGIN;
INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('t1', 2500, 'EUR') RETURNING id;
END;
