//! Durations and byte sizes as people write them in task files (`4h`, `64GiB`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::CoreError;

/// A duration with second precision, written like `90s`, `30m`, `4h`, `1h30m`, `2d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HumanDuration {
    secs: u64,
}

impl HumanDuration {
    pub const fn from_secs(secs: u64) -> Self {
        HumanDuration { secs }
    }
    pub const fn as_secs(self) -> u64 {
        self.secs
    }
    pub const fn as_std(self) -> Duration {
        Duration::from_secs(self.secs)
    }
}

const DURATION_UNITS: &[(&str, u64)] = &[
    ("d", 86_400),
    ("h", 3_600),
    ("m", 60),
    ("s", 1),
    ("days", 86_400),
    ("day", 86_400),
    ("hours", 3_600),
    ("hour", 3_600),
    ("hr", 3_600),
    ("min", 60),
    ("mins", 60),
    ("minutes", 60),
    ("sec", 1),
    ("secs", 1),
    ("seconds", 1),
];

impl FromStr for HumanDuration {
    type Err = CoreError;
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| CoreError::InvalidDuration {
            input: input.to_string(),
            why: why.to_string(),
        };
        let text = input.trim();
        if text.is_empty() {
            return Err(err("it is empty"));
        }
        if text.starts_with('-') {
            return Err(err("a duration cannot be negative"));
        }
        let mut rest = text;
        let mut total: u64 = 0;
        while !rest.is_empty() {
            let digits_end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits_end == 0 {
                return Err(err("expected a number before each unit"));
            }
            let number: u64 = rest[..digits_end]
                .parse()
                .map_err(|_| err("the number is too large"))?;
            rest = rest[digits_end..].trim_start();
            let unit_end = rest
                .find(|c: char| !c.is_ascii_alphabetic())
                .unwrap_or(rest.len());
            if unit_end == 0 {
                return Err(err("every number needs a unit (s, m, h or d)"));
            }
            let unit = rest[..unit_end].to_ascii_lowercase();
            let scale = DURATION_UNITS
                .iter()
                .find(|(name, _)| *name == unit)
                .map(|(_, scale)| *scale)
                .ok_or_else(|| err(&format!("unknown unit `{unit}`")))?;
            total = number
                .checked_mul(scale)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(|| err("the duration is too large"))?;
            rest = rest[unit_end..].trim_start();
        }
        Ok(HumanDuration { secs: total })
    }
}

impl TryFrom<String> for HumanDuration {
    type Error = CoreError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<HumanDuration> for String {
    fn from(value: HumanDuration) -> Self {
        value.to_string()
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.secs == 0 {
            return f.write_str("0s");
        }
        let mut left = self.secs;
        for (unit, scale) in &DURATION_UNITS[..4] {
            if left >= *scale {
                write!(f, "{}{}", left / scale, unit)?;
                left %= scale;
            }
        }
        Ok(())
    }
}

/// A number of bytes, written like `512MiB`, `64GiB`, `2TB` or `1.5G`.
///
/// `K`, `M`, `G`, `T` without `B` are binary (as in Slurm's `--mem`), `KB`/`MB`/… decimal,
/// `KiB`/`MiB`/… binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ByteSize {
    bytes: u64,
}

impl ByteSize {
    pub const fn from_bytes(bytes: u64) -> Self {
        ByteSize { bytes }
    }
    pub const fn as_bytes(self) -> u64 {
        self.bytes
    }
    pub const fn gib(n: u64) -> Self {
        ByteSize {
            bytes: n * 1024 * 1024 * 1024,
        }
    }
    pub const fn mib(n: u64) -> Self {
        ByteSize {
            bytes: n * 1024 * 1024,
        }
    }
}

const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("kb", 1_000),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("mb", 1_000_000),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("gb", 1_000_000_000),
    ("t", 1 << 40),
    ("tib", 1 << 40),
    ("tb", 1_000_000_000_000),
];

impl FromStr for ByteSize {
    type Err = CoreError;
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| CoreError::InvalidSize {
            input: input.to_string(),
            why: why.to_string(),
        };
        let text = input.trim();
        if text.starts_with('-') {
            return Err(err("a size cannot be negative"));
        }
        let number_end = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        if number_end == 0 {
            return Err(err("expected a number first"));
        }
        let number_text = &text[..number_end];
        let unit = text[number_end..].trim().to_ascii_lowercase();
        let scale = SIZE_UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, scale)| *scale)
            .ok_or_else(|| err(&format!("unknown unit `{unit}`")))?;
        // Whole numbers are multiplied exactly (an `f64` is not, past 2^53).
        if let Ok(whole) = number_text.parse::<u64>() {
            return whole
                .checked_mul(scale)
                .map(ByteSize::from_bytes)
                .ok_or_else(|| err("the size is too large"));
        }
        let number: f64 = number_text
            .parse()
            .map_err(|_| err("the number is malformed"))?;
        let bytes = number * scale as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(err("the size is too large"));
        }
        Ok(ByteSize {
            bytes: bytes.round() as u64,
        })
    }
}

