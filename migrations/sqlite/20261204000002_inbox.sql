-- Messages an idempotent consumer gave up on: a permanent error, too many
-- deliveries, or a message id reused with another payload. One row per
-- (consumer, message id); kept until an operator deletes it. Times are Unix
-- milliseconds.
CREATE TABLE IF NOT EXISTS idem_poison (
    consumer    TEXT    NOT NULL,
    message_id  TEXT    NOT NULL,
    source      TEXT,
    source_seq  INTEGER,
    payload     BLOB    NOT NULL,
    error       TEXT    NOT NULL,
    deliveries  INTEGER NOT NULL,
    state       TEXT    NOT NULL DEFAULT 'poison' CHECK (state IN ('poison', 'requeued')),
    requeues    INTEGER NOT NULL DEFAULT 0,
    first_seen  INTEGER NOT NULL,
    poisoned_at INTEGER NOT NULL,
    requeued_at INTEGER,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
