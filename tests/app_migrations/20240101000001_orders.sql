-- An application's own migration, kept beside idem's in the same database.
CREATE TABLE orders (
    id BIGINT PRIMARY KEY,
    customer TEXT NOT NULL
);
