"""Method names are declared in the installed metadata (one entry point per name and alias), so an unknown name is
refused from the metadata alone, before torch is imported; discovery checks the declarations against what the
modules register."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest

from elastic_bench.foundation.registry import Registry, UnknownNameError, check_declared, declared

GROUP = "elastic_bench.methods"
# Runs the command line in a fresh interpreter and reports on stdout whether torch was imported.
PROBE = textwrap.dedent("""
    import sys
    from elastic_bench import cli
    try:
        code = cli.main(sys.argv[1:])
    except SystemExit as exit_:
        code = exit_.code
    print("torch imported" if "torch" in sys.modules else "torch not imported")
    sys.exit(code)
""")


@pytest.mark.parametrize("argv, message", [
    (["run", "--methods", "nope"], "unknown method 'nope'; (14 valid method names)"),  # more than 12: counted
    (["run", "--methods", "full,strea"], "unknown method 'strea'; did you mean streaming"),
    (["run", "-O", "nope.x=1"], "unknown method 'nope'"),
    (["run", "--methods", "full", "-O", "streamng.local=1"], "unknown method 'streamng'; did you mean streaming"),
    (["methods", "nope"], "unrecognized arguments: nope"),
])
def test_an_unknown_method_name_is_refused_without_importing_torch(tmp_path, argv, message):
    # run outside the checkout, so the installed metadata is what the interpreter reads
    done = subprocess.run([sys.executable, "-c", PROBE, *argv, "--output", str(tmp_path / "out")]
                          if argv[0] == "run" else [sys.executable, "-c", PROBE, *argv],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "torch not imported"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (tmp_path / "out").exists()


def test_every_registered_method_name_and_alias_is_declared():
    from elastic_bench.modeling.interface import REGISTRY

    assert sorted([*REGISTRY.names(), *REGISTRY.aliases()]) == declared("method", GROUP)
    check_declared("method", GROUP, ["dense", "duo", "xattn", "elastic_attention"])  # aliases pass


def test_run_config_accepts_an_alias_and_refuses_options_of_an_undeclared_method():
    from elastic_bench.evaluation.runner import RunConfig

    assert [m.name for m in RunConfig(methods=["dense", "duo"]).build_methods()] == ["full", "duo_attention"]
    with pytest.raises(UnknownNameError, match="unknown method 'streamng'; did you mean streaming"):
        RunConfig(methods=["full"], method_options={"streamng": {"local": 1}})


# ---- discovery against a plugin distribution made on the fly ------------------------------------------------------


def install_plugin(root, monkeypatch, entry_points: dict[str, str], module: str) -> str:
    """A distribution ``widgets-plugin`` under ``root`` (put on ``sys.path``) declaring ``entry_points`` (name →
    value) under its own group, and its module ``widgets_plugin`` with the source ``module``; returns the group."""
    group = f"test_widgets_{root.name}"
    info = root / "widgets_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: widgets-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    (root / "widgets_plugin.py").write_text(textwrap.dedent(module))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "widgets_plugin", raising=False)
    return group


REGISTERING = """
    from widgets_registry import WIDGETS

    class Knob:
        pass

    WIDGETS.add("knob", Knob, *ALIASES)
"""


@pytest.fixture
def widgets(monkeypatch):
    """Makes the registry of a plugin group, importable by the plugin module as ``widgets_registry.WIDGETS``."""
    def make(group: str) -> Registry[type]:
        holder = types.ModuleType("widgets_registry")
        holder.WIDGETS = Registry("widget", entry_points=group)
        monkeypatch.setitem(sys.modules, "widgets_registry", holder)
        return holder.WIDGETS

    return make


def test_declared_names_are_read_without_importing_the_plugin(tmp_path, monkeypatch, widgets):
    group = install_plugin(tmp_path, monkeypatch, {"knob": "widgets_plugin:Knob", "dial": "widgets_plugin:Knob"},
                           REGISTERING.replace("*ALIASES", '"dial"'))
    assert declared("widget", group) == ["dial", "knob"]
    with pytest.raises(UnknownNameError, match="unknown widget 'knbo'; did you mean knob"):
        check_declared("widget", group, ["dial", "knbo"])
    assert "widgets_plugin" not in sys.modules
    registry = widgets(group)
    assert registry.names() == ["knob"] and registry.aliases() == {"dial": "knob"}


def test_an_alias_the_plugin_registers_but_does_not_declare_fails_discovery(tmp_path, monkeypatch, widgets):
    group = install_plugin(tmp_path, monkeypatch, {"knob": "widgets_plugin:Knob"},
                           REGISTERING.replace("*ALIASES", '"dial"'))
    registry = widgets(group)
    for _ in range(2):  # a failed discovery fails every lookup, not just the first
        with pytest.raises(ImportError, match="registered widget names not declared in the group: dial"):
            registry.get("knob")


def test_a_declaration_its_module_does_not_register_fails_discovery(tmp_path, monkeypatch, widgets):
    group = install_plugin(tmp_path, monkeypatch, {"knob": "widgets_plugin:Knob", "lever": "widgets_plugin:Knob"},
                           REGISTERING.replace("*ALIASES", ""))
    with pytest.raises(ImportError, match="does not register that object as widget 'lever'"):
        widgets(group).names()


def test_a_plugin_listed_by_module_still_registers_and_leaves_names_to_the_lookup(tmp_path, monkeypatch, widgets):
    group = install_plugin(tmp_path, monkeypatch, {"widgets": "widgets_plugin"}, REGISTERING.replace("*ALIASES", ""))
    assert declared("widget", group) is None
    check_declared("widget", group, ["anything"])  # no verdict without importing: the registry's lookup decides
    registry = widgets(group)
    assert registry.names() == ["knob"]
    with pytest.raises(UnknownNameError, match="unknown widget 'anything'"):
        registry.get("anything")
