//! `--floors`: what each statement of idem's fresh Postgres path costs.
//!
//! Every variant but the baselines claims a fresh key the way the engine does
//! (a first message, the work's insert, then the completed record with the
//! `COMMIT` in one message), written out by hand so that one piece at a time
//! can change: the first message carries nothing (`BEGIN` alone, unsafe),
//! `SELECT 1`, the lock alone, the check alone, both as shipped, or both in
//! one PL/pgSQL or SQL-function call; or the key's own row is its lock (an
//! `in_progress` insert, then an update to the completed record: the design
//! of `KeyLock::Row` as prepared statements); or the record goes into a copy
//! of the key table whose `expires_at` index is a b-tree (as shipped), a BRIN
//! index or none. The guide's SQL, the unprotected write and the engine
//! itself run beside them on the same pool. Each figure is the median over
//! rounds of the variant's throughput ÷ the guide's SQL's in the same round,
//! with the quartiles.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use idem_runtime::store::postgres::{pool_options, prepare_claims};
use idem_runtime::{Engine, Policy, Via};
use serde::Serialize;
use sqlx::{Executor, PgPool, Postgres, Transaction};

use crate::charge::{keyed, unprotected, Business, CHARGE_CARD};
use crate::measure::{drive, median, op, OpFn};
use crate::pg::{self, Pg};
use crate::target::{BenchError, TENANT};
use crate::throughput::ops_for;

/// One way of claiming a fresh key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Floor {
    SeedSql,
    Unprotected,
    NoLock,
    SelectOne,
    LockOnly,
    CheckOnly,
    Shipped,
    OneCall,
    OneSqlCall,
    Engine,
    BtreeCopy,
    NoIndex,
    Brin,
    RowClaim,
    RowClaimBounded,
}

impl Floor {
    const ALL: [Floor; 15] = [
        Floor::SeedSql,
        Floor::Unprotected,
        Floor::NoLock,
        Floor::SelectOne,
        Floor::LockOnly,
        Floor::CheckOnly,
        Floor::Shipped,
        Floor::OneCall,
        Floor::OneSqlCall,
        Floor::Engine,
        Floor::BtreeCopy,
        Floor::NoIndex,
        Floor::Brin,
        Floor::RowClaim,
        Floor::RowClaimBounded,
    ];

    fn label(self) -> &'static str {
        match self {
            Floor::SeedSql => "the guide's SQL (seed-sql)",
            Floor::Unprotected => "the unprotected write",
            Floor::NoLock => "`BEGIN` (no lock, no check: unsafe)",
            Floor::SelectOne => "`SELECT 1; BEGIN`",
            Floor::LockOnly => "the lock alone (unsafe)",
            Floor::CheckOnly => "the check alone (unsafe)",
            Floor::Shipped => "the lock and the check (shipped)",
            Floor::OneCall => "the lock and the check in one PL/pgSQL call",
            Floor::OneSqlCall => "the lock and the check in one SQL-function call",
            Floor::Engine => "the engine (`Engine::run`)",
            Floor::BtreeCopy => "shipped, record into a copy: `expires_at` b-tree",
            Floor::NoIndex => "shipped, record into a copy: no `expires_at` index",
            Floor::Brin => "shipped, record into a copy: `expires_at` BRIN",
            Floor::RowClaim => {
                "the key's row as its lock: `in_progress` insert, then update (wait unbounded)"
            }
            Floor::RowClaimBounded => {
                "the key's row as its lock, the wait bounded in the same statement"
            }
        }
    }

    /// The message that opens a hand-written claim's transaction.
    fn first_message(self, lock: i64, key: &str) -> String {
        let lock_stmt = format!("EXECUTE idem_v1_lock({lock}, 5000)");
        let check_stmt = format!("EXECUTE idem_v1_check('{SCOPE}', '{key}')");
        match self {
            Floor::NoLock => "BEGIN".into(),
            Floor::SelectOne => "SELECT 1; BEGIN".into(),
            Floor::LockOnly => format!("{lock_stmt}; BEGIN"),
            Floor::CheckOnly => format!("{check_stmt}; BEGIN"),
            Floor::OneCall => {
                format!("EXECUTE floor_lock_and_check({lock}, 5000, '{SCOPE}', '{key}'); BEGIN")
            }
            Floor::OneSqlCall => {
                format!("EXECUTE floor_lock_and_check_sql({lock}, 5000, '{SCOPE}', '{key}'); BEGIN")
            }
            Floor::RowClaim | Floor::RowClaimBounded => {
                let (name, bound) = match self {
                    Floor::RowClaim => ("floor_row_claim", ""),
                    _ => ("floor_row_claim_bounded", ", '5000'"),
                };
                format!(
                    "EXECUTE {name}('{SCOPE}', '{key}', '{}', decode('{FINGERPRINT}', 'hex'), \
                     86400000{bound}); BEGIN",
                    CHARGE_CARD.name(),
                )
            }
            _ => format!("{lock_stmt}; {check_stmt}; BEGIN"),
        }
    }

    /// Whether the claim's first message inserts the key's row, which the
    /// record then updates.
    fn holds_row(self) -> bool {
        matches!(self, Floor::RowClaim | Floor::RowClaimBounded)
    }

    /// The prepared statement that writes a hand-written claim's record.
    fn insert(self) -> &'static str {
        match self {
            Floor::BtreeCopy => "floor_insert_btree",
            Floor::NoIndex => "floor_insert_no_index",
            Floor::Brin => "floor_insert_brin",
            _ => "idem_v1_insert_completed",
        }
    }
}

