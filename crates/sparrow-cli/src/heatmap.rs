//! Needle-in-a-haystack heatmaps as PNG: context length (x) × needle depth (y), each cell
//! coloured by accuracy (red 0 → yellow 0.5 → green 1) with the value written in it.
//!
//! Drawn with plotters' bitmap backend only; text uses an embedded DejaVu Sans Mono
//! (`assets/`, Bitstream Vera licence) through ab_glyph, so no system font is needed.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::OnceLock;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");
pub(super) const FAMILY: &str = "sans-serif";

const CELL_W: u32 = 96;
const CELL_H: u32 = 48;
const LEFT: u32 = 110;
const TOP: u32 = 64;
const BOTTOM: u32 = 70;
const RIGHT: u32 = 24;
const TITLE_PX: u32 = 18;

/// The PNG's size in pixels for a grid of `n_lengths` columns and `n_depths` rows under
/// `title` (wide enough for the title).
pub fn size(n_lengths: usize, n_depths: usize, title: &str) -> Result<(u32, u32), String> {
    register_font()?;
    let (title_w, _) = (FAMILY, TITLE_PX)
        .into_font()
        .box_size(title)
        .map_err(|e| format!("cannot lay out the heatmap title: {e:?}"))?;
    let grid_w = LEFT + CELL_W * n_lengths as u32 + RIGHT;
    Ok((
        grid_w.max(title_w + 40).max(480),
        TOP + CELL_H * n_depths as u32 + BOTTOM,
    ))
}

/// Accuracy (clamped to 0..1) as a colour: red → yellow → green.
pub fn colour(acc: f64) -> RGBColor {
    let a = if acc.is_finite() {
        acc.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let (red, yellow, green) = (
        (215.0, 48.0, 39.0),
        (254.0, 224.0, 139.0),
        (26.0, 152.0, 80.0),
    );
    let mix = |x: (f64, f64, f64), y: (f64, f64, f64), t: f64| {
        RGBColor(
            (x.0 + (y.0 - x.0) * t).round() as u8,
            (x.1 + (y.1 - x.1) * t).round() as u8,
            (x.2 + (y.2 - x.2) * t).round() as u8,
        )
    };
    if a < 0.5 {
        mix(red, yellow, a * 2.0)
    } else {
        mix(yellow, green, (a - 0.5) * 2.0)
    }
}

/// Register the embedded font with plotters (once per process).
pub(super) fn register_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
            .map_err(|_| "the embedded heatmap font cannot be read".to_string())
    })
    .clone()
}

