//! Refusals: why a fenced write changed nothing.
//!
//! A release, extend or completion is fenced by the lease's token. When its statement
//! matches no row, the record is read back and the state machine says why (gone, another
//! token, completed); all three report their refusals through here.

use idem_core::{FencingToken, Key, Scope, StoreError, machine};

use crate::inner::{Conn, Inner};

impl Inner {
    /// Why a fenced statement changed nothing: the record is gone, has another token, or is
    /// completed. Read after the fact; only the token's holder could have changed it since.
    pub(crate) async fn refusal(
        &self,
        client: &impl Conn,
        scope: &Scope,
        key: &Key,
        token: FencingToken,
    ) -> StoreError {
        match self.read_on(client, &self.sql.get, scope, key).await {
            Ok((now, existing)) => match machine::release(existing.as_ref(), token, now) {
                Err(e) => e,
                // Unreachable while tokens are unique; absent is the safe word for it.
                Ok(()) => StoreError::Stale(idem_core::Stale::Absent),
            },
            Err(e) => e,
        }
    }
}
