#!/usr/bin/env bash
# Prices each piece of idem's Postgres protocol with pgbench (a C client, so
# the figures are the server's and the wire's, not sqlx's): every script is the
# unprotected write plus one piece, run for the same time at the same client
# count. 9a and 9b pipeline what needs no answer in between (pgbench's
# \startpipeline): 9a is idem's protocol as a pipelining driver could send it
# (4 round trips instead of 6), 9b the least any safe claim must do (lock and
# read, the business write, the record; no read before the lock, so no cheap
# replay). 10 is the 4-round-trip fresh path (the lock-and-check message
# and BEGIN pipelined, then the business write, the record, COMMIT), 11 the same
# with one outbox message inserted as `outbox::enqueue` does, 12 that insert
# pipelined with the record's (no round trip of its own): 11 and 12 against
# 10 bound what enqueuing costs in any client; 13 is the guide's SQL (claim
# insert, business write, completion update), the fresh path's yardstick; 14
# is the fresh path as the engine ships it, in 3 round trips (the record's
# insert travels with the COMMIT; pipelined and prepared here, where the
# engine sends one simple-protocol message with literals).
# Usage: run.sh "host=127.0.0.1 port=5432 user=postgres" [clients] [seconds]
#
# It creates a database `idem_pgbench`, applies idem's migrations and the
# benchmark's payments table, and prints tps and µs per operation per script.
set -euo pipefail
conn=$1
clients=${2:-8}
seconds=${3:-6}
here=$(cd "$(dirname "$0")" && pwd)
bin=$(dirname "$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | tail -1)")
psql() { "$bin/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql "$conn dbname=postgres" -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS idem_pgbench" -c "CREATE DATABASE idem_pgbench"
for migration in "$here"/../../migrations/postgres/*.sql; do
  psql "$conn dbname=idem_pgbench" -f "$migration"
done
psql "$conn dbname=idem_pgbench" -c "CREATE TABLE payments (id bigserial PRIMARY KEY, tenant_id text NOT NULL, \
  amount_cents bigint NOT NULL, currency text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
base=
for script in "$here"/[0-9]*.sql; do
  tps=$("$bin/pgbench" "$conn dbname=idem_pgbench" -n -M prepared -c "$clients" -j 2 -T "$seconds" -f "$script" 2>/dev/null \
        | awk '/^tps/ {print $3}')
  base=${base:-$tps}
  awk -v s="$(basename "$script" .sql)" -v t="$tps" -v b="$base" -v c="$clients" \
    'BEGIN { printf "%-18s %9.0f tps  %6.1f µs/op  %.2f× unprotected\n", s, t, 1e6 / t, t / b }'
done
