//! The times a usage query names: RFC 3339, a date (midnight UTC), `now`, or a duration
//! ago (`90m`, `24h`, `7d`, `2w`), decoded once here into timestamps.

use tacc_core::Timestamp;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::ServerError;

/// A window when the query names no start.
pub const DEFAULT_WINDOW_SECS: u64 = 7 * 86_400;

/// What the accepted forms are, for error messages and docs.
const FORMS: &str = "use RFC 3339 (2025-05-01T12:00:00Z), a date (2025-05-01, midnight \
     UTC), `now`, or a duration ago such as 90m, 24h, 7d or 2w";

/// `text` as a point in time, relative forms counted back from `now`.
pub fn parse_time(text: &str, now: Timestamp) -> Result<Timestamp, ServerError> {
    let text = text.trim();
    let bad = |why: &str| ServerError::BadRequest(format!("`{text}` is not a time{why}: {FORMS}"));
    if text == "now" {
        return Ok(now);
    }
    if let Some(ago) = relative_secs(text) {
        let ago = ago.ok_or_else(|| bad(" (too far back)"))?;
        return Ok(Timestamp(now.0.saturating_sub(ago.saturating_mul(1000))));
    }
    let instant = if text.len() == 10 {
        date_midnight(text).ok_or_else(|| bad(""))?
    } else {
        OffsetDateTime::parse(text, &Rfc3339).map_err(|e| bad(&format!(" ({e})")))?
    };
    let millis = instant.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(millis)
        .map(Timestamp)
        .map_err(|_| bad(" (before 1970)"))
}

/// `Some(seconds)` for `<number><s|m|h|d|w>` (`Some(None)` when it overflows); `None`
/// when `text` is not of that form.
fn relative_secs(text: &str) -> Option<Option<u64>> {
    let unit = text.chars().last()?;
    let factor = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        'w' => 7 * 86_400,
        _ => return None,
    };
    let number = &text[..text.len() - 1];
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(factor)),
    )
}

/// `YYYY-MM-DD` at midnight UTC.
fn date_midnight(text: &str) -> Option<OffsetDateTime> {
    let mut parts = text.split('-');
    let year: i32 = parts.next()?.parse().ok()?;
    let month: u8 = parts.next()?.parse().ok()?;
    let day: u8 = parts.next()?.parse().ok()?;
    let month = time::Month::try_from(month).ok()?;
    let date = time::Date::from_calendar_date(year, month, day).ok()?;
    Some(date.midnight().assume_utc())
}

/// The window `[since, until)` of a query, checked.
pub fn window(
    since: Option<&str>,
    until: Option<&str>,
    now: Timestamp,
) -> Result<(Timestamp, Timestamp), ServerError> {
    let until = until
        .map(|t| parse_time(t, now))
        .transpose()?
        .unwrap_or(now);
    let since = match since {
        Some(text) => parse_time(text, now)?,
        None => Timestamp(until.0.saturating_sub(DEFAULT_WINDOW_SECS * 1000)),
    };
    if since >= until {
        return Err(ServerError::BadRequest(format!(
            "the window is empty: --since ({}) must be before --until ({})",
            rfc3339(since),
            rfc3339(until)
        )));
    }
    Ok((since, until))
}

/// A timestamp in RFC 3339, UTC, to the second.
pub fn rfc3339(at: Timestamp) -> String {
    OffsetDateTime::from_unix_timestamp((at.0 / 1000) as i64)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{}ms", at.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp(1_746_100_000_000);

    #[test]
    fn relative_forms_count_back_from_now() {
        assert_eq!(parse_time("now", NOW).unwrap(), NOW);
        assert_eq!(
            parse_time("90m", NOW).unwrap(),
            Timestamp(NOW.0 - 5_400_000)
        );
        assert_eq!(
            parse_time("24h", NOW).unwrap(),
            Timestamp(NOW.0 - 86_400_000)
        );
        assert_eq!(
            parse_time("7d", NOW).unwrap(),
            Timestamp(NOW.0 - 604_800_000)
        );
        assert_eq!(
            parse_time("2w", NOW).unwrap(),
            Timestamp(NOW.0 - 1_209_600_000)
        );
        assert_eq!(parse_time("45s", NOW).unwrap(), Timestamp(NOW.0 - 45_000));
    }

    #[test]
    fn absolute_forms_are_rfc3339_or_a_date() {
        assert_eq!(
            parse_time("2025-05-01T00:00:00Z", NOW).unwrap(),
            Timestamp(1_746_057_600_000)
        );
        assert_eq!(
            parse_time("2025-05-01T02:00:00+02:00", NOW).unwrap(),
            Timestamp(1_746_057_600_000)
        );
        assert_eq!(
            parse_time("2025-05-01", NOW).unwrap(),
            Timestamp(1_746_057_600_000)
        );
        assert_eq!(
            rfc3339(Timestamp(1_746_057_600_000)),
            "2025-05-01T00:00:00Z"
        );
    }

    #[test]
    fn anything_else_is_refused_with_the_accepted_forms() {
        for bad in [
            "yesterday",
            "7x",
            "d",
            "-3d",
            "2025-13-01",
            "2025-05-01 10:00",
        ] {
            let error = parse_time(bad, NOW).unwrap_err().to_string();
            assert!(error.contains("RFC 3339") && error.contains(bad), "{error}");
        }
        let empty = window(Some("1d"), Some("2d"), NOW).unwrap_err().to_string();
        assert!(empty.contains("must be before"), "{empty}");
        let (since, until) = window(None, None, NOW).unwrap();
        assert_eq!(
            (until, until.0 - since.0),
            (NOW, DEFAULT_WINDOW_SECS * 1000)
        );
    }
}
