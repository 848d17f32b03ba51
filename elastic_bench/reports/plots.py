"""A comparison's plots, as PNG bytes (matplotlib's Agg canvas and seaborn, one style for all).

Design decisions:
- No pyplot and no global state: each plot is a `matplotlib.figure.Figure` drawn under `STYLE` (``rc_context``) and
  saved to PNG; nothing opens a window or changes another caller's settings.
- Each configuration keeps one colour and one marker in every plot of a comparison (`styles`): each method its own
  hue, far from the others' (``full`` dark grey), its configurations shades of that hue, and every configuration its
  own marker, so two configurations never look alike even where colours are hard to tell apart.
- Score points carry their 95% interval (`summary.sample_interval`: the cluster bootstrap of the per-sample scores,
  items resampled whole across lengths) and their label beside
  them, placed where it covers no other label or point (`_label_points`); points that (nearly) coincide are drawn side
  by side, so none hides another. The legend beside the axes keys every colour and marker.
- Score axes span the data and their intervals (not 0-100): a band of 98-100 fills the plot.
- Frontiers join the non-dominated points (`summary.pareto_front`) in increasing x; the routing map of a method whose
  per-head modes change from prompt to prompt (a router) is the fraction of prompts routed FULL per layer × KV head,
  one panel per task category.
"""

from __future__ import annotations

import colorsys
import io
import math
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox, ScaledTranslation

from .benchmarks import benchmark_of
from .summary import AXES, BASELINE, Comparison, Config, sample_interval
from .tables import cell_frame, slug

STYLE = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook", font_scale=0.85),
         "savefig.dpi": 110, "figure.dpi": 110, "legend.frameon": False}
"""The one style of every plot (seaborn's whitegrid, notebook context)."""
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*", "h", "<", ">", "p")
HUES = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22")
"""One hue per method (tab10 without its grey): no two alike, the baseline ``full`` apart in dark grey."""
BASELINE_HUE = "#404040"
FULL = 0  # kernels.plan.Mode.FULL: the decisions' code of a head computed in full
NEAR = (0.03, 0.05)  # points closer than these fractions of the axes (x, y) are drawn side by side
SIDE_BY_SIDE = 12.0  # points between markers drawn side by side
BAND, WIDE = 5.0, 15.0  # scores spread over more than WIDE points: a second panel zooms on those within BAND of best


@dataclass
class Plot:
    """One plot: ``id`` (file stem and anchor), ``title``, ``caption`` and the ``png`` bytes."""

    id: str
    title: str
    caption: str
    png: bytes

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels, read from the PNG's header chunk."""
        return int.from_bytes(self.png[16:20], "big"), int.from_bytes(self.png[20:24], "big")


def styles(comparison: Comparison) -> dict[str, tuple[tuple, str]]:
    """(colour, marker) of each configuration label: a hue per method (`HUES`, cycled beyond nine methods), shades of
    it from dark to light for the configurations of one method, and a marker per configuration (`MARKERS`)."""
    methods = list(dict.fromkeys(c.method_name for c in comparison.configs if c.method_name != BASELINE))
    found = {}
    for name in [BASELINE, *methods]:
        mine = [c for c in comparison.configs if c.method_name == name]
        hue = BASELINE_HUE if name == BASELINE else HUES[methods.index(name) % len(HUES)]
        h, light, sat = colorsys.rgb_to_hls(*to_rgb(hue))
        shades = [light] if len(mine) == 1 else np.linspace(max(0.2, light - 0.15), min(0.75, light + 0.2), len(mine))
        for c, shade in zip(mine, shades):
            found[c.label] = colorsys.hls_to_rgb(h, float(shade), sat)
    return {c.label: (found[c.label], MARKERS[i % len(MARKERS)]) for i, c in enumerate(comparison.configs)}


def colours(comparison: Comparison) -> dict[str, tuple]:
    """The colour of each configuration label (`styles`), in the comparison's order."""
    return {label: colour for label, (colour, _) in styles(comparison).items()}


