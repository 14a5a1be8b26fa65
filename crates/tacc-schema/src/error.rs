//! The crate's error type and the compiler-style rendering of located errors.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong while reading a task file or checking a [`crate::TaskSpec`].
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// Mistakes in a task file, each located at a line and column of that file, in file
    /// order (never empty): a file is checked whole, so one run reports them all.
    #[error("{0}")]
    Located(Diagnostics),

    /// A semantic mistake in a spec that has no source text (one received as JSON).
    #[error("error: {message}\n  --> field `{field}`{}", render_help(help))]
    Invalid {
        /// Dotted path of the offending field, e.g. `resources.gpus` or `datasets.0.mount`.
        field: String,
        message: String,
        help: Option<String>,
    },

    /// The task file (or the directory holding it) could not be read.
    #[error("error: cannot read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A directory was given but holds no task file.
    #[error(
        "error: no task file in `{}`\n   = help: looked for {}; create `task.yaml` there or pass the task file's path",
        dir.display(),
        looked_for.join(", ")
    )]
    TaskFileNotFound {
        dir: PathBuf,
        looked_for: Vec<String>,
    },
}

impl SchemaError {
    /// The first located diagnostic (in file order), when this error points into a file.
    pub fn diagnostic(&self) -> Option<&Diagnostic> {
        self.diagnostics().first()
    }

    /// Every located diagnostic, in file order; empty when this error points nowhere.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            SchemaError::Located(diagnostics) => diagnostics.as_slice(),
            _ => &[],
        }
    }

    /// An [`SchemaError::Invalid`] back from the text it renders as (what a server sends
    /// when it refuses a field of a submitted spec), so a client holding the task file can
    /// point at the line that wrote the field; `None` for any other text.
    pub fn invalid_from_rendered(text: &str) -> Option<SchemaError> {
        let rest = text.strip_prefix("error: ")?;
        let (message, rest) = rest.split_once("\n  --> field `")?;
        let (field, rest) = rest.split_once('`')?;
        let help = match rest {
            "" => None,
            rest => Some(rest.strip_prefix("\n   = help: ")?.to_string()),
        };
        Some(SchemaError::Invalid {
            field: field.to_string(),
            message: message.to_string(),
            help,
        })
    }

    /// The help line, if the error carries one.
    pub fn help(&self) -> Option<&str> {
        match self {
            SchemaError::Located(diagnostics) => diagnostics.first().help.as_deref(),
            SchemaError::Invalid { help, .. } => help.as_deref(),
            _ => None,
        }
    }
}

fn render_help(help: &Option<String>) -> String {
    match help {
        Some(help) => format!("\n   = help: {help}"),
        None => String::new(),
    }
}

/// How many diagnostics a rendering shows; the rest are counted ("and 4 more errors"),
/// since past a screenful the first ones fixed usually make others disappear.
pub const MAX_SHOWN_DIAGNOSTICS: usize = 20;

/// The mistakes found in one task file, in file order (line, then column); never empty.
/// A check that finds one more mistake pushes it ([`Diagnostics::push`]); the order is
/// restored when the list is rendered or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(Vec<Diagnostic>);

impl Diagnostics {
    /// A list of one.
    pub fn one(diagnostic: Diagnostic) -> Self {
        Diagnostics(vec![diagnostic])
    }

    /// The list of `diagnostics` in file order, the same mistake reported twice kept once;
    /// `None` when there are none.
    pub fn new(mut diagnostics: Vec<Diagnostic>) -> Option<Self> {
        diagnostics.sort_by_key(|d| (d.line, d.column));
        diagnostics.dedup();
        (!diagnostics.is_empty()).then_some(Diagnostics(diagnostics))
    }

    /// The first mistake in the file.
    pub fn first(&self) -> &Diagnostic {
        &self.0[0]
    }

    pub fn as_slice(&self) -> &[Diagnostic] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true; here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.0
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, diagnostic) in self.0.iter().take(MAX_SHOWN_DIAGNOSTICS).enumerate() {
            if index > 0 {
                f.write_str("\n\n")?;
            }
            write!(f, "{diagnostic}")?;
        }
        let hidden = self.0.len().saturating_sub(MAX_SHOWN_DIAGNOSTICS);
        if hidden > 0 {
            write!(
                f,
                "\n\nerror: and {hidden} more error{} in {} (not shown; fix these first)",
                if hidden == 1 { "" } else { "s" },
                self.0[0].file
            )?;
        }
        if self.0.len() > 1 {
            write!(
                f,
                "\n\nerror: {} has {} errors",
                self.0[0].file,
                self.0.len()
            )?;
        }
        Ok(())
    }
}

/// One error at a place in a source file, rendered the way rustc renders its errors:
///
/// ```text
/// error: unknown field `memroy` in `resources`
///   --> examples/bad/task.yaml:5:3
///    |
///  5 |   memroy: 64GiB
///    |   ^^^^^^
///    = help: did you mean `memory`? Valid fields: nodes, gpus, gpu_type, cpus, memory, time_limit
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// An error (the file is refused) or a warning (accepted, but worth a look).
    pub severity: Severity,
    pub message: String,
    /// The file name as the user gave it, so the rendered path is one they recognise.
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// 1-based, counted in characters.
    pub column: usize,
    /// The text of `line`, shown under the location.
    pub source_line: String,
    /// How many characters the caret underline covers (at least one).
    pub underline: usize,
    pub help: Option<String>,
}

/// Characters of a source line an error shows at most (more when the column is further).
const SHOWN_CHARS: usize = 160;

/// Whether a [`Diagnostic`] refuses the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Severity {
    #[default]
    Error,
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let number = self.line.to_string();
        let gutter = " ".repeat(number.len() + 2);
        // Tabs would make the caret drift; columns count characters, so one space per tab keeps it aligned.
        let mut shown_line = self.source_line.replace('\t', " ");
        let mut underline = self.underline.max(1);
        // A line of megabytes (an oversized value) is cut, so the error stays readable.
        let limit = SHOWN_CHARS.max(self.column + 20);
        if shown_line.chars().count() > limit {
            shown_line = shown_line.chars().take(limit).collect::<String>() + "…";
            underline = underline.min(limit + 1 - self.column.min(limit)).max(1);
        }
        let caret_indent = " ".repeat(self.column.saturating_sub(1));
        writeln!(f, "{}: {}", self.severity, self.message)?;
        writeln!(
            f,
            "{}--> {}:{}:{}",
            " ".repeat(number.len() + 1),
            self.file,
            self.line,
            self.column
        )?;
        writeln!(f, "{gutter}|")?;
        writeln!(f, " {number} | {shown_line}")?;
        write!(f, "{gutter}| {caret_indent}{}", "^".repeat(underline))?;
        if let Some(help) = &self.help {
            write!(f, "\n{gutter}= help: {help}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_field_survives_its_trip_through_text() {
        for help in [Some("do this".to_string()), None] {
            let error = SchemaError::Invalid {
                field: "notify.webhook".into(),
                message: "the webhook's host 127.0.0.1 is a loopback address".into(),
                help: help.clone(),
            };
            let Some(SchemaError::Invalid {
                field,
                message,
                help: back,
            }) = SchemaError::invalid_from_rendered(&error.to_string())
            else {
                panic!("{error} did not parse back");
            };
            assert_eq!(field, "notify.webhook");
            assert!(message.ends_with("loopback address"));
            assert_eq!(back, help);
        }
        assert!(SchemaError::invalid_from_rendered("snapshot x is unknown").is_none());
    }
}
