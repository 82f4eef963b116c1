//! `LockError` as an HTTP response (cargo feature `axum`), so a handler
//! can return `Result<_, LockError>` (or `?` it into its own error that
//! delegates here).
//!
//! | error | status | why |
//! |---|---|---|
//! | `Timeout` | 503, `Retry-After` | someone else holds the lock; asking again later may work |
//! | `Lost` | 503 | the work lost its exclusivity midway and was stopped (`on_lost = "abort"`); nothing is wrong with the request, so not a 409, and a retry of an idempotent handler is what a client should do |
//! | `Closed` | 503 | this instance is shutting down ([`LockClient::close`](crate::LockClient::close)); another one can serve the request |
//! | `MaxHoldReached` | 500 | the handler ran past its `max_hold` and was stopped: the server is slow or hung, asking again at once is unlikely to help |
//! | anything else | 500 | a setting, the code (`UpgradeRefused`) or the lock service is broken; the client cannot help |
//!
//! The body is a small JSON object: `{"error": "lock_busy" | "lock_lost" |
//! "lock_closed" | "lock_max_hold" | "lock_unavailable", "key": …, "message": …}` (`key` only where the error
//! names one). It carries no credentials: messages redact passwords.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::LockError;

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        let (status, code, key, retry_after) = match &self {
            LockError::Timeout { key, waited } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "lock_busy",
                Some(key.as_str()),
                // At least a second; about as long as this call waited.
                Some(waited.as_secs_f64().ceil().max(1.0) as u64),
            ),
            LockError::Lost { key } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "lock_lost",
                Some(key.as_str()),
                None,
            ),
            LockError::Closed => (StatusCode::SERVICE_UNAVAILABLE, "lock_closed", None, None),
            LockError::MaxHoldReached { key, .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "lock_max_hold",
                Some(key.as_str()),
                None,
            ),
            LockError::InvalidKey { key, .. } | LockError::UpgradeRefused { key } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "lock_unavailable",
                Some(key.as_str()),
                None,
            ),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "lock_unavailable",
                None,
                None,
            ),
        };
        let mut body = format!("{{\"error\":\"{code}\"");
        if let Some(key) = key {
            body.push_str(&format!(",\"key\":{}", json_string(key)));
        }
        body.push_str(&format!(
            ",\"message\":{}}}",
            json_string(&self.to_string())
        ));
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}
