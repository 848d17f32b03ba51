"""A comparison's plots, as PNG bytes (matplotlib's Agg canvas and seaborn, one style for all).

Design decisions:
- No pyplot and no global state: each plot is a `matplotlib.figure.Figure` drawn under `STYLE` (``rc_context``) and
  saved to PNG; nothing opens a window or changes another caller's settings.
- Each configuration keeps one colour and one marker in every plot of a comparison; names are in a legend beside
  the axes, never written over the points, so no label hides another.
- Frontiers join the non-dominated points (`summary.pareto_front`) in increasing x; the routing map of a method whose
  per-head modes change from prompt to prompt (a router) is the fraction of prompts routed FULL per layer × KV head,
  one panel per task category.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from .summary import AXES, Comparison, Config
from .tables import cell_frame, slug

STYLE = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook", font_scale=0.85),
         "savefig.dpi": 110, "figure.dpi": 110, "legend.frameon": False}
"""The one style of every plot (seaborn's whitegrid, notebook context)."""
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*", "h", "<", ">", "p")
FULL = 0  # kernels.plan.Mode.FULL: the decisions' code of a head computed in full


@dataclass
class Plot:
    """One plot: ``id`` (file stem and anchor), ``title``, ``caption`` and the ``png`` bytes."""

    id: str
    title: str
    caption: str
    png: bytes


def colours(comparison: Comparison) -> dict[str, tuple]:
    """One colour per configuration label (seaborn's colorblind palette; husl beyond ten)."""
    labels = [c.label for c in comparison.configs]
    palette = sns.color_palette("colorblind" if len(labels) <= 10 else "husl", len(labels))
    return dict(zip(labels, palette))


def _draw(width: float, height: float, paint) -> bytes:
    """A ``width`` × ``height`` inch figure painted by ``paint(fig)`` under `STYLE`, as PNG bytes."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height), layout="constrained")
        paint(fig)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _legend(ax) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def frontier(comparison: Comparison, axis: str, key: str) -> Plot:
    """Mean score (y) against ``axis`` (x: ``omega_esr`` or ``speedup``), one marker per configuration, the Pareto
    frontier joined."""
    palette = colours(comparison)
    front = next(f.labels for f in comparison.frontiers if f.axis == axis)
    by_label = {c.label: c for c in comparison.configs}

    def paint(fig):
        ax = fig.add_subplot()
        for i, c in enumerate(comparison.configs):
            x = getattr(c, axis)
            if x is None or np.isnan(x) or np.isnan(c.score):
                continue
            ax.scatter([x], [c.score], s=90 if c.label in front else 55, color=palette[c.label],
                       marker=MARKERS[i % len(MARKERS)], edgecolor="black" if c.label in front else "white",
                       linewidth=1.2, label=c.label, zorder=3)
        xs = [getattr(by_label[name], axis) for name in front]
        ys = [by_label[name].score for name in front]
        ax.plot(xs, ys, color="black", linestyle="--", linewidth=1.2, label="Pareto frontier", zorder=2)
        ax.set_xlabel(AXES[axis])
        ax.set_ylabel("mean score (%)")
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), max(100.0, ax.get_ylim()[1]) + 2)
        _legend(ax)

    title = f"Pareto frontier, score vs {AXES[axis]}"
    caption = f"{title}; the frontier (dashed) joins {' → '.join(front) or 'no configuration'}."
    return Plot(f"{key}-frontier-{axis.replace('_', '-')}", title, caption, _draw(8, 4.2, paint))


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
            ax.set_title(f"{category} ({len(by_category[category])} prompts)")
            ax.set_xlabel("KV head")
            ax.set_ylabel("layer" if k == 0 else "")
        fig.suptitle(f"{config.label}: fraction of prompts routed FULL")

    width = min(16, 1.5 + len(categories) * max(2.5, 0.45 * heads + 1))
    png = _draw(width, min(12, 1.2 + 0.32 * layers + 0.8), paint)
    return Plot(f"{key}-routing-{index}", f"Routing map of {config.label}",
                f"{config.label}: the fraction of prompts whose prefill computed each KV head FULL (layer × KV head), "
                "per task category.", png)


def length_curves(comparison: Comparison, benchmark: str, key: str) -> Plot | None:
    """Mean score over a benchmark's tasks against the length, one line per configuration (None for one length)."""
    frame = cell_frame(comparison)
    frame = frame[frame["benchmark"] == benchmark]
    if frame["length"].nunique() < 2:
        return None
    means = frame.groupby(["label", "length", "task"])["score"].mean().groupby(["label", "length"]).mean()
    palette = colours(comparison)
    markers = {label: MARKERS[i % len(MARKERS)] for i, label in enumerate(palette)}

    def paint(fig):
        ax = fig.add_subplot()
        sns.lineplot(data=means.reset_index(), x="length", y="score", hue="label", style="label",
                     hue_order=list(palette), style_order=list(palette), palette=palette, markers=markers,
                     dashes=False, ax=ax)
        lengths = sorted(frame["length"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel("mean score (%)")
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), max(100.0, ax.get_ylim()[1]) + 2)
        _legend(ax)

    return Plot(f"{key}-{slug(benchmark)}-length", f"{benchmark}: score vs length",
                f"{benchmark}: mean score over its tasks at each length.", _draw(8, 4.2, paint))
