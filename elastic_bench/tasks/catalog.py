"""Every benchmark elastic-bench knows: its registered tasks (by name prefix), upstream, data and licence; and the
benchmarks or parts of them that are public but not registered, with the reason. ``elastic-bench tasks`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    """One benchmark.

    Attributes:
        name: as the papers write it.
        prefix: the registered task names that start with it (None: not registered).
        upstream: the code and data it reproduces.
        licence: the licences of its data (and of the files shipped in `data/`).
        note: for a benchmark or part not registered, why.
    """

    name: str
    prefix: str | None
    upstream: str
    licence: str
    note: str = ""


BENCHMARKS = (
    Benchmark("RULER", "ruler_", "NVIDIA/RULER (generated locally)",
              "code and configuration Apache-2.0; SQuAD and HotpotQA CC BY-SA 4.0; Paul Graham's essays as "
              "RULER's script fetches them"),
    Benchmark("RULER v2", "ruler2_", "NVIDIA-NeMo/Skills branch chsieh/ruler2 (generated locally: MMLU, HotpotQA)",
              "code Apache-2.0; MMLU MIT (cais/mmlu); HotpotQA CC BY-SA 4.0"),
    Benchmark("LongBench-E", "longbench_e_", "THUDM/LongBench data.zip", "MIT (THUDM/LongBench)"),
    Benchmark("LongBench-v2", "longbench_v2", "THUDM/LongBench-v2 data.json", "MIT (THUDM/LongBench)"),
    Benchmark("LongBench Pro", "longbench_pro", "caskcsg/LongBench-Pro longbench_pro.json",
              "Apache-2.0 (dataset card)"),
    Benchmark("LongBench", "longbench_", "THUDM/LongBench data.zip", "MIT (THUDM/LongBench)"),
    Benchmark("NoLiMa", "nolima", "amodaresi/NoLiMa needle sets and shuffled books",
              "Adobe Research License, non-commercial research only (also its code's task template, read from "
              "the data directory, not shipped); books: the dataset's haystack/LICENSES.md"),
    Benchmark("BABILong", "babilong_", "RMT-team/babilong (100 samples per task and length)",
              "prompts Apache-2.0 (booydar/babilong); samples: bAbI facts in PG-19 text, see the dataset card"),
    Benchmark("MRCR", "mrcr_", "openai/mrcr parquet files", "MIT (dataset card)"),
    Benchmark("GraphWalks", "graphwalks_", "openai/graphwalks parquet files", "MIT (dataset card)"),
    Benchmark("HELMET", "helmet_", "princeton-nlp/HELMET data.tar.gz; ∞Bench, ICL sets on the hub",
              "code MIT; data: each source's own terms (KILT, MS MARCO, TREC, Banking77, CLINC150, NLU Evaluation "
              "Data, ∞Bench)"),
    Benchmark("testbed", "testbed_", "this package's testbed generators", "Apache-2.0"),
    Benchmark("Code completion", "code_completion", "LongBench lcc's prompt and code_sim_score over the Python source "
              "of the installed torch package", "torch's BSD-3-Clause (read in place, nothing shipped)"),
    Benchmark("HELMET NarrativeQA, ∞Bench En.QA", None, "princeton-nlp/HELMET", "code MIT",
              "scored by a GPT-4o judge in HELMET (NarrativeQA's demonstrations are also drawn unseeded)"),
    Benchmark("LongBench Pro T4 summaries", None, "caskcsg/LongBench-Pro", "Apache-2.0",
              "half of their score is a Qwen3-Embedding-8B similarity"),
)


def benchmark_of(task: str) -> Benchmark | None:
    """The registered benchmark a task name belongs to (the first prefix that matches), or None."""
    return next((b for b in BENCHMARKS if b.prefix is not None and task.startswith(b.prefix)), None)
