//! Minimal SVG line charts, one line per system, like the papers' figures
//! (throughput or bytes per version). Hand-written: a chart is a few dozen
//! SVG elements and this keeps the harness free of a plotting stack.

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders an SVG line chart. `lines` are (label, points (x, y)).
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[(String, Vec<(f64, f64)>)],
) -> String {
    let (w, h) = (720.0, 420.0);
    let (l, r, t, b) = (70.0, 160.0, 40.0, 50.0);
    let pw = w - l - r;
    let ph = h - t - b;
    let xs = lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
    let x_min = xs.clone().fold(f64::INFINITY, f64::min);
    let x_max = xs.fold(f64::NEG_INFINITY, f64::max);
    let (x_min, x_max) = if x_min.is_finite() && x_max > x_min {
        (x_min, x_max)
    } else {
        (0.0, 1.0)
    };
    let y_max = nice_max(
        lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .fold(0.0, f64::max),
    );
    let sx = |x: f64| l + (x - x_min) / (x_max - x_min) * pw;
    let sy = |y: f64| t + ph - y / y_max * ph;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        w / 2.0,
        esc(title)
    );
    for i in 0..=5 {
        let y = y_max * i as f64 / 5.0;
        let (x2, yy, tx, ty) = (l + pw, sy(y), l - 6.0, sy(y) + 4.0);
        s += &format!(
            "<line x1=\"{l}\" x2=\"{x2}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#ddd\"/><text x=\"{tx}\" y=\"{ty}\" text-anchor=\"end\">{}</text>\n",
            fmt_num(y)
        );
    }
    // Whole-number ticks (versions), at most about ten of them.
    let step = ((x_max - x_min) / 10.0).ceil().max(1.0);
    let mut x = x_min;
    while x <= x_max + 1e-9 {
        s += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            sx(x),
            t + ph + 18.0,
            fmt_num(x)
        );
        x += step;
    }
    let (x2, y0) = (l + pw, t + ph);
    s += &format!(
        "<line x1=\"{l}\" x2=\"{x2}\" y1=\"{y0}\" y2=\"{y0}\" stroke=\"black\"/><line x1=\"{l}\" x2=\"{l}\" y1=\"{t}\" y2=\"{y0}\" stroke=\"black\"/>\n"
    );
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n<text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
        l + pw / 2.0,
        h - 10.0,
        esc(x_label),
        t + ph / 2.0,
        esc(y_label)
    );
    for (i, (label, pts)) in lines.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>\n",
            path.join(" ")
        );
        for (x, y) in pts {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{c}\"/>\n",
                sx(*x),
                sy(*y)
            );
        }
        let ly = t + 10.0 + i as f64 * 18.0;
        s += &format!(
            "<line x1=\"{0}\" x2=\"{1}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"/><text x=\"{2}\" y=\"{3}\">{4}</text>\n",
            l + pw + 12.0,
            l + pw + 32.0,
            l + pw + 38.0,
            ly + 4.0,
            esc(label)
        );
    }
    s += "</svg>\n";
    s
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_lines_and_legend() {
        let svg = line_chart(
            "t<1>",
            "version",
            "MB/s",
            &[
                ("a".into(), vec![(1.0, 10.0), (2.0, 30.0)]),
                ("b".into(), vec![(1.0, 5.0)]),
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t&lt;1&gt;"));
        assert_eq!(nice_max(73.0), 100.0);
        assert_eq!(nice_max(0.0), 1.0);
    }
}
