//! Key derivation, for `deriveKey` and for a tool's calls.

use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use idem_embed::KeyFields;

use crate::js_error;

/// Parses key field specs, so a bad one is an error when the tool is declared, not at its
/// first call.
pub(crate) fn parse_fields(fields: Option<Vec<String>>) -> napi::Result<Option<KeyFields>> {
    fields
        .map(|f| KeyFields::parse(f).map_err(|e| js_error("invalid", e)))
        .transpose()
}

/// A JavaScript number as an ordinal: a non-negative integer (idem-keys refuses those beyond
/// 2^53 with the derivation's own message).
pub(crate) fn ordinal(n: Option<f64>) -> napi::Result<u64> {
    let n = n.unwrap_or(0.0);
    if !(n >= 0.0 && n.fract() == 0.0 && n.is_finite()) {
        return Err(js_error(
            "derive",
            format!("ordinal {n} is not a non-negative integer"),
        ));
    }
    // Integral and non-negative; beyond u64 it saturates, and idem-keys refuses it.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(n as u64)
}

/// The key of one intent from arguments given as JSON text; `keyFields` derives it from only
/// the named arguments.
#[napi]
pub fn derive_key(
    scope: String,
    tool: String,
    args_json: String,
    ordinal_: Option<f64>,
    secret: Option<Buffer>,
    key_fields: Option<Vec<String>>,
) -> napi::Result<String> {
    let fields = parse_fields(key_fields)?;
    derive_text(
        &scope,
        &tool,
        &args_json,
        ordinal(ordinal_)?,
        secret.as_deref(),
        fields.as_ref(),
    )
}

/// Checks key field specs (throws on a malformed, empty or repeated one).
#[napi]
pub fn check_key_fields(key_fields: Vec<String>) -> napi::Result<()> {
    parse_fields(Some(key_fields)).map(|_| ())
}

pub(crate) fn derive_text(
    scope: &str,
    tool: &str,
    args_json: &str,
    ordinal: u64,
    secret: Option<&[u8]>,
    fields: Option<&KeyFields>,
) -> napi::Result<String> {
    let args = idem_keys::parse_args(args_json).map_err(|e| js_error("derive", e))?;
    idem_embed::derive_key(scope, tool, &args, ordinal, secret, fields)
        .map(|k| k.as_str().to_owned())
        .map_err(|e| match e {
            idem_embed::EmbedError::Field(f) => js_error("invalid", f),
            other => js_error("derive", other),
        })
}
