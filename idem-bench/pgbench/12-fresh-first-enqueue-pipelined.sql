\set r random(1, 1000000000000000)
\startpipeline
BEGIN;
SELECT idem_lock_if_fresh(:r, 5000, 't1', 'k-' || :client_id || '-' || :r);
\endpipeline
INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('t1', 2500, 'EUR') RETURNING id;
\startpipeline
INSERT INTO idem_outbox (message_id, scope, parent_key, step, sink, destination, ordering_key, headers, payload, content_type, max_attempts) VALUES ('m-' || :client_id || '-' || :r, 't1', 'k-' || :client_id || '-' || :r, 'charge-notice.v1', 'nats', 'bench.charges', NULL, '[]'::jsonb, '\x7b22616d6f756e74223a20323530307d', 'application/json', 10) ON CONFLICT (message_id) DO NOTHING;
INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, response_status, response_content_type, response_body, created_at, locked_until, expires_at) VALUES ('t1', 'k-' || :client_id || '-' || :r, 'bench.v1', '\x0102030405060708091011121314151617181920212223242526272829303132', 'completed', 200, 'application/json', '\x7b7d', now(), now(), now() + interval '1 day');
\endpipeline
END;
