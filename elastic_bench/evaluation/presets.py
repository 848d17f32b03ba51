"""Settings presets: every method's options at once, as one source ran them, each value cited to that source.

- ``elastic-paper``: every baseline and Elastic mode as the Elastic Attention paper (arXiv 2601.17367) evaluated them,
  from the paper first and from its official code (LCM-Lab/Elastic-Attention @ c62a0fe) where the paper is silent.
- ``upstream``: each baseline as its own repository deploys it (mit-han-lab/duo-attention @ fe93c314ae87,
  princeton-pli/PruLong @ ff22598e2ca2, mit-han-lab/x-attention @ e37988770b9d, InfLLM-V2 as MiniCPM4's
  ``modeling_minicpm.py`` configures OpenBMB/infllmv2_cuda_impl @ f908e73, MoonshotAI/MoBA @ 61e456b,
  XunhaoLai/native-sparse-attention-triton @ 9bea856).
- ``official-code``: Elastic Attention as its released code runs; the same reading of training is a set of
  ``train-router`` options (`Preset.train_router`), which ``run`` does not apply.

Design decisions:
- A preset is data: per method, option → `Setting` (value and source). ``run --preset NAME`` (``preset:`` in the run
  YAML) builds each method with the preset's options, then the explicit ``-O`` options over them.
- A preset *applies* to a method it names options for. Such a cell's folder reads ``METHOD-preset=NAME`` followed by
  the options that differ from the preset's values (`label`), and its fingerprint and ``config.json`` record the
  preset. A method the preset names nothing for (``full``, ``streaming``) keeps its folder and fingerprint, so its
  cells are shared with runs made without a preset.
- ``docs/presets.md`` lists every value with its source; a test checks this module against that table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from elastic_bench.foundation.registry import did_you_mean


@dataclass(frozen=True)
class Setting:
    """One option's value under a preset and where it comes from (a paper's section or table, a file and line)."""

    value: Any
    source: str


@dataclass(frozen=True)
class Preset:
    """A named set of method options.

    Attributes:
        name: what ``run --preset`` takes.
        summary: one line, shown by ``elastic-bench methods --preset NAME``.
        methods: method name → option → `Setting`.
        train_router: ``train-router`` options giving the same reading of training (printed, not applied by ``run``).
    """

    name: str
    summary: str
    methods: dict[str, dict[str, Setting]]
    train_router: dict[str, Setting] = field(default_factory=dict)

    def options(self, method: str) -> dict[str, Any]:
        """The option values this preset sets for the registered method ``method`` ({} for one it does not name)."""
        return {option: setting.value for option, setting in self.methods.get(method, {}).items()}


_PAPER_ESR = ("Elastic paper Fig. 8c/12c: DuoAttention = PruLong ΩESR 0.60 at 8K to 0.70 at 256K, which is "
              "0.70 × (1 − 1152/S): a one-shot prefill, sink 128 + window 1024 (reference/method.md §7)")
_PAPER_MSR = "Elastic paper Table 1, Table 2/10: DuoAttention and PruLong at ΩMSR 0.70"
_PAPER_SPARSE = "Elastic paper Table 6 / App. D.1, sparse config: sink 128, local 2048, XA stride 16, threshold 0.9"
_BSA_BLOCK = ("official code: Block-Sparse-Attention's fixed 128-token blocks (the paper's Table 6 says 64; "
              "reference/method.md §9 #10)")
_DENSE_DECODE = ("official eval model decodes every head densely over the whole cache "
                 "(training/eval/modeling_flash_qwen.py:1020-1200; reference/method.md §8)")
_DUO_DEPLOY = ("duo-attention duo_attn/patch/llama.py: dense first chunk, then chunked prefill "
               "(reference/baselines.md §2.5)")

_MINICPM = "MiniCPM4 modeling_minicpm.py, MiniCPMInfLLMv2Attention.__init__: sparse_config"
_INFLLM_V2 = {option: Setting(value, f"{_MINICPM} {key} {value}{note}") for option, key, value, note in (
    ("block_size", "block_size", 64, ""),
    ("kernel_size", "kernel_size", 32, ""),
    ("kernel_stride", "kernel_stride", 16, ""),
    ("topk", "topk", 64, " (the window's blocks are added to it)"),
    ("window_size", "window_size", 2048, " (local_blocks = window_size // block_size)"),
    ("init_blocks", "init_blocks", 1, ""),
    ("dense_len", "dense_len", 8192, " (kv_seq_len < dense_len: dense attention)"),
)}
_PAPER_INFLLM = ("; the Elastic paper's InfLLM-V2 setting is not checked here (reference/paper-results.md has no "
                 "InfLLM-V2 row): upstream's value")
_NSA = "native-sparse-attention-triton README: compressed_attention(..."
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "elastic-paper",
        "every baseline and Elastic mode as the Elastic Attention paper evaluated them (its official code where the "
        "paper is silent)",
        {
            "duo_attention": {
                "sparsity": Setting(0.7, _PAPER_MSR),
                "sink": Setting(128, _PAPER_ESR),
                "local": Setting(1024, _PAPER_ESR),
                "prefill": Setting("one-shot", _PAPER_ESR),
            },
            "prulong": {
                "sparsity": Setting(0.7, _PAPER_MSR),
                "sink": Setting(128, "PruLong run_scripts/prulong_masksonly.sh (sink 128); " + _PAPER_ESR),
                "local": Setting(1024, "PruLong run_scripts/prulong_masksonly.sh (local window 1024); " + _PAPER_ESR),
                "prefill": Setting("one-shot", _PAPER_ESR),
            },
            "xattention": {
                "threshold": Setting(0.9, "Elastic paper Table 2 (XAttention τ 0.9); " + _PAPER_SPARSE),
                "stride": Setting(16, _PAPER_SPARSE),
                "block_size": Setting(128, _BSA_BLOCK),
                "rule": Setting("upstream", "paper silent; official code: upstream's find_blocks_chunked, copied in "
                                            "src/Xattention.py (reference/method.md §6, §9 #6)"),
            },
            "elastic": {
                "xa_threshold": Setting(0.9, _PAPER_SPARSE + " (reference/method.md §9 #9)"),
                "sink": Setting(128, _PAPER_SPARSE),
                "local": Setting(2048, _PAPER_SPARSE),
                "granularity": Setting("block", "Elastic paper §3.3 / App. E: Block-Sparse-Attention block streaming, "
                                                "1 sink block + 16 local blocks (reference/method.md §6)"),
                "sparse_decode": Setting(False, "paper silent; " + _DENSE_DECODE),
            },
            "infllm_v2": {option: Setting(s.value, s.source + _PAPER_INFLLM) for option, s in _INFLLM_V2.items()},
        },
    ),
    Preset(
        "upstream",
        "each baseline as its own repository deploys it (DuoAttention's and PruLong's chunked prefill with a dense "
        "first chunk, XAttention's defaults)",
        {
            "duo_attention": {
                "sparsity": Setting(0.5, "duo-attention README: 50% retrieval heads for GQA models "
                                         "(reference/baselines.md §2.4)"),
                "sink": Setting(64, "duo-attention README, scripts/niah.sh and eval/LongBench scripts: sink 64 "
                                    "(reference/baselines.md §2.5)"),
                "local": Setting(256, "duo-attention README, scripts/niah.sh and eval/LongBench scripts: recent 256 "
                                      "(reference/baselines.md §2.5)"),
                "prefill": Setting("chunked", _DUO_DEPLOY),
                "chunk_size": Setting(32000, "duo-attention scripts/niah.sh, scripts/efficiency.sh: "
                                             "--prefilling_chunk_size 32000"),
                "sparse_decode": Setting(True, "duo-attention duo_attn/patch/llama.py: the streaming cache is cut to "
                                               "sink + recent after every forward"),
            },
            "prulong": {
                "sink": Setting(128, "PruLong eval/model_utils.py: --duoattn_sink 128 (reference/baselines.md §3.4)"),
                "local": Setting(1024, "PruLong eval/model_utils.py: --duoattn_sliding 1024 "
                                       "(reference/baselines.md §3.4)"),
                "prefill": Setting("chunked", "PruLong eval/model_utils.py: --duoattn_chunk_prefilling, through "
                                              "DuoAttention's deployment (reference/baselines.md §3.4)"),
                "chunk_size": Setting(32768, "PruLong eval/run_scripts/run_prulong_32k.sh: "
                                             "--duoattn_chunk_prefilling 32768"),
                "sparse_decode": Setting(True, "DuoAttention's deployment, which PruLong's evaluation calls: the "
                                               "streaming cache keeps sink + window"),
            },
            "xattention": {
                "threshold": Setting(0.8, "x-attention xattn/src/Xattention.py: Xattention_prefill(threshold=0.8) "
                                          "(reference/baselines.md §4.2)"),
                "stride": Setting(16, "x-attention xattn/src/load_llama.py: FastPrefillConfig(stride=16) "
                                      "(reference/baselines.md §4.2)"),
                "block_size": Setting(128, "x-attention Xattention_prefill(block_size=128); Block-Sparse-Attention "
                                           "asserts 128 (reference/baselines.md §4.1)"),
                "rule": Setting("upstream", "x-attention xattn/src/utils.py: find_blocks_chunked "
                                            "(reference/baselines.md §4.1)"),
            },
            "infllm_v2": _INFLLM_V2,
            "moba": {
                "chunk_size": Setting(4096, "MoBA examples/llama.py: --moba-chunk-size 4096"),
                "topk": Setting(12, "MoBA examples/llama.py: --moba-topk 12"),
            },
            "nsa": {option: Setting(value, f"{_NSA}{option}={value}); NSA paper, pretraining setup: {paper}")
                    for option, value, paper in (
                        ("block_size", 64, "l' = 64"), ("kernel_size", 32, "l = 32"), ("kernel_stride", 16, "d = 16"),
                        ("topk", 16, "n = 16, the initial and local blocks included"),
                        ("init_blocks", 1, "1 initial block"), ("local_blocks", 2, "2 local blocks"))},
        },
    ),
    Preset(
        "official-code",
        "Elastic Attention as its released code runs (τ 0.8 in FA-XA / XA-SSA; train-router: segment-mean pooling, "
        "|Ω−t|, t_sen 0.6, cosine temperature)",
        {
            "elastic": {
                "xa_threshold": Setting(0.8, "official eval model hard-codes XAttention threshold 0.8 "
                                             "(training/eval/modeling_flash_qwen.py; reference/method.md §6, §9 #9)"),
                "sparse_decode": Setting(False, _DENSE_DECODE),
            },
        },
        train_router={
            "train_pooling": Setting("mean", "official training pools the whole user-prompt segment "
                                             "(training/modeling_flash_qwen.py:996-1057; reference/method.md §9 #1)"),
            "penalty": Setting("abs", "official loss λ1·abs(Ω−t) + λ2·(Ω−t)² "
                                      "(training/modeling_flash_qwen.py:2254-2275; reference/method.md §9 #2)"),
            "targets": Setting({"Single QA": 0.6, "MultiHop QA": 0.6, "Summarization": 1.0, "Code": 1.0,
                                "In-Context Learning": 1.0},
                               "official run_scripts/training.sh: t_sen 0.6, t_rob 1.0 "
                               "(reference/method.md §4, §9 #3)"),
            "tau_schedule": Setting("cosine", "official training/lh_trainer.py:465-521: cosine 1.5 → 1.0 over 60% of "
                                              "the steps (reference/method.md §3, §9 #11)"),
            "lambda_weight_decay": Setting(0.1, "official λ optimizer group: weight decay 0.1 (reference/method.md §4, "
                                                "§9 #14)"),
        },
    ),
)}


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        UnknownNameError: no such preset (naming the closest).
    """
    if name not in PRESETS:
        raise did_you_mean("preset", name, list(PRESETS))
    return PRESETS[name]


def applies(preset: str | None, method: str) -> bool:
    """Whether the preset ``preset`` (None: none) sets options of the registered method ``method``."""
    return preset is not None and bool(get_preset(preset).options(method))


def label(method: Any, preset: str | None) -> str:
    """The result folder of ``method`` (a built `elastic_bench.modeling.interface.Method`) under ``preset``: the
    method's own label where the preset does not apply, else ``NAME-preset=PRESET`` and the options whose values differ
    from the preset's (from their defaults, for options the preset leaves), e.g.
    ``duo_attention-preset=elastic-paper-pattern=gates%2Fduo``."""
    if not applies(preset, method.name):
        return method.label()
    return method.label(base=get_preset(preset).options(method.name), tag=f"preset={preset}")


def describe(preset: Preset) -> list[tuple[str, str, Any, str]]:
    """``(target, option, value, source)`` rows of everything ``preset`` sets: the target is a method name (an option
    of ``run -O METHOD.OPTION``) or ``train-router`` (a field of its config, not applied by ``run``)."""
    rows = [(method, option, s.value, s.source) for method, options in preset.methods.items()
            for option, s in options.items()]
    return rows + [("train-router", option, s.value, s.source) for option, s in preset.train_router.items()]
