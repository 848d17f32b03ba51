"""Model loading: a local path or hub id, the tiny random models ``tiny:qwen3`` / ``tiny:llama``, ``testbed``, or
``random:<preset>``.

A local path is a transformers folder (with config.json), a GGUF file, or a folder holding one GGUF file; a GGUF
checkpoint is dequantized in memory by transformers (``gguf_file``; the ``gguf`` package reads it).

The tiny models are random weights from a small config (seeded), with tokenizers built offline: byte-level for
``tiny:qwen3``, a small subword (byte-level BPE) vocabulary trained on the spot for ``tiny:llama``, so tests see two
tokenizers of different granularity. They need no download and exist for tests and smoke runs. ``testbed`` is the
project's own small long-context model, shipped inside the package. ``random:llama-3.1-8b`` / ``random:qwen3-8b`` are
random weights at the real shapes, built directly on the target device, for speed and memory measurements (with the
byte-level tokenizer).

A spec is resolved once (`resolve_model`) into a `ModelSource`: its kind, where its files are, its folder label and
the positions it was trained for; `load_model` and a run take that object, so nothing parses the spec again.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

import torch

from elastic_bench.foundation.registry import did_you_mean

TESTBED_DIR = Path(__file__).resolve().parents[1] / "data" / "testbed"
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
        """A folder-safe name (``tiny:qwen3`` → ``tiny-qwen3``, ``org/name`` → ``org--name``); for a local checkpoint
        the model's own name where its files state one (a GGUF's ``general.name``, a config.json's ``_name_or_path``
        that is a name, not a path), else the GGUF file's stem or the folder's name."""
        if self.gguf is not None:
            name = gguf_metadata(self.gguf, "general.name").get("general.name")
            return (_folder_safe(name) if isinstance(name, str) else "") or self.gguf.stem
        if self.kind == "folder":
            return _folder_safe(_config_name(Path(self.path)) or "") or Path(self.path).resolve().name
        return self.spec.replace("tiny:", "tiny-").replace("/", "--")

    @cached_property
    def positions(self) -> int:
        """The positions the model was trained for (its config's ``max_position_embeddings``; a GGUF's
        ``<arch>.context_length``), read without loading the weights. For a GGUF checkpoint this also checks that
        transformers can load its architecture (a ValueError otherwise)."""
        if self.kind in ("tiny", "random"):
            return _config("llama").max_position_embeddings
        from transformers import AutoConfig

        if self.gguf is not None:
            with _gguf_errors(self.gguf):
                config = AutoConfig.from_pretrained(str(self.gguf.parent), gguf_file=self.gguf.name)
            return int(config.max_position_embeddings)
        return int(AutoConfig.from_pretrained(self.path, **_hub_access(self)).max_position_embeddings)


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
HUB_TIMEOUT = 5.0  # seconds the hub has to answer before a hub model is looked up in the local cache only


def _hub_access(source: ModelSource) -> dict[str, bool]:
    """The ``from_pretrained`` arguments that read a hub model's files: none when the hub answers; when it cannot be
    used (``HF_HUB_OFFLINE`` is set, or no answer within ``HUB_TIMEOUT`` seconds), the local cache only, so that
    transformers does not retry the network; none for a model that is not a hub id.

    Raises:
        ValueError: the hub cannot be used and the model is not in the local cache (one line).
    """
    if source.kind != "hub":
        return {}
    from huggingface_hub import constants, try_to_load_from_cache

    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    why = "HF_HUB_OFFLINE is set" if offline else _hub_unreachable(constants.ENDPOINT)
    if why is None:
        return {}
    if isinstance(try_to_load_from_cache(source.path, "config.json"), str):
        return {"local_files_only": True}
    raise ValueError(f"hub model {source.spec} is not in the local Hugging Face cache and the hub cannot be used "
                     f"({why}): download it where the hub is reachable, or give a local folder")


@lru_cache(maxsize=1)
def _hub_unreachable(endpoint: str) -> str | None:
    """Why the hub at ``endpoint`` does not answer within ``HUB_TIMEOUT`` seconds (one request, once per process),
    or None when it does."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=HUB_TIMEOUT)
    except Exception as err:  # noqa: BLE001  (no network, DNS, proxy, TLS: all mean "unreachable")
        return f"{endpoint} did not answer: {type(err).__name__}"
    return None


def load_model(spec: str | ModelSource, dtype: torch.dtype | None = None, device: str | torch.device | None = None):
    """Load ``(model, tokenizer)`` for ``spec``.

    Args:
        spec: ``tiny:qwen3``, ``tiny:llama``, ``testbed``, ``random:<preset>``, a local transformers folder, a GGUF
            file (or a folder holding one; dequantized to ``dtype`` in memory), a Hugging Face hub id, or one of
            these already resolved (`resolve_model`).
        dtype: weights dtype; bf16 on CUDA and fp32 on CPU by default.
        device: ``"cuda"``, ``"cpu"``, ...; CUDA when available by default (checked with `check_device`; ``"meta"``
            builds the weights without storage).

    Returns:
        The model in eval mode with ``attn_implementation="sdpa"``, and its tokenizer.
    """
    device = check_device(device, meta=True)
    dtype = dtype or default_dtype(device)
    source = resolve_model(spec)
    tokenizer = load_tokenizer(source)
    if source.kind == "tiny":
        model = tiny_model(source.name, tokenizer)
        model.to(device=device, dtype=dtype)
    elif source.kind == "random":
        model = random_model(source.name, device, dtype)
    else:
        from transformers import AutoModelForCausalLM

        gguf = source.gguf
        if gguf is not None:
            with _gguf_errors(gguf):
                model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype,
                                                             attn_implementation="sdpa")
        else:
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, attn_implementation="sdpa",
                                                         **_hub_access(source))
        model.to(device)
    model.eval()
    return model, tokenizer


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