/// Write the heatmap of `accuracy[d][l]` (depth `depths[d]`, length `lengths[l]`) to `path`.
pub fn write(
    path: &Path,
    title: &str,
    lengths: &[usize],
    depths: &[f64],
    accuracy: &[Vec<f64>],
) -> Result<(), String> {
    if accuracy.len() != depths.len() || accuracy.iter().any(|r| r.len() != lengths.len()) {
        return Err("heatmap: the accuracy grid does not match lengths × depths".into());
    }
    register_font()?;
    let err = |e: DrawingAreaErrorKind<_>| format!("cannot draw {}: {e}", path.display());
    let (w, h) = size(lengths.len(), depths.len(), title)?;
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;

    let centre = Pos::new(HPos::Center, VPos::Center);
    let title_style = TextStyle::from((FAMILY, TITLE_PX).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    root.draw(&Text::new(
        title.to_string(),
        (w as i32 / 2, 12),
        title_style,
    ))
    .map_err(err)?;

    let label = TextStyle::from((FAMILY, 14).into_font())
        .color(&BLACK)
        .pos(centre);
    let value = TextStyle::from((FAMILY, 16).into_font())
        .color(&BLACK)
        .pos(centre);
    for (d, depth) in depths.iter().enumerate() {
        let y0 = (TOP + CELL_H * d as u32) as i32;
        root.draw(&Text::new(
            format!("{depth:.2}"),
            (LEFT as i32 - 40, y0 + CELL_H as i32 / 2),
            label.clone(),
        ))
        .map_err(err)?;
        for (l, _) in lengths.iter().enumerate() {
            let x0 = (LEFT + CELL_W * l as u32) as i32;
            let acc = accuracy[d][l];
            root.draw(&Rectangle::new(
                [(x0, y0), (x0 + CELL_W as i32, y0 + CELL_H as i32)],
                colour(acc).filled(),
            ))
            .map_err(err)?;
            root.draw(&Rectangle::new(
                [(x0, y0), (x0 + CELL_W as i32, y0 + CELL_H as i32)],
                WHITE.stroke_width(1),
            ))
            .map_err(err)?;
            let text = if acc.is_finite() {
                format!("{acc:.2}")
            } else {
                "n/a".into()
            };
            root.draw(&Text::new(
                text,
                (x0 + CELL_W as i32 / 2, y0 + CELL_H as i32 / 2),
                value.clone(),
            ))
            .map_err(err)?;
        }
    }
    let grid_bottom = (TOP + CELL_H * depths.len() as u32) as i32;
    for (l, length) in lengths.iter().enumerate() {
        let x = (LEFT + CELL_W * l as u32 + CELL_W / 2) as i32;
        root.draw(&Text::new(
            length.to_string(),
            (x, grid_bottom + 14),
            label.clone(),
        ))
        .map_err(err)?;
    }
    let grid_mid = (LEFT + CELL_W * lengths.len() as u32 / 2) as i32;
    root.draw(&Text::new(
        "context length (tokens)",
        (grid_mid, grid_bottom + 42),
        label.clone(),
    ))
    .map_err(err)?;
    root.draw(&Text::new(
        "depth",
        (LEFT as i32 - 40, TOP as i32 - 14),
        label,
    ))
    .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_run_red_yellow_green() {
        assert_eq!(colour(0.0), RGBColor(215, 48, 39));
        assert_eq!(colour(0.5), RGBColor(254, 224, 139));
        assert_eq!(colour(1.0), RGBColor(26, 152, 80));
        assert_eq!(colour(f64::NAN), colour(0.0));
    }

    /// The PNG decodes, has the announced size, cells carry their colour, and text was
    /// drawn (dark pixels in a cell's centre and in the title band).
    #[test]
    fn heatmap_is_a_valid_png_with_coloured_cells_and_text() {
        let dir = std::env::temp_dir().join(format!("sparrow-heatmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("grid.png");
        let lengths = [1024, 2048, 4096];
        let depths = [0.0, 0.5, 1.0];
        let acc = vec![
            vec![1.0, 0.5, 0.0],
            vec![1.0, 1.0, 0.25],
            vec![0.0, 0.0, 0.0],
        ];
        let title = "needle accuracy: quest decode (page 16, budget 1024, dense_layers [0, 1])";
        write(&path, title, &lengths, &depths, &acc).unwrap();

        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), size(3, 3, title).unwrap());
        assert!(info.width > 600, "the long title widens the image");
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let px = |x: u32, y: u32| {
            let i = ((y * info.width + x) * 3) as usize;
            (buf[i], buf[i + 1], buf[i + 2])
        };
        let c = |a: f64| {
            let RGBColor(r, g, b) = colour(a);
            (r, g, b)
        };
        // Near the top-left corner of cells (away from the written value).
        for (d, row) in acc.iter().enumerate() {
            for (l, &a) in row.iter().enumerate() {
                let (x, y) = (LEFT + CELL_W * l as u32 + 6, TOP + CELL_H * d as u32 + 6);
                assert_eq!(px(x, y), c(a), "cell depth {d} length {l}");
            }
        }
        let dark = |x0: u32, x1: u32, y0: u32, y1: u32| {
            (y0..y1)
                .flat_map(|y| (x0..x1).map(move |x| (x, y)))
                .filter(|&(x, y)| {
                    let (r, g, b) = px(x, y);
                    (r as u32 + g as u32 + b as u32) < 200
                })
                .count()
        };
        let (cx, cy) = (LEFT + CELL_W / 2, TOP + CELL_H / 2);
        assert!(
            dark(cx - 30, cx + 30, cy - 10, cy + 10) > 20,
            "no value text"
        );
        assert!(dark(0, info.width, 0, TOP - 20) > 50, "no title text");
        std::fs::remove_dir_all(&dir).ok();
    }
}
