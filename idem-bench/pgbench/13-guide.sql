\set r random(1, 1000000000000000)
BEGIN;
INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, created_at, locked_until, expires_at) VALUES ('t1', 'k-' || :client_id || '-' || :r, 'bench.v1', '\x0102030405060708091011121314151617181920212223242526272829303132', 'in_progress', now(), now(), now() + interval '1 day') ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, status = 'in_progress', response_status = NULL, response_content_type = NULL, response_body = NULL, expires_at = excluded.expires_at WHERE idempotency_keys.expires_at < now() RETURNING key;
INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('t1', 2500, 'EUR') RETURNING id;
UPDATE idempotency_keys SET status = 'completed', response_status = 200, response_content_type = 'application/json', response_body = '\x7b7d' WHERE scope = 't1' AND key = 'k-' || :client_id || '-' || :r;
END;
