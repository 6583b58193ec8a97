//! A dependency-free SVG chart: throughput relative to the unprotected write,
//! per backend and client count, one bar per scenario.

use std::fmt::Write as _;

use crate::report::Report;

const COLORS: &[(&str, &str)] = &[
    ("unprotected", "#9e9e9e"),
    ("same-writes", "#c9b458"),
    ("seed-sql", "#e07b39"),
    ("idem", "#2a7ab9"),
    ("idem-macro", "#6aa9d8"),
    ("idem-row-lock", "#8e6bb8"),
    ("idem-solo", "#a3c4dc"),
    ("replay", "#3c9d5d"),
];

/// One bar group: backend, clients, and (scenario, throughput ÷ unprotected) bars.
type Group = (String, usize, Vec<(&'static str, f64)>);

/// Draws the report's throughput cells as grouped bars.
pub fn chart(r: &Report) -> String {
    let groups: Vec<Group> = r
        .backends
        .iter()
        .flat_map(|b| {
            let mut clients: Vec<usize> = b.cells.iter().map(|c| c.clients).collect();
            clients.sort_unstable();
            clients.dedup();
            clients.into_iter().map(move |n| {
                let base = b
                    .cells
                    .iter()
                    .find(|c| c.scenario == "unprotected" && c.clients == n)
                    .map(|c| c.throughput)
                    .unwrap_or(f64::NAN);
                let bars = COLORS
                    .iter()
                    .filter_map(|(name, _)| {
                        b.cells
                            .iter()
                            .find(|c| c.scenario == *name && c.clients == n)
                            .map(|c| (*name, c.throughput / base))
                    })
                    .collect();
                (b.backend.clone(), n, bars)
            })
        })
        .collect();
    let max = groups
        .iter()
        .flat_map(|g| g.2.iter().map(|b| b.1))
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max);
    // Replays run at many times the write rate (25x and more on SQLite); the
    // axis stops at 5x so the gap between the writes stays visible, and taller
    // bars are cut with their value printed.
    let top = (max * 1.1).ceil().clamp(1.0, 5.0);
    // The right margin holds the target lines' labels.
    let (w, h, left, right, bottom, topm) = (1240.0, 420.0, 60.0, 120.0, 70.0, 50.0);
    let plot_h = h - bottom - topm;
    let group_w = (w - left - right) / groups.len().max(1) as f64;
    let bar_w = (group_w - 16.0) / COLORS.len() as f64;
    let y = |v: f64| topm + plot_h * (1.0 - v / top);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="15" font-weight="bold">Throughput relative to the unprotected write (higher is better; {} cores, medians of {} round{})</text>"#,
        r.cores,
        r.rounds,
        if r.rounds == 1 { "" } else { "s" }
    );
    let mut tick = 0.0;
    while tick <= top + 1e-9 {
        let ty = y(tick);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{ty:.1}" y2="{ty:.1}" stroke="#e0e0e0"/>"##,
            w - right
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{tick:.1}×</text>"#,
            left - 6.0,
            ty + 4.0
        );
        tick += 0.5;
    }
    for (target, label) in [(0.85, "target 0.85"), (2.5, "replay target 2.5")] {
        if target <= top {
            let ty = y(target);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{}" y1="{ty:.1}" y2="{ty:.1}" stroke="#c62828" stroke-dasharray="5,4"/>"##,
                w - right
            );
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{:.1}" fill="#c62828">{label}</text>"##,
                w - right + 4.0,
                ty + 4.0
            );
        }
    }
    for (gi, (backend, clients, bars)) in groups.iter().enumerate() {
        let gx = left + gi as f64 * group_w + 8.0;
        for (bi, (name, v)) in bars.iter().enumerate() {
            let color = COLORS
                .iter()
                .find(|c| c.0 == *name)
                .map(|c| c.1)
                .unwrap_or("#000");
            let v = if v.is_finite() { *v } else { 0.0 };
            let shown = v.min(top);
            let x = gx + bi as f64 * bar_w;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{backend} {name} {clients} clients: {v:.2}×</title></rect>"#,
                y(shown),
                bar_w - 2.0,
                (plot_h * shown / top).max(0.0)
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{v:.2}</text>"#,
                x + bar_w / 2.0 - 1.0,
                y(shown) - 3.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{backend} · {clients} client{}</text>"#,
            gx + (group_w - 16.0) / 2.0,
            h - bottom + 18.0,
            if *clients == 1 { "" } else { "s" }
        );
    }
    let mut lx = left;
    for (name, color) in COLORS {
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{color}"/>"#,
            h - 30.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{name}</text>"#,
            lx + 16.0,
            h - 20.0
        );
        lx += 120.0;
    }
    s.push_str("</svg>\n");
    s
}
