use crate::record::RecordState;

/// A boxed backend error, kept as the `source` of [`StoreError::Unavailable`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store call failed.
///
/// Callers match on the variant: [`StoreError::Unavailable`] means "fail closed" (503, never
/// execute, [design §6](docs/design.md#6-a-store-failure-fails-closed)); [`StoreError::Stale`]
/// means this executor lost its lease and its result was not written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The fencing token is not the current lease's; nothing was changed.
    #[error("refused: {0}")]
    Stale(Stale),
    /// No record for this scope and key (or only an expired one).
    #[error("no record for this scope and key")]
    NotFound,
    /// `resolve` was asked to settle a record that is not abandoned.
    #[error("the record is {state}; only an abandoned record can be resolved")]
    NotAbandoned {
        /// The record's state.
        state: RecordState,
    },
    /// The backend could not be read or written. The message includes the cause's, so the
    /// cause is not repeated as `source()`.
    #[error("store unavailable: {0}")]
    Unavailable(BoxError),
    /// The backend holds data idem cannot read (a newer schema, a damaged row).
    #[error("store data is unreadable: {0}")]
    Corrupt(String),
}

/// Why a fencing token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Stale {
    /// The record is gone: released, resolved, expired or purged.
    #[error("the record no longer exists")]
    Absent,
    /// Another lease (a takeover, an operator) replaced this one.
    #[error("the lease was taken over; this token is no longer current")]
    Superseded,
    /// The record is already completed.
    #[error("the record is already completed")]
    Completed,
}

impl StoreError {
    /// Wraps a backend failure.
    pub fn unavailable(e: impl Into<BoxError>) -> Self {
        StoreError::Unavailable(e.into())
    }

    /// Whether this is a fencing refusal.
    pub fn is_stale(&self) -> bool {
        matches!(self, StoreError::Stale(_))
    }

    /// Whether the store could not be reached or used: fail closed.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Corrupt(_))
    }
}
