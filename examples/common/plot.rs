//! Loss curves as SVG, for the training examples.

/// Train (and validation) losses against steps, as an SVG line chart.
pub fn loss_svg(train: &[(u64, f32)], val: &[(u64, f32)]) -> String {
    let (w, h, m) = (640.0, 360.0, 40.0);
    let all = train.iter().chain(val);
    let xmax = all.clone().map(|p| p.0).max().unwrap_or(1).max(1) as f32;
    let ymax = all.clone().map(|p| p.1).fold(0.0f32, f32::max).max(1e-3);
    let pt = |&(s, l): &(u64, f32)| {
        format!(
            "{:.1},{:.1}",
            m + (w - 2.0 * m) * s as f32 / xmax,
            h - m - (h - 2.0 * m) * l / ymax
        )
    };
    let line = |pts: &[(u64, f32)], color: &str| {
        let p: Vec<String> = pts.iter().map(pt).collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            p.join(" ")
        )
    };
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<line x1=\"{m}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/><line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{y0}\" stroke=\"black\"/>\
<text x=\"{m}\" y=\"{t}\">loss (0 to {ymax:.2}) against step (0 to {xmax}); blue: train, orange: validation</text>{}{}</svg>\n",
        line(train, "#1f77b4"),
        line(val, "#ff7f0e"),
        y0 = h - m,
        x1 = w - m,
        t = m - 12.0,
    )
}
