-- Versions interleave with idem's on purpose: each migrator must ignore the other's.
ALTER TABLE orders ADD COLUMN note TEXT;
