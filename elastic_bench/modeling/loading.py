"""Model loading: a local path or hub id, the tiny random models ``tiny:<family>``, ``testbed``, or
``random:<preset>``.

A local path is a transformers folder (with config.json), a GGUF file, or a folder holding one GGUF file; a GGUF
checkpoint is dequantized in memory by transformers (``gguf_file``; the ``gguf`` package reads it).

The tiny models are random weights from a small config (seeded), with tokenizers built offline: byte-level for
``tiny:qwen3``, a small subword (byte-level BPE) vocabulary trained on the spot for ``tiny:llama``, so tests see two
tokenizers of different granularity. They need no download and exist for tests and smoke runs. The other tiny
families (`TINY_FAMILIES`: Qwen3-MoE, Qwen3-Next, Qwen3.5, Gemma 3, gpt-oss, DeepSeek-V3) are the same small shapes in
each family's architecture, with the byte-level tokenizer: MoE blocks of few experts, and each family's layer kinds
(linear attention, sliding windows, MLA; `elastic_bench.modeling.layer_kinds`). ``testbed`` is the project's own
small long-context model, shipped inside the package. ``random:<preset>`` (`RANDOM_PRESETS`) are random weights at
the real shapes of a published model, built directly on the target device, for speed and memory measurements (with
the byte-level tokenizer); docs/architectures.md cites each preset's config.

A spec is resolved once (`resolve_model`) into a `ModelSource`: its kind, where its files are, its folder label and
the positions it was trained for; `load_model` and a run take that object, so nothing parses the spec again.

Placement over several devices (`check_placement`, checked on the config before any weights load): ``tp`` > 1 shards
the model by transformers' tensor-parallel plan over the ranks of a ``torchrun`` (`elastic_bench.modeling.
tensor_parallel`); ``device_map="auto"`` spreads its layers over the GPUs of one host with accelerate.
"""

from __future__ import annotations

import copy
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

import torch

from elastic_bench.foundation.registry import did_you_mean
from elastic_bench.foundation.torchrun import torchrun_env

TESTBED_DIR = Path(__file__).resolve().parents[1] / "data" / "testbed"


def _alternating(pattern: list[str], layers: int) -> list[str]:
    """``layers`` layer types repeating ``pattern``."""
    return [pattern[i % len(pattern)] for i in range(layers)]


