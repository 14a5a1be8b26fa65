//! Where each field of a task file was written, so that errors found after parsing (by us or
//! by later layers, through [`crate::LoadedTask::error_at`]) still point at the right line.

use std::collections::BTreeMap;

use marked_yaml::types::MarkedScalarNode;
use marked_yaml::{Marker, Node};

use crate::error::{Diagnostic, Diagnostics, SchemaError, Severity};

/// A place in the source text: 1-based line and column, and how wide the thing there is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
    pub width: usize,
}

/// The span table of one parsed task file: dotted field path → location.
///
/// Paths name fields the way they nest in the file, with list items by index:
/// `resources.memory`, `environment.vars.OMP_NUM_THREADS`, `datasets.0.mount`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spans {
    source_name: String,
    lines: Vec<String>,
    fields: BTreeMap<String, Location>,
}

impl Spans {
    pub(crate) fn new(source_name: &str, text: &str) -> Self {
        Spans {
            source_name: source_name.to_string(),
            lines: yaml_lines(text).map(str::to_string).collect(),
            fields: BTreeMap::new(),
        }
    }

    /// The file name errors are reported against.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// Where the field at `field_path` was written, if it was.
    pub fn location(&self, field_path: &str) -> Option<Location> {
        self.fields.get(field_path).copied()
    }

    /// An error located at `field_path`; when that field was not written in the file, at its
    /// nearest written parent (`environment.image` → `environment`), else at the file's start.
    pub fn error_at(
        &self,
        field_path: &str,
        message: impl Into<String>,
        help: Option<String>,
    ) -> SchemaError {
        let mut path = field_path;
        let location = loop {
            if let Some(location) = self.location(path) {
                break location;
            }
            match path.rfind('.') {
                Some(dot) => path = &path[..dot],
                None => {
                    break Location {
                        line: 1,
                        column: 1,
                        width: 1,
                    };
                }
            }
        };
        self.error_at_location(location, message, help)
    }

    /// The error listing `found` (mistakes already located, such as the reader's) and the
    /// semantic `problems` located at their fields, in file order; `None` when both are
    /// empty. A problem at the very place a located mistake was already reported there is
    /// left out: it judged the default that stood in for the unreadable value.
    pub(crate) fn located_problems(
        &self,
        problems: Vec<crate::spec::Problem>,
        mut found: Vec<Diagnostic>,
    ) -> Option<SchemaError> {
        let already = found.clone();
        for problem in problems {
            let error = self.error_at(&problem.field, problem.message, problem.help);
            for diagnostic in error.diagnostics() {
                let seen = already
                    .iter()
                    .any(|d| d.line == diagnostic.line && d.column == diagnostic.column);
                if !seen {
                    found.push(diagnostic.clone());
                }
            }
        }
        Diagnostics::new(found).map(SchemaError::Located)
    }

    pub(crate) fn error_at_location(
        &self,
        location: Location,
        message: impl Into<String>,
        help: Option<String>,
    ) -> SchemaError {
        let source_line = self
            .lines
            .get(location.line.saturating_sub(1))
            .cloned()
            .unwrap_or_default();
        SchemaError::Located(Diagnostics::one(Diagnostic {
            severity: Severity::Error,
            message: message.into(),
            file: self.source_name.clone(),
            line: location.line,
            column: location.column,
            source_line,
            underline: location.width,
            help,
        }))
    }

