-- idem's tables on MySQL 8.0+ and MariaDB 10.6+ (InnoDB). Times are Unix
-- milliseconds (BIGINT), read from the server's clock. Text that is compared
-- exactly (scopes, keys, message ids, consumers) uses a binary collation, so
-- `A` and `a` are different keys; idem's reads cast such columns to CHAR, as
-- servers flag binary-collated text as binary. `key` is a reserved word in
-- MySQL: idem's statements quote it.

-- The key record: one row per (scope, key). The row is also the claim's lock:
-- a claim inserts an in_progress row, and a duplicate's insert waits on it.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope                 VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`                 VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    step                  VARCHAR(255) NOT NULL,
    fingerprint           VARBINARY(32) NOT NULL,
    status                VARCHAR(16) NOT NULL,
    response_status       SMALLINT,
    response_content_type VARCHAR(255),
    response_body         LONGBLOB,
    response_headers      LONGTEXT,
    claim_token           BIGINT,
    created_at            BIGINT NOT NULL,
    locked_until          BIGINT NOT NULL,
    expires_at            BIGINT NOT NULL,
    PRIMARY KEY (scope, `key`),
    KEY idempotency_keys_expires_at (expires_at),
    CONSTRAINT idempotency_keys_status CHECK (status IN ('in_progress', 'completed')),
    CONSTRAINT idempotency_keys_response CHECK (status = 'in_progress' OR response_status IS NOT NULL)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- The transactional outbox: messages enqueued in the claim's transaction and
-- delivered by the relay after the commit. See docs/OUTBOX.md.
CREATE TABLE IF NOT EXISTS idem_outbox (
    id            BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    -- child_key(parent_key, step), or an explicit id: a retried or taken-over
    -- attempt cannot enqueue a second copy.
    message_id    VARCHAR(700) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    scope         VARCHAR(512) NOT NULL,
    parent_key    VARCHAR(255),
    step          VARCHAR(255) NOT NULL,
    sink          VARCHAR(255) NOT NULL,
    destination   TEXT NOT NULL,
    ordering_key  VARCHAR(512),
    headers       LONGTEXT NOT NULL,
    payload       LONGBLOB NOT NULL,
    content_type  VARCHAR(255) NOT NULL,
    state         VARCHAR(16) NOT NULL DEFAULT 'pending',
    attempts      INT NOT NULL DEFAULT 0,
    max_attempts  INT NOT NULL,
    available_at  BIGINT NOT NULL,
    lease_until   BIGINT,
    lease_owner   VARCHAR(255),
    lease_token   BIGINT NOT NULL DEFAULT 0,
    last_error    TEXT,
    receipt       TEXT,
    created_at    BIGINT NOT NULL,
    sent_at       BIGINT,
    UNIQUE KEY idem_outbox_message_id (message_id),
    -- The relay's claim: pending messages in id order.
    KEY idem_outbox_pending (state, id),
    -- The ordering check: an older unsent message with the same key.
    KEY idem_outbox_ordering (ordering_key, id),
    -- Operators: the messages of one operation.
    KEY idem_outbox_parent (scope, parent_key),
    -- The retention purge.
    KEY idem_outbox_sent_at (state, sent_at),
    CONSTRAINT idem_outbox_state CHECK (state IN ('pending', 'sent', 'dead')),
    CONSTRAINT idem_outbox_max_attempts CHECK (max_attempts > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Messages an idempotent consumer gave up on. One row per (consumer,
-- message id); kept until an operator deletes it.
CREATE TABLE IF NOT EXISTS idem_poison (
    consumer    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id  VARCHAR(450) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    source      TEXT,
    source_seq  BIGINT,
    payload     LONGBLOB NOT NULL,
    error       TEXT NOT NULL,
    deliveries  INT NOT NULL,
    state       VARCHAR(16) NOT NULL DEFAULT 'poison',
    requeues    INT NOT NULL DEFAULT 0,
    first_seen  BIGINT NOT NULL,
    poisoned_at BIGINT NOT NULL,
    requeued_at BIGINT,
    PRIMARY KEY (consumer, message_id),
    CONSTRAINT idem_poison_state CHECK (state IN ('poison', 'requeued'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
