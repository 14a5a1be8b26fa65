//! How many GPUs a task asks for on each node: a whole number (`gpus: 2`), or a share
//! of one GPU (`gpus: 0.5`) that several tasks of one tenant may pack onto one GPU.
//!
//! Counted in hundredths of a GPU: the finest share worth giving (MPS takes a percentage,
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), and whole numbers so sums stay exact. On the
//! wire a whole count is an integer (`2`, as before) and a share a decimal (`0.5`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Hundredths in one GPU.
pub const GPU_HUNDREDTHS: u32 = 100;

/// GPUs per node, in hundredths: `0` none, `50` half of one GPU, `200` two whole GPUs.
/// Only whole counts or shares below one GPU exist ([`GpuCount::parse`] refuses `1.5`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuCount(u32);

/// Why a number is not a GPU count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuCountError {
    #[error("`{0}` is not a number of GPUs")]
    NotANumber(String),
    #[error("a number of GPUs cannot be negative, found `{0}`")]
    Negative(String),
    #[error("`{0}` is finer than a hundredth of a GPU")]
    TooFine(String),
    #[error("`{0}` is more than one GPU but not a whole number; a task shares at most one GPU")]
    FractionAboveOne(String),
    #[error("`{0}` is far too large")]
    TooLarge(String),
}

impl GpuCountError {
    /// How to write it instead, for an error message's help line.
    pub fn help(&self) -> &'static str {
        match self {
            GpuCountError::TooFine(_) => {
                "give a share in hundredths of a GPU, e.g. `gpus: 0.25`, or whole GPUs, e.g. `gpus: 1`"
            }
            GpuCountError::FractionAboveOne(_) => {
                "ask for whole GPUs (e.g. `gpus: 2`), or for a share of one GPU below 1 (e.g. `gpus: 0.5`)"
            }
            _ => "write whole GPUs, e.g. `gpus: 2`, or a share of one GPU, e.g. `gpus: 0.5`",
        }
    }
}

impl GpuCount {
    pub const ZERO: GpuCount = GpuCount(0);

    /// `n` whole GPUs.
    pub const fn whole(n: u32) -> GpuCount {
        GpuCount(n.saturating_mul(GPU_HUNDREDTHS))
    }

    /// A share of one GPU in hundredths; `None` unless `1..=99`.
    pub fn share(hundredths: u32) -> Option<GpuCount> {
        (1..GPU_HUNDREDTHS)
            .contains(&hundredths)
            .then_some(GpuCount(hundredths))
    }

    /// The count in hundredths of a GPU (what quotas and fair share add up).
    pub fn hundredths(self) -> u32 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Whole GPUs the task holds on its own (`0` for a share of one).
    pub fn whole_gpus(self) -> u32 {
        if self.is_share() {
            0
        } else {
            self.0 / GPU_HUNDREDTHS
        }
    }

    /// True for a share of one GPU (`0 < count < 1`).
    pub fn is_share(self) -> bool {
        (1..GPU_HUNDREDTHS).contains(&self.0)
    }

    /// The share of one GPU in percent (`Some(50)` for `0.5`), `None` for whole GPUs.
    pub fn share_percent(self) -> Option<u32> {
        self.is_share().then_some(self.0)
    }

    /// Read `2`, `0.5`, `0.25`: whole GPUs, or a share of one GPU in hundredths.
    pub fn parse(text: &str) -> Result<GpuCount, GpuCountError> {
        let text = text.trim().replace('_', "");
        if text.starts_with('-') {
            return Err(GpuCountError::Negative(text));
        }
        let (whole, fraction) = match text.split_once('.') {
            Some((whole, fraction)) => (whole, fraction),
            None => (text.as_str(), ""),
        };
        let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
        if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
            return Err(GpuCountError::NotANumber(text));
        }
        let fraction = fraction.trim_end_matches('0');
        if fraction.len() > 2 {
            return Err(GpuCountError::TooFine(text));
        }
        let whole: u32 = if whole.is_empty() {
            0
        } else {
            whole
                .parse()
                .map_err(|_| GpuCountError::TooLarge(text.clone()))?
        };
        let hundredths = if fraction.is_empty() {
            0
        } else {
            format!("{fraction:0<2}")
                .parse::<u32>()
                .map_err(|_| GpuCountError::NotANumber(text.clone()))?
        };
        if hundredths > 0 && whole > 0 {
            return Err(GpuCountError::FractionAboveOne(text));
        }
        whole
            .checked_mul(GPU_HUNDREDTHS)
            .map(|w| GpuCount(w + hundredths))
            .ok_or(GpuCountError::TooLarge(text))
    }

    fn from_f64(value: f64) -> Result<GpuCount, GpuCountError> {
        if !value.is_finite() {
            return Err(GpuCountError::NotANumber(value.to_string()));
        }
        // Through the decimal text, so `0.29` is 29 hundredths and not 28.999….
        GpuCount::parse(&format!("{value}"))
    }
}

