//! `attnc show DIR -o util.svg`: a PE × time picture of what every op slot does, by phase.

use super::load;
use std::path::PathBuf;
use svg::node::element::{Group, Line, Rectangle, Text};
use svg::Document;
use timeline::{Class, Grid};

#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// Directory written by `attnc compile`
    pub dir: PathBuf,
    /// Where to write the SVG picture
    #[arg(short = 'o', long = "out", value_name = "FILE.svg")]
    pub out: PathBuf,
}

/// At most this many PE rows and time columns: beyond that cells would be thinner than a pixel
/// at the picture's size, so PEs and cycles are grouped into bins instead.
const MAX_ROWS: usize = 64;
const MAX_COLS: usize = 400;
const PLOT_W: f64 = 900.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 70.0;
/// Classes an op slot can have, in legend order.
const LEGEND: [Class; 5] = [
    Class::Qk,
    Class::Softmax,
    Class::Av,
    Class::Other,
    Class::Idle,
];

fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// The cell colour: the class colours mixed in proportion to the slot-cycles of each, so a
/// half-idle QKᵀ cell is a paler blue than a busy one and a fully idle cell is grey.
fn blend(counts: &[u32; Class::COUNT]) -> (u8, u8, u8) {
    let total: u32 = counts.iter().sum();
    if total == 0 {
        return (255, 255, 255);
    }
    let mut acc = [0.0f64; 3];
    for c in Class::ALL {
        let w = f64::from(counts[c as usize]) / f64::from(total);
        let (r, g, b) = c.rgb();
        acc[0] += w * f64::from(r);
        acc[1] += w * f64::from(g);
        acc[2] += w * f64::from(b);
    }
    (
        acc[0].round() as u8,
        acc[1].round() as u8,
        acc[2].round() as u8,
    )
}

