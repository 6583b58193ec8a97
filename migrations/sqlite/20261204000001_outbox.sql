-- The transactional outbox: messages enqueued in the claim's transaction and
-- delivered by the relay after the commit. See docs/OUTBOX.md.
-- Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS idem_outbox (
    id            INTEGER PRIMARY KEY,
    -- child_key(parent_key, step), or an explicit id: a retried or taken-over
    -- attempt cannot enqueue a second copy.
    message_id    TEXT    NOT NULL UNIQUE,
    scope         TEXT    NOT NULL,
    parent_key    TEXT,
    step          TEXT    NOT NULL,
    sink          TEXT    NOT NULL,
    destination   TEXT    NOT NULL,
    ordering_key  TEXT,
    headers       TEXT    NOT NULL DEFAULT '[]',
    payload       BLOB    NOT NULL,
    content_type  TEXT    NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    max_attempts  INTEGER NOT NULL CHECK (max_attempts > 0),
    available_at  INTEGER NOT NULL,
    lease_until   INTEGER,
    lease_owner   TEXT,
    lease_token   INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    receipt       TEXT,
    created_at    INTEGER NOT NULL,
    sent_at       INTEGER
);

-- The relay's claim: due pending messages, oldest first.
CREATE INDEX IF NOT EXISTS idem_outbox_due ON idem_outbox (available_at, id) WHERE state = 'pending';
-- The ordering check: an older unsent message with the same key.
CREATE INDEX IF NOT EXISTS idem_outbox_ordering ON idem_outbox (ordering_key, id)
    WHERE state <> 'sent' AND ordering_key IS NOT NULL;
-- Operators: the messages of one operation.
CREATE INDEX IF NOT EXISTS idem_outbox_parent ON idem_outbox (scope, parent_key);
-- Operators: dead letters.
CREATE INDEX IF NOT EXISTS idem_outbox_dead ON idem_outbox (id) WHERE state = 'dead';
-- The retention purge.
CREATE INDEX IF NOT EXISTS idem_outbox_sent_at ON idem_outbox (sent_at) WHERE state = 'sent';
