BEGIN;
SELECT 1;
INSERT INTO payments (tenant_id, amount_cents, currency) VALUES ('t1', 2500, 'EUR') RETURNING id;
END;