_LINEAR_3_1 = ["linear_attention"] * 3 + ["full_attention"]  # Qwen3-Next / Qwen3.5: full attention one layer in four
# Tiny random models: `TINY_SHAPES` in each family's architecture (transformers' model type), with these fields beside.
TINY_FAMILIES: dict[str, dict] = {
    "qwen3": {},
    "llama": {},
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
    "qwen3_next": dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                       num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16),
    "qwen3_5_text": dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                         linear_value_head_dim=16),
    "gemma3_text": dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        sliding_window=64, query_pre_attn_scalar=16),
    "gpt_oss": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=64, num_local_experts=4,
                    num_experts_per_tok=2, intermediate_size=64, rope_parameters=dict(rope_type="default",
                                                                                      rope_theta=1e6)),
    # MLA: 4 heads of 16 + 8 key dims (no-RoPE, RoPE: the rotary's head_dim) and 16 value dims over a 32-dim latent;
    # layer 1 MoE
    "deepseek_v3": dict(num_key_value_heads=4, head_dim=8, kv_lora_rank=32, q_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, moe_intermediate_size=32,
                        rope_parameters=dict(rope_type="default", rope_theta=1e6)),
}
TINY_ARCHITECTURES = tuple(TINY_FAMILIES)
# Real shapes for speed and memory measurements (random weights); docs/architectures.md cites the configs.
RANDOM_PRESETS = {
    "llama-3.1-8b": dict(arch="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         rope_theta=500000.0, tie_word_embeddings=False),
    "qwen3-8b": dict(arch="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     rope_theta=1000000.0, tie_word_embeddings=False),
    # the real model's context: llama3 rope scaling of 8K positions by 8 (the 8B preset keeps plain rope over 256K)
    "llama-3.1-70b": dict(arch="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                          rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192),
                          max_position_embeddings=131072, tie_word_embeddings=False),
    # hybrid: 48 Gated DeltaNet layers, 16 full-attention ones (Qwen/Qwen3.5-27B, text_config)
    "qwen3.5-27b": dict(arch="qwen3_5_text", hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                        layer_types=_alternating(_LINEAR_3_1, 64), num_attention_heads=24, num_key_value_heads=4,
                        head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                        linear_value_head_dim=128, linear_conv_kernel_dim=4, vocab_size=248320,
                        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25),
                        max_position_embeddings=262144, tie_word_embeddings=False),
    # sliding window: 5 local layers of 1,024 tokens, then a global one (google/gemma-3-27b-it, text_config)
    "gemma-3-27b": dict(arch="gemma3_text", hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
                        layer_types=_alternating(["sliding_attention"] * 5 + ["full_attention"], 62),
                        num_attention_heads=32, num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168,
                        sliding_window=1024, vocab_size=262208, max_position_embeddings=131072,
                        rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                                         "full_attention": dict(rope_type="linear", rope_theta=1e6, factor=8.0)},
                        tie_word_embeddings=True),
    # sliding window 128 every other layer, learned sinks, 32 experts top-4 (openai/gpt-oss-20b)
    "gpt-oss-20b": dict(arch="gpt_oss", hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                        layer_types=_alternating(["sliding_attention", "full_attention"], 24), sliding_window=128,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                        num_experts_per_tok=4, vocab_size=201088, max_position_embeddings=131072,
                        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                             beta_slow=1.0, original_max_position_embeddings=4096, truncate=False),
                        tie_word_embeddings=False),
    # MoE: 128 experts top-8 (Qwen/Qwen3-30B-A3B)
    "qwen3-30b-a3b": dict(arch="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          num_experts=128, num_experts_per_tok=8, vocab_size=151936, rope_theta=1000000.0,
                          tie_word_embeddings=False),
    # MLA in DeepSeek-V3's architecture, 64 experts top-6 and 2 shared (moonshotai/Moonlight-16B-A3B)
    "moonlight-16b-a3b": dict(arch="deepseek_v3", hidden_size=2048, intermediate_size=11264, moe_intermediate_size=1408,
                              num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, head_dim=64,
                              kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
                              v_head_dim=128, n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
                              n_group=1, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.446,
                              vocab_size=163840, rope_parameters=dict(rope_type="default", rope_theta=50000.0),
                              tie_word_embeddings=False),
}
NAMED_MODELS = [*(f"tiny:{a}" for a in TINY_ARCHITECTURES), "testbed", *(f"random:{p}" for p in RANDOM_PRESETS)]

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_device(spec: str | torch.device | None, meta: bool = False) -> torch.device:
    """The device ``spec`` names (``cpu``, ``cuda``, ``cuda:1``, ...; None: CUDA when available), checked to exist on
    this machine, so that a wrong ``--device`` is refused before any model loads.

    Accepted: ``cpu`` (without an index: there is one CPU device), ``cuda`` / ``cuda:N`` of an existing GPU, a device
    type whose torch module says it is available (``mps``, ``xpu``), and ``meta`` (weights without storage: shapes
    only) when ``meta`` is True, as `load_model` allows.

    Raises:
        ValueError: ``spec`` is not a device name, or names a device this machine does not have (one line).
    """
    if spec is None:
        return default_device()
    wrong = ValueError(f"device must be cpu, cuda or cuda:N (e.g. cuda:0), got {str(spec)!r}")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise wrong from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("no CUDA device: torch.cuda.is_available() is False")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{device} does not exist ({count} device{'' if count == 1 else 's'})")
    elif device.type == "cpu":
        if device.index is not None:
            raise ValueError(f"the CPU takes no device index: give cpu, got {str(spec)!r}")
    elif device.type != "meta" or not meta:
        available = getattr(getattr(torch, device.type, None), "is_available", None)  # torch.mps, torch.xpu, ...
        if available is None:
            raise wrong
        if not available():
            raise ValueError(f"no {device.type} device: torch.{device.type}.is_available() is False")
    return device


