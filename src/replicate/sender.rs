//! One destination node's sender: a pipelined connection through the
//! proxy, each Produce holding the next batch of every ready partition the
//! node leads, up to `MAX_IN_FLIGHT_REQUESTS` of them unanswered (Kafka's
//! `Sender` shape). The writer and the reader of the connection run
//! together; when the connection fails, every batch it carried goes back
//! to its partition to be sent again, which the proxy answers as a
//! duplicate if an earlier attempt landed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::ProduceRequest;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::client::bulk::{produce_request_many, produce_result_many, ProducePart};
use crate::client::conn::{Connection, Receiver, Sender, Sent};
use crate::client::error::error_name;
use crate::client::protocol::Produced;
use crate::client::{Client, ClientError};
use crate::sync::error_chain;

use super::metrics::ErrorKind;
use super::partitions::{Outcome, Settled, ToSend};
use super::{lock, ReplicateError, Shared};

/// About this many bytes of batches in one Produce (at least one batch).
const MAX_PRODUCE_BYTES: usize = 4 * 1024 * 1024;
/// PRODUCER_FENCED: the proxy's answer to a fenced link's Produce.
const PRODUCER_FENCED: i16 = 90;
/// DUPLICATE_SEQUENCE_NUMBER: an earlier attempt of the batch landed.
const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;

/// A Produce written and not yet answered.
struct Ticket {
    /// `None` while it is being written.
    sent: Option<Sent>,
    batches: Vec<ToSend>,
    _permit: OwnedSemaphorePermit,
}

