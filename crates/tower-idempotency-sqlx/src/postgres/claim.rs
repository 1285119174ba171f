//! The claim: its statement's passes, the record each found, and the decision on it.

use super::*;
use crate::dialect::completed;
use tower_idempotency_core::{Answer, Write};

/// What one pass of a claim found, from the row its statement returned.
pub(super) enum Pass {
    /// The claim's answer.
    Answer(Claim),
    /// A record to take over, as this write; then the key is the caller's, or another pass
    /// looks again.
    TakeOver(Write),
    /// No record, though the insert did nothing: another claim committed the key in between.
    Again,
}

impl PostgresStore {
    /// The claim, on `connection`: one statement, rarely two (see [`CLAIM_ATTEMPTS`]), each
    /// bounded by the timeout. Inside a transaction of `connection`'s, the claim is that
    /// transaction's; with `lock`, it is the transactional mode's (see
    /// [`Sql::claim_locked`]): the key's advisory lock is tried first, and a lock held by
    /// another transaction answers from the committed record.
    pub(super) async fn claim_on(
        &self,
        connection: &mut PgConnection,
        claiming: Claiming<'_>,
        lock: Option<i64>,
    ) -> Result<Claim, StoreError> {
        let reservation = claiming.reservation;
        let lease = crate::dialect::lease_on(&self.base.options, claiming.lease);
        let key = &*table_key(claiming.key);
        let fingerprint = claiming.fingerprint.to_hex();
        let token = reservation.as_u128().to_be_bytes();
        let lease_ms = millis(lease.duration());
        let take_over = lease.takes_over();
        let timeout = self.base.timeout();
        // The write's own deadline, checked by the server after it was made: the timeout.
        let in_time_ms = millis(timeout);
        let bound = |sql: &sqlx::SqlStr| {
            sqlx::query(sql.clone())
                .bind(key)
                .bind(fingerprint.as_str())
                .bind(&token[..])
                .bind(lease_ms)
                .bind(take_over)
        };
        // Almost always one pass. Another pass only when a concurrent claim committed the key
        // between this statement's snapshot and its insert (the statement then sees no row),
        // or when the record found had expired or was abandoned and another claim took it
        // over first.
        for _ in 0..CLAIM_ATTEMPTS {
            let sent = clock::now_us();
            let query = match lock {
                Some(lock) => bound(&self.sql.claim_locked).bind(lock),
                None => bound(&self.sql.claim)
                    .bind(in_time_ms)
                    .bind(self.clock.deadline(sent, timeout)),
            };
            let row = within(timeout, async {
                query
                    .fetch_optional(&mut *connection)
                    .await
                    .map_err(unavailable)
            })
            .await?;
            if let (None, Some(row)) = (lock, &row)
                && let Ok(server) = row.try_get::<i64, _>(7)
            {
                self.clock.sample(sent, clock::now_us(), server);
            }
            let pass = match (lock, row) {
                (_, None) => Pass::Again,
                (None, Some(row)) => self.pass(&row, 0, &token, &fingerprint, lease)?,
                (Some(_), Some(row)) => {
                    if row.try_get::<bool, _>(0).map_err(corrupt)? {
                        self.pass(&row, 1, &token, &fingerprint, lease)?
                    } else {
                        Pass::Answer(committed(&row, &fingerprint, lease)?)
                    }
                }
            };
            match pass {
                Pass::Answer(claim) => return Ok(claim),
                Pass::Again => {}
                Pass::TakeOver(write) => {
                    let deadline = self.clock.deadline(clock::now_us(), timeout);
                    let query = match write {
                        // Past its retention: absent, to be written over.
                        Write::Reserve => bound(&self.sql.take_over)
                            .bind(in_time_ms)
                            .bind(deadline)
                            .bind(lease.forgets_expired()),
                        Write::TakeOver => bound(&self.sql.take_over_abandoned)
                            .bind(in_time_ms)
                            .bind(deadline),
                    };
                    let taken = within(timeout, async {
                        query
                            .execute(&mut *connection)
                            .await
                            .map(|done| done.rows_affected())
                            .map_err(unavailable)
                    })
                    .await?;
                    if taken == 1 {
                        return Ok(Claim::New(reservation));
                    }
                }
            }
        }
        Err(StoreError::new(StoreErrorKind::Unavailable))
    }

