//! `Retry-After`: a number of seconds or an HTTP date (RFC 9110 §10.2.3).

use std::time::{Duration, SystemTime};

use http::HeaderValue;

/// How long a `Retry-After` value asks the client to wait, measured from
/// `now`; `None` when the value is neither delay-seconds nor an HTTP date.
/// A date in the past means no wait.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderValue;
/// use idem_client::parse_retry_after;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("2"), now), Some(Duration::from_secs(2)));
/// let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:40 GMT"); // now + 3 s
/// assert_eq!(parse_retry_after(&date, now), Some(Duration::from_secs(3)));
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("soon"), now), None);
/// ```
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // A delay too large for u64 is still a valid (enormous) delay; the cap applies.
        let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_dates_and_garbage() {
        let now = SystemTime::now();
        let parse = |s: &'static str| parse_retry_after(&HeaderValue::from_static(s), now);
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(
            parse("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(parse("-1"), None);
        assert_eq!(parse("1.5"), None);
        assert_eq!(parse(""), None);
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO),
            "a date in the past means retry now"
        );
        let later = now + Duration::from_secs(10);
        let header = HeaderValue::from_str(&httpdate::fmt_http_date(later)).unwrap();
        let wait = parse_retry_after(&header, now).unwrap();
        // HTTP dates have whole seconds.
        assert!(
            wait <= Duration::from_secs(10) && wait > Duration::from_secs(8),
            "{wait:?}"
        );
    }
}
