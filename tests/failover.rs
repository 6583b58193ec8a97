//! A primary failover under load from retrying idem-client clients over
//! HTTP, with real Postgres 15 streaming replication, synchronous and
//! asynchronous, and an outbox relay delivering to a receiver with an
//! inbox: the scenario is `failover_scenario` (its docs say what is
//! measured and asserted), run here at its bounded size (240 keys, 8
//! clients).

mod failover_scenario;

use failover_scenario::{failover, Figures, Plan};

/// The suite's run: 240 keys, 8 clients, the kill after 90 answers (about
/// 20 s for both runs).
const BOUNDED: Plan = Plan {
    keys: 240,
    clients: 8,
    kill_after: 90,
};

/// What holds over HTTP in both runs: no 500 (nor any 5xx but 503), every
/// 503 and 409 told the client when to come back, no replay differed in
/// a byte from the first answer, and no key was still held when every key
/// was sent once more.
fn assert_http(figures: &Figures) {
    assert_eq!(figures.server_errors, 0, "a 5xx other than 503");
    assert_eq!(
        figures.without_retry_after, 0,
        "a 503 or 409 without Retry-After"
    );
    assert_eq!(
        figures.replays_differing, 0,
        "a replay differed from the first answer"
    );
    assert_eq!(figures.in_progress_after, 0, "a claim stuck by the kill");
    assert_eq!(
        figures.replays_identical + figures.reexecuted,
        BOUNDED.keys,
        "every key sent once more was replayed or ran again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_replication_failover_loses_nothing() {
    let figures = failover(true, BOUNDED).await;
    assert!(figures.answered_before_kill >= BOUNDED.kill_after as usize);
    assert!(figures.unavailable > 0, "no claim met the missing primary");
    assert!(
        figures.retries >= figures.unavailable,
        "idem-client retried every 503"
    );
    assert_eq!(figures.lost, 0);
    assert_eq!(figures.reexecuted, 0);
    assert_eq!(figures.receiver_duplicates, 0);
    assert_http(&figures);
    assert_eq!(
        figures.replays_identical, BOUNDED.keys,
        "every answer replayed byte for byte after the failover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_replication_failover_reruns_only_what_was_lost() {
    let figures = failover(false, BOUNDED).await;
    assert!(figures.answered_before_kill >= BOUNDED.kill_after as usize);
    // Commits no longer wait for the standby, so the clients may have been
    // answered for every key before the kill: the outage's 503s are the
    // synchronous run's to show. Answers were lost with the primary, each whole (record and write in
    // one transaction): each such key ran once more, and only once.
    assert!(
        figures.lost > 0,
        "nothing was lost: the WAL receiver was not held"
    );
    assert_eq!(figures.reexecuted, figures.lost);
    assert_http(&figures);
    // What left the building from the old primary and came again after it
    // (re-enqueued with the same id by a re-run, or left pending by a lost
    // mark-sent) was answered from the receiver's record: no effect twice.
    assert_eq!(figures.receiver_duplicates, 0);
    assert!(
        figures.answered_from_record > 0,
        "no message reached the receiver twice: the failover lost no delivered one"
    );
    assert_eq!(
        figures.deliveries,
        BOUNDED.keys as u64 + figures.answered_from_record,
        "every delivery beyond the first per message was answered from the record"
    );
}