impl TryFrom<String> for ByteSize {
    type Error = CoreError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<ByteSize> for String {
    /// Exact, unlike `Display`, which rounds to one decimal for people: a size sent as JSON
    /// (a task spec from the CLI to the server) must arrive as the same number of bytes.
    fn from(value: ByteSize) -> Self {
        let shown = value.to_string();
        if shown.parse::<ByteSize>().ok() == Some(value) {
            shown
        } else {
            format!("{}B", value.bytes)
        }
    }
}

impl fmt::Display for ByteSize {
    /// Exact binary units when the value divides evenly, otherwise one decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: &[(&str, u64)] = &[
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, scale) in UNITS {
            if self.bytes >= *scale {
                return if self.bytes % scale == 0 {
                    write!(f, "{}{}", self.bytes / scale, name)
                } else {
                    write!(f, "{:.1}{}", self.bytes as f64 / *scale as f64, name)
                };
            }
        }
        write!(f, "{}B", self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_compound_and_long_units() {
        let cases = [
            ("90s", 90),
            ("30m", 1800),
            ("4h", 14_400),
            ("1h30m", 5400),
            ("2d", 172_800),
            ("1 hour", 3600),
            ("0s", 0),
        ];
        for (text, secs) in cases {
            assert_eq!(
                text.parse::<HumanDuration>().unwrap().as_secs(),
                secs,
                "{text}"
            );
        }
    }

    #[test]
    fn durations_reject_bad_input_with_reason() {
        for (text, why) in [
            ("", "empty"),
            ("-5m", "negative"),
            ("10", "needs a unit"),
            ("5y", "unknown unit `y`"),
            ("h", "number before"),
        ] {
            let err = text.parse::<HumanDuration>().unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn durations_display_round_trips() {
        for secs in [0, 1, 59, 60, 3661, 90_061, 172_800] {
            let d = HumanDuration::from_secs(secs);
            assert_eq!(d.to_string().parse::<HumanDuration>().unwrap(), d);
        }
        assert_eq!(HumanDuration::from_secs(5400).to_string(), "1h30m");
    }

    #[test]
    fn sizes_parse_binary_and_decimal() {
        assert_eq!("64GiB".parse::<ByteSize>().unwrap(), ByteSize::gib(64));
        assert_eq!("64G".parse::<ByteSize>().unwrap(), ByteSize::gib(64));
        assert_eq!("2GB".parse::<ByteSize>().unwrap().as_bytes(), 2_000_000_000);
        assert_eq!("1.5 GiB".parse::<ByteSize>().unwrap().as_bytes(), 3 << 29);
        assert_eq!("100".parse::<ByteSize>().unwrap().as_bytes(), 100);
    }

    #[test]
    fn sizes_reject_bad_input_with_reason() {
        for (text, why) in [
            ("-1GiB", "negative"),
            ("GiB", "number first"),
            ("5 parsecs", "unknown unit"),
            ("1.2.3G", "malformed"),
        ] {
            let err = text.parse::<ByteSize>().unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn sizes_display_round_trips() {
        for bytes in [0, 512, 1024, 1536, 1 << 30, 3 << 29, 64 << 30] {
            let s = ByteSize::from_bytes(bytes);
            let back = s.to_string().parse::<ByteSize>().unwrap().as_bytes();
            assert!(
                (back as i64 - bytes as i64).unsigned_abs() <= bytes / 20,
                "{s}"
            );
        }
        assert_eq!(ByteSize::gib(64).to_string(), "64GiB");
    }

    #[test]
    fn sizes_serialise_exactly() {
        for bytes in [
            0,
            1,
            1536,
            100_000_000,
            2_000_000_000_000,
            64 << 30,
            (1 << 53) + 1,
            u64::MAX,
        ] {
            let size = ByteSize::from_bytes(bytes);
            let json = serde_json::to_string(&size).unwrap();
            assert_eq!(
                serde_json::from_str::<ByteSize>(&json).unwrap(),
                size,
                "{json}"
            );
        }
        assert_eq!(String::from(ByteSize::gib(64)), "64GiB");
        assert_eq!(
            String::from(ByteSize::from_bytes(2_000_000_000_000)),
            "2000000000000B"
        );
        assert_eq!(
            "18446744073709551615"
                .parse::<ByteSize>()
                .unwrap()
                .as_bytes(),
            u64::MAX
        );
        assert!("18446744073709551616".parse::<ByteSize>().is_err());
        assert!("16777216TiB".parse::<ByteSize>().is_err());
    }
}