def check_backend(backend: str, device: str | torch.device | None) -> None:
    """Refuse an attention ``backend`` (``--backend``) that cannot run on ``device`` (checked with `check_device`),
    e.g. ``triton`` on a CPU, before any model loads; ``auto`` runs everywhere.

    Raises:
        ValueError: ``device`` is wrong, or ``backend`` is unknown or not available on it (one line).
    """
    from elastic_bench.kernels import available_backends, backend_names

    device = check_device(device)
    if backend == "auto":
        return
    if backend not in backend_names():
        raise did_you_mean("attention backend", backend, ["auto", *backend_names()])
    if backend not in available_backends(device):
        raise ValueError(f"attention backend {backend!r} cannot run on {device}; available there: auto, "
                         f"{', '.join(available_backends(device))}")


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


ModelKind = Literal["tiny", "random", "testbed", "folder", "gguf", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """A model spec resolved once (`resolve_model`): what it names and where its files are.

    Attributes:
        spec: the spec as given (``tiny:qwen3``, ``testbed``, a path, a hub id); results record it.
        kind: ``tiny`` / ``random`` (random weights built here), ``testbed`` (the shipped checkpoint), ``folder`` (a
            local transformers folder), ``gguf`` (a GGUF checkpoint) or ``hub`` (a Hugging Face hub id).
        name: the architecture of a ``tiny`` model or the preset of a ``random`` one (``qwen3``, ``llama-3.1-8b``);
            ``""`` for the others.
        path: where the model's files are: the testbed's or a local folder, a GGUF file's folder, a hub id; ``""``
            for the built-in random models. A method looks there for the artifacts shipped with the model
            (`elastic_bench.modeling.interface.Method.artifacts`).
        gguf: the GGUF file of a ``gguf`` checkpoint, else None.
    """

    spec: str
    kind: ModelKind
    name: str = ""
    path: str = ""
    gguf: Path | None = None

    @cached_property
    def label(self) -> str:
        """A folder-safe name (``tiny:qwen3`` → ``tiny-qwen3``, ``random:llama-3.1-8b`` → ``random-llama-3.1-8b``,
        ``org/name`` → ``org--name``); for a local checkpoint the model's own name where its files state one (a GGUF's
        ``general.name``, a config.json's ``_name_or_path`` that is a name, not a path), else the GGUF file's stem or
        the folder's name."""
        if self.gguf is not None:
            name = gguf_metadata(self.gguf, "general.name").get("general.name")
            return (_folder_safe(name) if isinstance(name, str) else "") or self.gguf.stem
        if self.kind == "folder":
            return _folder_safe(_config_name(Path(self.path)) or "") or Path(self.path).resolve().name
        return _folder_safe(self.spec)

    @cached_property
    def positions(self) -> int:
        """The positions the model was trained for (its config's ``max_position_embeddings``; a GGUF's
        ``<arch>.context_length``), read without loading the weights. For a GGUF checkpoint this also checks that
        transformers can load its architecture (a ValueError otherwise)."""
        return int(self.config.max_position_embeddings)

    @cached_property
    def config(self):
        """The model's transformers config, read without the weights (for a GGUF checkpoint this checks that
        transformers can load its architecture: a ValueError otherwise)."""
        if self.kind == "tiny":
            return _config(self.name, **(TINY_SHAPES | TINY_FAMILIES[self.name]))
        if self.kind == "random":
            fields = dict(RANDOM_PRESETS[self.name])
            return _config(fields.pop("arch"), **fields)
        from transformers import AutoConfig

        if self.gguf is not None:
            with _gguf_errors(self.gguf):
                return AutoConfig.from_pretrained(str(self.gguf.parent), gguf_file=self.gguf.name)
        return AutoConfig.from_pretrained(self.path, **_hub_access(self))


def resolve_model(spec: str | ModelSource) -> ModelSource:
    """The `ModelSource` of ``spec`` (a `ModelSource` is returned as it is).

    Raises:
        FileNotFoundError: the testbed is missing, a path (``./name``, ``/a/b``, ``a/b/c``, ...) names nothing, or a
            folder holds neither config.json nor a ``.gguf`` file.
        ValueError: an unknown name, a file that is not GGUF, or a folder of several ``.gguf`` files.
    """
    if isinstance(spec, ModelSource):
        return spec
    if spec.startswith("tiny:") or spec.startswith("random:"):
        kind, _, name = spec.partition(":")
        if name not in (TINY_ARCHITECTURES if kind == "tiny" else RANDOM_PRESETS):
            raise did_you_mean("model", spec, NAMED_MODELS)
        return ModelSource(spec, kind, name=name)
    if spec == "testbed":
        if not (TESTBED_DIR / "config.json").exists():
            raise FileNotFoundError(f"the testbed checkpoint is missing from this installation ({TESTBED_DIR})")
        return ModelSource(spec, "testbed", path=str(TESTBED_DIR))
    if Path(spec).exists():
        gguf = gguf_file(spec)
        if gguf:
            return ModelSource(spec, "gguf", path=str(gguf.parent), gguf=gguf)
        if not (Path(spec) / "config.json").exists():
            raise FileNotFoundError(f"{spec} is a path but holds no config.json and no .gguf file: not a transformers "
                                    "model directory nor a GGUF checkpoint")
        return ModelSource(spec, "folder", path=spec)
    if HUB_ID.fullmatch(spec):
        return ModelSource(spec, "hub", path=spec)  # reached only when loaded (`_hub_access`)
    if "/" in spec or "\\" in spec or spec.startswith((".", "~")):
        raise FileNotFoundError(f"no such model folder or file: {spec}")
    raise did_you_mean("model", spec, NAMED_MODELS + ["<local path>", "<hub org/name>"])


HUB_ID = re.compile(r"(?!.*\.\.)[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # org/name, as the hub allows them


def _hub_access(source: ModelSource) -> dict[str, bool]:
    """The ``from_pretrained`` arguments that read a hub model's files: none when the hub answers; when it cannot be
    used (`elastic_bench.results.digests.hub_unavailable`: ``HF_HUB_OFFLINE`` is set, or no quick answer), the local
    cache only, so that
    transformers does not retry the network; none for a model that is not a hub id.

    Raises:
        ValueError: the hub cannot be used and the model is not in the local cache (one line).
    """
    if source.kind != "hub":
        return {}
    from huggingface_hub import try_to_load_from_cache

    from elastic_bench.results.digests import hub_unavailable

    why = hub_unavailable()
    if why is None:
        return {}
    if isinstance(try_to_load_from_cache(source.path, "config.json"), str):
        return {"local_files_only": True}
    raise ValueError(f"hub model {source.spec} is not in the local Hugging Face cache and the hub cannot be used "
                     f"({why}): download it where the hub is reachable, or give a local folder")


# The files of a transformers folder that its weights, configuration and tokenizer load from (`model_digest`).
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.bin", "*.index.json", "tokenizer*",
               "special_tokens_map.json", "added_tokens.json", "vocab*", "merges.txt", "chat_template*", "*.tiktoken",
               "*.py")


def model_digest(spec: str | ModelSource) -> str | None:
    """What a run knows the model's weights, configuration and tokenizer by, wherever its files lie: the SHA-256 over a
    folder's `MODEL_FILES` or a GGUF file (`elastic_bench.results.digests.files_digest`, each file read once per
    content), the commit a hub id resolves to (``hub@<commit>``); None for the built-in random models, which their spec
    and the code make.

    Raises:
        ValueError: a hub model that the hub cannot serve and the local cache does not hold (`_hub_access`).
    """
    from elastic_bench.results.digests import HUB_TIMEOUT, files_digest, hub_revision

    source = resolve_model(spec)
    if source.kind in ("tiny", "random"):
        return None
    if source.kind == "hub":
        commit = hub_revision(source.path, "model", online=not _hub_access(source), timeout=HUB_TIMEOUT)
        return f"hub@{commit}" if commit else None
    if source.gguf is not None:
        return files_digest(source.gguf.parent, [source.gguf])
    folder = Path(source.path)
    return files_digest(folder, sorted({p for pattern in MODEL_FILES for p in folder.glob(pattern) if p.is_file()}))


def load_model(spec: str | ModelSource, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
               tp: int = 1, device_map: Literal["auto"] | None = None):
    """Load ``(model, tokenizer)`` for ``spec``.

    Args:
        spec: ``tiny:qwen3``, ``tiny:llama``, ``testbed``, ``random:<preset>``, a local transformers folder, a GGUF
            file (or a folder holding one; dequantized to ``dtype`` in memory), a Hugging Face hub id, or one of
            these already resolved (`resolve_model`).
        dtype: weights dtype; bf16 on CUDA and fp32 on CPU by default.
        device: ``"cuda"``, ``"cpu"``, ...; CUDA when available by default (checked with `check_device`; ``"meta"``
            builds the weights without storage). Under tensor parallelism, this rank's device.
        tp: ranks per model under ``torchrun`` (tensor parallelism: every rank of the run calls `load_model` and
            keeps its shard; `elastic_bench.modeling.tensor_parallel`); 1: the whole model in this process.
        device_map: ``"auto"``: the layers spread over the GPUs of this host by accelerate (``device`` unused).

    Returns:
        The model in eval mode with ``attn_implementation="sdpa"`` (``"eager"`` for a family without SDPA support,
        `base_attention`), and its tokenizer.

    Raises:
        ValueError: a placement `check_placement` refuses (before any weights load).
    """
    from elastic_bench.modeling import tensor_parallel

    device = check_device(device, meta=True)
    dtype = dtype or default_dtype(device)
    source = resolve_model(spec)
    world = torchrun_world_size()
    check_placement(source, tp, device_map, world)
    tokenizer = load_tokenizer(source)
    if source.kind in ("tiny", "random"):
        if source.kind == "tiny":
            model = tiny_model(source.name, tokenizer).to(device=device, dtype=dtype)
        else:
            model = random_model(source.name, device, dtype)
        if tp > 1:  # built alike on every rank (seeded): each keeps its slices
            model = tensor_parallel.distribute(model, tp, world)
        elif device_map:
            model = _dispatch(model, dtype)
    else:
        from transformers import AutoModelForCausalLM

        # sharded as it loads (tensor parallelism), placed by accelerate (device map), or moved to `device` below
        placed = ({"distributed_config": tensor_parallel.distributed_config(tp, world)} if tp > 1
                  else {"device_map": device_map} if device_map else {})
        gguf = source.gguf
        implementation = base_attention(source.config)
        if gguf is not None:
            with _gguf_errors(gguf):
                model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype,
                                                             attn_implementation=implementation, **placed)
        else:
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, attn_implementation=implementation,
                                                         **placed, **_hub_access(source))
        if not placed:
            model.to(device)
    if tp > 1:
        from elastic_bench.modeling.attention import softmax_modules

        tensor_parallel.mark(model, tp, softmax_modules(model))
    model.eval()
    return model, tokenizer


