//! A task's secrets on the node: each goes into the task's environment under its name
//! (never over a variable the platform owns), and every exact value is masked in the
//! task's log lines before they leave the node.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// What a masked value is replaced with.
pub(crate) const MASK: &str = "***";

/// Values shorter than this are not masked: masking `1` or `ab` everywhere would make
/// logs unreadable and reveal the value anyway.
pub(crate) const MIN_MASKED_LEN: usize = 4;

/// Variables the platform sets (besides every `TACC_*`): a secret must not replace them.
const PLATFORM_VARS: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NODE_RANK",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONUNBUFFERED",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
];

/// Checks that every secret may be set under its name; `Err` is the attempt's message.
pub(crate) fn check_names(secrets: &BTreeMap<String, String>) -> Result<(), String> {
    for name in secrets.keys() {
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "secret `{name}` cannot be an environment variable name (letters, digits and \
                 `_`, not starting with a digit); rename the secret"
            ));
        }
        if name.to_ascii_uppercase().starts_with("TACC_") || PLATFORM_VARS.contains(&name.as_str())
        {
            return Err(format!(
                "secret `{name}` would replace a variable the platform sets; rename the secret \
                 (`TACC_*`, {} are reserved)",
                PLATFORM_VARS.join(", ")
            ));
        }
    }
    Ok(())
}

/// Puts the secrets into the task's environment (after [`check_names`]).
pub(crate) fn inject(env: &mut BTreeMap<String, String>, secrets: &BTreeMap<String, String>) {
    env.extend(secrets.iter().map(|(k, v)| (k.clone(), v.clone())));
}

/// Replaces exact secret values in log lines with [`MASK`].
#[derive(Debug, Clone, Default)]
pub(crate) struct SecretMask {
    /// Longest first, so a value containing another is masked whole.
    values: Vec<String>,
}

impl SecretMask {
    /// A mask for these values; each line of a multi-line value is masked on its own too,
    /// since logs arrive line by line.
    pub fn new<'a>(values: impl IntoIterator<Item = &'a String>) -> SecretMask {
        let mut masked: Vec<String> = Vec::new();
        for value in values {
            let pieces = std::iter::once(value.as_str()).chain(value.lines());
            for piece in pieces {
                let piece = piece.trim_end_matches('\r');
                if piece.len() >= MIN_MASKED_LEN && !masked.iter().any(|m| m == piece) {
                    masked.push(piece.to_string());
                }
            }
        }
        masked.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        SecretMask { values: masked }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The greatest position at most `cut` (a character boundary of `text`) where `text`
    /// may be split without cutting through a value: the two sides are then masked
    /// apart and no value escapes masking by straddling the cut.
    pub fn safe_cut(&self, text: &str, mut cut: usize) -> usize {
        loop {
            let mut moved = false;
            for value in &self.values {
                let mut start = cut.saturating_sub(value.len() - 1);
                while !text.is_char_boundary(start) {
                    start -= 1;
                }
                let mut end = (cut + value.len() - 1).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                let straddling = text[start..end]
                    .match_indices(value.as_str())
                    .map(|(at, _)| start + at)
                    .find(|at| *at < cut && at + value.len() > cut);
                if let Some(at) = straddling {
                    cut = at;
                    moved = true;
                }
            }
            if !moved {
                return cut;
            }
        }
    }

    /// The length of the longest value (0 when there is none).
    pub fn longest(&self) -> usize {
        self.values.first().map_or(0, String::len)
    }

    /// `line` with every occurrence of every value replaced, scanning left to right (at
    /// each position the longest value that matches wins).
    pub fn apply<'a>(&self, line: &'a str) -> Cow<'a, str> {
        if self.values.is_empty() {
            return Cow::Borrowed(line);
        }
        let mut out = String::new();
        let mut rest = line;
        let mut changed = false;
        loop {
            // The earliest match; among matches at one position, the longest (values are
            // sorted longest first and `<` keeps the first found).
            let mut best: Option<(usize, usize)> = None;
            for value in &self.values {
                if let Some(at) = rest.find(value.as_str()) {
                    if best.is_none_or(|(b, _)| at < b) {
                        best = Some((at, value.len()));
                    }
                }
            }
            match best {
                None => break,
                Some((at, len)) => {
                    changed = true;
                    out.push_str(&rest[..at]);
                    out.push_str(MASK);
                    rest = &rest[at + len..];
                }
            }
        }
        if !changed {
            return Cow::Borrowed(line);
        }
        out.push_str(rest);
        Cow::Owned(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(values: &[&str]) -> SecretMask {
        let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        SecretMask::new(&values)
    }

    #[test]
    fn exact_values_are_masked_wherever_they_are_in_a_line() {
        let m = mask(&["hunter2-token"]);
        assert_eq!(m.apply("key=hunter2-token"), "key=***");
        assert_eq!(
            m.apply("hunter2-token and hunter2-token again"),
            "*** and *** again"
        );
        assert_eq!(m.apply("hunter2-tok is not it"), "hunter2-tok is not it");
        assert!(matches!(m.apply("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_longest_value_wins_and_short_values_are_left_alone() {
        let m = mask(&["abcd", "abcdefgh", "xyz"]);
        assert_eq!(m.apply("[abcdefgh] [abcd] [xyz]"), "[***] [***] [xyz]");
        assert!(mask(&["", "abc"]).is_empty());
    }

    #[test]
    fn each_line_of_a_multi_line_value_is_masked() {
        let m = mask(&["-----BEGIN KEY-----\nMIIEvQIBADAN\n-----END KEY-----\n"]);
        assert_eq!(m.apply("MIIEvQIBADAN"), "***");
        assert_eq!(m.apply("got -----END KEY-----"), "got ***");
    }

    #[test]
    fn a_safe_cut_never_splits_a_value() {
        let mask = mask(&["s3cr3t-value"]);
        let text = "xx s3cr3t-value yy";
        for cut in 0..=text.len() {
            let safe = mask.safe_cut(text, cut);
            assert!(safe <= cut);
            let (left, right) = text.split_at(safe);
            assert_eq!(
                format!("{}{}", mask.apply(left), mask.apply(right)),
                "xx *** yy",
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn masking_works_on_multibyte_text() {
        let m = mask(&["pässwörd"]);
        assert_eq!(m.apply("ü pässwörd ü"), "ü *** ü");
    }

    #[test]
    fn platform_names_are_refused_and_others_accepted() {
        let named = |name: &str| BTreeMap::from([(name.to_string(), "v".to_string())]);
        assert!(check_names(&named("HF_TOKEN")).is_ok());
        assert!(check_names(&named("_X1")).is_ok());
        for reserved in [
            "TACC_TASK_ID",
            "tacc_anything",
            "PATH",
            "HOME",
            "MASTER_ADDR",
        ] {
            let error = check_names(&named(reserved)).unwrap_err();
            assert!(error.contains("reserved"), "{reserved}: {error}");
        }
        for bad in ["", "1ABC", "A-B", "A=B"] {
            let error = check_names(&named(bad)).unwrap_err();
            assert!(
                error.contains("environment variable name"),
                "{bad}: {error}"
            );
        }
        let mut env = BTreeMap::from([("A".to_string(), "1".to_string())]);
        inject(&mut env, &named("HF_TOKEN"));
        assert_eq!(env["HF_TOKEN"], "v");
    }
}
