\set r random(1, 1000000000000000)
BEGIN;
SELECT pg_advisory_xact_lock(:r);
INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('t1', 2500, 'EUR') RETURNING id;
END;
