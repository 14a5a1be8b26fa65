//! Stacked bars over categories (e.g. one bar per day, one stack per user): what
//! `tcloud usage --plot` draws.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{Chart, FONT, PlotError, colour, draw_error};

/// Bars, one per category, each stacked from the series in order.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedBars {
    pub title: String,
    pub y_label: String,
    /// Names under the bars (e.g. dates), in order.
    pub categories: Vec<String>,
    /// Each stack's name and one value per category.
    pub stacks: Vec<(String, Vec<f64>)>,
    pub width: u32,
    pub height: u32,
}

impl StackedBars {
    pub fn to_svg(&self) -> Result<String, PlotError> {
        crate::svg_of(self)
    }

    /// Write to `path`: SVG or PNG by its extension.
    pub fn write(&self, path: &Path) -> Result<(), PlotError> {
        crate::write(self, path)
    }

    /// The height of the tallest bar.
    fn tallest(&self) -> f64 {
        (0..self.categories.len())
            .map(|i| {
                self.stacks
                    .iter()
                    .map(|(_, values)| values.get(i).copied().unwrap_or(0.0).max(0.0))
                    .sum::<f64>()
            })
            .fold(0.0, f64::max)
    }
}

impl Chart for StackedBars {
    fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let count = self.categories.len();
        if count == 0 || self.stacks.is_empty() {
            return Err(PlotError::Empty(format!(
                "`{}` has no bars: widen the window or check the filters",
                self.title
            )));
        }
        root.fill(&WHITE).map_err(draw_error)?;
        let tallest = self.tallest();
        let top = if tallest > 0.0 { tallest * 1.1 } else { 1.0 };
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            // A segmented range is inclusive: `0..count - 1` makes one slot per category.
            .build_cartesian_2d((0..count - 1).into_segmented(), 0.0..top)
            .map_err(draw_error)?;
        let label = |value: &SegmentValue<usize>| match value {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                self.categories.get(*i).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(count.min(12))
            .x_label_formatter(&label)
            .light_line_style(WHITE.mix(0.0))
            .y_desc(self.y_label.as_str())
            .label_style((FONT, 12))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(draw_error)?;
        let mut base = vec![0.0; count];
        for (index, (name, values)) in self.stacks.iter().enumerate() {
            let colour = colour(index);
            let bars: Vec<Rectangle<(SegmentValue<usize>, f64)>> = (0..count)
                .filter_map(|i| {
                    let value = values.get(i).copied().unwrap_or(0.0).max(0.0);
                    let bottom = base[i];
                    base[i] += value;
                    (value > 0.0).then(|| {
                        let mut bar = Rectangle::new(
                            [
                                (SegmentValue::Exact(i), bottom),
                                (SegmentValue::Exact(i + 1), bottom + value),
                            ],
                            colour.filled(),
                        );
                        bar.set_margin(0, 0, 3, 3);
                        bar
                    })
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(draw_error)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled())
                });
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(draw_error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{png_size, svg_texts};

    fn usage() -> StackedBars {
        StackedBars {
            title: "GPU-hours per day".into(),
            y_label: "GPU-hours".into(),
            categories: vec!["05-01".into(), "05-02".into(), "05-03".into()],
            stacks: vec![
                ("alice".into(), vec![4.0, 0.0, 2.5]),
                ("bob".into(), vec![1.0, 3.0, 0.0]),
            ],
            width: 800,
            height: 420,
        }
    }

    #[test]
    fn stacked_bars_are_valid_svg_with_a_bar_per_nonzero_value() {
        let svg = usage().to_svg().unwrap();
        let ((width, height), texts) = svg_texts(&svg);
        assert_eq!((width.as_str(), height.as_str()), ("800", "420"));
        for expected in [
            "GPU-hours per day",
            "GPU-hours",
            "alice",
            "bob",
            "05-01",
            "05-03",
        ] {
            assert!(
                texts.iter().any(|t| t == expected),
                "{expected} in {texts:?}"
            );
        }
        let document = roxmltree::Document::parse(&svg).unwrap();
        let filled = |colour: &str| {
            document
                .descendants()
                .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some(colour))
                .count()
        };
        // Four non-zero values: four bars, plus one legend mark per stack.
        assert_eq!(filled("#1F77B4") + filled("#D62728"), 4 + 2);
    }

    #[test]
    fn png_has_the_requested_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.png");
        usage().write(&path).unwrap();
        if let Ok(keep) = std::env::var("TACC_PLOT_KEEP") {
            std::fs::copy(&path, std::path::Path::new(&keep).join("usage.png")).unwrap();
        }
        assert_eq!(png_size(&path), (800, 420));
    }

    #[test]
    fn one_category_is_one_bar() {
        let svg = StackedBars {
            categories: vec!["05-01".into()],
            stacks: vec![("alice".into(), vec![2.0])],
            ..usage()
        }
        .to_svg()
        .unwrap();
        let document = roxmltree::Document::parse(&svg).unwrap();
        let bars = document
            .descendants()
            .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some("#1F77B4"))
            .count();
        assert_eq!(bars, 1 + 1, "the bar and its legend mark");
    }

    #[test]
    fn no_categories_is_an_error_that_says_what_to_do() {
        let error = StackedBars {
            categories: vec![],
            ..usage()
        }
        .to_svg()
        .unwrap_err();
        assert!(error.to_string().contains("widen the window"), "{error}");
    }
}
