//! Cross-site request forgery defences of the dashboard's forms.
//!
//! Forms of a signed-in session carry the session's CSRF token ([`super::Session`]). The
//! sign-in form has no session yet, so it is bound to a pre-session cookie instead: the
//! form page sets [`LOGIN_COOKIE`] (random, `HttpOnly`, `SameSite=Strict`) and puts the
//! same value in a hidden field; a sign-in is accepted only when both arrive and match
//! (another site can neither read the cookie nor make the browser send it). Beside the
//! tokens, every state-changing dashboard request whose browser says where it came from
//! (`Sec-Fetch-Site`, `Origin`) must come from this origin ([`cross_site`]); the guard
//! checks that before anything else, so a forged sign-in opens no session.

use axum::http::{HeaderMap, header};

/// The pre-session cookie that binds the sign-in form to this browser.
pub(crate) const LOGIN_COOKIE: &str = "tacc_login";
/// How long a sign-in form stays usable.
const LOGIN_TTL_SECS: u64 = 3600;

/// Whether `a` and `b` are the same secret, compared in constant time.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` among the request's `Cookie` headers, if any.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(found, _)| *found == name)
        .map(|(_, value)| value.trim().to_string())
        .filter(|value| !value.is_empty())
}

/// The sign-in form's token: the browser's pre-session cookie when it holds one of ours
/// (so two open sign-in tabs both work), else a fresh one.
pub(crate) fn login_token(headers: &HeaderMap) -> String {
    cookie(headers, LOGIN_COOKIE)
        .filter(|value| is_token(value))
        .unwrap_or_else(super::session::random_text)
}

/// Whether the sign-in form sent back the token its cookie holds.
pub(crate) fn login_token_matches(headers: &HeaderMap, sent: &str) -> bool {
    cookie(headers, LOGIN_COOKIE).is_some_and(|held| is_token(&held) && same_secret(&held, sent))
}

/// The `Set-Cookie` value that stores the sign-in form's token (or, with `None`, removes
/// it once it has served).
pub(crate) fn login_cookie(token: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    let (value, age) = match token {
        Some(token) => (token, LOGIN_TTL_SECS),
        None => ("", 0),
    };
    format!(
        "{LOGIN_COOKIE}={value}; Path=/ui/login; HttpOnly; SameSite=Strict; Max-Age={age}{secure}"
    )
}

/// 256 random bits, base64url: what [`super::session::random_text`] makes.
fn is_token(value: &str) -> bool {
    value.len() == 43
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Why a state-changing request did not come from this dashboard's own pages, when the
/// browser says so: `Sec-Fetch-Site` other than `same-origin`, or an `Origin` that is not
/// this server (the `Host` the request was sent to). A request that sends neither (a
/// script, an old browser) passes here and still needs its form token.
pub(crate) fn cross_site(headers: &HeaderMap) -> Option<String> {
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("(not text)").to_string())
    };
    if let Some(site) = text("sec-fetch-site")
        && !site.eq_ignore_ascii_case("same-origin")
    {
        return Some(format!(
            "the browser says this form was sent from another site (Sec-Fetch-Site: {site})"
        ));
    }
    let origin = text("origin")?;
    let host = text("host").unwrap_or_default();
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    match authority {
        Some(authority) if !host.is_empty() && authority.eq_ignore_ascii_case(&host) => None,
        _ => Some(format!(
            "this form was sent from {origin}, not from this server ({host})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn only_this_servers_own_pages_may_post() {
        assert_eq!(cross_site(&headers(&[("host", "h:8383")])), None);
        assert_eq!(
            cross_site(&headers(&[
                ("host", "h:8383"),
                ("origin", "http://h:8383"),
                ("sec-fetch-site", "same-origin"),
            ])),
            None
        );
        for hostile in [
            headers(&[("host", "h:8383"), ("origin", "http://evil.example")]),
            headers(&[("host", "h:8383"), ("origin", "null")]),
            headers(&[("host", "h:8383"), ("origin", "http://h:8383.evil")]),
            headers(&[("host", "h:8383"), ("sec-fetch-site", "cross-site")]),
            headers(&[("host", "h:8383"), ("sec-fetch-site", "same-site")]),
            headers(&[("origin", "http://h:8383")]),
        ] {
            assert!(cross_site(&hostile).is_some(), "{hostile:?}");
        }
    }

    #[test]
    fn the_sign_in_token_must_match_its_cookie() {
        let token = super::super::session::random_text();
        let mut map = HeaderMap::new();
        map.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {LOGIN_COOKIE}={token}")).unwrap(),
        );
        assert!(login_token_matches(&map, &token));
        assert_eq!(login_token(&map), token, "an open form's token is kept");
        assert!(!login_token_matches(&map, ""));
        assert!(!login_token_matches(&map, &token[1..]));
        assert!(!login_token_matches(&HeaderMap::new(), &token));
        assert_ne!(login_token(&HeaderMap::new()), token);
        let set = login_cookie(Some(&token), true);
        for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/ui/login"] {
            assert!(set.contains(part), "{set}");
        }
        assert!(login_cookie(None, false).contains("Max-Age=0"));
    }
}
