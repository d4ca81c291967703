"""Inline SVG charts for the dashboard: plain functions from numbers to markup, no JavaScript and no
network, so the page renders offline and a test can count what was drawn.

Every data mark carries class "mark" and a <title> that the browser shows as a tooltip.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 920, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 44
PALETTE = ("#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00", "#b82e2e")

# Bucket widths for time axes, smallest first; the chart takes the first giving at most MAX_BUCKETS.
BUCKETS_MS = tuple(
    s * 1000 for s in (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)
)
MAX_BUCKETS = 60


def bucket_ms(first_ms: int, last_ms: int) -> int:
    """The bucket width that shows [first_ms, last_ms] in at most MAX_BUCKETS bars."""
    span = max(last_ms - first_ms, 1)
    return next((b for b in BUCKETS_MS if span / b <= MAX_BUCKETS), BUCKETS_MS[-1])


def time_label(ms: int, width_ms: int) -> str:
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    if width_ms >= 86_400_000:
        return t.strftime("%Y-%m-%d")
    return t.strftime("%m-%d %H:%M" if width_ms >= 3_600_000 else "%H:%M:%S")


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _legend(names: Sequence[str]) -> tuple[list[str], int]:
    """Legend entries in rows below the plot; returns the markup and the extra height the rows need."""
    parts, x, row = [], LEFT, 0
    for i, name in enumerate(names):
        width = 24 + 8 * len(name)  # 11px capitals are about 8px wide
        if x > LEFT and x + width > WIDTH - RIGHT:
            x, row = LEFT, row + 1
        y = HEIGHT - 14 + 16 * row
        parts.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{color(i)}"/>')
        parts.append(f'<text class="legend" x="{x + 14}" y="{y + 9}">{escape(name)}</text>')
        x += width
    return parts, 16 * row


def _frame(title: str, body: list[str], y_max: float, y_label: str, legend: Sequence[str]) -> str:
    plot_h = HEIGHT - TOP - BOTTOM
    legend_parts, extra = _legend(legend)
    height = HEIGHT + extra
    parts = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}"/>',
        f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}"/>',
    ]
    for frac in (0.0, 0.5, 1.0):
        y = TOP + plot_h * (1 - frac)
        value = y_max * frac
        text = f"{value:,.0f}" if y_max >= 10 or value == int(value) else f"{value:.1f}"
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{text}</text>')
    parts.append(
        f'<text class="label" x="14" y="{TOP + plot_h / 2:.0f}" transform="rotate(-90 14 {TOP + plot_h / 2:.0f})" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    parts += body + legend_parts
    parts.append("</svg>")
    return "\n".join(parts)


def empty(title: str, message: str) -> str:
    return (
        f'<svg class="chart empty" role="img" aria-label="{escape(title)}" viewBox="0 0 {WIDTH} 60" width="{WIDTH}" '
        f'height="60" xmlns="http://www.w3.org/2000/svg"><text x="{LEFT}" y="34">{escape(message)}</text></svg>'
    )


def stacked_bars(
    title: str, categories: Sequence[str], series: Mapping[str, Sequence[int]], y_label: str = "count"
) -> str:
    """One bar per category, stacked by series (a series holds one value per category)."""
    totals = [sum(values[i] for values in series.values()) for i in range(len(categories))]
    if not categories or not any(totals):
        return empty(title, "no data")
    y_max = max(totals)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / len(categories)
    bar_w = max(slot * 0.8, 1.0)
    every = max(1, round(len(categories) / 10))  # about ten x labels
    body = []
    for i, category in enumerate(categories):
        x = LEFT + i * slot + (slot - bar_w) / 2
        base = 0.0
        for s, (name, values) in enumerate(series.items()):
            if not values[i]:
                continue
            h = plot_h * values[i] / y_max
            y = TOP + plot_h - base - h
            tip = escape(f"{category} · {name}: {values[i]:,}")
            body.append(
                f'<rect class="mark" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{color(s)}"><title>{tip}</title></rect>'
            )
            base += h
        if i % every == 0:
            cx, cy = x + bar_w / 2, TOP + plot_h + 14
            body.append(f'<text class="tick" x="{cx:.1f}" y="{cy}" text-anchor="middle">{escape(category)}</text>')
    return _frame(title, body, y_max, y_label, list(series) if len(series) > 1 else [])


def lines(title: str, categories: Sequence[str], series: Mapping[str, Sequence[int]], y_label: str = "count") -> str:
    """One line per series over the categories (time buckets), a point per value; a series of zeros lies flat
    on the axis, where a broker that takes no writes shows."""
    if not categories or not series:
        return empty(title, "no data")
    y_max = max(max(values) for values in series.values()) or 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(categories) - 1, 1)
    every = max(1, round(len(categories) / 10))
    body = []
    for s, (name, values) in enumerate(series.items()):
        points = [(LEFT + i * step, TOP + plot_h * (1 - v / y_max)) for i, v in enumerate(values)]
        body.append(f'<polyline fill="none" stroke="{color(s)}" stroke-width="2" '
                    f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in points)}"/>')  # fmt: skip
        body += [
            f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color(s)}">'
            f"<title>{escape(f'{categories[i]} · {name}: {values[i]:,}')}</title></circle>"
            for i, (x, y) in enumerate(points)
        ]
    for i in range(0, len(categories), every):
        body.append(f'<text class="tick" x="{LEFT + i * step:.1f}" y="{TOP + plot_h + 14}" text-anchor="middle">'
                    f"{escape(categories[i])}</text>")  # fmt: skip
    return _frame(title, body, y_max, y_label, list(series))


def timeline(
    title: str, lanes: Sequence[str], points: Sequence[tuple[int, int, float, str]], x_range: tuple[int, int]
) -> str:
    """Points (time ms, lane index, size, tooltip) on one horizontal lane per name; area ~ size."""
    if not lanes or not points:
        return empty(title, "no data")
    lane_h = 26
    height = TOP + lane_h * len(lanes) + BOTTOM
    left = LEFT + 8 * max(len(lane) for lane in lanes)
    plot_w = WIDTH - left - RIGHT
    first, last = x_range
    span = max(last - first, 1)
    biggest = max(p[2] for p in points) or 1.0
    parts = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, lane in enumerate(lanes):
        y = TOP + lane_h * i + lane_h / 2
        parts.append(f'<line class="grid" x1="{left}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{y + 4}" text-anchor="end">{escape(lane)}</text>')
    for ms, row, size, tip in points:
        x = left + plot_w * (ms - first) / span
        y = TOP + lane_h * row + lane_h / 2
        r = 3 + 8 * (size / biggest) ** 0.5
        parts.append(
            f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{color(1)}" fill-opacity="0.7">'
            f"<title>{escape(tip)}</title></circle>"
        )
    width_ms = bucket_ms(first, last)
    for frac in (0.0, 0.5, 1.0):
        ms = int(first + span * frac)
        x = left + plot_w * frac
        anchor = ("start", "middle", "end")[int(frac * 2)]
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{height - BOTTOM + 18}" text-anchor="{anchor}">'
            f"{escape(time_label(ms, width_ms))}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