/// The hand-written claims' scope.
const SCOPE: &str = "floors";

/// The hand-written claims' fingerprint, in hex.
const FINGERPRINT: &str = "abababababababababababababababababababababababababababababababab";

/// The copies of the key table, by the suffix of their insert's name.
const COPIES: [(&str, Option<&str>); 3] = [
    ("btree", Some("CREATE INDEX IF NOT EXISTS floor_keys_btree_expires_at ON floor_keys_btree (expires_at)")),
    ("no_index", None),
    ("brin", Some("CREATE INDEX IF NOT EXISTS floor_keys_brin_expires_at ON floor_keys_brin USING brin (expires_at)")),
];

/// The lock and the check in one call: a volatile PL/pgSQL function reads
/// with a snapshot taken after the lock, as the shipped second statement does.
const ONE_CALL: &str = "CREATE OR REPLACE FUNCTION floor_lock_and_check(p_lock bigint, p_wait_ms int, p_scope text, p_key text) \
     RETURNS void LANGUAGE plpgsql VOLATILE AS $$ BEGIN \
       IF NOT pg_try_advisory_xact_lock(p_lock) THEN PERFORM idem_wait_for_lock(p_lock, p_wait_ms); END IF; \
       PERFORM idem_refuse(k.status) FROM idempotency_keys k WHERE k.scope = p_scope AND k.key = p_key; \
     END $$";

/// The same as a volatile SQL function: each of its statements takes a new
/// snapshot too, but Postgres 15 plans its body on every call.
const ONE_SQL_CALL: &str = "CREATE OR REPLACE FUNCTION floor_lock_and_check_sql(p_lock bigint, p_wait_ms int, p_scope text, p_key text) \
     RETURNS void LANGUAGE sql VOLATILE AS $$ \
       SELECT CASE WHEN pg_try_advisory_xact_lock(p_lock) THEN true ELSE idem_wait_for_lock(p_lock, p_wait_ms) END; \
       SELECT idem_refuse(k.status) FROM idempotency_keys k WHERE k.scope = p_scope AND k.key = p_key; \
     $$";

/// Every hand-written claim takes a lock id of its own.
static NEXT_LOCK: AtomicI64 = AtomicI64::new(1);

/// One variant's ratios at one client count.
#[derive(Debug, Clone, Serialize)]
pub struct FloorRow {
    /// What the variant does.
    pub variant: &'static str,
    /// Concurrent clients.
    pub clients: usize,
    /// Median over rounds of its throughput ÷ the guide's SQL's.
    pub median: f64,
    /// First quartile of the same.
    pub q1: f64,
    /// Third quartile of the same.
    pub q3: f64,
}