def _score_limits(lows: list[float], highs: list[float]) -> tuple[float, float]:
    """A score axis spanning ``[min(lows), max(highs)]`` with a margin (at least 2 points wide), within -1..101."""
    low, high = min(lows), max(highs)
    pad = max(high - low, 2.0) * 0.08
    return max(low - pad, -1.0), min(high + pad, 101.0)


def _shifted(ax, points: float):
    """``ax``'s data transform moved ``points`` (1/72 inch) to the right."""
    return ax.transData + ScaledTranslation(points / 72, 0, ax.figure.dpi_scale_trans)


def _side_by_side(xs: list[float], ys: list[float], limits: tuple[tuple, tuple]) -> list[float]:
    """A horizontal shift in points for each point, spreading each group of points that lie within `NEAR` of each
    other (as fractions of the axes ``limits``) side by side, in their order."""
    (x0, x1), (y0, y1) = limits
    fx = [(x - x0) / ((x1 - x0) or 1) for x in xs]
    fy = [(y - y0) / ((y1 - y0) or 1) for y in ys]
    group = list(range(len(xs)))
    for i in range(len(xs)):
        for j in range(i):
            if abs(fx[i] - fx[j]) < NEAR[0] and abs(fy[i] - fy[j]) < NEAR[1]:
                group[i] = group[j]
                break
    shifts = []
    for i, g in enumerate(group):
        members = [k for k, h in enumerate(group) if h == g]
        shifts.append((members.index(i) - (len(members) - 1) / 2) * SIDE_BY_SIDE)
    return shifts


# Label positions tried in turn: (x, y) offset in points, horizontal alignment.
_SPOTS = [(9 * side, dy, "left" if side > 0 else "right") for dy in (0, 11, -11, 22, -22, 33, -33) for side in (1, -1)]


def _label_points(ax, points: list[tuple[float, float, float, str]]) -> None:
    """Write each label beside its point ``(x, y, shift in points, label)``: at the first of `_SPOTS` where it stays
    inside the axes and covers no label or point already there (the first spot when none is free), joined to its
    point by a thin line when set above or below it. The figure's layout must be final (drawn once)."""
    renderer = ax.figure.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    size = 6 * ax.figure.dpi / 72  # half a marker
    taken = []
    for x, y, shift, _ in points:
        px, py = _shifted(ax, shift).transform((x, y))
        taken.append(Bbox([[px - size, py - size], [px + size, py + size]]))

    def write(x, y, shift, label, dx, dy, ha):
        text = ax.annotate(label, (x, y), xycoords=_shifted(ax, shift), xytext=(dx, dy), textcoords="offset points",
                           ha=ha, va="center", fontsize=7.5, zorder=4,
                           arrowprops={"arrowstyle": "-", "color": "0.6", "linewidth": 0.6} if dy else None)
        text.update_positions(renderer)
        return text, Text.get_window_extent(text, renderer)  # the words alone, not the line to the point

    for x, y, shift, label in points:
        for spot in _SPOTS:
            text, box = write(x, y, shift, label, *spot)
            if inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1) and not any(
                    box.overlaps(t) for t in taken):
                break
            text.remove()
        else:
            text, box = write(x, y, shift, label, *_SPOTS[0])
        taken.append(box)


def _draw(width: float, height: float, paint) -> bytes:
    """A ``width`` × ``height`` inch figure painted by ``paint(fig)`` under `STYLE`, as PNG bytes."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasAgg(fig)
        paint(fig)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _legend(ax) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _interval(c: Config) -> tuple[float, float]:
    """The bar of a configuration's mean score: its 95% interval (the point alone without one)."""
    found = c.score_interval
    if found is None or not math.isfinite(found.low):
        return c.score, c.score
    return min(found.low, c.score), max(found.high, c.score)


