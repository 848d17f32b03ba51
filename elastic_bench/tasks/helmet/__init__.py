"""HELMET (princeton-nlp/HELMET @ 4526dfb, MIT; data: its data.tar.gz, ∞Bench and the ICL datasets on the hub): the
recall, RAG, re-ranking, many-shot ICL and long-document QA categories, registered as ``helmet_<dataset>`` in the
groups ``helmet_recall``, ``helmet_rag``, ``helmet_rerank``, ``helmet_icl``, ``helmet_longqa`` and ``helmet``.

Long-document QA has only ∞Bench En.MC here: HELMET scores NarrativeQA and ∞Bench En.QA with a GPT-4o judge (and
draws NarrativeQA's demonstrations unseeded), which no local run reproduces; `elastic_bench.tasks.catalog` lists
them as unavailable.
"""

from __future__ import annotations

from ..base import GROUPS, register
from . import datasets as d


def _add(name: str, group: str, base: type, **attrs) -> None:
    cls = type(f"Helmet_{name}", (base,), {"__doc__": f"HELMET {name}: {base.__doc__}", **attrs})
    if issubclass(cls, d.FileTask):
        cls.sources = cls.file_sources()
    elif issubclass(cls, d.Icl):
        cls.sources = tuple(cls.splits.values())
    register(f"helmet_{name}", group=group)(cls)
    GROUPS.setdefault("helmet", []).append(f"helmet_{name}")


_add("json_kv", "helmet_recall", d.JsonKV)
_add("ruler_niah_mk_2", "helmet_recall", d.RulerNiah, **d.niah_attributes("niah_multikey_2", 50, many=False))
_add("ruler_niah_mk_3", "helmet_recall", d.RulerNiah, **d.niah_attributes("niah_multikey_3", 100, many=False))
_add("ruler_niah_mv", "helmet_recall", d.RulerNiah, **d.niah_attributes("niah_multivalue", 50, many=True))

_KS = (20, 50, 105, 220, 440, 1000)
_add("kilt_nq", "helmet_rag", d.Kilt, **d.kilt_attributes("nq", 6, _KS))
_add("kilt_triviaqa", "helmet_rag", d.Kilt, **d.kilt_attributes("triviaqa", 6, _KS))
_add("kilt_hotpotqa", "helmet_rag", d.Kilt, **d.kilt_attributes("hotpotqa", 3, _KS))
_add("kilt_popqa", "helmet_rag", d.Kilt, **d.kilt_attributes("popqa", 6, _KS, threshold=3))

_add("msmarco_rerank", "helmet_rerank", d.MsMarco)


def _icl(name: str, base: type, repo: str, config: str | None, label: str, labels: int, shots: tuple[int, ...],
         splits: dict[str, str]) -> None:
    sources = {role: d.icl_source(name, split, repo, config) for role, split in splits.items()}
    _add(f"icl_{name}", "helmet_icl", base, label=label, labels=labels, shots=shots, splits=sources)


_icl("trec_coarse", d.Icl, "CogComp/trec", None, "coarse_label", 6, (200, 400, 800, 1600, 3300, 6600),
     {"train": "train", "test": "test"})
_icl("trec_fine", d.Icl, "CogComp/trec", None, "fine_label", 50, (200, 400, 800, 1600, 3200, 6400),
     {"train": "train", "test": "test"})
_icl("banking77", d.Icl, "PolyAI/banking77", None, "label", 77, (180, 360, 720, 1450, 2900, 5900),
     {"train": "train", "test": "test"})
_icl("clinic150", d.Icl, "clinc/clinc_oos", "plus", "intent", 151, (220, 440, 880, 1750, 3525, 7050),
     {"train": "train", "test": "validation"})
_icl("nlu", d.IclHeldOut, "xingkunliuxtracta/nlu_evaluation_data", None, "label", 68,
     (250, 510, 1020, 2040, 4080, 8296), {"train": "train"})

_add("infbench_choice", "helmet_longqa", d.InfBenchChoice)
