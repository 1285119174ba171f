//! The claim: the insert, the read of a record the key has, the decision on it and the
//! take-over it may call for.

use super::*;
use crate::dialect::completed;
use tower_idempotency_core::Write;

impl MySqlStore {
    /// The claim on `connection`: the insert, and for a key with a record its read and maybe
    /// a take-over, each a statement.
    pub(super) async fn claim_on(
        &self,
        connection: &mut MySqlConnection,
        claiming: Claiming<'_>,
    ) -> Result<Claim, StoreError> {
        let bound = Bound::new(claiming);
        let (key, fingerprint, token) = (bound.key(), bound.fingerprint(), &bound.token);
        let reservation = claiming.reservation;
        let lease = crate::dialect::lease_on(&self.base.options, claiming.lease);
        for _ in 0..CLAIM_ATTEMPTS {
            let inserted = bound
                .insert(&self.sql.insert)
                .execute(&mut *connection)
                .await
                .map_err(unavailable)?
                .rows_affected();
            if inserted == 1 {
                return Ok(Claim::New(reservation));
            }
            let Some(row) = sqlx::query(self.sql.read.clone())
                .bind(key)
                .fetch_optional(&mut *connection)
                .await
                .map_err(unavailable)?
            else {
                // Released or forgotten in between: insert again.
                continue;
            };
            let write = match decide(Some(found(&row, token, fingerprint)?), lease) {
                Decision::Answer(answer) => {
                    return answer.claim(
                        reservation,
                        decode,
                        tower_idempotency_core::Tombstone::from_bytes,
                    );
                }
                Decision::Write(write) => write,
            };
            let taking = taking_over(&self.sql, write, key, fingerprint, token, lease);
            let taken = taking.execute(&mut *connection).await;
            if taken.map_err(unavailable)?.rows_affected() == 1 {
                return Ok(Claim::New(reservation));
            }
        }
        Err(StoreError::new(StoreErrorKind::Unavailable))
    }
}

/// A claim's values as the statements take them.
pub(super) struct Bound<'a> {
    key: std::borrow::Cow<'a, str>,
    fingerprint: tower_idempotency_core::FingerprintHex,
    pub(super) token: Token,
    lease: Lease,
}

impl<'a> Bound<'a> {
    pub(super) fn new(claiming: Claiming<'a>) -> Self {
        Self {
            key: table_key(claiming.key),
            fingerprint: claiming.fingerprint.to_hex(),
            token: crate::dialect::token(&claiming.reservation),
            lease: claiming.lease,
        }
    }

    /// The key as the table holds it.
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// The fingerprint as the table holds it.
    pub(super) fn fingerprint(&self) -> &str {
        self.fingerprint.as_str()
    }

    /// The insert `statement` of the caller's pending reservation, bound.
    pub(super) fn insert(&self, statement: &sqlx::SqlStr) -> Query<'_> {
        sqlx::query(statement.clone())
            .bind(self.key())
            .bind(self.fingerprint())
            .bind(&self.token[..])
            .bind(millis(self.lease.duration()))
            .bind(self.lease.takes_over())
    }
}

/// The take-over statement the claim's write calls for, bound: the caller's reservation
/// written over the record it read.
pub(super) fn taking_over<'q>(
    sql: &Sql,
    write: Write,
    key: &'q str,
    fingerprint: &'q str,
    token: &'q [u8; 16],
    lease: Lease,
) -> Query<'q> {
    let lease_ms = millis(lease.duration());
    match write {
        // A record was read: the completed one past its retention, absent, written over.
        Write::Reserve => sqlx::query(sql.take_over.clone())
            .bind(fingerprint)
            .bind(&token[..])
            .bind(lease_ms)
            .bind(lease.takes_over())
            .bind(key)
            .bind(lease.forgets_expired()),
        Write::TakeOver => sqlx::query(sql.take_over_abandoned.clone())
            .bind(&token[..])
            .bind(lease_ms)
            .bind(lease.takes_over())
            .bind(key)
            .bind(fingerprint),
    }
}

/// A stored response read back.
pub(super) fn decode(response: &[u8]) -> Result<StoredResponse, StoreError> {
    codec::decode(Bytes::copy_from_slice(response))
}

/// What a claim's read of the record says: its token, fingerprint and response, whether it
/// expired, whether it was abandoned, its tombstone and whether that is remembered still.
pub(super) fn found<'r>(
    row: &'r MySqlRow,
    token: &[u8; 16],
    fingerprint: &str,
) -> Result<Found<&'r [u8]>, StoreError> {
    let stored_token: Option<&[u8]> = row.try_get(0).map_err(corrupt)?;
    let stored_fingerprint: &[u8] = row.try_get(1).map_err(corrupt)?;
    let response: Option<&[u8]> = row.try_get(2).map_err(corrupt)?;
    let same_fingerprint = stored_fingerprint == fingerprint.as_bytes();
    let expired = row.try_get::<i64, _>(3).map_err(corrupt)? != 0;
    let tombstone: Option<&[u8]> = row.try_get(5).map_err(corrupt)?;
    let remembered = row.try_get::<i64, _>(6).map_err(corrupt)? != 0;
    let completed = completed(same_fingerprint, response, tombstone, expired, remembered);
    Ok(match (stored_token, completed) {
        (None, Some(completed)) => completed,
        _ => Found::Pending {
            same_fingerprint,
            mine: stored_token == Some(&token[..]),
            abandoned: row.try_get::<i64, _>(4).map_err(corrupt)? != 0,
        },
    })
}