def _zooms(bars: list[tuple[float, float]], band: list[tuple[float, float]]) -> bool:
    """Whether a panel of the ``band`` of bars (``(low, high)`` of the scores near the best) shows them larger than a
    panel of all ``bars``: when the scores spread over more than `WIDE` points, the band's axis would span at most
    half of the whole axis, and the band holds something to tell apart (not every bar one and the same score, e.g.
    all at 100, which a zoom would draw alone on an axis of 99.85-100.15)."""
    whole, near = _score_limits(*zip(*bars)), _score_limits(*zip(*band))
    spread = max(high for _, high in bars) - min(low for low, _ in bars)
    flat = max(high for _, high in band) == min(low for low, _ in band)
    return spread > WIDE and not flat and near[1] - near[0] <= (whole[1] - whole[0]) / 2


def _score_panel(ax, configs: list[Config], axis: str, look: dict, front: list[Config]) -> list[tuple]:
    """Mean scores with their intervals against ``axis`` on ``ax``, side by side where they meet, the frontier
    joined; the points to label, ``(x, y, shift, label)``."""
    xs, bars = [getattr(c, axis) for c in configs], [_interval(c) for c in configs]
    x0, x1 = min(xs), max(xs)
    pad = max(x1 - x0, 0.1) * 0.06
    limits = ((x0 - pad, x1 + pad), _score_limits([b[0] for b in bars], [b[1] for b in bars]))
    ax.set_xlim(*limits[0])
    ax.set_ylim(*limits[1])
    shifts = _side_by_side(xs, [c.score for c in configs], limits)
    for c, x, (low, high), shift in zip(configs, xs, bars, shifts):
        colour, marker = look[c.label]
        moved = _shifted(ax, shift)
        ax.plot([x, x], [low, high], color=colour, linewidth=1.3, marker="_", markersize=7, transform=moved, zorder=2)
        ax.scatter([x], [c.score], s=80 if c in front else 50, color=colour, marker=marker, label=c.label, zorder=3,
                   edgecolor="black" if c in front else "white", linewidth=1.1, transform=moved)
    ax.plot([getattr(c, axis) for c in front], [c.score for c in front], color="black", linestyle="--", linewidth=1.0,
            label="Pareto frontier", zorder=1)
    ax.set_xlabel(AXES[axis])
    return [(x, c.score, shift, c.label) for c, x, shift in zip(configs, xs, shifts)]


def frontier(comparison: Comparison, axis: str, key: str) -> Plot:
    """Mean score (y, with its 95% interval) against ``axis`` (x: ``omega_esr`` or ``speedup``), one labelled marker
    per configuration, the Pareto frontier joined; where the scores spread over more than `WIDE` points, a second
    panel zooms on the configurations within `BAND` points of the best."""
    look = styles(comparison)
    by_label = {c.label: c for c in comparison.configs}
    front = [by_label[name] for name in next(f.labels for f in comparison.frontiers if f.axis == axis)]
    shown = [c for c in comparison.configs if getattr(c, axis) is not None and math.isfinite(getattr(c, axis))
             and math.isfinite(c.score)]
    best = max((c.score for c in shown), default=math.nan)
    band = [c for c in shown if c.score >= best - BAND]
    zoom = bool(shown) and len(band) > 1 and _zooms([_interval(c) for c in shown], [_interval(c) for c in band])

    def paint(fig):
        axes = fig.subplots(1, 2 if zoom else 1, squeeze=False)[0]
        if not shown:
            return
        labels = [(axes[0], _score_panel(axes[0], shown, axis, look, front))]
        axes[0].set_ylabel("mean score (%), 95% interval")
        if zoom:
            labels[0] = (axes[0], [p for p, c in zip(labels[0][1], shown) if c not in band])
            labels.append((axes[1], _score_panel(axes[1], band, axis, look, [c for c in front if c in band])))
            axes[1].set_title(f"zoom: within {BAND:g} points of the best", fontsize=9)
            axes[0].axhspan(*axes[1].get_ylim(), color="0.9", zorder=0)
        axes[-1].legend(*axes[0].get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        borderaxespad=0.0)
        fig.canvas.draw()  # the layout, final before the labels are placed
        for ax, points in labels:
            _label_points(ax, points)

    title = f"Pareto frontier, score vs {AXES[axis]}"
    caption = (f"{title}; the frontier (dashed) joins {' → '.join(c.label for c in front) or 'no configuration'}. "
               "Bars: 95% bootstrap intervals of the mean score over the per-sample scores; points that coincide are "
               "drawn side by side" + ("; the right panel zooms on the shaded band." if zoom else "."))
    return Plot(f"{key}-frontier-{axis.replace('_', '-')}", title, caption,
                _draw(15 if zoom else 9, 5.2 if zoom else 4.8, paint))


