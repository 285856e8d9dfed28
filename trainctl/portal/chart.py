"""The job page's chart: loss, throughput and step time by step, from the job's progress events
(trainctl/progress.py ``series``), drawn here as one SVG of three panels (no script, no third-party
code; the page shows it as an image, so nothing in it runs). Every number is the job's, formatted
here; every word is the portal's own, escaped all the same."""

from __future__ import annotations

from xml.sax.saxutils import escape

WIDTH, PANEL_H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 120, 70, 16, 22, 22
MAX_DRAWN = 600  # points per line: the newest step always among them
PANELS = (("loss", "loss", ""), ("throughput", "throughput", "/s"), ("step_time_s", "step time", " s"))


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def throughput_key(points: list[dict]) -> str | None:
    """``tokens_per_s`` where the events give it, else ``samples_per_s``, else None."""
    for key in ("tokens_per_s", "samples_per_s"):
        if any(key in p for p in points):
            return key
    return None


def values(points: list[dict], metric: str) -> list[tuple[int, float]]:
    key = throughput_key(points) if metric == "throughput" else metric
    return [(p["step"], p[key]) for p in points if key and key in p]


def _thin(xy: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if len(xy) <= MAX_DRAWN:
        return xy
    every = -(-len(xy) // MAX_DRAWN)
    kept = xy[::every]
    return kept if kept[-1] == xy[-1] else [*kept, xy[-1]]


def summary(points: list[dict]) -> str:
    """One sentence for the image's text alternative: the steps and each metric's first and last value."""
    if not points:
        return "No progress events yet."
    parts = [f"{len(points)} reported steps, {points[0]['step']} to {points[-1]['step']}"]
    unit = (throughput_key(points) or "").replace("_per_s", "/s")
    for metric, label, _ in PANELS:
        xy = values(points, metric)
        if xy:
            name = f"throughput ({unit})" if metric == "throughput" else label
            parts.append(f"{name} from {_fmt(xy[0][1])} to {_fmt(xy[-1][1])}")
    return "; ".join(parts) + "."


def svg(points: list[dict]) -> str:
    """The chart of ``points`` (``series``' output): one panel per metric, each on its own scale,
    the steps along the bottom; a panel whose metric no event gives says so."""
    height = len(PANELS) * PANEL_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" font-family="sans-serif" font-size="11">',
           f"<title>{escape(summary(points))}</title>", f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>']
    steps = [p["step"] for p in points]
    lo_x, hi_x = (min(steps), max(steps)) if steps else (0, 1)
    span_x = (hi_x - lo_x) or 1
    plot_w = WIDTH - PAD_L - PAD_R
    unit = (throughput_key(points) or "").replace("_per_s", "")
    for i, (metric, label, suffix) in enumerate(PANELS):
        top = i * PANEL_H
        plot_h = PANEL_H - PAD_T - PAD_B
        title = f"{label} ({unit}{suffix})" if metric == "throughput" and unit else f"{label}{' (s)' if suffix == ' s' else ''}"
        out.append(f'<g class="panel" data-metric="{metric}" transform="translate(0,{top})">')
        out.append(f'<text x="{PAD_L}" y="14" font-weight="bold">{escape(title)}</text>')
        out.append(f'<rect x="{PAD_L}" y="{PAD_T}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>')
        xy = values(points, metric)
        if not xy:
            out.append(f'<text class="none" x="{PAD_L + 8}" y="{PAD_T + plot_h / 2:.0f}" fill="#666">no {escape(label)} in the events</text></g>')
            continue
        ys = [v for _, v in xy]
        lo_y, hi_y = min(ys), max(ys)
        span_y = (hi_y - lo_y) or (abs(hi_y) or 1.0)
        base_y = lo_y if hi_y != lo_y else lo_y - span_y / 2

        def at(step: int, v: float, plot_h: float = plot_h, base_y: float = base_y, span_y: float = span_y) -> str:
            x = PAD_L + (step - lo_x) / span_x * plot_w if hi_x != lo_x else PAD_L + plot_w / 2
            y = PAD_T + plot_h - (v - base_y) / span_y * plot_h
            return f"{x:.1f},{y:.1f}"

        drawn = _thin(xy)
        out.append(f'<text x="{PAD_L - 4}" y="{PAD_T + 10}" text-anchor="end">{_fmt(base_y + span_y)}</text>')
        out.append(f'<text x="{PAD_L - 4}" y="{PAD_T + plot_h}" text-anchor="end">{_fmt(base_y)}</text>')
        out.append(f'<polyline class="series" data-metric="{metric}" fill="none" stroke="#1f5fa8" stroke-width="1.5" points="{" ".join(at(s, v) for s, v in drawn)}"/>')
        if len(drawn) == 1:
            out.append(f'<circle cx="{at(*drawn[0]).split(",")[0]}" cy="{at(*drawn[0]).split(",")[1]}" r="3" fill="#1f5fa8"/>')
        out.append(f'<text x="{PAD_L}" y="{PANEL_H - 6}">step {lo_x}</text><text x="{WIDTH - PAD_R}" y="{PANEL_H - 6}" text-anchor="end">step {hi_x}</text></g>')
    out.append("</svg>")
    return "".join(out)
