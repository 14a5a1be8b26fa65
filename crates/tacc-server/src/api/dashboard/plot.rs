//! Line charts as inline SVG, drawn on the server so a page shows its curves without
//! JavaScript: one chart per measure (CPU, memory, GPU), one curve per rank. Every text
//! that reaches the SVG is escaped here, since the chart is inserted into the page as is.

use std::fmt::Write;

use tacc_core::Timestamp;

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 180.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 22.0;
const BOTTOM: f64 = 22.0;
/// Colours of the curves, rank by rank (readable on white, distinct for colour blindness).
const PALETTE: [&str; 6] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9",
];

/// One curve: its legend and its points (time, value).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Curve {
    pub(crate) label: String,
    pub(crate) points: Vec<(Timestamp, f64)>,
}

/// How the y axis reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Cores,
    Bytes,
    Percent,
}

impl Unit {
    /// The label of `value` on an axis whose top is `top`.
    fn label(self, value: f64, top: f64) -> String {
        match self {
            Unit::Cores if top < 0.1 => format!("{value:.3}"),
            Unit::Cores if top < 10.0 => format!("{value:.2}"),
            Unit::Cores => format!("{value:.1}"),
            Unit::Percent => format!("{value:.0}%"),
            Unit::Bytes => {
                tacc_core::ByteSize::from_bytes(value.max(0.0).round() as u64).to_string()
            }
        }
    }

    /// The top of the y axis for data whose maximum is `max`.
    fn top(self, max: f64) -> f64 {
        match self {
            Unit::Percent => 100.0,
            _ if max <= 0.0 => 1.0,
            _ => max * 1.15,
        }
    }
}

/// Text made safe for SVG/HTML content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The chart `title` of `curves` as an `<svg>` element.
pub(crate) fn line_chart(title: &str, unit: Unit, curves: &[Curve]) -> String {
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{label}" xmlns="http://www.w3.org/2000/svg">"#,
        label = escape(title)
    );
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="14" class="chart-title">{}</text>"#,
        escape(title)
    );
    let all = || curves.iter().flat_map(|c| c.points.iter());
    let (Some(first), Some(last)) = (all().map(|p| p.0).min(), all().map(|p| p.0).max()) else {
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" class="chart-empty" text-anchor="middle">no samples yet</text></svg>"#,
            WIDTH / 2.0,
            HEIGHT / 2.0
        );
        return svg;
    };
    let max = all().map(|p| p.1).fold(0.0, f64::max);
    let top = unit.top(max);
    let span = last.millis_since(first).max(1) as f64;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |t: Timestamp| LEFT + t.millis_since(first) as f64 / span * plot_w;
    let y = |v: f64| TOP + plot_h - (v / top).clamp(0.0, 1.0) * plot_h;
    for step in 0..=4 {
        let value = top * f64::from(step) / 4.0;
        let at = y(value);
        let _ = write!(
            svg,
            r#"<line x1="{LEFT}" x2="{}" y1="{at:.1}" y2="{at:.1}" class="grid"/><text x="{}" y="{:.1}" class="axis" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT,
            LEFT - 6.0,
            at + 4.0,
            escape(&unit.label(value, top))
        );
    }
    let seconds = span / 1000.0;
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="{}" class="axis">{}</text><text x="{}" y="{}" class="axis" text-anchor="end">latest</text>"#,
        HEIGHT - 6.0,
        escape(&format!("−{}", super::render::human_secs(seconds as u64))),
        WIDTH - RIGHT,
        HEIGHT - 6.0,
    );
    for (i, curve) in curves.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let points: Vec<String> = curve
            .points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect();
        if points.len() == 1 {
            let (t, v) = curve.points[0];
            let _ = write!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{colour}"/>"#,
                x(t),
                y(v)
            );
        } else {
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="{}"/>"#,
                points.join(" ")
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="14" class="legend" fill="{colour}" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT - 150.0 * i as f64,
            escape(&curve.label)
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_one_curve_per_rank_within_its_frame() {
        let curves = vec![
            Curve {
                label: "rank 0".into(),
                points: vec![(Timestamp(0), 0.5), (Timestamp(2_000), 1.0)],
            },
            Curve {
                label: "rank 1".into(),
                points: vec![(Timestamp(0), 0.25), (Timestamp(2_000), 0.75)],
            },
        ];
        let svg = line_chart("CPU (cores)", Unit::Cores, &curves);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 2);
        // The highest point (1.0 of a 1.15 axis) is inside the plot, the first at its left.
        assert!(svg.contains(&format!("points=\"{LEFT:.1},")));
        assert!(svg.contains(">rank 1<"));
    }

    #[test]
    fn text_in_a_chart_is_escaped() {
        let curves = vec![Curve {
            label: "<script>alert(1)</script>".into(),
            points: vec![(Timestamp(0), 50.0)],
        }];
        let svg = line_chart("a & b", Unit::Percent, &curves);
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(svg.contains("a &amp; b"));
        assert!(svg.contains("<circle"), "a single sample is a dot");
    }

    #[test]
    fn a_chart_without_samples_says_so() {
        let svg = line_chart("GPU", Unit::Percent, &[]);
        assert!(svg.contains("no samples yet"));
    }
}
