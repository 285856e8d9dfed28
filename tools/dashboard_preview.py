"""Draw a layout preview of the CloudWatch dashboard the stack creates (docs/dashboard.png).

The preview is drawn from the same dashboard body the stack registers
(``infra.observability.dashboard_body``), for the dev stack's settings: every widget at its grid
position with its title and what it shows (the metric or the Logs Insights query). It is not a
screenshot and shows no data. Needs Pillow (tools/requirements-preview.txt):

    make dashboard-preview
"""

from __future__ import annotations

import argparse
import re
import textwrap
from dataclasses import dataclass

from infra.observability import DASHBOARD_GRID_WIDTH, dashboard_body

UNIT_X, UNIT_Y = 40, 36  # pixels per dashboard grid unit
MARGIN = 16


@dataclass(frozen=True)
class Box:
    x: int
    y: int
    width: int
    height: int
    title: str
    kind: str  # metric or log
    shows: str  # the metric names, or the query's stats clause


def describe(widget: dict) -> str:
    props = widget["properties"]
    if widget["type"] == "metric":
        names = []
        for row in props["metrics"]:
            names += re.findall(r'MetricName="([^"]+)"', row[0]["expression"])
        return "ContainerInsights: " + ", ".join(dict.fromkeys(names))
    query = props["query"]
    stats = query.split("| stats ", 1)[1] if "| stats " in query else query.split(" | ", 1)[1]
    return "Logs Insights: stats " + stats


def layout(body: dict) -> list[Box]:
    """Where each widget is and what it shows, from the dashboard body."""
    return [Box(w["x"], w["y"], w["width"], w["height"], w["properties"]["title"], w["type"], describe(w)) for w in body["widgets"]]


def draw(boxes: list[Box], path: str, title: str) -> None:
    from PIL import Image, ImageDraw, ImageFont  # pyright: ignore[reportMissingImports]  # Pillow: only `make dashboard-preview` installs it

    rows = max(b.y + b.height for b in boxes)
    width, height = DASHBOARD_GRID_WIDTH * UNIT_X + 2 * MARGIN, rows * UNIT_Y + 2 * MARGIN + 40
    img = Image.new("RGB", (width, height), (242, 243, 243))
    d = ImageDraw.Draw(img)
    head, body, small = ImageFont.load_default(size=18), ImageFont.load_default(size=14), ImageFont.load_default(size=11)
    d.text((MARGIN, 12), title, fill=(22, 25, 31), font=head)
    for b in boxes:
        x0, y0 = MARGIN + b.x * UNIT_X + 4, 40 + MARGIN + b.y * UNIT_Y + 4
        x1, y1 = x0 + b.width * UNIT_X - 8, y0 + b.height * UNIT_Y - 8
        d.rectangle((x0, y0, x1, y1), fill=(255, 255, 255), outline=(200, 203, 207))
        d.text((x0 + 10, y0 + 8), b.title, fill=(22, 25, 31), font=body)
        d.text((x0 + 10, y0 + 30), "metric graph" if b.kind == "metric" else "Logs Insights", fill=(0, 115, 187), font=small)
        for i, line in enumerate(textwrap.wrap(b.shows, width=int((x1 - x0) / 6.2))[:4]):
            d.text((x0 + 10, y0 + 48 + 15 * i), line, fill=(84, 91, 100), font=small)
        # the plot area, empty: this is a layout preview without data
        d.rectangle((x0 + 10, y1 - 70, x1 - 10, y1 - 10), outline=(225, 227, 230))
        d.text((x0 + 16, y1 - 46), "layout preview: no data", fill=(170, 175, 180), font=small)
    img.save(path, optimize=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Draw docs/dashboard.png, a layout preview of the CloudWatch dashboard.")
    ap.add_argument("--out", default="docs/dashboard.png")
    ap.add_argument("--cluster", default="training-dev")
    ap.add_argument("--region", default="us-west-2")
    args = ap.parse_args(argv)
    body = dashboard_body(cluster_name=args.cluster, region=args.region, training_namespaces=["training"], karpenter=True)
    draw(layout(body), args.out, f"CloudWatch dashboard {args.cluster}-training (layout preview from the dashboard definition, no data)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