    /// What a claim's row says, its columns from `first` on (see [`found`]): the answer, a
    /// take-over, or another pass when there is no record.
    fn pass(
        &self,
        row: &PgRow,
        first: usize,
        token: &[u8; 16],
        fingerprint: &str,
        lease: Lease,
    ) -> Result<Pass, StoreError> {
        let Some(found) = found(row, first, token, fingerprint)? else {
            return Ok(Pass::Again);
        };
        Ok(match decide(Some(found), lease) {
            Decision::Write(write) => Pass::TakeOver(write),
            Decision::Answer(answer) => {
                let reservation = Reservation::from_u128(u128::from_be_bytes(*token));
                Pass::Answer(answer.claim(
                    reservation,
                    decode,
                    tower_idempotency_core::Tombstone::from_bytes,
                )?)
            }
        })
    }
}

/// A claim's row, its columns from `first` on: the token, fingerprint and response of the
/// record, whether it expired, whether it was abandoned, its tombstone and whether that is
/// remembered still; `None` when there is no record (the fingerprint NULL, as in the
/// transactional claim's row).
fn found<'r>(
    row: &'r PgRow,
    first: usize,
    token: &[u8; 16],
    fingerprint: &str,
) -> Result<Option<Found<&'r [u8]>>, StoreError> {
    let stored_token: Option<&[u8]> = row.try_get(first).map_err(corrupt)?;
    let Some(stored_fingerprint) = row.try_get::<Option<&str>, _>(first + 1).map_err(corrupt)?
    else {
        return Ok(None);
    };
    let same_fingerprint = stored_fingerprint == fingerprint;
    let response: Option<&[u8]> = row.try_get(first + 2).map_err(corrupt)?;
    let expired = row.try_get(first + 3).map_err(corrupt)?;
    let tombstone: Option<&[u8]> = row.try_get(first + 5).map_err(corrupt)?;
    let remembered = row.try_get(first + 6).map_err(corrupt)?;
    let completed = completed(same_fingerprint, response, tombstone, expired, remembered);
    Ok(Some(match (stored_token, completed) {
        (None, Some(completed)) => completed,
        _ => Found::Pending {
            same_fingerprint,
            mine: stored_token == Some(&token[..]),
            abandoned: row.try_get(first + 4).map_err(corrupt)?,
        },
    }))
}

fn decode(response: &[u8]) -> Result<StoredResponse, StoreError> {
    codec::decode(Bytes::copy_from_slice(response))
}

/// What the committed record answers while another transaction holds the key's lock (the
/// transactional claim's row, its columns from 1 on): a replay or a conflict if one is there
/// within its retention, pending otherwise. Past its retention, the record is absent: the
/// transaction holding the key is creating it again, so neither its old response nor its old
/// fingerprint answers.
fn committed(row: &PgRow, fingerprint: &str, lease: Lease) -> Result<Claim, StoreError> {
    // No token is the caller's, and no take-over while another transaction holds the key.
    let found = found(row, 1, &[0; 16], fingerprint)?;
    match decide(found, crate::dialect::while_held(lease)) {
        Decision::Answer(Answer::Conflict) => Ok(Claim::Conflict),
        Decision::Answer(Answer::Replay(response)) => decode(response).map(Claim::Replay),
        // Remembered past its window: the transaction holding the key cannot create it again
        // (a claim that forgets expired operations finds it absent).
        Decision::Answer(Answer::Expired(tombstone)) => {
            tower_idempotency_core::Tombstone::from_bytes(tombstone).map(Claim::Expired)
        }
        _ => Ok(Claim::Pending),
    }
}
