-- The response headers a replay carries (Location, ETag, ...): a JSON array
-- of [name, value] pairs, NULL when the response kept none. Rows written
-- before this column existed replay without headers, as they were answered.
ALTER TABLE idempotency_keys ADD COLUMN response_headers TEXT;