def check_device_map(device_map: str | None) -> None:
    """Refuse ``device_map="auto"`` on a machine without a GPU, where the command line would run it on the CPU without
    a word (`load_model` itself accepts it: accelerate places every layer on the CPU)."""
    if device_map is not None and not torch.cuda.is_available():
        raise ValueError("--device-map auto spreads a model over this host's GPUs, and it has none "
                         "(torch.cuda.is_available() is False): leave it out to run on the CPU")


def check_placement(spec: str | ModelSource, tp: int = 1, device_map: str | None = None,
                    world_size: int | None = None) -> None:
    """Refuse a placement of model ``spec`` that cannot work, reading its config only (no weights): ``tp`` that the
    ``torchrun`` processes or the model's heads do not allow, or a family without a tensor-parallel plan
    (`elastic_bench.modeling.tensor_parallel.check`); a ``device_map`` other than ``"auto"``, with ``tp`` > 1, under
    ``torchrun``, or without accelerate installed.

    Args:
        world_size: the processes of the run; None: ``torchrun``'s (``WORLD_SIZE``), 1 outside it.

    Raises:
        ValueError: one line saying what is wrong.
    """
    from elastic_bench.modeling import tensor_parallel

    world = torchrun_world_size() if world_size is None else world_size
    if device_map is not None:
        if device_map != "auto":
            raise ValueError(f"device_map must be auto, got {device_map!r}")
        if tp > 1:
            raise ValueError("give --tp or --device-map, not both: a device map places a whole model in one process")
        if world > 1:
            raise ValueError("--device-map auto places one model over the GPUs of this host: run it in one process, "
                             "not under torchrun")
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise ValueError("--device-map auto needs accelerate: pip install 'elastic-bench[device-map]'") from None
    if tp != 1:  # the config is read only for a tensor-parallel run
        tensor_parallel.check(resolve_model(spec).config, tp, world)