def _bars(data: pd.DataFrame, x: str, y: str, comparison: Comparison, xlabel: str, ylabel: str) -> bytes:
    palette = colours(comparison)

    def paint(fig):
        ax = fig.add_subplot()
        sns.barplot(data=data, x=x, y=y, hue="label", hue_order=list(palette), palette=palette, ax=ax,
                    errorbar=None)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 1.05)
        if data[x].nunique() * max(len(str(v)) for v in data[x]) > 60:  # long names side by side would touch
            ax.tick_params(axis="x", labelrotation=25)
        _legend(ax)

    return _draw(max(8, 1.2 * data[x].nunique() + 4), 4.2, paint)


def sparsity_by_category(comparison: Comparison, key: str) -> Plot:
    """ΩMSR per task category per configuration (the adaptive-sparsity table as bars)."""
    frame = cell_frame(comparison)
    means = frame.groupby(["label", "category", "task"])["omega_msr"].mean().groupby(["label", "category"]).mean()
    png = _bars(means.reset_index(), "category", "omega_msr", comparison, "task category", "ΩMSR")
    return Plot(f"{key}-msr-by-category", "Adaptive sparsity: ΩMSR per task category",
                "ΩMSR (fraction of heads sparse) per task category: a router that adapts is sparser on robust "
                "tasks than on sensitive ones.", png)


def sparsity_by_task(comparison: Comparison, key: str) -> Plot:
    """ΩMSR per task per configuration (mean over the lengths)."""
    frame = cell_frame(comparison)
    means = frame.groupby(["label", "task"])["omega_msr"].mean().reset_index()
    png = _bars(means, "task", "omega_msr", comparison, "task", "ΩMSR")
    return Plot(f"{key}-msr-by-task", "ΩMSR per task", "ΩMSR per task and configuration (mean over the lengths).",
                png)


def routing_map(comparison: Comparison, config: Config, key: str, index: int) -> Plot:
    """Fraction of prompts whose prefill ran each KV head FULL, layers × KV heads, one panel per task category."""
    by_category: dict[str, list[np.ndarray]] = {}
    for (task, _), cell in config.cells.items():
        category = comparison.category(task)
        for sample in cell.samples:
            if sample.decisions is not None:
                by_category.setdefault(sample.category or category, []).append(np.array(sample.decisions) == FULL)
    categories = sorted(by_category)
    maps = {c: np.mean(by_category[c], axis=0) for c in categories}
    layers, heads = next(iter(maps.values())).shape
    annotate = layers * heads <= 96

    def paint(fig):
        axes = fig.subplots(1, len(categories), squeeze=False, sharey=True)[0]
        for k, (ax, category) in enumerate(zip(axes, categories)):
            sns.heatmap(maps[category], vmin=0, vmax=1, cmap="rocket_r", annot=annotate, fmt=".2f", square=False,
                        cbar=k == len(categories) - 1, cbar_kws={"label": "fraction of prompts FULL"}, ax=ax,
                        linewidths=0.5, linecolor="white")
            ax.set_title(f"{category}\n{len(by_category[category])} prompts", fontsize="medium")
            ax.set_xlabel("KV head")
            ax.set_ylabel("layer" if k == 0 else "")
        fig.suptitle(f"{config.label}: fraction of prompts routed FULL")

    width = min(16, 1.5 + len(categories) * max(2.5, 0.45 * heads + 1))
    png = _draw(width, min(12, 1.2 + 0.32 * layers + 0.8), paint)
    return Plot(f"{key}-routing-{index}", f"Routing map of {config.label}",
                f"{config.label}: the fraction of prompts whose prefill computed each KV head FULL (layer × KV head), "
                "per task category.", png)


