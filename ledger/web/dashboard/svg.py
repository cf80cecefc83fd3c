"""Small server-rendered SVG charts (no JavaScript, no CDN). Numbers in, markup out."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from markupsafe import Markup, escape

ACCEPTED_COLOUR = "#2b6cb0"
FAILED_COLOUR = "#c53030"
PROJECTION_COLOUR = "#2f855a"
REFUSED_COLOUR = "#b7791f"
LATENCY_COLOUR = "#6b46c1"


def _polyline(values: Sequence[float], width: float, height: float, top: float,
              pad: float = 2.0) -> str:
    """Return the points attribute of a polyline scaled into the box."""
    if not values:
        return ""
    peak = top or 1.0
    step = (width - 2 * pad) / max(1, len(values) - 1)
    points = []
    for i, value in enumerate(values):
        x = pad + i * step
        y = height - pad - (height - 2 * pad) * (value / peak)
        points.append(f"{x:.1f},{y:.1f}")
    return " ".join(points)


def series_chart(points: Sequence[tuple[datetime, int, int]], *, width: int = 168,
                 height: int = 40, label: str = "") -> Markup:
    """Return a sparkline of accepted (blue) and failed (red) per hour, with its axes: the
    peak and 0 on the left, the first hour and now below."""
    title = escape(label)
    if not points or not any(a or f for _, a, f in points):
        return Markup(
            f'<svg class="spark" role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><title>{title}: no deliveries in the last 48 h'
            f'</title><text x="4" y="{height // 2 + 4}" class="axis">no deliveries in 48 h'
            f'</text></svg>')
    accepted = [float(a) for _, a, _ in points]
    failed = [float(f) for _, _, f in points]
    top = max(max(accepted), max(failed), 1.0)
    first, last = points[0][0], points[-1][0]
    summary = escape(f"{label}: {int(sum(accepted))} accepted, {int(sum(failed))} failed, "
                     f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC")
    left, plot_w, plot_h = 24, width - 24, height - 11
    shift = f'transform="translate({left},0)"'
    return Markup(
        f'<svg class="spark" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{summary}</title>'
        f'<text x="{left - 3}" y="8" text-anchor="end" class="axis">{int(top)}</text>'
        f'<text x="{left - 3}" y="{plot_h}" text-anchor="end" class="axis">0</text>'
        f'<line x1="{left}" y1="{plot_h}" x2="{width}" y2="{plot_h}" class="axis-line"/>'
        f'<text x="{left}" y="{height - 1}" class="axis">{first:%H:%M}</text>'
        f'<text x="{width}" y="{height - 1}" text-anchor="end" class="axis">now</text>'
        f'<polyline {shift} fill="none" stroke="{ACCEPTED_COLOUR}" stroke-width="1.5" '
        f'points="{_polyline(accepted, plot_w, plot_h, top)}"/>'
        f'<polyline {shift} fill="none" stroke="{FAILED_COLOUR}" stroke-width="1.5" '
        f'points="{_polyline(failed, plot_w, plot_h, top)}"/></svg>')


def _human_bytes(value: float) -> str:
    """Return a decimal byte count with a unit (kB, MB, GB, TB)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(value) < 1000 or unit == "PB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} PB"


def projection_chart(*, events_per_day: float, bytes_per_receipt: float,
                     retention_days: float, horizon_days: int | None = None,
                     width: int = 480, height: int = 180) -> Markup:
    """Return the retained-bytes projection: linear growth until retention, then flat."""
    horizon = horizon_days or max(2, int(retention_days * 2) or 2)
    values = [events_per_day * min(day, retention_days) * bytes_per_receipt
              for day in range(horizon + 1)]
    top = max(max(values), 1.0)
    left, bottom = 70, 24
    plot_w, plot_h = width - left - 10, height - bottom - 10
    line = _polyline(values, plot_w, plot_h, top, pad=0)
    retention_x = plot_w * min(retention_days, horizon) / horizon
    return Markup(
        f'<svg class="projection" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>Projected retained bytes over {horizon} days'
        f'</title><g transform="translate({left},10)">'
        f'<line x1="0" y1="{plot_h}" x2="{plot_w}" y2="{plot_h}" stroke="#999"/>'
        f'<line x1="0" y1="0" x2="0" y2="{plot_h}" stroke="#999"/>'
        f'<line x1="{retention_x:.1f}" y1="0" x2="{retention_x:.1f}" y2="{plot_h}" '
        f'stroke="#bbb" stroke-dasharray="4 3"/>'
        f'<polyline fill="none" stroke="{PROJECTION_COLOUR}" stroke-width="2" points="{line}"/>'
        f'<text x="-6" y="8" text-anchor="end" class="axis">{_human_bytes(top)}</text>'
        f'<text x="-6" y="{plot_h}" text-anchor="end" class="axis">0</text>'
        f'<text x="0" y="{plot_h + 16}" class="axis">day 0</text>'
        f'<text x="{retention_x:.1f}" y="{plot_h + 16}" text-anchor="middle" class="axis">'
        f'retention {round(retention_days, 1):g} d</text>'
        f'<text x="{plot_w}" y="{plot_h + 16}" text-anchor="end" class="axis">day {horizon}'
        f'</text></g></svg>')


