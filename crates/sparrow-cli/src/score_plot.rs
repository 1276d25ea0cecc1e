//! RULER scores as a PNG line chart: context length (x, evenly spaced in the order given)
//! against average score (y, 0–100), one line per attention policy with a legend. Drawn
//! with plotters' bitmap backend and the heatmap's embedded font.

use super::heatmap::{register_font, FAMILY};
use plotters::prelude::*;
use std::path::Path;

/// Line colours, cycled (colour-blind-safe Okabe–Ito palette, black first for the
/// reference policy).
const COLOURS: [RGBColor; 8] = [
    RGBColor(0, 0, 0),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(0, 114, 178),
    RGBColor(204, 121, 167),
    RGBColor(240, 228, 66),
];

/// One policy's line: its label and a score (0–100) per length, `None` where not measured.
pub struct Series {
    pub label: String,
    pub scores: Vec<Option<f64>>,
}

/// Draw `series` over `lengths` to `path` under `title`.
pub fn write(path: &Path, title: &str, lengths: &[usize], series: &[Series]) -> Result<(), String> {
    if lengths.is_empty() || series.iter().any(|s| s.scores.len() != lengths.len()) {
        return Err("score plot: every series needs one score per length".into());
    }
    register_font()?;
    let err = |e: DrawingAreaErrorKind<_>| format!("cannot draw {}: {e}", path.display());
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = lengths.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..100f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                lengths[i as usize].to_string()
            } else {
                String::new()
            }
        })
        .x_desc("context length (tokens)")
        .y_desc("RULER score")
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<(f64, f64)> = s
            .scores
            .iter()
            .enumerate()
            .filter_map(|(x, y)| y.map(|y| (x as f64, y)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, colour.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FAMILY, 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PNG decodes at the announced size, and each series' colour is drawn at its
    /// point: a policy at 100 near the top, one at 0 near the bottom.
    #[test]
    fn score_plot_draws_each_series_at_its_scores() {
        let dir = std::env::temp_dir().join(format!("sparrow-scoreplot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ruler.png");
        let series = [
            Series {
                label: "full".into(),
                scores: vec![Some(100.0), Some(100.0)],
            },
            Series {
                label: "quest".into(),
                scores: vec![Some(0.0), None],
            },
        ];
        write(&path, "RULER", &[4096, 8192], &series).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(std::fs::read(&path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (900, 560));
        let px = |x: usize, y: usize| {
            let i = (y * info.width as usize + x) * 3;
            (buf[i], buf[i + 1], buf[i + 2])
        };
        let rows_with = |colour: (u8, u8, u8)| -> Vec<usize> {
            (0..info.height as usize)
                .filter(|&y| (0..info.width as usize).any(|x| px(x, y) == colour))
                .collect()
        };
        let orange = rows_with((230, 159, 0));
        assert!(!orange.is_empty(), "the second series is drawn");
        // quest's only point is at 0: its marker is low in the plot, below the legend's
        // entry too; full's line is drawn at the top.
        assert!(*orange.last().unwrap() > info.height as usize * 3 / 4);
        let black_rows = rows_with((0, 0, 0));
        assert!(black_rows.iter().any(|&y| y < info.height as usize / 4));
        // A series with a score per length missing is refused.
        let bad = [Series {
            label: "x".into(),
            scores: vec![Some(1.0)],
        }];
        assert!(write(&path, "t", &[1, 2], &bad).is_err());
    }
}