def length_curves(comparison: Comparison, benchmark: str, key: str) -> Plot | None:
    """The benchmark's score (its protocol's mean over its tasks) against the length, with its 95% interval, one line
    per configuration (None for one length)."""
    frame = cell_frame(comparison)
    frame = frame[frame["benchmark"] == benchmark]
    if frame["length"].nunique() < 2:
        return None
    bench = comparison.protocol.benchmark(benchmark)
    lengths = sorted(frame["length"].unique())
    look = styles(comparison)
    curves = []  # (config, means [n], lows [n], highs [n]) over `lengths`
    for c in comparison.configs:
        ys, lows, highs = [], [], []
        for n in lengths:
            keys = [(task, m) for task, m in c.cells if m == n and benchmark_of(task).name == benchmark]
            found = sample_interval(c, "score", keys, weights={k: bench.weight(k[0]) for k in keys})
            y = bench.task_mean({task: c.cells[(task, n)].score for task, _ in keys})
            ys.append(y)
            lows.append(min(y, found.low) if math.isfinite(found.low) else y)
            highs.append(max(y, found.high) if math.isfinite(found.high) else y)
        curves.append((c, ys, lows, highs))

    lows_all = [v for *_, lows, _ in curves for v in lows]
    highs_all = [v for *_, highs in curves for v in highs]
    best = max(v for _, ys, _, _ in curves for v in ys)
    near = [(max(low, best - BAND), high) for low, high in zip(lows_all, highs_all) if high >= best - BAND]
    zoom = _zooms(list(zip(lows_all, highs_all)), near)

    def panel(ax, limits: tuple[float, float]) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xlim(lengths[0] / 2**0.3, lengths[-1] * 2**0.3)
        ax.set_ylim(*limits)
        for i, (c, ys, lows, highs) in enumerate(curves):
            colour, marker = look[c.label]
            dodge = 2 ** ((i - (len(curves) - 1) / 2) * 0.025)  # side by side where lines meet
            ax.errorbar([n * dodge for n in lengths], ys, yerr=[np.subtract(ys, lows), np.subtract(highs, ys)],
                        color=colour, marker=marker, markersize=7, markeredgecolor="white", markeredgewidth=0.6,
                        linewidth=1.4, capsize=3, label=c.label)
        ax.set_xticks(lengths, [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("length (tokens)")

    def paint(fig):
        axes = fig.subplots(1, 2 if zoom else 1, squeeze=False)[0]
        panel(axes[0], _score_limits(lows_all, highs_all))
        axes[0].set_ylabel("mean score (%), 95% interval")
        if zoom:
            panel(axes[1], _score_limits(*zip(*near)))
            axes[1].set_title(f"zoom: within {BAND:g} points of the best", fontsize=9)
            axes[0].axhspan(*axes[1].get_ylim(), color="0.9", zorder=0)
        axes[-1].legend(*axes[0].get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        borderaxespad=0.0)

    return Plot(f"{key}-{slug(benchmark)}-length", f"{benchmark}: score vs length",
                f"{benchmark}: score at each length ({comparison.protocol.name} protocol: "
                f"{'equal' if bench.task_weights is None else 'item-weighted'} mean over its tasks); bars: 95% "
                "bootstrap intervals over the per-sample scores"
                + ("; the right panel zooms on the shaded band." if zoom else "."),
                _draw(15 if zoom else 9, 5.2 if zoom else 4.6, paint))