/// The whole measurement.
#[derive(Debug, Clone, Serialize)]
pub struct FloorsResult {
    /// Rounds per cell.
    pub rounds: usize,
    /// Per variant and client count.
    pub rows: Vec<FloorRow>,
}

/// Creates the function and the tables the variants use on `pg`'s database
/// and a pool of its own whose connections prepare their statements.
async fn floor_pool(pg: &Pg, connections: u32) -> Result<PgPool, BenchError> {
    sqlx::query(ONE_CALL).execute(&pg.pool).await?;
    sqlx::query(ONE_SQL_CALL).execute(&pg.pool).await?;
    let mut prepares = String::from(
        "PREPARE floor_lock_and_check(bigint, int, text, text) AS \
         SELECT floor_lock_and_check($1, $2, $3, $4); \
         PREPARE floor_lock_and_check_sql(bigint, int, text, text) AS \
         SELECT floor_lock_and_check_sql($1, $2, $3, $4)",
    );
    for (name, index) in COPIES {
        let table = format!("floor_keys_{name}");
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (LIKE idempotency_keys INCLUDING DEFAULTS \
             INCLUDING CONSTRAINTS, PRIMARY KEY (scope, key))"
        ))
        .execute(&pg.pool)
        .await?;
        if let Some(index) = index {
            sqlx::query(index).execute(&pg.pool).await?;
        }
        // As idem_v1_insert_completed, into the copy.
        prepares.push_str(&format!(
            "; PREPARE floor_insert_{name}(text, text, text, bytea, smallint, text, bytea, float8, text) AS \
             INSERT INTO {table} (scope, key, step, fingerprint, status, response_status, \
               response_content_type, response_body, response_headers, claim_token, created_at, \
               locked_until, expires_at) \
             VALUES ($1, $2, $3, $4, 'completed', $5, $6, $7, $9, NULL, now(), now(), \
                     now() + $8 * interval '1 millisecond')"
        ));
    }
    // The key's own row as its lock, in the shape of `KeyLock::Row`'s claim
    // (the record then a plain update, the cheapest completion of that row):
    // the bounded form sets the wait inside the insert and resets it in its
    // `RETURNING` (to 0, standing in for the session's value the engine
    // restores).
    prepares.push_str(
        "; PREPARE floor_row_claim(text, text, text, bytea, float8) AS \
         INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, created_at, locked_until, expires_at) \
         VALUES ($1, $2, $3, $4, 'in_progress', now(), now() + interval '30 seconds', now() + $5 * interval '1 millisecond') \
         ON CONFLICT DO NOTHING RETURNING 1; \
         PREPARE floor_row_claim_bounded(text, text, text, bytea, float8, text) AS \
         INSERT INTO idempotency_keys (scope, key, step, fingerprint, status, created_at, locked_until, expires_at) \
         SELECT $1, $2, $3, $4, 'in_progress', now(), now() + interval '30 seconds', now() + $5 * interval '1 millisecond' \
           FROM (SELECT set_config('lock_timeout', $6, true)) AS bound \
         ON CONFLICT DO NOTHING RETURNING set_config('lock_timeout', '0', true); \
         PREPARE floor_row_complete(text, text, smallint, text, bytea, text) AS \
         UPDATE idempotency_keys SET status = 'completed', response_status = $3, response_content_type = $4, \
           response_body = $5, response_headers = $6, locked_until = now() \
         WHERE scope = $1 AND key = $2",
    );
    let prepares: Arc<str> = prepares.into();
    let pool = pool_options(&Policy::default(), connections)
        .after_connect(move |conn, _| {
            let prepares = prepares.clone();
            Box::pin(async move {
                prepare_claims(conn).await?;
                conn.execute(&*prepares).await?;
                Ok(())
            })
        })
        .connect_with(pg.connect_options())
        .await?;
    Ok(pool)
}

