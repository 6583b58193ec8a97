\set r random(1, 1000000000000000)
BEGIN;
INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('t1', 2500, 'EUR') RETURNING id;
INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, response_content_type, response_body, created_at, locked_until, expires_at) VALUES ('t1', 'k-' || :client_id || '-' || :r, 'bench.v1', sha256('x'), 'completed', 200, 'application/json', '\x7b7d', now(), now(), now() + interval '1 day') ON CONFLICT (scope, key) DO NOTHING;
END;
