//! The `idem` command: look into, clean and migrate idem's key stores, on SQLite files and
//! Postgres databases alike.
//!
//! ```text
//! idem inspect --key K --scope TENANT [--step STEP ...] --store NAME=URL ...
//! idem inspect --key K --scope TENANT --config idem.toml [--service NAME ...] [--store NAME=URL ...]
//! idem keys list   --store URL [--scope TENANT] [--step STEP] [--status S] [--expired] [--limit N]
//! idem keys show   --store URL --key K --scope TENANT
//! idem keys delete --store URL --key K --scope TENANT [--yes]
//! idem keys list|show|delete --config idem.toml [--service NAME] ...
//! idem purge       --store URL [--batch N] [--dry-run]
//! idem migrate     --store URL [--check]
//! idem migrate     --sql sqlite|postgres
//! idem steps       --store NAME=URL ... [--declared a.v1,b.v2] [--declared-by BINARY]
//! idem outbox status  --store URL [--max-age 5m]
//! idem outbox list    --store URL [--state pending|sent|dead] [--limit N]
//! idem outbox requeue --store URL --id MESSAGE
//! idem outbox skip    --store URL --id MESSAGE [--yes]
//! idem inbox poison   --store URL [--consumer C] [--limit N]
//! idem inbox requeue  --store URL --consumer C --id MESSAGE
//! idem tenant move    --tenant T --to INDEX --directory URL --shard URL ... [--lease-wait 30s]
//! idem tenant move    --tenant T --to INDEX --config idem.toml [--service NAME]
//! ```
//!
//! A store is `NAME=URL` or just a URL: `postgres://…` (or `postgresql://…`),
//! `mysql://…` (or `mariadb://…`),
//! `sqlite:…`, or a SQLite file path. `--json` prints JSON for scripts;
//! keys are printed as `#` and their log tag (the first 12 hex digits of
//! their SHA-256, as idem's logs show them) unless `--show-keys` is given.
//!
//! A config file (`--config FILE`, or `IDEM_CONFIG`) names each service's
//! store, or its shards and router, for `keys`, `inspect` and `tenant move`:
//!
//! ```toml
//! [services.orders]
//! store = "postgres://idem@db/orders"
//!
//! [services.payments]                 # sharded by tenant, the hash router
//! shards = ["postgres://idem@db0/payments", "postgres://idem@db1/payments"]
//!
//! [services.ledger]                   # routed by the directory table
//! shards = ["postgres://idem@db0/ledger", "postgres://idem@db1/ledger"]
//! directory = "postgres://idem@db0/directory"
//! ```
//!
//! For a sharded service, `keys list` merges the shards (newest first,
//! `--limit` over all of them) and names each row's shard; `keys show` and
//! `keys delete` route the tenant as the service does and read every shard,
//! so a copy an interrupted move left elsewhere is reported (exit 1);
//! `inspect` reads the tenant's shard, and a move's other shard while one
//! is unfinished.
//!
//! Exit codes: 0 done, nothing to report; 1 found something (a record in
//! progress or missing, pending migrations, live keys of an undeclared step,
//! no record to show or delete, dead or blocked outbox messages or one older
//! than `--max-age`, poisoned inbox messages, nothing to requeue or skip, a tenant move that must
//! be run again: a relay still leasing its messages, or another move of it
//! running, a key record on a shard its tenant is not routed to); 2 usage
//! error (a bad URL, a shard out of range, an unknown tenant, a config that
//! cannot be read or names no store); 3 a store or shard could not be
//! opened or queried.

//!
//! The binary is `idem` (`cargo install --path idem-cli`); this library holds
//! its parts, so tests elsewhere in the workspace can reach the same code.

mod args;
mod cli;
mod config;
mod exit;
pub mod inspect;
mod keys;
mod migrate;
mod output;
mod queues;
mod service;
pub mod steps;
pub mod store;
mod tenant;

pub use cli::main;
