"""Where benchmark corpora come from: a local data directory first, then the Hugging Face hub when reachable.

The data directory is the ``data_dir`` a task is built with (``elastic-bench run --data-dir``, ``RunConfig.data_dir``),
else the ``ELASTIC_BENCH_DATA`` environment variable. Files are looked up at fixed paths under it:

| path under the data directory | what | hub fallback |
|---|---|---|
| `longbench/data/<name>.jsonl` or `longbench/data.zip` | LongBench and LongBench-E | `THUDM/LongBench` `data.zip` |
| `longbench_v2/data.json` | LongBench-v2 items | `THUDM/LongBench-v2` `data.json` |
| `ruler/PaulGrahamEssays.json` | RULER essay haystack (`{"text": ...}`) | none |
| `ruler/squad.json` | SQuAD v2.0 dev (`dev-v2.0.json`) | `rajpurkar/squad_v2` validation rows |
| `ruler/hotpotqa.json` | HotpotQA dev distractor (`hotpot_dev_distractor_v1.json`) | `hotpotqa/hotpot_qa` rows |
| `ruler/english_words.json` | RULER's cwe word list for very long inputs | none |
| `nltk_data/tokenizers/punkt_tab/english/` | nltk's punkt sentence model | none (nltk's own paths are searched) |

The hub is used only where it holds the very file the official code reads, or the same records in rows that convert
back to the official structure (SQuAD, HotpotQA; needs the ``datasets`` package: ``pip install elastic-bench[hub]``);
nothing is ever substituted. A file that cannot be found raises `FileNotFoundError` saying which file to provide and
where. A run knows a task's results by what its corpus files hold (`identities`: their SHA-256, or a hub dataset's
commit), never by where they lie.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "ELASTIC_BENCH_DATA"


def data_root(data_dir: str | Path | None) -> Path | None:
    """The data directory: ``data_dir``, else ``$ELASTIC_BENCH_DATA``, else None."""
    value = data_dir or os.environ.get(ENV_VAR)
    return Path(value).expanduser() if value else None


@dataclass(frozen=True)
class Source:
    """One corpus file.

    Attributes:
        description: what the file is, for error messages.
        paths: candidate paths under the data directory, in order of preference.
        how: how to obtain the file.
        hub: ``(dataset repo id, file name)`` of an identical copy on the Hugging Face hub, if any.
        hub_rows: ``(dataset repo id, config, split)`` of hub rows that convert back to the file's records (read
            through the ``datasets`` package: the ``hub`` extra), if any.
        when: the inputs that read the file, where not every input does (empty: every input).
    """

    description: str
    paths: tuple[str, ...]
    how: str
    hub: tuple[str, str] | None = None
    hub_rows: tuple[str, str | None, str] | None = None
    when: str = ""

    def where(self) -> str:
        """Where the file comes from, in one line: its paths under the data directory, then its hub fallback."""
        text = " or ".join(self.paths)
        if self.hub is not None:
            text += f", else hub {self.hub[0]} {self.hub[1]}"
        if self.hub_rows is not None:
            text += f", else hub {self.hub_rows[0]} (needs the hub extra: pip install 'elastic-bench[hub]')"
        return f"{self.when}: {text}" if self.when else text


def hub_download(repo_id: str, filename: str, local_only: bool = False) -> Path:
    """Download (or reuse from the local cache) one file of a hub dataset repository; ``local_only``: from the local
    cache alone (the hub cannot be used)."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id, filename, repo_type="dataset", local_files_only=local_only))


def hub_rows(repo_id: str, config: str | None, split: str) -> list[dict]:
    """The rows of one split of a hub dataset (through the ``datasets`` package)."""
    from datasets import load_dataset

    return list(load_dataset(repo_id, config, split=split))


def fetch(source: Source, data_dir: str | Path | None) -> Path:
    """The local path of ``source``: from the data directory, else downloaded from the hub; raises
    `FileNotFoundError` naming the file to provide."""
    root = data_root(data_dir)
    if root is not None:
        for relative in source.paths:
            if (root / relative).exists():
                return root / relative
    hub_note = ""
    if source.hub is not None:
        from elastic_bench.results.digests import hub_unavailable

        why = hub_unavailable()  # then the local cache alone: no minute of retries before the message
        try:
            return hub_download(*source.hub, local_only=why is not None)
        except Exception as err:  # noqa: BLE001  (offline, not installed, gated: all mean "provide it locally")
            copy = f"{source.hub[0]}/{source.hub[1]}"
            hub_note = (f" (the hub copy {copy} could not be fetched: {type(err).__name__})" if why is None else
                        f" (the hub cannot be used, {why}, and its copy {copy} is not in the local cache)")
    where = " or ".join(str(root / p) if root else f"<data dir>/{p}" for p in source.paths)
    unset = "" if root else f"; no data directory is set: pass --data-dir or set {ENV_VAR}"
    raise FileNotFoundError(f"{source.description} not found{hub_note}: provide {where}{unset}. {source.how}")


def identity(source: Source, data_dir: str | Path | None) -> str | None:
    """What a cell that reads ``source`` is known by (its fingerprint's ``data``): the SHA-256 of the file it reads
    (under the data directory, else the hub copy, fetched as `fetch` does; a folder: over its files), or for hub rows
    ``<repo>@<commit>`` (`elastic_bench.results.digests.hub_revision`); None when it cannot be found (the cell then
    fails, naming the file to provide)."""
    from elastic_bench.foundation.files import digest
    from elastic_bench.results.digests import cached_digest, hub_revision, hub_unavailable

    try:
        path = fetch(source, data_dir)
    except FileNotFoundError:
        if source.hub_rows is None:
            return None
        commit = hub_revision(source.hub_rows[0], "dataset", hub_unavailable() is None)
        return f"{source.hub_rows[0]}@{commit}" if commit else None
    return digest(path) if path.is_dir() else cached_digest(path)


def identities(sources: tuple[Source, ...], data_dir: str | Path | None) -> dict[str, str | None]:
    """`identity` of each of ``sources`` (a task's corpus files), by the source's first path under the data
    directory."""
    return {source.paths[0]: identity(source, data_dir) for source in sources}
