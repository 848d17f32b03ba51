"""`elastic-bench tasks` says what data each task needs and where it comes from, and what it says is true;
`elastic-bench methods` prints plain, aligned text; `run`'s argument errors come before torch is imported."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from elastic_bench import tasks
from elastic_bench.cli import main
from elastic_bench.evaluation.commands import plain
from elastic_bench.tasks import corpora


@pytest.fixture
def listing(capsys, monkeypatch):
    """The stdout of ``elastic-bench ARGV`` on a terminal 200 columns wide."""
    monkeypatch.setenv("COLUMNS", "200")

    def run(*argv: str) -> str:
        assert main(list(argv)) == 0
        return capsys.readouterr().out

    return run


def test_tasks_lists_every_task_with_where_its_data_comes_from(listing):
    rows, name = {}, None
    for line in listing("tasks").split("\n\n")[0].splitlines()[1:]:  # the task table, below its header
        if line.startswith(" "):  # the wrapped rest of a long list of files
            rows[name] = (rows[name][0], f"{rows[name][1]} {line.strip()}")
            continue
        name, kind, origin = re.split(r"\s{2,}", line.strip(), maxsplit=2)
        rows[name] = (kind, origin)
    assert sorted(rows) == tasks.names()
    assert rows["ruler_niah_single_1"] == ("offline", "generated")
    assert rows["testbed_niah_single"] == ("offline", "generated")
    assert rows["ruler_niah_single_2"] == ("corpus", "ruler/PaulGrahamEssays.json; "
                                                     "nltk_data/tokenizers/punkt_tab/english/")
    assert rows["ruler_cwe"][0] == "offline" and rows["ruler_cwe"][1].endswith(": ruler/english_words.json")
    assert rows["ruler_qa_1"] == ("corpus or hub", "ruler/squad.json, else hub rajpurkar/squad_v2 (needs the hub "
                                                   "extra: pip install 'elastic-bench[hub]')")
    assert rows["longbench_e_hotpotqa"] == ("corpus or hub", "longbench/data/hotpotqa_e.jsonl or longbench/data.zip, "
                                                             "else hub THUDM/LongBench data.zip")
    assert rows["longbench_v2_cot"] == ("corpus or hub",
                                        "longbench_v2/data.json, else hub THUDM/LongBench-v2 data.json")


def test_tasks_lists_the_groups_and_where_corpora_are_read(listing):
    text = listing("tasks")
    for group, members in tasks.groups().items():
        assert re.search(rf"^{group}\s+{len(members)}$", text, re.MULTILINE), group
    assert "--data-dir" in text and "$ELASTIC_BENCH_DATA" in text


def test_what_tasks_says_is_true_offline_tasks_run_and_the_others_name_their_first_file(tmp_path, monkeypatch):
    """With an empty data folder and no hub, a task listed as offline builds its samples; any other fails naming the
    first file it is listed with."""
    from elastic_bench.modeling.loading import byte_tokenizer

    def offline(*args, **kwargs):
        raise ConnectionError("no hub in tests")

    monkeypatch.setattr(corpora, "hub_download", offline)
    monkeypatch.setattr(corpora, "hub_rows", offline)
    tok = byte_tokenizer()
    for name in tasks.names():
        task = tasks.get(name, data_dir=str(tmp_path))
        needed = [s for s in task.sources if not s.when]
        if not needed:
            assert len(task.samples(tok, 2048, limit=1)) == 1, name
            continue
        for length in (2048, 4096, 8192):  # the shortest length the task accepts (HELMET 4K, LongBench Pro 8K)
            try:
                task.samples(tok, length, limit=1)
            except tasks.LengthTooShortError:
                continue
            except FileNotFoundError as missing:
                assert str(tmp_path / needed[0].paths[0]) in str(missing), name
                break
            raise AssertionError(f"{name} built samples without its data")
        else:
            raise AssertionError(f"{name} accepts none of the lengths tried")


def test_methods_prints_plain_aligned_text(listing):
    from elastic_bench.modeling.interface import method_names

    text = listing("methods")
    assert "`" not in text.replace("run -O", "")
    lines = text.splitlines()
    for name in method_names():
        assert any(line.startswith(f"{name} ") for line in lines), name
    assert re.search(r"^streaming\s+Every KV head keeps the first sink tokens and a local-token window", text, re.M)
    assert re.search(r"^ {4}local +2048 +window tokens, counting the query itself\.$", text, re.M)
    assert re.search(r"^ {4}router +null +router checkpoint directory \(router\.safetensors", text, re.M)
    knobs = [line for line in lines if re.match(r"^ {4}\S", line)]
    assert len({line.index(line.split()[1], 4) for line in knobs}) == 1  # the defaults start in one column


def test_plain_keeps_the_content_of_markup():
    assert plain('``prefill="chunked"`` (see `elastic_bench.kernels`), ``x``') == (
        'prefill="chunked" (see elastic_bench.kernels), x')


EARLY = """
import contextlib, io, json, sys
from elastic_bench.cli import main
found = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    found.append([code, err.getvalue().strip()])
print(json.dumps({"results": found, "torch": "torch" in sys.modules}))
"""


def early_errors(argvs: list[list[str]]) -> tuple[list[tuple[int, str]], bool]:
    """``([(exit status, stderr)] of elastic-bench ARGV for each of argvs], whether torch was imported)``, in a fresh
    interpreter."""
    done = subprocess.run([sys.executable, "-c", EARLY, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    return [tuple(result) for result in found["results"]], found["torch"]


def test_run_argument_errors_come_before_torch_is_imported(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("")
    cases = {
        "--lengths abc": "argument --lengths: --lengths takes an integer; got 'abc'",
        "--lengths 0": "lengths must be positive token counts, got 0",
        "--lengths 1K,1024": "lengths gives 1024 tokens more than once (1K = 1024 tokens, 1M = 1024K)",
        "--limit 0": "limit must be at least 1, got 0",
        "--seed -1": "seed must be >= 0, got -1",
        "--tasks nope": "unknown task 'nope'",
        f"--output {afile}": f"--output {afile} is a file; expected a folder",
        "-O streaming": "method options look like METHOD.OPTION=VALUE",
    }
    results, torch_imported = early_errors([["run", *case.split()] for case in cases])
    for (code, err), expected in zip(results, cases.values()):
        assert code == 2 and expected in err and len(err.splitlines()) == 1, (expected, err)
    assert not torch_imported, "an argument error of run waited for torch"


def test_demo_and_compare_argument_errors_come_before_torch_is_imported():
    results, torch_imported = early_errors([["demo", "--limit", "0"], ["compare", "runs/a"]])
    assert results == [(2, "elastic-bench: error: --limit must be >= 1, got 0"),
                       (2, "elastic-bench: error: compare needs two or more run folders, got 1")]
    assert not torch_imported
