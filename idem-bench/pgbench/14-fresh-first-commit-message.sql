\set r random(1, 1000000000000000)
\startpipeline
BEGIN;
SELECT idem_lock_if_fresh(:r, 5000, 't1', 'k-' || :client_id || '-' || :r);
\endpipeline
INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('t1', 2500, 'EUR') RETURNING id;
\startpipeline
INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, response_content_type, response_body, created_at, locked_until, expires_at) VALUES ('t1', 'k-' || :client_id || '-' || :r, 'bench.v1', '\x0102030405060708091011121314151617181920212223242526272829303132', 'completed', 200, 'application/json', '\x7b7d', now(), now(), now() + interval '1 day');
END;
\endpipeline
