\set r random(1, 1000000000000000)
BEGIN;
SELECT * FROM idem_lock_and_read(:r, 5000, 't1', 'k-' || :client_id || '-' || :r);
INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('t1', 2500, 'EUR') RETURNING id;
END;
