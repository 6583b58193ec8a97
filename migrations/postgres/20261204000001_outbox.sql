-- The transactional outbox: messages enqueued in the claim's transaction and
-- delivered by the relay after the commit. See docs/OUTBOX.md.
CREATE TABLE IF NOT EXISTS idem_outbox (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- child_key(parent_key, step), or an explicit id: a retried or taken-over
    -- attempt cannot enqueue a second copy.
    message_id    text COLLATE "C" NOT NULL UNIQUE,
    scope         text        NOT NULL,
    parent_key    text,
    step          text        NOT NULL,
    sink          text        NOT NULL,
    destination   text        NOT NULL,
    ordering_key  text,
    headers       jsonb       NOT NULL DEFAULT '[]',
    payload       bytea       NOT NULL,
    content_type  text        NOT NULL,
    state         text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL CHECK (max_attempts > 0),
    available_at  timestamptz NOT NULL DEFAULT now(),
    lease_until   timestamptz,
    lease_owner   text,
    lease_token   bigint      NOT NULL DEFAULT 0,
    last_error    text,
    receipt       text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    sent_at       timestamptz
) WITH (fillfactor = 70);

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
