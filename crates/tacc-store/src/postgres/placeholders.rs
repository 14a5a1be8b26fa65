//! The store's SQL is written once with SQLite's `?` placeholders (and `?N` where one
//! value is used twice); PostgreSQL numbers its parameters (`$1`, `$2`, …). [`numbered`]
//! rewrites one into the other, so the PostgreSQL store's statements read the same as the
//! SQLite store's they mirror, dynamic `IN (?, ?, …)` lists included.

/// `sql` with every `?` turned into `$N`, N counting from 1 in order of appearance, and
/// every `?N` into `$N`. A `?` inside a quoted literal or identifier is left alone.
pub(crate) fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut next = 0u32;
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), _) if c == q => {
                quote = None;
                out.push(c);
            }
            (Some(_), _) => out.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                out.push(c);
            }
            (None, '?') => {
                out.push('$');
                if chars.peek().is_some_and(char::is_ascii_digit) {
                    while let Some(digit) = chars.next_if(char::is_ascii_digit) {
                        out.push(digit);
                    }
                } else {
                    next += 1;
                    out.push_str(&next.to_string());
                }
            }
            (None, _) => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn plain_marks_are_numbered_in_order() {
        assert_eq!(
            numbered("SELECT a FROM t WHERE b = ? AND c IN (?, ?)"),
            "SELECT a FROM t WHERE b = $1 AND c IN ($2, $3)"
        );
    }

    #[test]
    fn numbered_marks_keep_their_number() {
        assert_eq!(
            numbered("WHERE task_id = ?1 AND attempt = ?2 OR task_id = ?1 LIMIT ?3"),
            "WHERE task_id = $1 AND attempt = $2 OR task_id = $1 LIMIT $3"
        );
    }

    #[test]
    fn marks_inside_literals_are_left_alone() {
        assert_eq!(
            numbered("SELECT '?', \"a?\" FROM t WHERE x = ?"),
            "SELECT '?', \"a?\" FROM t WHERE x = $1"
        );
    }
}
