"""Model loading: a local path or hub id, the tiny random models ``tiny:qwen3`` / ``tiny:llama``, ``testbed``, or
``random:<preset>``.

The tiny models are random weights from a small config (seeded), with tokenizers built offline: byte-level for
``tiny:qwen3``, a small subword (byte-level BPE) vocabulary trained on the spot for ``tiny:llama``, so tests see two
tokenizers of different granularity. They need no download and exist for tests and smoke runs. ``testbed`` is the
project's own small long-context model, shipped inside the package. ``random:llama-3.1-8b`` / ``random:qwen3-8b`` are
random weights at the real shapes, built directly on the target device, for speed and memory measurements (with the
byte-level tokenizer).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import torch

from elastic_bench.registry import did_you_mean

TESTBED_DIR = Path(__file__).parent / "data" / "testbed"
TINY_ARCHITECTURES = ("qwen3", "llama")
# Real shapes for speed and memory measurements (random weights).
RANDOM_PRESETS = {
    "llama-3.1-8b": dict(arch="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         rope_theta=500000.0, tie_word_embeddings=False),
    "qwen3-8b": dict(arch="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     rope_theta=1000000.0, tie_word_embeddings=False),
}
NAMED_MODELS = [*(f"tiny:{a}" for a in TINY_ARCHITECTURES), "testbed", *(f"random:{p}" for p in RANDOM_PRESETS)]

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_device(spec: str | torch.device | None) -> torch.device:
    """The device ``spec`` names (``cpu``, ``cuda``, ``cuda:1``, ...; None: CUDA when available), checked to exist on
    this machine, so that a wrong ``--device`` is refused before any model loads.

    Raises:
        ValueError: ``spec`` is not a device name, or names a device this machine does not have (one line).
    """
    if spec is None:
        return default_device()
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be cpu, cuda or cuda:N (e.g. cuda:0), got {str(spec)!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("no CUDA device: torch.cuda.is_available() is False")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{device} does not exist ({count} device{'' if count == 1 else 's'})")
    elif device.type not in ("cpu", "meta"):
        backend = getattr(torch, device.type, None)  # torch.mps, torch.xpu, ...: a device module with is_available
        available = getattr(backend, "is_available", None)
        if available is not None and not available():
            raise ValueError(f"no {device.type} device: torch.{device.type}.is_available() is False")
    return device


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(spec: str, dtype: torch.dtype | None = None, device: str | torch.device | None = None):
    """Load ``(model, tokenizer)`` for ``spec``.

    Args:
        spec: ``tiny:qwen3``, ``tiny:llama``, ``testbed``, a local directory, or a Hugging Face hub id.
        dtype: weights dtype; bf16 on CUDA and fp32 on CPU by default.
        device: ``"cuda"``, ``"cpu"``, ...; CUDA when available by default (checked with `check_device`).

    Returns:
        The model in eval mode with ``attn_implementation="sdpa"``, and its tokenizer.
    """
    device = check_device(device)
    dtype = dtype or default_dtype(device)
    if spec.startswith("tiny:"):
        arch = spec.removeprefix("tiny:")
        if arch not in TINY_ARCHITECTURES:
            raise did_you_mean("model", spec, NAMED_MODELS)
        tokenizer = bpe_tokenizer() if arch == "llama" else byte_tokenizer()
        model = tiny_model(arch, tokenizer)
        model.to(device=device, dtype=dtype)
    elif spec.startswith("random:"):
        preset = spec.removeprefix("random:")
        if preset not in RANDOM_PRESETS:
            raise did_you_mean("model", spec, NAMED_MODELS)
        model, tokenizer = random_model(preset, device, dtype), byte_tokenizer()
    else:
        path = _resolve_path(spec)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device)
    model.eval()
    return model, tokenizer


def _resolve_path(spec: str) -> str:
    if spec == "testbed":
        if not (TESTBED_DIR / "config.json").exists():
            raise FileNotFoundError(f"the testbed checkpoint is missing from this installation ({TESTBED_DIR})")
        return str(TESTBED_DIR)
    if Path(spec).exists():
        if not (Path(spec) / "config.json").exists():
            raise FileNotFoundError(f"{spec} is a path but holds no config.json: not a transformers model directory")
        return spec
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        return spec  # a hub id; transformers reports a clear error when it cannot be reached
    raise did_you_mean("model", spec, NAMED_MODELS + ["<local path>", "<hub org/name>"])


def model_label(spec: str) -> str:
    """A folder-safe name for ``spec`` (``tiny:qwen3`` → ``tiny-qwen3``, ``org/name`` → ``org--name``)."""
    if Path(spec).exists():
        spec = Path(spec).resolve().name
    return spec.replace("tiny:", "tiny-").replace("/", "--")


def _config(arch: str, **fields):
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        max_position_embeddings=1 << 18,
        bos_token_id=None,
        attn_implementation="sdpa",
    )
    return (Qwen3Config if arch == "qwen3" else LlamaConfig)(**(common | fields))


def random_model(preset: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Random weights (N(0, 0.02)) at the shapes of ``RANDOM_PRESETS[preset]``, built on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM

    fields = dict(RANDOM_PRESETS[preset])
    config = _config(fields.pop("arch"), eos_token_id=BYTE_EOS, pad_token_id=BYTE_PAD, **fields)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def tiny_model(arch: str, tokenizer, seed: int = 0):
    """A 2-layer random model (4 query / 2 KV heads of dim 16) of the given architecture, sized to ``tokenizer``."""
    from transformers import AutoModelForCausalLM

    config = _config(
        arch,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=1e6,
        tie_word_embeddings=True,
    )
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


def model_dir(spec: str) -> str:
    """Where the files of model ``spec`` are, without loading it: the testbed's or a local folder, a hub id as given;
    ``""`` for the built-in random models."""
    if spec.startswith(("tiny:", "random:")):
        return ""
    return _resolve_path(spec)


def max_positions(spec: str) -> int:
    """The positions model ``spec`` was trained for (its config's ``max_position_embeddings``), read without loading
    the weights."""
    if spec.startswith(("tiny:", "random:")):
        return _config("llama").max_position_embeddings
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_dir(spec)).max_position_embeddings)

