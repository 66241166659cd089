//! Script replies read back into records. A reply idem cannot read is corrupt, never guessed.

use idem_core::store::columns::{Columns, ListedColumns};
use idem_core::{FencingToken, Key, Listed, Record, Scope, StoreError, StoredResponse, Timestamp};
use redis::Value;

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("redis reply: {what}"))
}

/// The items of an array reply.
pub(crate) fn items(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(corrupt(format!("expected an array, got {other:?}"))),
    }
}

pub(crate) fn bytes(v: &Value) -> Result<&[u8], StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.as_bytes()),
        other => Err(corrupt(format!("expected a string, got {other:?}"))),
    }
}

pub(crate) fn text(v: &Value) -> Result<&str, StoreError> {
    std::str::from_utf8(bytes(v)?).map_err(corrupt)
}

pub(crate) fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(n) => Ok(*n),
        other => number(bytes(other)?),
    }
}

pub(crate) fn timestamp(v: &Value) -> Result<Timestamp, StoreError> {
    int(v).map(Timestamp::from_millis)
}

/// The fields a listing reads of a record hash, in the order [`listed`] reads them.
pub(crate) const LISTED_FIELDS: [&str; 8] = ["sc", "k", "cat", "lex", "comp", "exp", "att", "rep"];

/// What a listing shows of a record, from an `HMGET` of [`LISTED_FIELDS`]; `None` when the
/// hash is gone (deleted between the scan and the read: every field nil).
pub(crate) fn listed(v: &Value) -> Result<Option<Listed>, StoreError> {
    let Value::Array(fields) = v else {
        return Err(corrupt(format!("expected fields, got {v:?}")));
    };
    let [sc, k, cat, lex, comp, exp, att, rep] = fields.as_slice() else {
        return Err(corrupt(format!("HMGET answered {} fields", fields.len())));
    };
    if fields.iter().all(|f| matches!(f, Value::Nil)) {
        return Ok(None);
    }
    let opt = |v: &Value| match v {
        Value::Nil => Ok(None),
        v => int(v).map(Some),
    };
    ListedColumns {
        scope: text(sc)?.to_owned(),
        key: text(k)?.to_owned(),
        created_at: int(cat)?,
        lease_expires_at: int(lex)?,
        completed_at: opt(comp)?,
        expires_at: opt(exp)?.unwrap_or(Timestamp::NEVER.as_millis()),
        attempts: int(att)?,
        replays: int(rep)?,
    }
    .into_listed("redis")
    .map(Some)
}

/// The record in an HGETALL reply, or `None` when empty: (field, value, field, value...) as
/// scripts return it, or a map as the command itself answers on RESP3.
pub(crate) fn record(v: &Value) -> Result<Option<Record>, StoreError> {
    let pairs: Vec<(&Value, &Value)> = match v {
        Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((k, v)),
                _ => None,
            })
            .collect(),
        Value::Map(map) => map.iter().map(|(k, v)| (k, v)).collect(),
        other => return Err(corrupt(format!("expected fields, got {other:?}"))),
    };
    if pairs.is_empty() {
        return Ok(None);
    }
    let field = |name: &str| -> Result<Option<&Value>, StoreError> {
        for (k, v) in &pairs {
            if bytes(k)? == name.as_bytes() {
                return Ok(Some(*v));
            }
        }
        Ok(None)
    };
    let need = |name: &str| field(name)?.ok_or_else(|| corrupt(format!("no field {name}")));
    let num = |name: &str| need(name).and_then(int);
    let opt = |name: &str| field(name)?.map(int).transpose();
    let columns = Columns {
        scope: text(need("sc")?)?.to_owned(),
        key: text(need("k")?)?.to_owned(),
        fingerprint: bytes(need("fp")?)?.to_vec(),
        token: num("tok")?,
        created_at: num("cat")?,
        acquired_at: num("aat")?,
        lease_expires_at: num("lex")?,
        completed_at: opt("comp")?,
        completed_by: opt("by")?,
        expires_at: opt("exp")?.unwrap_or(Timestamp::NEVER.as_millis()),
        retention_ms: num("ret")?,
        attempts: num("att")?,
        replays: num("rep")?,
        response: field("resp")?.map(bytes).transpose()?.map(<[u8]>::to_vec),
    };
    columns.into_record("redis").map(Some)
}

/// The values of a reply the prelude's `joined` made: `N` values separated by spaces, the
/// last taking the rest (a fingerprint's bytes may hold spaces).
fn joined<'r, const N: usize>(reply: &'r [u8], what: &str) -> Result<[&'r [u8]; N], StoreError> {
    let mut values = reply.splitn(N, |b| *b == b' ');
    let mut out = [&[][..]; N];
    for slot in &mut out {
        *slot = values
            .next()
            .ok_or_else(|| corrupt(format!("{what} answered fewer than {N} values")))?;
    }
    Ok(out)
}

/// A number among a reply's joined values.
fn number(v: &[u8]) -> Result<i64, StoreError> {
    std::str::from_utf8(v)
        .map_err(corrupt)?
        .parse()
        .map_err(corrupt)
}

/// A claim that acquired, from the claim script's `LEASE_END ATTEMPT`: when the lease ends
/// and which attempt this is.
pub(crate) fn acquired(reply: &[u8]) -> Result<(Timestamp, u32), StoreError> {
    let [lease_end, attempt] = joined(reply, "claim")?;
    let attempt = u32::try_from(number(attempt)?)
        .map_err(|_| corrupt("claim returned an attempt out of range"))?;
    Ok((Timestamp::from_millis(number(lease_end)?), attempt))
}

/// The record a completion made, from the complete script's `NOW CAT AAT LEX RET ATT REP FP`
/// and what the caller already has: the scope, key, token and response.
pub(crate) fn completed(
    reply: &[u8],
    scope: &Scope,
    key: &Key,
    token: FencingToken,
    response: StoredResponse,
) -> Result<Record, StoreError> {
    let [now, cat, aat, lex, ret, att, rep, fp] = joined(reply, "complete")?;
    let now = number(now)?;
    let retention_ms = number(ret)?;
    let columns = Columns {
        scope: scope.as_str().to_owned(),
        key: key.as_str().to_owned(),
        fingerprint: fp.to_vec(),
        token: token.as_i64(),
        created_at: number(cat)?,
        acquired_at: number(aat)?,
        lease_expires_at: number(lex)?,
        completed_at: Some(now),
        completed_by: Some(0),
        // As the script wrote it.
        expires_at: now.saturating_add(retention_ms),
        retention_ms,
        attempts: number(att)?,
        replays: number(rep)?,
        response: None,
    };
    let mut record = columns.into_record("redis")?;
    record.response = Some(response);
    Ok(record)
}