def human_bytes(value: float) -> str:
    """Return a readable decimal byte count."""
    return _human_bytes(value)


def volume_bars(buckets: Sequence[tuple[datetime, int, int]], *, label: str,
                width: int = 336, height: int = 64, fmt: str = "%H:%M") -> Markup:
    """Return bars of accepted per bucket with the failed share in red, and a text title."""
    top = max([a for _, a, _ in buckets] + [1])
    slot = width / max(1, len(buckets))
    bars = []
    for i, (start, accepted, failed) in enumerate(buckets):
        x = i * slot + 1
        tall = (height - 14) * accepted / top
        red = (height - 14) * min(failed, accepted) / top
        when = f"{start:%Y-%m-%d}" + (f" {start:{fmt}}" if fmt else "")
        tip = escape(f"{when} UTC: {accepted} accepted, {failed} failed")
        bars.append(
            f'<g><title>{tip}</title>'
            f'<rect x="{x:.1f}" y="{height - 12 - tall:.1f}" width="{slot - 2:.1f}" '
            f'height="{tall:.1f}" fill="{ACCEPTED_COLOUR}"/>'
            f'<rect x="{x:.1f}" y="{height - 12 - red:.1f}" width="{slot - 2:.1f}" '
            f'height="{red:.1f}" fill="{FAILED_COLOUR}"/></g>')
    first = buckets[0][0] if buckets else None
    start_text = (f"{first:%m-%d}" + (f" {first:{fmt}}" if fmt else "")) if first else ""
    return Markup(
        f'<svg class="bars" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{escape(label)}</title>{"".join(bars)}'
        f'<text x="0" y="{height - 1}">{escape(start_text)}</text>'
        f'<text x="{width}" y="{height - 1}" text-anchor="end">now</text></svg>')


def value_bars(values: Sequence[tuple[datetime, float | None, str]], *, label: str,
               colour: str, width: int = 336, height: int = 48,
               fmt: str = "%H:%M") -> Markup:
    """Return one bar per bucket of `values` (start, value or None, tooltip text)."""
    finite = [v for _, v, _ in values if v is not None and v != float("inf")]
    top = max([*finite, 1.0])
    slot = width / max(1, len(values))
    bars = []
    for i, (start, value, text) in enumerate(values):
        x = i * slot + 1
        shown = top if value == float("inf") else (value or 0.0)
        tall = (height - 14) * shown / top
        when = f"{start:%Y-%m-%d}" + (f" {start:{fmt}}" if fmt else "")
        bars.append(
            f'<g><title>{escape(f"{when} UTC: {text}")}</title>'
            f'<rect x="{x:.1f}" y="{height - 12 - tall:.1f}" width="{slot - 2:.1f}" '
            f'height="{tall:.1f}" fill="{colour}"/></g>')
    return Markup(
        f'<svg class="bars" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{escape(label)}</title>{"".join(bars)}'
        f'<text x="0" y="{height - 1}">{escape(label)}</text></svg>')


def rate_chart(points: Sequence[tuple[datetime, int | None]], *, label: str, unit: str,
               width: int = 336, height: int = 96) -> Markup:
    """Return bars per bucket with a y axis (0 and the peak) and an x axis (start, now).

    A bucket whose value is unknown (None) is drawn as a gap with its own tooltip.
    """
    left, bottom = 34, 16
    plot_w, plot_h = width - left - 2, height - bottom - 4
    top = max([v for _, v in points if v is not None] + [1])
    slot = plot_w / max(1, len(points))
    bars = []
    for i, (start, value) in enumerate(points):
        x = left + i * slot + 1
        tip = escape(f"{start:%H:%M} UTC: " + (f"{value} {unit}" if value is not None
                                               else "not read (older than the sample)"))
        tall = plot_h * (value or 0) / top
        bars.append(f'<g><title>{tip}</title><rect x="{x:.1f}" y="{4 + plot_h - tall:.1f}" '
                    f'width="{max(slot - 2, 1):.1f}" height="{tall:.1f}" '
                    f'fill="{ACCEPTED_COLOUR if value is not None else "none"}"/></g>')
    first = f"{points[0][0]:%H:%M}" if points else ""
    return Markup(
        f'<svg class="rate" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><title>{escape(label)}</title>'
        f'<line x1="{left}" y1="4" x2="{left}" y2="{4 + plot_h}" class="axis-line"/>'
        f'<line x1="{left}" y1="{4 + plot_h}" x2="{width - 2}" y2="{4 + plot_h}" '
        f'class="axis-line"/>'
        f'<text x="{left - 4}" y="12" text-anchor="end" class="axis">{top}</text>'
        f'<text x="{left - 4}" y="{4 + plot_h}" text-anchor="end" class="axis">0</text>'
        f'{"".join(bars)}'
        f'<text x="{left}" y="{height - 2}" class="axis">{escape(first)}</text>'
        f'<text x="{width - 2}" y="{height - 2}" text-anchor="end" class="axis">now (UTC)</text>'
        f'</svg>')
