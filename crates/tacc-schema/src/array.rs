//! `array:` of a task file: the index set of a task array, written as ranges and lists
//! (`0-999`, `0-999:2`, `1,3,7`, or a mix such as `0-9,20-29:5`), and `notify:`, where the
//! platform reports the end of a task or a group.
//!
//! An array is one submission of many elements that differ only by `TACC_ARRAY_INDEX`.
//! Its written form is what travels and is stored; the indices are derived from it, and a
//! bad form is refused with what is wrong and how to write it instead.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most elements one array may have: large enough for real sweeps, small enough that one
/// submission stays one quick transaction.
pub const MAX_ARRAY_ELEMENTS: u32 = 100_000;

/// The indices of an array, in the order written; no index twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ArraySpec {
    written: String,
    indices: Vec<u32>,
}

/// Why an `array:` value is not valid, and how to write it instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayError {
    pub message: String,
    pub help: String,
}

impl fmt::Display for ArrayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.help)
    }
}

impl std::error::Error for ArrayError {}

const FORMS: &str = "write a range `0-999`, a range with a step `0-999:2`, or a list `1,3,7`";

fn bad(message: String, help: impl Into<String>) -> ArrayError {
    ArrayError {
        message,
        help: help.into(),
    }
}

fn number(text: &str, part: &str) -> Result<u32, ArrayError> {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix('-')
        && rest.parse::<u64>().is_ok()
    {
        return Err(bad(
            format!("array index `{text}` in `{part}` is negative"),
            "indices start at 0; write e.g. `0-9`",
        ));
    }
    text.parse::<u32>()
        .map_err(|_| bad(format!("`{text}` in `{part}` is not an array index"), FORMS))
}

/// One comma-separated part: its first index, last index and step.
fn part(text: &str) -> Result<(u32, u32, u32), ArrayError> {
    let (range, step) = match text.split_once(':') {
        Some((range, step)) => (range, Some(step)),
        None => (text, None),
    };
    // A leading `-` is a negative number, not a range.
    let (first, last) = match range.trim().get(1..).and_then(|rest| rest.split_once('-')) {
        Some((first_tail, last)) => {
            let first = format!("{}{first_tail}", &range.trim()[..1]);
            (number(&first, text)?, number(last, text)?)
        }
        None => {
            let only = number(range, text)?;
            (only, only)
        }
    };
    if last < first {
        return Err(bad(
            format!("array range `{}` ends before it starts", text.trim()),
            format!("write the smaller index first, e.g. `{last}-{first}`"),
        ));
    }
    let step = match step {
        None => 1,
        Some(step) => match step.trim().parse::<u32>() {
            Ok(0) | Err(_) => {
                return Err(bad(
                    format!("the step of `{}` must be a positive number", text.trim()),
                    "write e.g. `0-999:2` for every second index",
                ));
            }
            Ok(step) => step,
        },
    };
    Ok((first, last, step))
}

impl ArraySpec {
    /// The indices, in the order written.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    pub fn len(&self) -> usize {
        self.indices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// The array of exactly these indices (a rerun of some elements), written as a list.
    pub fn of_indices(indices: &[u32]) -> Result<Self, ArrayError> {
        let written = indices
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        written.parse()
    }
}

impl FromStr for ArraySpec {
    type Err = ArrayError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let written = s.trim();
        if written.is_empty() {
            return Err(bad("the array is empty".to_string(), FORMS));
        }
        let parts = written
            .split(',')
            .map(part)
            .collect::<Result<Vec<_>, _>>()?;
        // Count before building, so `0-4000000000` is refused without allocating it.
        let total: u64 = parts
            .iter()
            .map(|(first, last, step)| u64::from((last - first) / step) + 1)
            .sum();
        if total > u64::from(MAX_ARRAY_ELEMENTS) {
            return Err(bad(
                format!(
                    "the array `{written}` has {total} elements, more than the limit of {MAX_ARRAY_ELEMENTS}"
                ),
                "split it into several arrays, or use a step (e.g. `0-999999:10`)",
            ));
        }
        let mut indices = Vec::with_capacity(total as usize);
        let mut seen = std::collections::BTreeSet::new();
        for (first, last, step) in parts {
            for index in (first..=last).step_by(step as usize) {
                if !seen.insert(index) {
                    return Err(bad(
                        format!("array index {index} appears twice in `{written}`"),
                        "list every index once",
                    ));
                }
                indices.push(index);
            }
        }
        Ok(ArraySpec {
            written: written.to_string(),
            indices,
        })
    }
}

