"""How routers trained: the per-step log of each `train-router` folder (``train_log.jsonl``) as one table and one
plot, so that a reader sees whether each category's ΩMSR had stopped moving when training ended.

- The batch ΩMSR of a step is that of its few rows (`elastic_bench.method.trainer.RouterObjective.record`): noisy, so
  the curves and the table show its trailing mean over `WINDOW` steps.
- The plot has one panel per category (ΩMSR against the step, one line per router, its target dashed) and one of the
  LM loss; the table gives the smoothed ΩMSR per category every ``every`` steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import seaborn as sns

from .plots import _draw

WINDOW = 20  # steps of the trailing mean


def read_logs(folders: dict[str, str | Path]) -> pd.DataFrame:
    """``{router name: train-router folder}`` → one row per (router, step, category): ``router``, ``step``,
    ``category``, ``omega_msr`` (the step's batch ΩMSR), ``smoothed`` (its trailing mean over `WINDOW` steps),
    ``target`` (from ``router_config.json``, where it is there) and ``lm_loss``.

    Raises:
        FileNotFoundError: a folder has no ``train_log.jsonl``.
    """
    rows = []
    for name, folder in folders.items():
        folder = Path(folder)
        log = folder / "train_log.jsonl"
        if not log.is_file():
            raise FileNotFoundError(f"{folder}: no train_log.jsonl (not a train-router folder)")
        config = folder / "router_config.json"
        targets = json.loads(config.read_text()).get("training", {}).get("targets", {}) if config.is_file() else {}
        for line in log.read_text().splitlines():
            record = json.loads(line)
            for category, omega in record.get("omega_msr", {}).items():
                rows.append({"router": name, "step": record["step"], "category": category, "omega_msr": omega,
                             "target": targets.get(category), "lm_loss": record.get("lm_loss")})
    frame = pd.DataFrame(rows).sort_values(["router", "category", "step"], ignore_index=True)
    frame["smoothed"] = frame.groupby(["router", "category"])["omega_msr"].transform(
        lambda s: s.rolling(WINDOW, min_periods=1).mean())
    return frame


def curve_table(frame: pd.DataFrame, every: int = 50) -> str:
    """Markdown: the smoothed ΩMSR of each router and category at steps ``every``, ``2·every``, … and the last."""
    last = frame["step"].max()
    steps = sorted({s for s in frame["step"].unique() if s % every == 0} | {last})
    picked = frame[frame["step"].isin(steps)]
    table = picked.pivot_table(index=["router", "category"], columns="step", values="smoothed")
    table.columns = [f"step {s}" for s in table.columns]
    return table.round(3).to_markdown()


def curves_png(frame: pd.DataFrame) -> bytes:
    """The plot of the module doc, as PNG bytes."""
    categories = sorted(frame["category"].unique())

    def paint(figure):
        axes = figure.subplots(1, len(categories) + 1)
        for ax, category in zip(axes, categories):
            part = frame[frame["category"] == category]
            sns.lineplot(data=part, x="step", y="smoothed", hue="router", ax=ax)
            for target, colour in zip(part.groupby("router")["target"].first(),
                                                sns.color_palette(n_colors=part["router"].nunique())):
                if target is not None and target == target:
                    ax.axhline(target, linestyle="--", linewidth=0.8, color=colour)
            ax.set(title=f"{category}: ΩMSR (mean of {WINDOW} steps)", ylim=(-0.02, 1.02), ylabel="ΩMSR")
        loss = frame.drop_duplicates(["router", "step"])
        sns.lineplot(data=loss.assign(lm_loss=loss.groupby("router")["lm_loss"].transform(
            lambda s: s.rolling(WINDOW, min_periods=1).mean())), x="step", y="lm_loss", hue="router", ax=axes[-1])
        axes[-1].set(title=f"LM loss (mean of {WINDOW} steps)", ylabel="loss")

    return _draw(4.2 * (len(categories) + 1), 3.6, paint)