def torchrun_world_size() -> int:
    """The processes of this run: ``torchrun``'s ``WORLD_SIZE``, 1 outside it (checked: `torchrun_env`)."""
    return torchrun_env()[1]


def _dispatch(model, dtype: torch.dtype):
    """``model`` (built in one piece) with its layers spread by accelerate over the GPUs of this host (the CPU
    holds what does not fit; with no GPU, everything)."""
    from accelerate import dispatch_model, infer_auto_device_map

    placement = infer_auto_device_map(model, no_split_module_classes=model._no_split_modules, dtype=dtype)
    return dispatch_model(model, placement)


def load_tokenizer(spec: str | ModelSource):
    """The tokenizer of model ``spec`` (as `load_model` returns it), without the weights: what a run needs to check its
    lengths against its tasks before the model loads."""
    source = resolve_model(spec)
    if source.kind == "tiny":
        return bpe_tokenizer() if source.name == "llama" else byte_tokenizer()
    if source.kind == "random":
        return byte_tokenizer()
    from transformers import AutoTokenizer

    if source.gguf is not None:
        with _gguf_errors(source.gguf):
            return AutoTokenizer.from_pretrained(str(source.gguf.parent), gguf_file=source.gguf.name)
    return AutoTokenizer.from_pretrained(source.path, **_hub_access(source))


