"""`run` → `report` and `compare` end to end on the testbed and on tiny models, and the HTML page opened in headless
Chromium (Debian's ``chromium``; skipped where it is not installed): every plot loaded, every table there, the tables
sort, and no request left the page.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ended by NUL on
file descriptors 3 and 4), so the test sees every request the page makes (``Network.requestWillBeSent``); host names
resolve to nothing (``--host-resolver-rules``), so nothing can reach the network either way.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from elastic_bench import cli

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed, so the report page's browser "
                                    "tests are skipped (`make test` installs Debian's chromium where apt-get works)")
TESTBED = ["--model", "testbed", "--tasks", "testbed_niah_single,testbed_repeat", "--lengths", "1024", "--limit", "1",
           "--device", "cpu", "--no-progress"]
TINY = ["--tasks", "ruler_niah_single_1", "--lengths", "640", "--limit", "2", "--device", "cpu", "--no-progress"]

PAGE_STATE = """JSON.stringify({
  count: document.querySelectorAll("table.sortable").length,
  images: Array.from(document.images).map(i => ({alt: i.alt, width: i.naturalWidth, complete: i.complete})),
  tables: Array.from(document.querySelectorAll("h4[id]")).filter(h => h.nextElementSibling &&
      h.nextElementSibling.querySelector("table")).map(h => [h.id,
      h.nextElementSibling.querySelectorAll("tbody tr").length]),
  sorted: (function () {  // click ΩMSR of the first overview twice: descending order
    var t = document.querySelector("h4[id$=-overview] + div table"), th = t.querySelectorAll("thead th")[2];
    var before = Array.from(t.tBodies[0].rows).map(r => parseFloat(r.cells[2].textContent));
    th.click(); th.click();
    return [before, Array.from(t.tBodies[0].rows).map(r => parseFloat(r.cells[2].textContent))];
  })()
})"""


class DevTools:
    """Headless Chromium driven over ``--remote-debugging-pipe``."""

    def __init__(self, profile: Path, timeout: float = 60.0):
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()

        def pipes_on_3_and_4():  # in the child, before exec: the protocol's file descriptors
            r, w = os.dup(to_child), os.dup(from_child)
            os.dup2(r, 3)
            os.dup2(w, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=pipes_on_3_and_4, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self.timeout, self.events, self._buffer, self._next = timeout, [], b"", 0

    def _message(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._in], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "chromium did not answer"
            chunk = os.read(self._in, 1 << 20)
            assert chunk, "chromium exited"
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        return self.wait(lambda m: m.get("id") == self._next)["result"]

    def wait(self, found) -> dict:
        while not found(message := self._message()):
            self.events.append(message)
        return message

    def open(self, page: Path, script: str, width: int | None = None) -> tuple[dict, list[str]]:
        """Load ``page`` (in a window ``width`` pixels wide when given), run ``script`` (an expression giving a JSON
        string) once it loaded; (its value, the URL of every request the page made, itself included)."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        if width is not None:
            self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                             "mobile": False}, session=session)
        self.send("Network.enable", session=session)
        self.send("Page.enable", session=session)
        self.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        self.wait(lambda m: m.get("method") == "Page.loadEventFired")
        value = self.send("Runtime.evaluate", {"expression": script, "returnByValue": True}, session=session)
        sent = [e for e in self.events if e.get("method") == "Network.requestWillBeSent"]
        requests = [e["params"]["request"]["url"] for e in sent]
        return json.loads(value["result"]["value"]), requests

    def close(self) -> None:
        self.send("Browser.close")
        self.process.wait(timeout=30)
        os.close(self._in)
        os.close(self._out)


