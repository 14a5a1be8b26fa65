//! Response headers that keep bytes a task or a user produced from ever running as a page
//! of this origin. The dashboard and the API share one origin and one session cookie, so
//! an output named `x.html` or a log holding `<script>` would otherwise execute as
//! whoever opened the link (an admin). Three layers, each enough on its own for the
//! common browsers:
//!
//! - every response says `X-Content-Type-Options: nosniff`, so a browser never guesses
//!   HTML from bytes;
//! - bytes from tasks and users come as downloads ([`as_download`]:
//!   `application/octet-stream`, `Content-Disposition: attachment`) or as plain text
//!   ([`as_plain_text`], logs);
//! - every response carries a Content-Security-Policy: the dashboard's pages a strict one
//!   ([`DASHBOARD_CSP`]: scripts and styles only from `/ui/assets/`, nothing inline), every
//!   other response one that lets nothing load or run at all ([`API_CSP`], `sandbox`);
//!   and no response may be framed (`frame-ancestors 'none'`, `X-Frame-Options: DENY`)
//!   or leak its URL to another site (`Referrer-Policy: same-origin`: no `Referer` leaves
//!   for another site. Not `no-referrer`, under which browsers send `Origin: null` with
//!   the dashboard's own forms, and the check that refuses forms from other sites by
//!   their `Origin` could no longer tell them apart).

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::dashboard;

/// The dashboard's pages: their own script and style sheet, the API for the live log,
/// inline SVG charts (markup, not images); no inline script or style, no plugins, no
/// `<base>`, forms post only here, and no site may frame them.
pub(crate) const DASHBOARD_CSP: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'; object-src 'none'";

/// Everything that is not a dashboard page (JSON, logs, downloads): a browser that shows
/// it anyway loads and runs nothing, in a sandboxed, unique origin.
pub(crate) const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'; \
     base-uri 'none'; form-action 'none'; sandbox";

/// The layer on the whole router: the headers every response carries (see the module).
pub(super) async fn security_headers(request: Request, next: Next) -> Response {
    let page = dashboard::is_dashboard(request.uri().path());
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    let csp = if page { DASHBOARD_CSP } else { API_CSP };
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    response
}

/// Serve `response` as a file to save, never to render: `application/octet-stream`,
/// `Content-Disposition: attachment` with `path`'s last component as the file name.
pub(super) fn as_download(response: &mut Response, path: &str) {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(value) = HeaderValue::from_str(&content_disposition(path)) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
}

/// Serve `response` (a log) as UTF-8 plain text.
pub(super) fn as_plain_text(response: &mut Response) {
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
}

/// RFC 5987 `attr-char`s: what `filename*` may carry unencoded.
const ATTR_CHAR: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// `attachment; filename="…"; filename*=UTF-8''…` for the last component of `path`: the
/// quoted name keeps only characters that need no escaping anywhere (others become `_`),
/// the extended one carries the exact name percent-encoded. A name a task chose can never
/// end the header value or add a parameter.
pub(crate) fn content_disposition(path: &str) -> String {
    let name = path
        .rsplit(['/', '\\'])
        .find(|part| !part.is_empty())
        .unwrap_or("download");
    let plain: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-+ ()[]@,=".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let exact = utf8_percent_encode(name, ATTR_CHAR);
    format!("attachment; filename=\"{plain}\"; filename*=UTF-8''{exact}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_name_cannot_break_out_of_its_header() {
        assert_eq!(
            content_disposition("runs/1/x.html"),
            "attachment; filename=\"x.html\"; filename*=UTF-8''x.html"
        );
        let hostile = content_disposition("a/\"; filename=evil.html\r\nX: y");
        assert!(HeaderValue::from_str(&hostile).is_ok(), "{hostile}");
        assert!(!hostile.contains("\"; filename=evil"), "{hostile}");
        assert!(
            hostile.ends_with("filename*=UTF-8''%22%3B%20filename%3Devil.html%0D%0AX%3A%20y"),
            "{hostile}"
        );
        assert_eq!(
            content_disposition("données/été.csv"),
            "attachment; filename=\"_t_.csv\"; filename*=UTF-8''%C3%A9t%C3%A9.csv"
        );
        assert!(content_disposition("dir/").contains("filename=\"dir\""));
        assert!(content_disposition("").contains("filename=\"download\""));
    }

    #[test]
    fn the_dashboard_policy_forbids_inline_script_framing_plugins_and_base() {
        for part in [
            "script-src 'self'",
            "frame-ancestors 'none'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
        ] {
            assert!(DASHBOARD_CSP.contains(part), "{part}");
        }
        assert!(!DASHBOARD_CSP.contains("unsafe"));
        assert!(API_CSP.contains("sandbox") && API_CSP.contains("default-src 'none'"));
    }
}