GGUF_MAGIC = b"GGUF"  # the first bytes of every GGUF file


def gguf_file(spec: str) -> Path | None:
    """The GGUF checkpoint ``spec`` names: a GGUF file, or a folder without config.json holding exactly one ``.gguf``
    file; None for anything else (named models, hub ids, transformers folders, missing paths).

    Raises:
        ValueError: ``spec`` is a file but not a GGUF one, or a folder holding several ``.gguf`` files.
    """
    path = Path(spec)
    if path.is_dir():
        if (path / "config.json").exists():
            return None
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ValueError(f"{spec} holds {len(found)} GGUF files ({', '.join(f.name for f in found)}): "
                             "give the path of the one to load")
        if not found:
            return None
        path = found[0]
    elif not path.is_file():
        return None
    with path.open("rb") as f:
        if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file (it does not start with {GGUF_MAGIC!r}): give a .gguf file, "
                             "a model folder or a hub id")
    return path


def _require_gguf():
    """The ``gguf`` package, which reads GGUF files (for transformers too).

    Raises:
        ValueError: it is not installed (one line saying how to install it).
    """
    try:
        import gguf
    except ImportError:
        raise ValueError("reading a GGUF checkpoint needs the gguf package: pip install gguf") from None
    return gguf


@contextmanager
def _gguf_errors(path: Path):
    """Checks that ``gguf`` is installed, then turns what transformers raises for a GGUF checkpoint it cannot load (an
    unsupported architecture or tokenizer, a truncated file) into one ValueError naming the file."""
    _require_gguf()
    try:
        yield
    except (ValueError, KeyError, IndexError, NotImplementedError, OSError, ImportError) as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        raise ValueError(f"transformers cannot load the GGUF checkpoint {path}: {lines[0]}") from None


def gguf_metadata(path: Path, *keys: str) -> dict:
    """The values of the metadata ``keys`` present in GGUF file ``path`` (read from its header, not its tensors)."""
    reader = _require_gguf().GGUFReader(path, "r")
    return {key: reader.fields[key].contents() for key in keys if key in reader.fields}


