//! The names of idem's refusals, in one place.
//!
//! Every front end refuses in its own protocol (an RFC 9457 document over HTTP, a tool error
//! result over MCP, a typed exception in the language packages), but they all name the same
//! problem with the same word, so a client, a log search or a dashboard matches one string
//! whichever way the call came in. The HTTP layer appends the name to its problem-type base
//! URI; the MCP proxy puts it in `_meta.idem.problem`.

use std::fmt;

/// What kind of refusal this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemType {
    /// A key is required and none was sent.
    KeyMissing,
    /// The key is malformed, too long, or sent twice.
    KeyInvalid,
    /// A keyed request names no caller (none of the scope headers), and anonymous callers are
    /// not allowed: a scope shared by them all would replay one's response to another.
    PrincipalMissing,
    /// The request body is over the bound it is buffered to (to fingerprint it).
    BodyTooLarge,
    /// The request body could not be read.
    BodyUnreadable,
    /// The request body did not arrive within the time allowed for it; nothing was claimed.
    BodyTimeout,
    /// The key was first used for another request.
    KeyReused,
    /// The first request with this key is still executing.
    InFlight,
    /// An earlier execution's outcome is unknown; nothing is run again until it is resolved.
    OutcomeUnknown,
    /// The stored result was over the size bound; only its digest was kept.
    ResponseTooLarge,
    /// The store could not be used; nothing was executed.
    StoreUnavailable,
    /// The response broke off or was too large to buffer: the effect may have happened.
    ResponseFailed,
    /// The service behind idem could not be reached; nothing was sent (`idem mcp`).
    UpstreamUnavailable,
    /// The gateway could not connect to its upstream (or its TLS certificate did not
    /// verify); nothing was sent.
    UpstreamUnreachable,
    /// The gateway's connection to its upstream failed after the request was sent.
    UpstreamFailed,
    /// The gateway's upstream did not answer in time.
    UpstreamTimeout,
    /// The request is spelled so that the service behind idem could read it differently from
    /// the route policy (a method in lower case, a dot segment or a backslash in the path), or
    /// it names no path to forward; it was not forwarded.
    RequestInvalid,
    /// The method cannot be forwarded by a reverse proxy (`CONNECT`).
    MethodNotAllowed,
}

impl ProblemType {
    /// The name: the last part of the HTTP problem type URI, and `_meta.idem.problem` over MCP.
    pub const fn name(self) -> &'static str {
        match self {
            ProblemType::KeyMissing => "key-missing",
            ProblemType::KeyInvalid => "key-invalid",
            ProblemType::PrincipalMissing => "principal-missing",
            ProblemType::BodyTooLarge => "body-too-large",
            ProblemType::BodyUnreadable => "body-unreadable",
            ProblemType::BodyTimeout => "body-timeout",
            ProblemType::KeyReused => "key-reused",
            ProblemType::InFlight => "in-flight",
            ProblemType::OutcomeUnknown => "outcome-unknown",
            ProblemType::ResponseTooLarge => "response-too-large",
            ProblemType::StoreUnavailable => "store-unavailable",
            ProblemType::ResponseFailed => "response-failed",
            ProblemType::UpstreamUnavailable => "upstream-unavailable",
            ProblemType::UpstreamUnreachable => "upstream-unreachable",
            ProblemType::UpstreamFailed => "upstream-failed",
            ProblemType::UpstreamTimeout => "upstream-timeout",
            ProblemType::RequestInvalid => "request-invalid",
            ProblemType::MethodNotAllowed => "method-not-allowed",
        }
    }
}

impl ProblemType {
    /// Every problem type, for tables and configuration checks.
    pub const ALL: [ProblemType; 18] = [
        ProblemType::KeyMissing,
        ProblemType::KeyInvalid,
        ProblemType::PrincipalMissing,
        ProblemType::BodyTooLarge,
        ProblemType::BodyUnreadable,
        ProblemType::BodyTimeout,
        ProblemType::KeyReused,
        ProblemType::InFlight,
        ProblemType::OutcomeUnknown,
        ProblemType::ResponseTooLarge,
        ProblemType::StoreUnavailable,
        ProblemType::ResponseFailed,
        ProblemType::UpstreamUnavailable,
        ProblemType::UpstreamUnreachable,
        ProblemType::UpstreamFailed,
        ProblemType::UpstreamTimeout,
        ProblemType::RequestInvalid,
        ProblemType::MethodNotAllowed,
    ];

    /// The problem type named `name` (`key-reused`), if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for ProblemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
