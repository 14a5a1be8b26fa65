//! `tacc-plot`: the charts TACC draws for people — a line chart (the simulator's JCT CDF)
//! and stacked bars over time (`tcloud usage --plot`) — as SVG or PNG through `plotters`.
//! PNG is rasterised in pure Rust with a font embedded in the binary, so plotting needs
//! no system font or graphics library. It depends on no TACC crate: callers hand in
//! plain numbers and names.

mod bars;
mod lines;

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

pub use bars::StackedBars;
pub use lines::{LineChart, LineSeries};

/// The crate's errors.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(
        "cannot tell the image format of {0}: name the file with .svg or .png (e.g. usage.svg)"
    )]
    UnknownFormat(PathBuf),
    #[error("nothing to plot: {0}")]
    Empty(String),
    #[error("drawing the chart failed: {0}")]
    Draw(String),
    #[error("cannot write {path}: {source} (check the directory exists and is writable)")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An image format, from a file name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    pub fn of_path(path: &Path) -> Result<Format, PlotError> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(PlotError::UnknownFormat(path.to_path_buf())),
        }
    }
}

/// The family every chart's text uses; registered with the embedded font.
const FONT: &str = "sans-serif";

/// Text measurement (SVG) and rasterisation (PNG) both need the font registered once.
fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font is known to parse; a failure would leave text unmeasured,
        // which drawing then reports as an error.
        let _ = plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
}

fn draw_error(error: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(error.to_string())
}

/// A chart that can draw itself on any plotters backend.
trait Chart {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>;
}

/// The chart as an SVG document.
fn svg_of(chart: &impl Chart) -> Result<String, PlotError> {
    register_font();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, chart.size()).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

/// Write the chart to `path` in the format its extension names.
fn write(chart: &impl Chart, path: &Path) -> Result<(), PlotError> {
    let format = Format::of_path(path)?;
    register_font();
    let write_error = |source| PlotError::Write {
        path: path.to_path_buf(),
        source,
    };
    match format {
        Format::Svg => std::fs::write(path, svg_of(chart)?).map_err(write_error),
        Format::Png => {
            // The bitmap backend writes on `present`; its error hides the I/O cause, so a
            // path that cannot be created is reported first with its own.
            std::fs::File::create(path).map_err(write_error)?;
            let root = BitMapBackend::new(path, chart.size()).into_drawing_area();
            chart.draw(&root)?;
            root.present().map_err(draw_error)
        }
    }
}

/// Colours of successive series, readable on white and told apart in print.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
];

fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    /// Width and height from a PNG's signature and IHDR chunk; panics when it is not one.
    pub fn png_size(path: &Path) -> (u32, u32) {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
        assert_eq!(&bytes[12..16], b"IHDR", "the first chunk is IHDR");
        let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        (word(16), word(20))
    }

    /// The SVG parsed as XML: its root's size, and every text it shows.
    pub fn svg_texts(svg: &str) -> ((String, String), Vec<String>) {
        let document = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
        let root = document.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let size = (
            root.attribute("width").unwrap().to_string(),
            root.attribute("height").unwrap().to_string(),
        );
        let texts = document
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(|t| t.trim().to_string())
            .collect();
        (size, texts)
    }
}
