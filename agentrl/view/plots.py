"""Plots as inline SVG strings, computed in Python (no matplotlib): histograms and a per-step trend line.

Owns: binning (`bin_edges`, `histogram`) and drawing. A histogram shows fractions (not counts) so steps of different
sizes compare; the previous step, when given, is drawn as an outline over the same bins. Every string that reaches
the SVG is escaped; the output embeds directly into HTML.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

W, H = 320, 190
LEFT, RIGHT, TOP, BOTTOM = 42, 10, 34, 34
CURRENT_FILL = "#4c78a8"
PREVIOUS_STROKE = "#e45756"


def bin_edges(values: Sequence[float], bins: int = 20) -> list[float]:
    """Shared edges for a metric across all steps. Small integer ranges get one bin per integer."""
    if not values:
        return [0.0, 1.0]
    lo, hi = min(values), max(values)
    if all(float(v).is_integer() for v in values) and hi - lo <= 40:
        return [lo - 0.5 + k for k in range(int(hi - lo) + 2)]
    if hi == lo:
        return [lo - 0.5, hi + 0.5]
    step = (hi - lo) / bins
    return [lo + k * step for k in range(bins)] + [hi]


def histogram(values: Sequence[float], edges: Sequence[float]) -> list[float]:
    """Fraction of `values` in each bin (right edge inclusive for the last bin); values outside are dropped."""
    counts = [0] * (len(edges) - 1)
    lo, hi = edges[0], edges[-1]
    width = (hi - lo) / len(counts)
    uniform = all(abs((edges[k + 1] - edges[k]) - width) < 1e-9 * max(1.0, abs(width)) for k in range(len(counts)))
    for v in values:
        if v < lo or v > hi or math.isnan(v):
            continue
        k = min(int((v - lo) / width), len(counts) - 1) if uniform else _search(edges, v)
        counts[k] += 1
    n = len(values)
    return [c / n if n else 0.0 for c in counts]


def _search(edges: Sequence[float], v: float) -> int:
    for k in range(len(edges) - 1):
        if v < edges[k + 1]:
            return k
    return len(edges) - 2


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:.3g}" if abs(v) >= 1e5 else f"{v:.0f}"
    if abs(v) >= 10 or float(v).is_integer():
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def _x(edges: Sequence[float], v: float) -> float:
    span = (edges[-1] - edges[0]) or 1.0
    return LEFT + (v - edges[0]) / span * (W - LEFT - RIGHT)


def _y(frac: float, ymax: float) -> float:
    return TOP + (1 - frac / ymax) * (H - TOP - BOTTOM)


def _axes(edges: Sequence[float], ymax: float, title: str, xlabel: str) -> list[str]:
    base = H - BOTTOM
    parts = [f'<text x="{W / 2}" y="15" text-anchor="middle" class="t">{html.escape(title)}</text>',
             f'<line x1="{LEFT}" y1="{base}" x2="{W - RIGHT}" y2="{base}" class="ax"/>',
             f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}" class="ax"/>',
             f'<text x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end" class="l">{ymax:.0%}</text>',
             f'<text x="{LEFT - 4}" y="{base}" text-anchor="end" class="l">0</text>',
             f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 4}" text-anchor="middle" class="l">'
             f'{html.escape(xlabel)}</text>']
    for k, anchor in enumerate(("start", "middle", "middle", "middle", "end")):
        v = edges[0] + (edges[-1] - edges[0]) * k / 4
        parts.append(f'<text x="{_x(edges, v):.1f}" y="{base + 13}" text-anchor="{anchor}" class="l">{fmt(v)}</text>')
    return parts


def histogram_svg(values: Sequence[float], edges: Sequence[float], *, title: str, xlabel: str = "",
                  previous: Sequence[float] | None = None, labels: tuple[str, str] = ("this step", "previous")) -> str:
    """One histogram; `previous` (another sample over the same `edges`) is drawn as a red outline."""
    cur = histogram(values, edges)
    prev = histogram(previous, edges) if previous is not None else None
    ymax = max(cur + (prev or []) + [0.05])
    ymax = math.ceil(ymax * 20) / 20  # a round top: 5% steps
    parts = _axes(edges, ymax, title, xlabel)
    base = H - BOTTOM
    for k, frac in enumerate(cur):
        if frac > 0:
            x0, x1, y = _x(edges, edges[k]), _x(edges, edges[k + 1]), _y(frac, ymax)
            parts.append(f'<rect x="{x0 + 0.5:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 1, 0.5):.1f}" '
                         f'height="{base - y:.1f}" fill="{CURRENT_FILL}"><title>{fmt(edges[k])}..{fmt(edges[k + 1])}: '
                         f'{frac:.1%}</title></rect>')
    if prev is not None:
        pts = [f"{_x(edges, edges[0]):.1f},{base}"]
        for k, frac in enumerate(prev):
            y = _y(frac, ymax)
            pts += [f"{_x(edges, edges[k]):.1f},{y:.1f}", f"{_x(edges, edges[k + 1]):.1f},{y:.1f}"]
        pts.append(f"{_x(edges, edges[-1]):.1f},{base}")
        parts.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{PREVIOUS_STROKE}" stroke-width="1.5"/>')
        parts.append(_legend(labels))
    return _svg(parts, title)


def _legend(labels: tuple[str, str]) -> str:
    """One row between the title and the plot area, so it never covers a bar."""
    x, y = LEFT + 20, 20
    return (f'<rect x="{x}" y="{y}" width="9" height="9" fill="{CURRENT_FILL}"/>'
            f'<text x="{x + 13}" y="{y + 8}" class="l">{html.escape(labels[0])}</text>'
            f'<rect x="{x + 110}" y="{y}" width="9" height="9" fill="none" stroke="{PREVIOUS_STROKE}"/>'
            f'<text x="{x + 123}" y="{y + 8}" class="l">{html.escape(labels[1])}</text>')


def trend_svg(steps: Sequence[int], means: Sequence[float], *, title: str) -> str:
    """Mean of a metric per step as a line with points."""
    if not steps:
        return ""
    lo, hi = min(means), max(means)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    xs = [float(s) for s in steps] if len(steps) > 1 else [steps[0] - 0.5, steps[0] + 0.5]
    edges = [min(xs), max(xs)]
    span = hi - lo
    parts = _axes(edges, 1.0, title, "step")[:3]  # title + axes lines only: y labels are values, not fractions
    parts += [f'<text x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end" class="l">{fmt(hi)}</text>',
              f'<text x="{LEFT - 4}" y="{H - BOTTOM}" text-anchor="end" class="l">{fmt(lo)}</text>',
              f'<text x="{LEFT}" y="{H - BOTTOM + 13}" class="l">{steps[0]}</text>',
              f'<text x="{W - RIGHT}" y="{H - BOTTOM + 13}" text-anchor="end" class="l">{steps[-1]}</text>']
    pts = [(_x(edges, float(s)), _y((m - lo) / span, 1.0)) for s, m in zip(steps, means)]
    parts.append('<polyline points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                 + f'" fill="none" stroke="{CURRENT_FILL}" stroke-width="1.5"/>')
    parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{CURRENT_FILL}"><title>step {s}: {fmt(m)}</title>'
              f'</circle>' for (x, y), s, m in zip(pts, steps, means)]
    return _svg(parts, title)


def _svg(parts: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
            f'role="img" aria-label="{html.escape(title)}">' + "".join(parts) + "</svg>")
