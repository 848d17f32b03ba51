"""The training curves of router folders: smoothed per-category ΩMSR as a table and a plot."""

from __future__ import annotations

import json

import pytest

from elastic_bench.reports.training_curves import WINDOW, curve_table, curves_png, read_logs


def _folder(path, omegas, target):
    path.mkdir()
    lines = [json.dumps({"step": i + 1, "lm_loss": 1.0, "omega_msr": {"sensitive": o, "robust": 1.0}})
             for i, o in enumerate(omegas)]
    (path / "train_log.jsonl").write_text("\n".join(lines) + "\n")
    (path / "router_config.json").write_text(json.dumps({"training": {"targets": {"sensitive": target,
                                                                                  "robust": 1.0}}}))
    return path


def test_curves_smooth_each_category_and_name_the_targets(tmp_path):
    omegas = [0.0] * 50 + [1.0] * 50
    frame = read_logs({"a": _folder(tmp_path / "a", omegas, 0.5)})
    sensitive = frame[frame["category"] == "sensitive"].set_index("step")
    assert sensitive.loc[50, "smoothed"] == 0.0 and sensitive.loc[50 + WINDOW, "smoothed"] == 1.0
    assert sensitive.loc[60, "smoothed"] == pytest.approx(10 / WINDOW)
    assert set(frame["target"]) == {0.5, 1.0}
    table = curve_table(frame, every=50)
    assert "step 50" in table and "step 100" in table and "| ('a', 'sensitive') |" in table
    assert curves_png(frame).startswith(b"\x89PNG")


def test_a_folder_without_a_log_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no train_log.jsonl"):
        read_logs({"x": tmp_path})