def _config_name(folder: Path) -> str | None:
    """The ``_name_or_path`` of ``folder``'s config.json where it is a model name (``org/name`` or ``name``), not a
    path (absolute, or existing here) or empty; None otherwise."""
    try:
        name = json.loads((folder / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(name, str) or not re.fullmatch(r"[\w-][\w.-]*(/[\w-][\w.-]*)?", name) or Path(name).exists():
        return None
    return name


def _folder_safe(name: str) -> str:
    """``name`` as one folder name: ``/`` → ``--``, runs of other characters unsafe in paths → ``-``, no leading dot
    (``""`` when nothing is left)."""
    return re.sub(r"[^\w.+-]+", "-", name.strip().replace("/", "--")).lstrip(".")


def base_attention(config) -> str:
    """The attention implementation a model of ``config`` is loaded with, outside `elastic_bench.apply`: ``"sdpa"``, or
    ``"eager"`` for a family whose transformers model does not support SDPA (gpt-oss: SDPA has no learned sinks)."""
    from transformers import AutoModelForCausalLM

    try:
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        return "sdpa"
    return "sdpa" if getattr(model_class, "_supports_sdpa", True) else "eager"


def _config(arch: str, **fields):
    """The transformers config of model type ``arch`` with ``fields``, a long context and no BOS token, attending by
    `base_attention`."""
    from transformers import AutoConfig

    common = dict(max_position_embeddings=1 << 18, bos_token_id=None)
    # deep-copied: a config keeps (and may complete) the dicts it is given, such as a preset's rope parameters
    config = AutoConfig.for_model(arch, **copy.deepcopy(common | fields))
    config._attn_implementation = base_attention(config)
    return config


def random_model(preset: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Random weights (N(0, 0.02)) at the shapes of ``RANDOM_PRESETS[preset]``, built on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM

    fields = dict(RANDOM_PRESETS[preset])
    config = _config(fields.pop("arch"), eos_token_id=BYTE_EOS, pad_token_id=BYTE_PAD, **fields)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


TINY_SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, rope_theta=1e6, tie_word_embeddings=True)


def tiny_model(arch: str, tokenizer, seed: int = 0):
    """A small random model (`TINY_SHAPES`: 2 layers of 4 query / 2 KV heads of dim 16, or a family's own in
    `TINY_FAMILIES`) of the given architecture, sized to ``tokenizer``."""
    from transformers import AutoModelForCausalLM

    config = _config(arch, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, **(TINY_SHAPES | TINY_FAMILIES[arch]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # pad, turn start, turn end (= EOS)
BYTE_PAD, BYTE_EOS = 256, 258  # ids of the specials in the byte-level vocabulary


def _wrap(backend):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
        model_max_length=1 << 18,
    )


def byte_tokenizer():
    """An offline byte-level tokenizer (256 byte tokens, then the 3 specials) with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIALS))
    return _wrap(backend)


@lru_cache(maxsize=1)
def _bpe_json() -> str:
    from importlib import resources

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    assets = resources.files("wonderwords") / "assets"
    words = [w for name in ("nounlist.txt", "adjectivelist.txt", "verblist.txt")
             for w in (assets / name).read_text().splitlines() if w]
    corpus = [" ".join(words[i : i + 64]) for i in range(0, len(words), 64)]
    corpus += [" ".join(str(n) for n in range(i, i + 100)) + "." for i in range(0, 10000, 100)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus, trainer)
    return backend.to_str()


def bpe_tokenizer():
    """An offline byte-level BPE tokenizer (4,096 tokens) trained deterministically on wonderwords' word lists and
    numbers, with a ChatML chat template: any text round-trips, English words take one or two tokens."""
    from tokenizers import Tokenizer

    return _wrap(Tokenizer.from_str(_bpe_json()))


def max_positions(spec: str | ModelSource) -> int:
    """The positions model ``spec`` was trained for (`ModelSource.positions`), for a caller that holds only the
    spec."""
    return resolve_model(spec).positions


def model_context(config) -> dict:
    """The context a model was built for, as a cell records it: its transformers config's
    ``max_position_embeddings`` and rope parameters (``rope_parameters``, or ``rope_scaling`` in older configs:
    type, theta, scaling factor, original length, ...), JSON-normalised."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    context = {"max_position_embeddings": getattr(config, "max_position_embeddings", None), "rope": rope}
    return json.loads(json.dumps(context, default=str))