impl fmt::Display for GpuCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_share() {
            let text = format!("0.{:02}", self.0);
            f.write_str(text.trim_end_matches('0'))
        } else {
            write!(f, "{}", self.0 / GPU_HUNDREDTHS)
        }
    }
}

impl From<u32> for GpuCount {
    fn from(whole: u32) -> GpuCount {
        GpuCount::whole(whole)
    }
}

impl Serialize for GpuCount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_share() {
            serializer.serialize_f64(f64::from(self.0) / f64::from(GPU_HUNDREDTHS))
        } else {
            serializer.serialize_u32(self.0 / GPU_HUNDREDTHS)
        }
    }
}

impl<'de> Deserialize<'de> for GpuCount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<GpuCount, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = GpuCount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("whole GPUs (e.g. 2) or a share of one GPU (e.g. 0.5)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<GpuCount, E> {
                u32::try_from(v)
                    .ok()
                    .and_then(|v| v.checked_mul(GPU_HUNDREDTHS))
                    .map(GpuCount)
                    .ok_or_else(|| E::custom(GpuCountError::TooLarge(v.to_string())))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<GpuCount, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(GpuCountError::Negative(v.to_string()))),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<GpuCount, E> {
                GpuCount::from_f64(v).map_err(E::custom)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<GpuCount, E> {
                GpuCount::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_counts_and_shares_of_one_gpu_are_read_and_others_refused() {
        assert_eq!(GpuCount::parse("2"), Ok(GpuCount::whole(2)));
        assert_eq!(GpuCount::parse("0"), Ok(GpuCount::ZERO));
        assert_eq!(GpuCount::parse("0.5").unwrap().hundredths(), 50);
        assert_eq!(GpuCount::parse(".25").unwrap().share_percent(), Some(25));
        assert_eq!(GpuCount::parse("0.10").unwrap().hundredths(), 10);
        assert_eq!(GpuCount::parse("1.0"), Ok(GpuCount::whole(1)));
        assert_eq!(GpuCount::parse("2.00"), Ok(GpuCount::whole(2)));
        assert!(matches!(
            GpuCount::parse("0.333"),
            Err(GpuCountError::TooFine(_))
        ));
        assert!(matches!(
            GpuCount::parse("1.5"),
            Err(GpuCountError::FractionAboveOne(_))
        ));
        assert!(matches!(
            GpuCount::parse("-1"),
            Err(GpuCountError::Negative(_))
        ));
        assert!(matches!(
            GpuCount::parse("many"),
            Err(GpuCountError::NotANumber(_))
        ));
        assert!(matches!(
            GpuCount::parse("."),
            Err(GpuCountError::NotANumber(_))
        ));
        assert!(matches!(
            GpuCount::parse("99999999999"),
            Err(GpuCountError::TooLarge(_))
        ));
    }

    #[test]
    fn a_share_holds_no_whole_gpu_and_prints_as_written() {
        let half = GpuCount::parse("0.5").unwrap();
        assert!(half.is_share());
        assert_eq!(half.whole_gpus(), 0);
        assert_eq!(half.to_string(), "0.5");
        assert_eq!(GpuCount::parse("0.05").unwrap().to_string(), "0.05");
        assert_eq!(GpuCount::whole(4).whole_gpus(), 4);
        assert_eq!(GpuCount::whole(4).share_percent(), None);
        assert_eq!(GpuCount::whole(4).to_string(), "4");
    }

    #[test]
    fn whole_counts_stay_integers_on_the_wire_and_shares_are_decimals() {
        assert_eq!(serde_json::to_string(&GpuCount::whole(2)).unwrap(), "2");
        let half = GpuCount::share(50).unwrap();
        assert_eq!(serde_json::to_string(&half).unwrap(), "0.5");
        assert_eq!(serde_json::from_str::<GpuCount>("0.5").unwrap(), half);
        assert_eq!(
            serde_json::from_str::<GpuCount>("0.29")
                .unwrap()
                .hundredths(),
            29
        );
        assert_eq!(
            serde_json::from_str::<GpuCount>("3").unwrap(),
            GpuCount::whole(3)
        );
        assert!(serde_json::from_str::<GpuCount>("1.5").is_err());
        assert!(serde_json::from_str::<GpuCount>("-2").is_err());
    }
}