pub(super) async fn run(shared: Arc<Shared>, destination: Client, node: i32) {
    let mut backoff = shared.backoff();
    // After a broken connection, one request goes first, alone: a proxy
    // that fenced the link answers it (PRODUCER_FENCED, naming the link)
    // and closes; requests written behind it would meet the closed socket,
    // whose reset can discard that answer unread.
    let mut careful = false;
    loop {
        if shared.stopping() {
            return;
        }
        let address = lock(&shared.destination_nodes).get(&node).cloned();
        let opened = match address {
            Some(address) => Connection::open(destination.config(), &address).await,
            None => Err(ClientError::NoBrokers),
        };
        let conn = match opened {
            Ok(conn) => conn,
            Err(e) => {
                shared.metrics.error(ErrorKind::Produce);
                shared.metadata_stale.notify_one();
                let delay = backoff.next_delay();
                tracing::warn!(node, error = %error_chain(&e), retry_in_ms = delay.as_millis() as u64, "cannot connect to the destination");
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        let tickets = Mutex::new(VecDeque::new());
        let ended = session(&shared, node, conn, &tickets, careful).await;
        // Whatever the connection carried is sent again; after a broken
        // connection, only once a request the proxy instance had passed on
        // (it may have died with it) has had time to land, so that the
        // retry is seen as its duplicate.
        let retry_in = match ended {
            Ok(()) => shared.config.retry_backoff,
            Err(_) => shared.config.unknown_outcome_wait,
        };
        let now = Instant::now();
        let left: Vec<Ticket> = lock(&tickets).drain(..).collect();
        {
            let mut table = shared.table();
            for ticket in &left {
                for b in &ticket.batches {
                    table.settle(&b.tp, &b.batch, Outcome::Retry { retry_in }, now);
                }
            }
        }
        shared.changed.notify_waiters();
        match ended {
            Ok(()) => return,
            Err(e) => {
                careful = true;
                shared.metrics.error(ErrorKind::Produce);
                shared.metadata_stale.notify_one();
                let delay = backoff.next_delay();
                tracing::warn!(node, error = %error_chain(&e), unanswered = left.len(), retry_in_ms = delay.as_millis() as u64,
                    "destination connection failed; its batches are sent again");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Writes and reads on one connection until it fails (`Err`) or the run
/// stops with nothing left in flight (`Ok`).
async fn session(
    shared: &Shared,
    node: i32,
    conn: Connection,
    tickets: &Mutex<VecDeque<Ticket>>,
    careful: bool,
) -> Result<(), ClientError> {
    let (mut tx, mut rx) = conn.pipeline();
    let max = shared.config.max_in_flight_requests;
    let permits = Arc::new(Semaphore::new(if careful { 1 } else { max }));
    // The permits held back until the first answer.
    let held = if careful { max - 1 } else { 0 };
    let written = Notify::new();
    let writer = write(shared, node, &mut tx, tickets, &permits, &written);
    let reader = read(shared, &mut rx, tickets, &written, &permits, held);
    tokio::select! {
        r = writer => r,
        r = reader => r,
    }
}

async fn write(
    shared: &Shared,
    node: i32,
    tx: &mut Sender,
    tickets: &Mutex<VecDeque<Ticket>>,
    permits: &Arc<Semaphore>,
    written: &Notify,
) -> Result<(), ClientError> {
    let version = tx.version::<ProduceRequest>()?;
    let timeout_ms =
        i32::try_from((shared.config.request_timeout * 9 / 10).as_millis()).unwrap_or(i32::MAX);
    loop {
        let Ok(permit) = Arc::clone(permits).acquire_owned().await else {
            return Ok(());
        };
        let batches = loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if shared.stopping() {
                if lock(tickets).is_empty() {
                    return Ok(());
                }
            } else {
                let batches = shared
                    .table()
                    .next_sends(node, MAX_PRODUCE_BYTES, Instant::now());
                if !batches.is_empty() {
                    break batches;
                }
            }
            tokio::select! {
                _ = &mut changed => {}
                // A pause ends without a notification.
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        };
        let transactional = batches.iter().any(|b| b.batch.transactional);
        let parts = produce_parts(&batches);
        let request = produce_request_many(
            version,
            &parts,
            timeout_ms,
            transactional.then_some(shared.config.transactional_id.as_str()),
        );
        drop(parts);
        let request = match request {
            Ok(r) => r,
            Err(e) => {
                // A topic id not known yet (Produce v13): back to the queue.
                let mut table = shared.table();
                for b in &batches {
                    table.settle(
                        &b.tp,
                        &b.batch,
                        Outcome::Retry {
                            retry_in: shared.config.retry_backoff,
                        },
                        Instant::now(),
                    );
                }
                shared.metadata_stale.notify_one();
                tracing::debug!(error = %error_chain(&e), "produce not built; retried");
                continue;
            }
        };
        // Queued before it is written: a failure while writing sends its
        // batches again like those of every other unanswered request.
        lock(tickets).push_back(Ticket {
            sent: None,
            batches,
            _permit: permit,
        });
        let sent = tx.send(&request, version).await?;
        if let Some(last) = lock(tickets).back_mut() {
            last.sent = Some(sent);
        }
        written.notify_one();
    }
}

fn produce_parts(batches: &[ToSend]) -> Vec<ProducePart<'_>> {
    batches
        .iter()
        .map(|b| ProducePart {
            to: b.placement.partition_ref(&b.tp),
            records: b.batch.bytes.clone(),
        })
        .collect()
}

async fn read(
    shared: &Shared,
    rx: &mut Receiver,
    tickets: &Mutex<VecDeque<Ticket>>,
    written: &Notify,
    permits: &Semaphore,
    mut held: usize,
) -> Result<(), ClientError> {
    loop {
        let waiting = written.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        let front = lock(tickets).front().and_then(|t| t.sent);
        let Some(sent) = front else {
            if shared.stopping() && lock(tickets).is_empty() {
                return Ok(());
            }
            tokio::select! {
                _ = &mut waiting => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            continue;
        };
        let response = rx.recv::<ProduceRequest>(sent, Duration::ZERO).await?;
        let Some(ticket) = lock(tickets).pop_front() else {
            continue;
        };
        let parts = produce_parts(&ticket.batches);
        let outcomes = produce_result_many(&response, sent.version, &parts);
        drop(parts);
        settle(shared, &ticket.batches, outcomes);
        if held > 0 {
            permits.add_permits(std::mem::take(&mut held));
        }
        shared.changed.notify_waiters();
    }
}

/// Each batch's answer into the table, the metrics and, for an answer no
/// retry can change, the end of the run.
fn settle(shared: &Shared, batches: &[ToSend], outcomes: Vec<Result<Produced, ClientError>>) {
    let now = Instant::now();
    let mut retried = 0usize;
    let mut first_error = None;
    let mut table = shared.table();
    for (b, outcome) in batches.iter().zip(outcomes) {
        let outcome = match outcome {
            Ok(Produced::Appended { base_offset, .. }) => Outcome::Acked {
                base_offset: Some(base_offset),
            },
            Ok(Produced::Refused { code, .. }) if code == DUPLICATE_SEQUENCE_NUMBER => {
                Outcome::Acked { base_offset: None }
            }
            Ok(Produced::Refused { code, message }) if code == PRODUCER_FENCED => {
                shared.metrics.set_fenced();
                shared.fail(ReplicateError::Fenced {
                    link: shared.config.link.clone(),
                    message: message.unwrap_or_else(|| "PRODUCER_FENCED".into()),
                });
                return;
            }
            Ok(Produced::Refused { code, message }) => {
                shared.fail(ReplicateError::Refused {
                    tp: b.tp.to_string(),
                    offset: b.batch.base_offset,
                    producer_id: b.batch.producer_id,
                    code,
                    name: error_name(code),
                    message: message.unwrap_or_default(),
                });
                return;
            }
            Err(e) => {
                retried += 1;
                if e.invalidates_metadata() {
                    shared.metadata_stale.notify_one();
                }
                first_error.get_or_insert(e);
                Outcome::Retry {
                    retry_in: shared.config.retry_backoff,
                }
            }
        };
        match table.settle(&b.tp, &b.batch, outcome, now) {
            Settled::Acked { duplicate } => {
                shared.metrics.copied(
                    &b.tp.topic,
                    u64::from(b.batch.records),
                    b.batch.bytes.len() as u64,
                );
                if duplicate {
                    shared.metrics.duplicate();
                }
            }
            Settled::Requeued | Settled::Ignored => {}
        }
    }
    let commit_due = table.commit_due();
    drop(table);
    if commit_due {
        shared.commit_wanted.notify_one();
    }
    if let Some(e) = first_error {
        shared.metrics.error(ErrorKind::Produce);
        // One line per answer, not per partition.
        tracing::warn!(partitions = retried, error = %error_chain(&e), "destination refused batches for now; they are sent again");
    }
}
