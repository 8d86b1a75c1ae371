//! The memory trace drawn as an SVG timeline: allocated and reserved bytes over time, with
//! the named scopes (forward, backward, optimizer step...) as coloured bands underneath.
//!
//! Time is host time: a tensor is allocated when an op is recorded and returned when its last
//! handle drops, which is usually before the device has run the queued work (safe, because
//! the stream orders every later use of the block after it). A scope that syncs at its end
//! (`Device::track`) stretches to cover the device's work.

use super::trace::{Event, EventKind};
use crate::error::fmt_bytes;
use std::fmt::Write;

const W: f64 = 1000.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 40.0;
const TOP: f64 = 40.0;
const PLOT_H: f64 = 240.0;
const BAND_Y: f64 = TOP + PLOT_H + 12.0;
const BAND_H: f64 = 18.0;

/// Distinct colours for scope names, in order of first appearance.
const PALETTE: [&str; 8] = [
    "#8e6bd6", "#d9c94a", "#4fb37c", "#e07a7a", "#5aa9d6", "#c98a3b", "#9a9a9a", "#d66ba8",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders `events` (from `Device::memory_events`) as a standalone SVG document.
pub fn timeline_svg(events: &[Event], title: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<rect width="{W}" height="{H}" fill="white"/><text x="{LEFT}" y="20" font-size="14">{}</text>"#,
        esc(title)
    );
    if events.is_empty() {
        s.push_str(r#"<text x="70" y="120">no events (turn the trace on with WGRAD_TRACE=1 or Device::set_memory_trace)</text></svg>"#);
        return s;
    }
    let t0 = events[0].t_us as f64;
    let t1 = (events[events.len() - 1].t_us as f64).max(t0 + 1.0);
    let ymax = events
        .iter()
        .map(|e| e.reserved.max(e.allocated))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.05;
    let x = |t: u64| LEFT + (t as f64 - t0) / (t1 - t0) * (W - LEFT - RIGHT);
    let y = |b: u64| TOP + PLOT_H - b as f64 / ymax * PLOT_H;

    // Axes and labels.
    for k in 0..=4 {
        let b = (ymax / 1.05 * k as f64 / 4.0) as u64;
        let yy = y(b);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 4.0,
            yy + 4.0,
            fmt_bytes(b)
        );
    }
    let ms = (t1 - t0) / 1000.0;
    for k in 0..=5 {
        let xx = LEFT + k as f64 / 5.0 * (W - LEFT - RIGHT);
        let _ = write!(
            s,
            r#"<text x="{xx:.1}" y="{}" text-anchor="middle">{:.0} ms</text>"#,
            BAND_Y + BAND_H + 14.0,
            ms * k as f64 / 5.0
        );
    }

    // Step lines: allocated (filled) and reserved.
    let mut alloc = format!("M{LEFT},{:.1}", y(0));
    let mut resv = String::new();
    let (mut pa, mut pr) = (0u64, 0u64);
    for (i, e) in events.iter().enumerate() {
        let xx = x(e.t_us);
        let _ = write!(
            alloc,
            " L{xx:.1},{:.1} L{xx:.1},{:.1}",
            y(pa),
            y(e.allocated)
        );
        if i == 0 {
            let _ = write!(resv, "M{xx:.1},{:.1}", y(e.reserved));
        } else {
            let _ = write!(resv, " L{xx:.1},{:.1} L{xx:.1},{:.1}", y(pr), y(e.reserved));
        }
        pa = e.allocated;
        pr = e.reserved;
    }
    let end = x(events[events.len() - 1].t_us);
    let _ = write!(alloc, " L{end:.1},{:.1} Z", y(0));
    let _ = write!(
        s,
        r##"<path d="{alloc}" fill="#4a7bd0" fill-opacity="0.35" stroke="#2c5aa0" stroke-width="1"/>"##
    );
    let _ = write!(
        s,
        r##"<path d="{resv}" fill="none" stroke="#d0782a" stroke-width="1.5"/>"##
    );

    // Outermost scopes as bands; a legend entry per distinct name.
    let mut depth = 0usize;
    let mut open: Option<(u64, String)> = None;
    let mut names: Vec<String> = Vec::new();
    let colour = |names: &mut Vec<String>, n: &str| -> &'static str {
        let i = names.iter().position(|m| m == n).unwrap_or_else(|| {
            names.push(n.to_string());
            names.len() - 1
        });
        PALETTE[i % PALETTE.len()]
    };
    for e in events {
        match e.kind {
            EventKind::ScopeBegin => {
                if depth == 0 {
                    open = Some((e.t_us, e.scope.as_deref().unwrap_or("").to_string()));
                }
                depth += 1;
            }
            EventKind::ScopeEnd => {
                depth = depth.saturating_sub(1);
                if depth == 0
                    && let Some((ts, name)) = open.take()
                {
                    let (x0, x1) = (x(ts), x(e.t_us).max(x(ts) + 0.5));
                    let c = colour(&mut names, &name);
                    let _ = write!(
                        s,
                        r#"<rect x="{x0:.1}" y="{BAND_Y}" width="{:.1}" height="{BAND_H}" fill="{c}"><title>{}</title></rect>"#,
                        x1 - x0,
                        esc(&name)
                    );
                }
            }
            _ => {}
        }
    }
    let mut lx = LEFT + 300.0;
    let _ = write!(
        s,
        r##"<rect x="{LEFT}" y="26" width="12" height="8" fill="#4a7bd0" fill-opacity="0.5"/><text x="{}" y="34">allocated</text>"##,
        LEFT + 16.0
    );
    let _ = write!(
        s,
        r##"<rect x="{}" y="29" width="12" height="2" fill="#d0782a"/><text x="{}" y="34">reserved</text>"##,
        LEFT + 90.0,
        LEFT + 106.0
    );
    for (i, n) in names.iter().enumerate().take(PALETTE.len()) {
        let _ = write!(
            s,
            r#"<rect x="{lx:.1}" y="26" width="12" height="8" fill="{}"/><text x="{:.1}" y="34">{}</text>"#,
            PALETTE[i],
            lx + 16.0,
            esc(n)
        );
        lx += 30.0 + 7.0 * n.len() as f64;
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_lines_and_bands() {
        let ev = |t, kind, a, scope: Option<&str>| Event {
            t_us: t,
            kind,
            bytes: 0,
            allocated: a,
            reserved: 1 << 21,
            scope: scope.map(Into::into),
        };
        let events = vec![
            ev(0, EventKind::ScopeBegin, 0, Some("forward")),
            ev(10, EventKind::Alloc, 1000, Some("forward")),
            ev(20, EventKind::ScopeEnd, 1000, Some("forward")),
            ev(30, EventKind::Free, 0, None),
        ];
        let svg = timeline_svg(&events, "t <1>");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("forward") && svg.contains("t &lt;1&gt;"));
        assert_eq!(svg.matches("<path").count(), 2);
    }
}
