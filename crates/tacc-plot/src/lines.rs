//! Line charts with an optional logarithmic x axis: the simulator's JCT CDF per policy.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{Chart, FONT, PlotError, colour, draw_error};

/// One named line.
#[derive(Debug, Clone, PartialEq)]
pub struct LineSeries {
    pub name: String,
    /// (x, y), in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart. With `log_x`, x values below 1 are drawn at 1.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    /// The y range; from the data when absent.
    pub y_range: Option<(f64, f64)>,
    pub series: Vec<LineSeries>,
    pub width: u32,
    pub height: u32,
}

impl LineChart {
    pub fn to_svg(&self) -> Result<String, PlotError> {
        crate::svg_of(self)
    }

    /// Write to `path`: SVG or PNG by its extension.
    pub fn write(&self, path: &Path) -> Result<(), PlotError> {
        crate::write(self, path)
    }

    fn x_range(&self) -> (f64, f64) {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let (low, high) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        if self.log_x {
            // Whole decades, from 1.
            let top = 10f64.powf(high.max(10.0).log10().ceil());
            (1.0, top)
        } else if low < high {
            (low, high)
        } else {
            (low - 1.0, low + 1.0)
        }
    }

    fn y_range_of_data(&self) -> (f64, f64) {
        self.y_range.unwrap_or_else(|| {
            let ys = self
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1));
            let high = ys.fold(0f64, f64::max);
            (0.0, if high > 0.0 { high * 1.05 } else { 1.0 })
        })
    }
}

impl Chart for LineChart {
    fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        if self.series.iter().all(|s| s.points.is_empty()) {
            return Err(PlotError::Empty(format!("`{}` has no points", self.title)));
        }
        root.fill(&WHITE).map_err(draw_error)?;
        let (x_low, x_high) = self.x_range();
        let (y_low, y_high) = self.y_range_of_data();
        let mut builder = ChartBuilder::on(root);
        builder
            .caption(&self.title, (FONT, 18))
            .margin(12)
            .margin_right(28)
            .x_label_area_size(40)
            .y_label_area_size(56);
        let log_x = self.log_x;
        let x_at = move |x: f64| if log_x { x.max(1.0) } else { x };
        macro_rules! draw_on {
            ($chart:ident) => {{
                $chart
                    .configure_mesh()
                    .x_label_formatter(&|x: &f64| tick(*x, log_x))
                    .x_desc(self.x_label.as_str())
                    .y_desc(self.y_label.as_str())
                    .label_style((FONT, 13))
                    .axis_desc_style((FONT, 14))
                    .light_line_style(WHITE.mix(0.0))
                    .draw()
                    .map_err(draw_error)?;
                for (index, series) in self.series.iter().enumerate() {
                    let colour = colour(index);
                    $chart
                        .draw_series(plotters::series::LineSeries::new(
                            series.points.iter().map(|(x, y)| (x_at(*x), *y)),
                            colour.stroke_width(2),
                        ))
                        .map_err(draw_error)?
                        .label(series.name.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
                        });
                }
                $chart
                    .configure_series_labels()
                    .label_font((FONT, 13))
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK.mix(0.4))
                    .position(SeriesLabelPosition::UpperLeft)
                    .draw()
                    .map_err(draw_error)?;
            }};
        }
        if self.log_x {
            let mut chart = builder
                .build_cartesian_2d((x_low..x_high).log_scale(), y_low..y_high)
                .map_err(draw_error)?;
            draw_on!(chart);
        } else {
            let mut chart = builder
                .build_cartesian_2d(x_low..x_high, y_low..y_high)
                .map_err(draw_error)?;
            draw_on!(chart);
        }
        Ok(())
    }
}

/// An x tick: powers of ten as `1e3` on a log axis, else the shortest exact form.
fn tick(x: f64, log_x: bool) -> String {
    let exponent = x.log10().round();
    if log_x && (10f64.powf(exponent) - x).abs() < 1e-9 * x.abs().max(1.0) {
        format!("1e{exponent}")
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{png_size, svg_texts};

    fn cdf() -> LineChart {
        LineChart {
            title: "JCT CDF".into(),
            x_label: "job completion time (s, log scale)".into(),
            y_label: "fraction of jobs".into(),
            log_x: true,
            y_range: Some((0.0, 1.0)),
            series: vec![
                LineSeries {
                    name: "fifo".into(),
                    points: vec![(5.0, 0.25), (50.0, 0.5), (5000.0, 1.0)],
                },
                LineSeries {
                    name: "las2d".into(),
                    points: vec![(0.5, 0.5), (20.0, 1.0)],
                },
            ],
            width: 720,
            height: 440,
        }
    }

    #[test]
    fn a_cdf_is_valid_svg_with_its_labels_and_legend() {
        let svg = cdf().to_svg().unwrap();
        let ((width, height), texts) = svg_texts(&svg);
        assert_eq!((width.as_str(), height.as_str()), ("720", "440"));
        for expected in ["JCT CDF", "fraction of jobs", "fifo", "las2d"] {
            assert!(
                texts.iter().any(|t| t == expected),
                "{expected} in {texts:?}"
            );
        }
        // Each series: its line and its legend mark, in its own colour.
        let document = roxmltree::Document::parse(&svg).unwrap();
        for colour in ["#1F77B4", "#D62728"] {
            let lines = document
                .descendants()
                .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(colour))
                .count();
            assert_eq!(lines, 2, "{colour}");
        }
    }

    #[test]
    fn log_ticks_read_as_powers_of_ten() {
        assert_eq!(tick(1.0, true), "1e0");
        assert_eq!(tick(1000.0, true), "1e3");
        assert_eq!(tick(20.0, true), "20");
        assert_eq!(tick(0.5, false), "0.5");
    }

    #[test]
    fn png_has_the_requested_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdf.PNG");
        cdf().write(&path).unwrap();
        if let Ok(keep) = std::env::var("TACC_PLOT_KEEP") {
            std::fs::copy(&path, std::path::Path::new(&keep).join("cdf.png")).unwrap();
        }
        assert_eq!(png_size(&path), (720, 440));
    }

    #[test]
    fn unknown_extensions_and_empty_charts_are_refused() {
        let error = cdf().write(Path::new("/tmp/x.jpg")).unwrap_err();
        assert!(error.to_string().contains(".svg or .png"), "{error}");
        let empty = LineChart {
            series: vec![],
            ..cdf()
        };
        assert!(matches!(empty.to_svg(), Err(PlotError::Empty(_))));
        let unwritable = cdf()
            .write(Path::new("/nonexistent-dir/x.svg"))
            .unwrap_err();
        assert!(
            unwritable.to_string().contains("/nonexistent-dir/x.svg"),
            "{unwritable}"
        );
    }
}