    /// A warning of the one-line form `FILE:LINE:COL: message` (as [`Spans::describe`]
    /// starts it) rendered like a compiler's, with the line and a caret under the token
    /// there; any other text as `warning: TEXT`.
    pub(crate) fn render_warning(&self, text: &str) -> String {
        let located = text
            .strip_prefix(self.source_name.as_str())
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| {
                let mut parts = rest.splitn(3, ':');
                let line: usize = parts.next()?.parse().ok()?;
                let column: usize = parts.next()?.parse().ok()?;
                let message = parts.next()?.strip_prefix(' ')?;
                let source_line = self.lines.get(line.checked_sub(1)?)?;
                (column >= 1).then_some(())?;
                Some(Diagnostic {
                    severity: Severity::Warning,
                    message: message.to_string(),
                    file: self.source_name.clone(),
                    line,
                    column,
                    source_line: source_line.clone(),
                    underline: token_width(source_line, column, None),
                    help: None,
                })
            });
        match located {
            Some(diagnostic) => diagnostic.to_string(),
            None => format!("warning: {text}"),
        }
    }

    /// `file:line:col` of a field, for warnings that are one line of text.
    pub(crate) fn describe(&self, location: Location) -> String {
        format!("{}:{}:{}", self.source_name, location.line, location.column)
    }

    /// Remember where `field_path` was written. A scalar value is the most precise place to
    /// point; for a mapping or list the key (`resources:`) reads better than the first child.
    pub(crate) fn record(
        &mut self,
        field_path: &str,
        key: Option<&MarkedScalarNode>,
        value: &Node,
    ) {
        let location = match (value, key) {
            (Node::Scalar(scalar), _) if !crate::reader::is_null(value) => {
                self.scalar_location(scalar)
            }
            (_, Some(key)) => self.scalar_location(key),
            (value, None) => self.node_location(value),
        };
        self.fields.insert(field_path.to_string(), location);
    }

    /// Remember the key's place rather than the value's (for errors about a name, such as an
    /// environment variable's).
    pub(crate) fn record_key(&mut self, field_path: &str, key: &MarkedScalarNode) {
        let location = self.scalar_location(key);
        self.fields.insert(field_path.to_string(), location);
    }

    pub(crate) fn record_location(&mut self, field_path: &str, location: Location) {
        self.fields.insert(field_path.to_string(), location);
    }

    pub(crate) fn scalar_location(&self, scalar: &MarkedScalarNode) -> Location {
        self.marker_location(scalar.span().start(), Some(scalar.as_str()))
    }

    pub(crate) fn node_location(&self, node: &Node) -> Location {
        match node {
            Node::Scalar(scalar) => self.scalar_location(scalar),
            other => self.marker_location(other.span().start(), None),
        }
    }

    fn marker_location(&self, marker: Option<&Marker>, text: Option<&str>) -> Location {
        let Some(marker) = marker else {
            return Location {
                line: 1,
                column: 1,
                width: 1,
            };
        };
        let Location { line, column, .. } = self.marker_position(marker);
        let width = self
            .lines
            .get(line - 1)
            .map(|source_line| token_width(source_line, column, text))
            .unwrap_or(1);
        Location {
            line,
            column,
            width,
        }
    }

    /// Where `marker` is, one character wide, kept inside the text. The YAML scanner
    /// places the end of input one line past the last when the text does not end with a
    /// line break (and may count a block scalar's columns in bytes): such places are
    /// reported at the end of the last line, or of their own line.
    pub(crate) fn marker_position(&self, marker: &Marker) -> Location {
        let last_line = self.lines.len().max(1);
        let line = marker.line().clamp(1, last_line);
        let line_width = self
            .lines
            .get(line - 1)
            .map_or(0, |source_line| source_line.chars().count());
        let column = if marker.line() > last_line {
            line_width + 1
        } else {
            marker.column().clamp(1, line_width + 1)
        };
        Location {
            line,
            column,
            width: 1,
        }
    }
}

/// The lines of `text` as YAML counts them: broken at `\r\n`, `\n` or a lone `\r`.
/// (`str::lines` does not break at a lone `\r`, so its line numbers would drift from the
/// parser's.) A line break at the very end does not start another line.
pub(crate) fn yaml_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (line, after) = match rest.find(['\r', '\n']) {
            Some(at) => {
                let break_len = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
                (&rest[..at], &rest[at + break_len..])
            }
            None => (rest, ""),
        };
        rest = after;
        Some(line)
    })
}

/// How many characters the token starting at `column` spans, so the caret underlines it all.
fn token_width(source_line: &str, column: usize, text: Option<&str>) -> usize {
    let rest: Vec<char> = source_line.chars().skip(column - 1).collect();
    let Some(&first) = rest.first() else {
        return 1;
    };
    if let Some(text) = text {
        let text_chars: Vec<char> = text.chars().collect();
        if !text_chars.is_empty() && rest.starts_with(&text_chars) {
            return text_chars.len();
        }
    }
    if first == '"' || first == '\'' {
        let close = rest[1..].iter().position(|&c| c == first);
        return close.map(|at| at + 2).unwrap_or(rest.len());
    }
    if matches!(first, '{' | '[' | '|' | '>' | '-') {
        return 1;
    }
    // A plain scalar ends at a comment, at a `key:` separator, or at the end of the line.
    let mut end = rest.len();
    for at in 0..rest.len() {
        let next_is_blank = rest.get(at + 1).is_none_or(|c| c.is_whitespace());
        if (rest[at] == '#' && at > 0 && rest[at - 1].is_whitespace())
            || (rest[at] == ':' && next_is_blank)
        {
            end = at;
            break;
        }
    }
    let trimmed = rest[..end]
        .iter()
        .rposition(|c| !c.is_whitespace())
        .map(|last| last + 1)
        .unwrap_or(1);
    trimmed.max(1)
}
