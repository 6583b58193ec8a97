-- Messages an idempotent consumer gave up on: a permanent error, too many
-- deliveries, or a message id reused with another payload. One row per
-- (consumer, message id); kept until an operator deletes it.
CREATE TABLE IF NOT EXISTS idem_poison (
    consumer    text COLLATE "C" NOT NULL,
    message_id  text COLLATE "C" NOT NULL,
    source      text,
    source_seq  bigint,
    payload     bytea       NOT NULL,
    error       text        NOT NULL,
    deliveries  integer     NOT NULL,
    state       text        NOT NULL DEFAULT 'poison' CHECK (state IN ('poison', 'requeued')),
    requeues    integer     NOT NULL DEFAULT 0,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    poisoned_at timestamptz NOT NULL DEFAULT now(),
    requeued_at timestamptz,
    PRIMARY KEY (consumer, message_id)
);