impl TryFrom<String> for ArraySpec {
    type Error = ArrayError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<ArraySpec> for String {
    fn from(value: ArraySpec) -> Self {
        value.written
    }
}

impl fmt::Display for ArraySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

/// Where to report the end of the task (or of the whole array): an HTTP POST of a JSON
/// event, signed with the named secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotifySpec {
    /// An `http://` or `https://` URL that receives the event.
    pub webhook: String,
    /// The name of one of your secrets (`tcloud secret set NAME`): the key of the
    /// `X-TACC-Signature: sha256=…` header, an HMAC-SHA256 of the body.
    pub secret: String,
}

/// Why `webhook` is not a URL the platform can post to, if it is not.
pub(crate) fn webhook_error(webhook: &str) -> Option<String> {
    let rest = webhook
        .strip_prefix("https://")
        .or_else(|| webhook.strip_prefix("http://"));
    match rest {
        None => Some(format!(
            "the webhook `{webhook}` is not an http:// or https:// URL"
        )),
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            Some(format!("the webhook `{webhook}` names no host"))
        }
        Some(_) if webhook.chars().any(char::is_whitespace) => {
            Some(format!("the webhook `{webhook}` contains a space"))
        }
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indices(text: &str) -> Vec<u32> {
        text.parse::<ArraySpec>().unwrap().indices().to_vec()
    }

    #[test]
    fn ranges_steps_and_lists() {
        assert_eq!(indices("0-3"), [0, 1, 2, 3]);
        assert_eq!(indices("0-9:4"), [0, 4, 8]);
        assert_eq!(indices("1,3,7"), [1, 3, 7]);
        assert_eq!(indices(" 5 "), [5]);
        assert_eq!(indices("0-1,10-14:2"), [0, 1, 10, 12, 14]);
        assert_eq!("0-999".parse::<ArraySpec>().unwrap().len(), 1000);
    }

    #[test]
    fn a_range_backwards_says_how_to_write_it() {
        let err = "5-2".parse::<ArraySpec>().unwrap_err();
        assert!(err.message.contains("`5-2` ends before it starts"), "{err}");
        assert!(err.help.contains("`2-5`"), "{err}");
    }

    #[test]
    fn bad_forms_are_refused_with_a_reason() {
        for (text, expected) in [
            ("", "empty"),
            ("a-b", "not an array index"),
            ("-3", "negative"),
            ("0-9:0", "step"),
            ("1,2,1", "appears twice"),
            ("0-100000", "more than the limit of 100000"),
            ("0-4000000000", "more than the limit"),
        ] {
            let err = text.parse::<ArraySpec>().unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        assert_eq!("0-99999".parse::<ArraySpec>().unwrap().len(), 100_000);
    }

    #[test]
    fn travels_as_written() {
        let spec: ArraySpec = "0-9:2".parse().unwrap();
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(json, "\"0-9:2\"");
        assert_eq!(serde_json::from_str::<ArraySpec>(&json).unwrap(), spec);
        assert!(serde_json::from_str::<ArraySpec>("\"9-0\"").is_err());
        assert_eq!(ArraySpec::of_indices(&[3, 7]).unwrap().to_string(), "3,7");
    }

    #[test]
    fn webhooks_must_be_http_urls() {
        assert_eq!(webhook_error("https://hooks.example.com/x"), None);
        assert_eq!(webhook_error("http://127.0.0.1:8080/"), None);
        assert!(webhook_error("ftp://x").unwrap().contains("http"));
        assert!(webhook_error("https://").unwrap().contains("no host"));
    }
}
