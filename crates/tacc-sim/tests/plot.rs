//! `tacc-sim --plot` run as a person would: the JCT CDF of each policy replayed, as an SVG
//! (parsed as XML: its size, axis titles and one legend entry per policy) and as a PNG
//! (its signature and size).

use std::path::PathBuf;
use std::process::Command;

fn excerpt() -> PathBuf {
    // Kept inside the repository (tests/data/README.md says where it comes from), so the
    // tests pass on a fresh clone with nothing beside it.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/excerpt_1000.csv")
}

fn simulate_and_plot(plot: &std::path::Path) {
    let output = Command::new(env!("CARGO_BIN_EXE_tacc-sim"))
        .arg(excerpt())
        .args(["--pool-gpus", "256", "--policy", "fifo,las2d", "--plot"])
        .arg(plot)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "tacc-sim failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_jct_cdf_is_an_svg_with_a_line_per_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdf.svg");
    simulate_and_plot(&path);
    let text = std::fs::read_to_string(&path).unwrap();
    let document = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let root = document.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        (root.attribute("width"), root.attribute("height")),
        (Some("720"), Some("440"))
    );
    let texts: Vec<&str> = document
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    for expected in [
        "fifo",
        "las2d",
        "fraction of jobs",
        "job completion time (s, log scale)",
    ] {
        assert!(texts.contains(&expected), "{expected} in {texts:?}");
    }
    // One curve per policy: polylines with many points (the mesh lines have two).
    let curves = document
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter(|n| {
            n.attribute("points")
                .is_some_and(|p| p.split(' ').count() > 100)
        })
        .count();
    assert_eq!(curves, 2);
}

#[test]
fn the_jct_cdf_is_a_png_by_its_extension() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdf.png");
    simulate_and_plot(&path);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&bytes[12..16], b"IHDR");
    let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!((word(16), word(20)), (720, 440));
}