@pytest.fixture
def browser(tmp_path):
    devtools = DevTools(tmp_path / "profile")
    yield devtools
    devtools.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run folders made by `elastic-bench run`: the testbed under full + elastic (and a copy of that run, as a
    second run), tiny Llama under full + streaming, tiny Qwen3 under full."""
    root = tmp_path_factory.mktemp("runs")
    commands = {
        "testbed": [*TESTBED, "--methods", "full,elastic", "--allow-in-distribution"],  # the router's own tasks
        "llama": ["--model", "tiny:llama", *TINY, "--methods", "full,streaming", "-O", "streaming.local=64"],
        "qwen3": ["--model", "tiny:qwen3", *TINY, "--methods", "full"],
    }
    for name, argv in commands.items():
        assert cli.main(["run", *argv, "--output", str(root / name)]) == 0
    shutil.copytree(root / "testbed", root / "testbed-again")
    return root


def _row(md: str, first: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(f"| {first} "))
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _check_page(browser: DevTools, page: Path) -> dict:
    state, requests = browser.open(page, PAGE_STATE)
    assert requests and all(url == page.resolve().as_uri() or url.startswith("data:") for url in requests), requests
    assert state["images"] and all(i["complete"] and i["width"] > 0 for i in state["images"]), state["images"]
    markdown_tables = (page.parent / "report.md").read_text().count("\n|:")
    assert state["count"] == markdown_tables and all(rows > 0 for _, rows in state["tables"]), state["tables"]
    before, after = state["sorted"]
    assert after == sorted(before, reverse=True)
    return state


@needs_chromium
def test_testbed_report_shows_adaptive_sparsity_and_the_routing_map_and_loads_offline(runs, tmp_path, browser):
    assert cli.main(["report", str(runs / "testbed"), "--output", str(tmp_path / "report")]) == 0
    state = _check_page(browser, tmp_path / "report" / "report.html")
    tables = dict(state["tables"])
    assert {f"testbed-{t}" for t in ("adaptive-sparsity", "overview", "testbed-score", "testbed-msr", "testbed-esr",
                                     "pairs", "legend")} <= set(tables)
    alts = [i["alt"] for i in state["images"]]
    assert "Routing map of elastic (router=testbed/elastic_router)" in alts  # the router the testbed ships
    assert not any(alt.startswith("Routing map of full") for alt in alts)  # full routes no prompt
    assert "Adaptive sparsity: ΩMSR per task category" in alts
    # the adaptive-sparsity row of elastic: ΩMSR per family, as its cells' metrics.json record them
    md = (tmp_path / "report" / "report.md").read_text()
    section = md[md.index("**Adaptive sparsity"):]
    header = [c.strip() for c in section.splitlines()[2].strip("|").split("|")]
    row = next([c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
               if line.startswith("| elastic (router=testbed/elastic_router) "))
    for task, family in (("testbed_niah_single", "sensitive"), ("testbed_repeat", "robust")):
        metrics = json.loads((runs / "testbed" / "testbed" / "elastic" / task / "1024" / "metrics.json").read_text())
        assert row[header.index(f"ΩMSR · {family}")] == f"{metrics['omega_msr']:.3f} ‡"  # scored in-distribution


@needs_chromium
def test_compare_of_two_testbed_runs_and_of_two_tiny_models(runs, tmp_path, browser):
    assert cli.main(["compare", str(runs / "testbed"), str(runs / "testbed-again"), "--output",
                     str(tmp_path / "testbed")]) == 0
    state = _check_page(browser, tmp_path / "testbed" / "report.html")
    assert {"methods-by-runs", "pairs"} <= {t.rpartition("testbed-again-")[2] for t in dict(state["tables"])}
    md = (tmp_path / "testbed" / "report.md").read_text()
    pair = "testbed · elastic (router=testbed/elastic_router) − testbed-again · elastic (router=testbed/elastic_router)"
    assert pair in md  # the same prompts, the same predictions: Δ 0
    assert _row(md, pair)[1:4] == ["+0.00 ‡", "+0.00", "+0.00"]  # the router's score: in-distribution
    assert cli.main(["compare", str(runs / "llama"), str(runs / "qwen3")]) == 0  # default output: beside the runs
    md = (runs / "compare-llama-qwen3" / "report.md").read_text()
    assert "llama · tiny-llama · streaming (local=64)" in md and "qwen3 · tiny-qwen3 · full" in md
    assert (runs / "compare-llama-qwen3" / "report.html").exists()


def test_tiny_model_report_files(runs):
    assert cli.main(["report", str(runs / "llama")]) == 0
    md = (runs / "llama" / "report" / "report.md").read_text()
    assert "## tiny-llama" in md and "**RULER: score by task**" in md
    assert (runs / "llama" / "report" / "report.html").stat().st_size > 10_000


@needs_chromium
def test_the_request_check_sees_a_page_that_fetches(tmp_path, browser):
    page = tmp_path / "fetches.html"
    page.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    _, requests = browser.open(page, 'JSON.stringify(0)')
    assert "http://example.invalid/x.png" in requests


FIGURES = """JSON.stringify(Array.from(document.querySelectorAll("figure")).map(function (f) {
  var img = f.querySelector("img"), link = img.closest("a");
  return {id: f.id, natural: img.naturalWidth, shown: img.getBoundingClientRect().width,
          room: f.parentElement.getBoundingClientRect().width, href: link && link.getAttribute("href")};
}))"""


@needs_chromium
def test_the_headline_figure_is_drawn_at_the_pages_width_and_every_figure_links_to_its_png(tmp_path, browser):
    """In a 1200-pixel window the two-panel frontier (1650 pixels) spans the page, about 1150 pixels, not a column of
    half of it; every figure is drawn at its own size where it fits, and links to its PNG beside the page."""
    from test_reports import _cell

    from elastic_bench.reports import load_cells, summarize, write_report

    for method, score in (("full", 100.0), ("elastic", 97.0), ("streaming", 50.0)):
        _cell(tmp_path / "run", method, "t", 1024, score, 0.2 * len(method) / 9, 1.0, category="sensitive")
    write_report(summarize(load_cells(tmp_path / "run")), tmp_path / "report", source="x")
    figures, _ = browser.open(tmp_path / "report" / "report.html", FIGURES, width=1200)
    headline = next(f for f in figures if f["id"].endswith("-frontier-omega-esr"))
    assert headline["natural"] == 1650 and 1100 <= headline["shown"] == pytest.approx(headline["room"], abs=3)
    for figure in figures:
        assert figure["shown"] == pytest.approx(min(figure["natural"], figure["room"]) + 2, abs=1), figure  # + border
        assert figure["href"] == f"{figure['id']}.png" and (tmp_path / "report" / figure["href"]).is_file()
