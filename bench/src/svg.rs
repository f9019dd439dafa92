//! Minimal SVG charts for docs/BENCHMARKS.md: grouped bars and lines, with axes, ticks and a
//! legend. Hand-written so the report needs no plotting dependency.

use std::fmt::Write;

const W: f64 = 760.0;
const H: f64 = 380.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" axis maximum and tick step for data up to `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v.abs() >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

fn frame(out: &mut String, title: &str, x_label: &str, y_label: &str, y_max: f64, y_step: f64) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>
"#,
        (LEFT + W - RIGHT) / 2.0,
        esc(title),
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0,
        esc(x_label),
        (TOP + H - BOTTOM) / 2.0,
        esc(y_label),
    );
    let mut v = 0.0;
    while v <= y_max + y_step / 2.0 {
        let y = H - BOTTOM - (v / y_max) * (H - TOP - BOTTOM);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(v)
        );
        v += y_step;
    }
    let _ = writeln!(
        out,
        r#"<line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}" stroke="black"/>"#,
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM,
        H - BOTTOM
    );
}

fn legend(out: &mut String, names: &[String]) {
    for (i, n) in names.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            W - RIGHT + 12.0,
            y - 10.0,
            COLOURS[i % COLOURS.len()],
            W - RIGHT + 30.0,
            y,
            esc(n)
        );
    }
}

/// Grouped bars: one group per category, one bar per series. `values[s][c]`.
pub fn bars(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[String],
    values: &[Vec<f64>],
) -> String {
    let max = values.iter().flatten().cloned().fold(0.0, f64::max);
    let (y_max, y_step) = nice_axis(max);
    let mut out = String::new();
    frame(&mut out, title, "", y_label, y_max, y_step);
    let plot_w = W - LEFT - RIGHT;
    let group_w = plot_w / categories.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (c, cat) in categories.iter().enumerate() {
        let gx = LEFT + c as f64 * group_w + group_w * 0.1;
        for (s, vals) in values.iter().enumerate() {
            let v = vals.get(c).copied().unwrap_or(0.0);
            let h = (v / y_max) * (H - TOP - BOTTOM);
            let _ = writeln!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                gx + s as f64 * bar_w,
                H - BOTTOM - h,
                bar_w,
                h,
                COLOURS[s % COLOURS.len()],
                esc(&series[s]),
                v
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            gx + group_w * 0.4,
            H - BOTTOM + 16.0,
            esc(cat)
        );
    }
    legend(&mut out, series);
    out.push_str("</svg>\n");
    out
}

/// Lines: one polyline per series of (x, y) points; `step` draws them as staircases.
pub fn lines(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    step: bool,
) -> String {
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (x_hi, y_hi) = pts.fold((0.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let x_lo = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(0.0f64, f64::min);
    let (y_max, y_step) = nice_axis(y_hi);
    let mut out = String::new();
    frame(&mut out, title, x_label, y_label, y_max, y_step);
    let (x_max, x_step) = nice_axis(x_hi - x_lo);
    let sx = |x: f64| LEFT + (x - x_lo) / x_max * (W - LEFT - RIGHT);
    let sy = |y: f64| H - BOTTOM - y / y_max * (H - TOP - BOTTOM);
    let mut t = 0.0;
    while t <= x_max + x_step / 2.0 {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            sx(x_lo + t),
            H - BOTTOM + 16.0,
            fmt_tick(x_lo + t)
        );
        t += x_step;
    }
    for (i, (_, p)) in series.iter().enumerate() {
        let mut d = String::new();
        let mut prev: Option<(f64, f64)> = None;
        for &(x, y) in p {
            if step {
                if let Some((_, py)) = prev {
                    let _ = write!(d, "{:.1},{:.1} ", sx(x), sy(py));
                }
            }
            let _ = write!(d, "{:.1},{:.1} ", sx(x), sy(y));
            prev = Some((x, y));
        }
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.8"/>"#,
            d.trim_end(),
            COLOURS[i % COLOURS.len()]
        );
    }
    let names: Vec<String> = series.iter().map(|(n, _)| n.clone()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axes_cover_the_data() {
        for max in [0.3, 1.0, 7.0, 42.0, 99.9, 12_345.0] {
            let (top, step) = nice_axis(max);
            assert!(top >= max && top <= max * 2.6, "{max} -> {top}");
            assert!((top / step).round() <= 10.0);
        }
    }

    #[test]
    fn charts_are_well_formed_and_escape_names() {
        let b = bars("t", "y", &["a".into()], &["x<y".into()], &[vec![1.0]]);
        assert!(b.starts_with("<svg") && b.trim_end().ends_with("</svg>"));
        assert!(b.contains("x&lt;y") && !b.contains("x<y"));
        let l = lines(
            "t",
            "x",
            "y",
            &[("s".into(), vec![(0.0, 1.0), (2.0, 3.0)])],
            true,
        );
        assert_eq!(l.matches("<polyline").count(), 1);
    }
}