/// A round step (1, 2 or 5 × 10^k) giving at most `max_ticks` ticks over `range`.
fn tick_step(range: f64, max_ticks: f64) -> f64 {
    let raw = (range / max_ticks).max(1.0);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|k| k * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn text(x: f64, y: f64, size: f64, anchor: &str, s: impl Into<String>) -> Text {
    Text::new(s)
        .set("x", x)
        .set("y", y)
        .set("font-size", size)
        .set("text-anchor", anchor)
}

/// Builds the picture from binned op-slot activity.
pub fn render(g: &Grid, m: &compiler::manifest::Manifest) -> Document {
    let rows = g.pe_bins;
    let cols = g.time_bins.max(1);
    let plot_h = (rows as f64 * 28.0).clamp(56.0, 512.0);
    let row_h = plot_h / rows as f64;
    let col_w = PLOT_W / cols as f64;
    let width = LEFT + PLOT_W + 30.0;
    let height = TOP + plot_h + 110.0;

    let mut totals = [0u64; Class::COUNT];
    let mut cells = Group::new().set("shape-rendering", "crispEdges");
    for r in 0..rows {
        let y = TOP + r as f64 * row_h;
        let mut c = 0;
        while c < g.time_bins {
            let counts = g.cell(r, 0, c);
            let colour = blend(counts);
            // Equal neighbours become one rectangle: far fewer elements for the same picture.
            let mut end = c + 1;
            while end < g.time_bins && blend(g.cell(r, 0, end)) == colour {
                end += 1;
            }
            for k in c..end {
                for (t, n) in totals.iter_mut().zip(g.cell(r, 0, k)) {
                    *t += u64::from(*n);
                }
            }
            cells = cells.add(
                Rectangle::new()
                    .set("x", LEFT + c as f64 * col_w)
                    .set("y", y)
                    .set("width", (end - c) as f64 * col_w)
                    .set("height", row_h)
                    .set("fill", hex(colour)),
            );
            c = end;
        }
    }

    let busy: u64 = totals.iter().sum::<u64>() - totals[Class::Idle as usize];
    let slots = (g.cycles * u64::from(g.pes)).max(1);
    let title = format!(
        "{}: {} cycles on {} PEs, lower bound {} (cycles/LB {:.3}), op slots busy {:.1}%",
        m.layer.name,
        m.cycles,
        m.pes,
        m.lower_bound,
        m.cycles as f64 / m.lower_bound.max(1) as f64,
        100.0 * busy as f64 / slots as f64
    );
    let subtitle = format!(
        "{} — each cell {} cycle{} × {} PE{}, coloured by the share of op-slot cycles in each phase (lineage)",
        m.schedule,
        g.width,
        if g.width == 1 { "" } else { "s" },
        g.pes_per_bin,
        if g.pes_per_bin == 1 { "" } else { "s" },
    );

    let mut axes = Group::new()
        .set("font-family", "sans-serif")
        .set("fill", "#222");
    axes = axes.add(
        Rectangle::new()
            .set("x", LEFT)
            .set("y", TOP)
            .set("width", PLOT_W)
            .set("height", plot_h)
            .set("fill", "none")
            .set("stroke", "#444"),
    );
    // x axis: cycles.
    let step = tick_step(g.cycles as f64, 10.0);
    let mut t = 0.0;
    while t <= g.cycles as f64 {
        let x = LEFT + t / g.cycles.max(1) as f64 * PLOT_W;
        axes = axes
            .add(
                Line::new()
                    .set("x1", x)
                    .set("x2", x)
                    .set("y1", TOP + plot_h)
                    .set("y2", TOP + plot_h + 5.0)
                    .set("stroke", "#444"),
            )
            .add(text(x, TOP + plot_h + 18.0, 11.0, "middle", format!("{t}")));
        t += step;
    }
    axes = axes.add(text(
        LEFT + PLOT_W / 2.0,
        TOP + plot_h + 36.0,
        12.0,
        "middle",
        "time (cycles)",
    ));
    // y axis: PEs, ticked at row starts.
    let pe_step = tick_step(f64::from(g.pes), 16.0).max(1.0) as u32;
    let mut pe = 0u32;
    while pe < g.pes {
        let row = (pe / g.pes_per_bin) as f64;
        let y = TOP + (row + 0.5) * row_h;
        axes = axes.add(text(LEFT - 8.0, y + 4.0, 11.0, "end", format!("{pe}")));
        pe += pe_step.max(g.pes_per_bin);
    }
    axes = axes.add(text(0.0, 0.0, 12.0, "middle", "PE").set(
        "transform",
        format!("translate(18,{}) rotate(-90)", TOP + plot_h / 2.0),
    ));
    axes = axes
        .add(text(LEFT, 24.0, 15.0, "start", title).set("font-weight", "bold"))
        .add(text(LEFT, 44.0, 11.0, "start", subtitle));

    // Legend, with each class's share of all op-slot cycles.
    let mut x = LEFT;
    let ly = TOP + plot_h + 58.0;
    for c in LEGEND {
        let share = 100.0 * totals[c as usize] as f64 / slots as f64;
        if c == Class::Other && totals[c as usize] == 0 {
            continue;
        }
        let label = format!("{} {share:.1}%", c.label());
        axes = axes
            .add(
                Rectangle::new()
                    .set("x", x)
                    .set("y", ly)
                    .set("width", 14)
                    .set("height", 14)
                    .set("fill", hex(c.rgb()))
                    .set("stroke", "#444"),
            )
            .add(text(x + 20.0, ly + 12.0, 12.0, "start", label.clone()));
        x += 40.0 + 7.0 * label.chars().count() as f64;
    }

    Document::new()
        .set("viewBox", (0, 0, width, height))
        .set("width", width)
        .set("height", height)
        .add(
            Rectangle::new()
                .set("width", "100%")
                .set("height", "100%")
                .set("fill", "white"),
        )
        .add(cells)
        .add(axes)
}

pub fn run(args: &ShowArgs) -> Result<(), String> {
    let loaded = load::load_dir(&args.dir)?;
    let (programs, m) = loaded
        .flat()
        .map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let m = &*m;
    let mut grid = Grid::new(m.pes, m.cycles, MAX_ROWS, MAX_COLS, 1);
    let bar = super::progress::Progress::bar(m.cycles, "cycles", false);
    timeline::walk(&programs, m, |t, slots| {
        grid.add(t, slots);
        if t.is_multiple_of(4096) {
            bar.set_position(t);
        }
    })
    .map_err(|e| format!("{}: {e}", args.dir.display()))?;
    drop(bar);
    let doc = render(&grid, m);
    svg::save(&args.out, &doc).map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    eprintln!(
        "wrote {} ({} × {} cells of {} cycles × {} PEs)",
        args.out.display(),
        grid.pe_bins,
        grid.time_bins,
        grid.width,
        grid.pes_per_bin
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(2312.0, 10.0), 500.0);
        assert_eq!(tick_step(7.0, 10.0), 1.0);
        assert_eq!(tick_step(1024.0, 16.0), 100.0);
    }

    #[test]
    fn blend_of_one_class_is_its_colour() {
        let mut c = [0; Class::COUNT];
        c[Class::Av as usize] = 3;
        assert_eq!(blend(&c), Class::Av.rgb());
    }
}
