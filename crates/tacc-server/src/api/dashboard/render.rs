//! The dashboard's HTML: minijinja templates compiled into the binary (no build step, no
//! files to install), rendered with HTML autoescape on — every value a task controls (its
//! name, reason, log, output paths) is escaped by the engine — and the small formatting
//! helpers the pages share (times, durations, sizes, resources).

use std::sync::LazyLock;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use minijinja::{AutoEscape, Environment};
use serde::Serialize;
use tacc_core::{ByteSize, Resources, Timestamp};

use crate::ServerError;

/// Every template, by name; `.html` names are autoescaped.
const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("error.html", include_str!("templates/error.html")),
    ("cluster.html", include_str!("templates/cluster.html")),
    ("queue.html", include_str!("templates/queue.html")),
    ("accounts.html", include_str!("templates/accounts.html")),
    ("task.html", include_str!("templates/task.html")),
];

static TEMPLATE_ENV: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    // Escape everything a template prints, whatever its name.
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    for (name, source) in TEMPLATES {
        env.add_template(name, source)
            .unwrap_or_else(|e| panic!("dashboard template {name} does not parse: {e:#}"));
    }
    env
});

/// `template` rendered with `context`, as a page with `status`.
pub(crate) fn page(
    status: StatusCode,
    template: &str,
    context: minijinja::Value,
) -> Result<Response, ServerError> {
    let html = render(template, context)?;
    Ok((status, Html(html)).into_response())
}

pub(crate) fn render(template: &str, context: minijinja::Value) -> Result<String, ServerError> {
    TEMPLATE_ENV
        .get_template(template)
        .and_then(|t| t.render(context))
        .map_err(|e| ServerError::Internal(format!("dashboard template {template}: {e:#}")))
}

/// Any serialisable value, for a template's context.
pub(crate) fn v<T: Serialize>(value: T) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(value))
}

/// Markup the server built and escaped itself (the SVG charts), passed through as is.
pub(crate) fn trusted(markup: String) -> minijinja::Value {
    minijinja::Value::from_safe_string(markup)
}

/// `2025-03-01 12:34:56 UTC`.
pub(crate) fn clock(at: Timestamp) -> String {
    let secs = (at.0 / 1000) as i64;
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{} ms", at.0),
    }
}

/// `3s ago`, `in 5 min`: how far `at` is from `now`, for a person.
pub(crate) fn relative(at: Timestamp, now: Timestamp) -> String {
    if at <= now {
        format!("{} ago", human_secs(now.millis_since(at) / 1000))
    } else {
        format!("in {}", human_secs(at.millis_since(now) / 1000))
    }
}

/// `45s`, `5 min`, `2h5m`, `3d4h`.
pub(crate) fn human_secs(secs: u64) -> String {
    if secs >= 86_400 {
        format!("{}d{}h", secs / 86_400, (secs % 86_400) / 3600)
    } else {
        crate::usage::human_duration(std::time::Duration::from_secs(secs))
    }
}

pub(crate) fn bytes(n: u64) -> String {
    ByteSize::from_bytes(n).to_string()
}

pub(crate) fn cpus(millis: u64) -> String {
    let cores = millis as f64 / 1000.0;
    if millis % 1000 == 0 {
        format!("{cores:.0}")
    } else {
        format!("{cores:.2}")
    }
}

/// `4 CPU · 16GiB · 2 GPU`.
pub(crate) fn resources(r: &Resources) -> String {
    let mut text = format!("{} CPU · {}", cpus(r.cpu_millis), bytes(r.memory_bytes));
    if r.gpus > 0 {
        text.push_str(&format!(" · {} GPU", r.gpus));
    }
    text
}

/// An error as a page for people: what went wrong and what to do, with its status.
pub(crate) fn error_page(error: &ServerError, signed_in: bool) -> Response {
    let status = error.status();
    let (title, advice) = match status {
        StatusCode::NOT_FOUND => ("Not found", "It does not exist, or it is not yours to see."),
        StatusCode::FORBIDDEN => ("Not allowed", "Your account may not do this."),
        StatusCode::BAD_REQUEST => ("Bad request", "Go back, reload the page and try again."),
        _ if status.is_server_error() => (
            "Server error",
            "The server could not do this; try again shortly, or tell the operator.",
        ),
        _ => ("Something went wrong", ""),
    };
    #[derive(Serialize)]
    struct Context<'a> {
        title: &'a str,
        status: u16,
        message: String,
        advice: &'a str,
        signed_in: bool,
    }
    let context = Context {
        title,
        status: status.as_u16(),
        message: error.to_string(),
        advice,
        signed_in,
    };
    match render("error.html", v(context)) {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => (status, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_parses_and_task_text_is_escaped() {
        for (name, _) in TEMPLATES {
            TEMPLATE_ENV.get_template(name).unwrap();
        }
        let html = render(
            "error.html",
            minijinja::context! {
                title => "t",
                status => 404,
                message => "<img src=x onerror=alert(1)> & \"quoted\"",
                advice => "",
                signed_in => false,
            },
        )
        .unwrap();
        assert!(!html.contains("<img src=x"), "{html}");
        assert!(html.contains("&lt;img src=x onerror=alert(1)&gt; &amp; &quot;quoted&quot;"));
    }

    #[test]
    fn times_and_sizes_read_as_people_say_them() {
        assert_eq!(clock(Timestamp(0)), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            clock(Timestamp(1_700_000_000_000)),
            "2023-11-14 22:13:20 UTC"
        );
        assert_eq!(relative(Timestamp(1_000), Timestamp(4_000)), "3s ago");
        assert_eq!(relative(Timestamp(301_000), Timestamp(1_000)), "in 5 min");
        assert_eq!(human_secs(90_000), "1d1h");
        assert_eq!(
            resources(&Resources::new(1_500, 2 << 30, 2)),
            "1.50 CPU · 2GiB · 2 GPU"
        );
        assert_eq!(
            resources(&Resources::new(4_000, 1 << 30, 0)),
            "4 CPU · 1GiB"
        );
    }
}