/// A fresh key claimed by hand the way `floor` says.
async fn by_hand(pool: PgPool, floor: Floor, key: String) -> Result<(), BenchError> {
    let lock = NEXT_LOCK.fetch_add(1, Ordering::Relaxed);
    let conn = pool.acquire().await?;
    let mut tx =
        Transaction::<Postgres>::begin(conn, Some(floor.first_message(lock, &key).into())).await?;
    let id = Postgres::business(&mut tx, TENANT)
        .await
        .map_err(|problem| problem.to_string())?;
    let body: String = format!("{id}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    let message = if floor.holds_row() {
        format!(
            "EXECUTE floor_row_complete('{SCOPE}', '{key}', 200, 'application/json', \
             decode('{body}', 'hex'), NULL); COMMIT; BEGIN"
        )
    } else {
        format!(
            "EXECUTE {}('{SCOPE}', '{key}', '{}', decode('{FINGERPRINT}', 'hex'), 200, \
             'application/json', decode('{body}', 'hex'), 86400000, NULL); COMMIT; BEGIN",
            floor.insert(),
            CHARGE_CARD.name(),
        )
    };
    // The record's insert or the claimed row's update: one row either way.
    let written = tx.execute(message.as_str()).await?.rows_affected();
    if written != 1 {
        return Err(format!("{}: the record took {written} rows", floor.label()).into());
    }
    Ok(())
}

fn floor_op(pool: &PgPool, engine: &Engine<Postgres>, floor: Floor, prefix: String) -> OpFn {
    let (pool, engine) = (pool.clone(), engine.clone());
    op(move |i| {
        let (pool, engine, key) = (pool.clone(), engine.clone(), format!("{prefix}-{i}"));
        async move {
            match floor {
                Floor::SeedSql => pg::seed(pool, key, false).await,
                Floor::Unprotected => unprotected(pool).await,
                Floor::Engine => match keyed(&engine, key, TENANT.to_string()).await? {
                    Via::Executed => Ok(()),
                    via => Err(format!("fresh key answered via {via}").into()),
                },
                _ => by_hand(pool, floor, key).await,
            }
        }
    })
}

/// The value at quantile `q` of `sorted`.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Runs every variant at every client count, `rounds` times, interleaved and
/// rotated each round, on a pool of `connections` to `pg`'s database.
pub async fn run(
    pg: &Pg,
    connections: u32,
    clients: &[usize],
    base_ops: u64,
    rounds: usize,
    run_id: &str,
) -> Result<FloorsResult, BenchError> {
    let pool = floor_pool(pg, connections).await?;
    let engine = Engine::new(pool.clone());
    for floor in Floor::ALL {
        let warm = floor_op(
            &pool,
            &engine,
            floor,
            format!("{run_id}-floor-warm-{floor:?}"),
        );
        if let (_, Some(e)) = drive(4, 40, warm).await {
            return Err(format!("floors, {}: {e}", floor.label()).into());
        }
    }
    let mut ratios: BTreeMap<(Floor, usize), Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        for &c in clients {
            let mut order = Floor::ALL;
            order.rotate_left(round % Floor::ALL.len());
            let mut throughput = BTreeMap::new();
            for floor in order {
                let prefix = format!("{run_id}-floor-{floor:?}-r{round}-c{c}");
                let (sample, err) = drive(
                    c,
                    ops_for(base_ops, c),
                    floor_op(&pool, &engine, floor, prefix),
                )
                .await;
                if let Some(e) = err {
                    return Err(format!("floors, {}: {e}", floor.label()).into());
                }
                eprintln!(
                    "  floors c={c:<2} round {}: {:>8.0} ops/s  {}",
                    round + 1,
                    sample.throughput,
                    floor.label()
                );
                throughput.insert(floor, sample.throughput);
            }
            let seed = throughput[&Floor::SeedSql];
            for (floor, ops) in throughput {
                ratios.entry((floor, c)).or_default().push(ops / seed);
            }
        }
    }
    let rows = ratios
        .into_iter()
        .map(|((floor, clients), mut values)| {
            values.sort_by(f64::total_cmp);
            FloorRow {
                variant: floor.label(),
                clients,
                median: median(&values),
                q1: quantile(&values, 0.25),
                q3: quantile(&values, 0.75),
            }
        })
        .collect();
    Ok(FloorsResult { rounds, rows })
}
