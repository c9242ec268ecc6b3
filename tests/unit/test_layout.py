"""The house's floor plan (issue 21): packages named for what they hold, no import circle (imports
inside functions count: a circle hidden in a function body is still one), small modules, and the
shipped configs naming each class where it is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

SRC = ROOT / "src"
MAX_TOP_LEVEL_MODULES = 12
MAX_LINES = 450


def modules(src: Path, package: str = "seqlab") -> dict[str, Path]:
    """Every module of `package` under `src`, by dotted name (a package by its __init__.py)."""
    found = {}
    for path in (src / package).rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(src: Path, package: str = "seqlab") -> dict[str, set[str]]:
    """module -> the modules of the package it imports anywhere in its source (at the top, in a
    function body, under TYPE_CHECKING). `from a.b import c` names the module a.b.c if there is
    one, else a.b; a module importing its own parent package is no edge (Python runs a package's
    __init__ before its modules anyway)."""
    mods = modules(src, package)

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package this module is in
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = owner(target)
                if found and found != name and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_seqlab_has_no_import_circle():
    graph = import_graph(SRC)
    assert len(graph) > 50  # the walk found the packages' modules
    assert (
        "seqlab.resume.points" in graph["seqlab.store.ghosts"]
    )  # an import inside a function counts
    assert circles(graph) == []


def test_no_two_packages_import_each_other():
    """The rooms too: a package that imports another is not imported by it (resume/ and sweeps/,
    say, each reaching into the other through different modules), so each can be read on its own."""
    graph = import_graph(SRC)
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        room = ".".join(module.split(".")[:2])
        rooms.setdefault(room, set()).update(".".join(t.split(".")[:2]) for t in targets)
    rooms = {room: targets - {room, "seqlab"} for room, targets in rooms.items()}
    assert rooms["seqlab.train"] >= {
        "seqlab.training",
        "seqlab.resume",
        "seqlab.sweeps",
        "seqlab.tracking",
    }
    assert circles(rooms) == []


def test_a_circle_hidden_in_a_function_body_is_found(tmp_path):
    """The check can fail: two modules of a package that import each other, one of them only
    inside a function (as sweep.py and search.py did), and a third reached through a package's
    __init__ re-export."""
    pkg = tmp_path / "seqlab"
    (pkg / "sweeps").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sweeps" / "__init__.py").write_text("from seqlab.sweeps.job import Job\n")
    (pkg / "sweeps" / "job.py").write_text("class Job:\n    pass\n")
    (pkg / "search.py").write_text("from seqlab import report\n\nVERDICT = 'v'\n")
    (pkg / "report.py").write_text(
        "def report():\n    from seqlab.search import VERDICT\n    return VERDICT\n"
    )
    (pkg / "train.py").write_text("from seqlab.sweeps import Job\n")
    graph = import_graph(tmp_path)
    assert graph["seqlab.train"] == {"seqlab.sweeps"} and graph["seqlab.sweeps"] == {
        "seqlab.sweeps.job"
    }
    assert circles(graph) == [["seqlab.report", "seqlab.search"]]
    (pkg / "sweeps" / "job.py").write_text("def later():\n    from seqlab import train\n")
    assert sorted(circles(graph := import_graph(tmp_path))) == [
        ["seqlab.report", "seqlab.search"],
        ["seqlab.sweeps", "seqlab.sweeps.job", "seqlab.train"],
    ]


def test_the_top_level_holds_few_modules_and_no_module_is_long():
    top = sorted(p.name for p in (SRC / "seqlab").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    long = {
        str(p.relative_to(SRC)): n
        for p in modules(SRC).values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_every_target_in_conf_names_a_current_path():
    """The shipped configs name each class where it is now, and each resolves."""
    import yaml
    from hydra.utils import get_object

    targets = set()
    for path in (ROOT / "conf").rglob("*.yaml"):

        def walk(node):
            if isinstance(node, dict):
                targets.update(v for k, v in node.items() if k == "_target_" and isinstance(v, str))
                for v in node.values():
                    walk(v)

        walk(yaml.safe_load(path.read_text()))
    ours = sorted(t for t in targets if t.startswith("seqlab."))
    assert (
        "seqlab.packing.module.SeqRegressor" in ours
        and "seqlab.sweeps.callback.MlflowSweepCallback" in ours
    )
    for target in ours:
        get_object(target)


def test_sweep_json_is_written_and_read_as_one_dataclass(tmp_path):
    """The sweep callback's hand-over to its jobs: a field renamed on one side fails where it is
    read, instead of reading as None; a resumed sweep's plan comes back as PlannedJobs."""
    from seqlab.sweeps.job import Job, PlannedJob, SweepInfo

    plan = {
        "data.batch_size=32 seed=0": PlannedJob(
            "a" * 32, "cpu-bs32", "KILLED", True, batch_size=32, val_rmse=0.1
        )
    }
    SweepInfo(
        "s-1", "b" * 32, "http://127.0.0.1:5001", "sqlite:///m.db", "1", ["seed"], plan
    ).write(tmp_path)
    info = Job(tmp_path / "0", ["seed=0"], sweep_dir=tmp_path, num=0).sweep_info()
    assert info.resume_plan == plan and info.swept_keys == ["seed"]
    assert (
        info.routed("sqlite:///m.db") == "http://127.0.0.1:5001"
        and info.routed("sqlite:///other.db") == "sqlite:///other.db"
    )
    assert (
        Job(tmp_path / "single").sweep_info() == SweepInfo()
    )  # no sweep: nothing known, every override names the run
    assert SweepInfo().swept_keys is None

    stored = __import__("json").loads((tmp_path / "sweep.json").read_text())
    (tmp_path / "sweep.json").write_text(
        __import__("json").dumps({**stored, "parent_run": stored.pop("parent_run_id")})
    )
    with pytest.raises(TypeError, match="parent_run"):
        SweepInfo.read(tmp_path)


@pytest.mark.parametrize(
    "quarantine, library, name",
    [
        ("seqlab.training.lightning_private", "pytorch_lightning", "pytorch-lightning"),
        ("seqlab.sweeps.optuna_private", "optuna", "optuna"),
        ("seqlab.tracking.mlflow_private", "mlflow", "mlflow"),
        ("seqlab.tracking.omegaconf_private", "omegaconf", "omegaconf"),
        ("seqlab.packing.hydra_private", "hydra", "hydra-core"),
    ],
)
def test_a_library_release_the_internals_were_not_tested_with_is_one_line(
    monkeypatch, quarantine, library, name
):
    import importlib

    from seqlab import SeqlabError

    check = importlib.import_module(quarantine).check_version
    check.cache_clear()
    monkeypatch.setattr(importlib.import_module(library), "__version__", "99.0.0")
    try:
        with pytest.raises(
            SeqlabError,
            match=rf"^{name} 99.0.0 is installed, but seqlab uses \w+ internals tested only with "
            r".*x: install that version \(make install does: requirements.lock\)$",
        ):
            check()
    finally:
        check.cache_clear()
    monkeypatch.undo()
    check()  # the installed release passes


def test_imports_sit_at_the_top_but_for_a_few_each_with_its_reason():
    """Issue 37, point 2: a reader sees a module's dependencies at its top. An import inside a
    function is kept only where a light module must answer without torch, Lightning, MLflow or
    Optuna (the command line's start-up, every multirun and job, a plugin Hydra imports, the step
    writer's helper process) or where an optional part is dear and seldom used (onnx, h5py, the
    plots), each saying why on its line; at most 15 of them import seqlab modules, 45 in all."""
    inside = []
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for imp in ast.walk(node):
                    if isinstance(imp, (ast.Import, ast.ImportFrom)):
                        name = imp.module if isinstance(imp, ast.ImportFrom) else imp.names[0].name
                        where = f"{path.relative_to(SRC)}:{imp.lineno}"
                        inside.append((where, (name or "").split(".")[0], lines[imp.lineno - 1]))
    ours = [where for where, top, _ in inside if top in ("seqlab", "hydra_plugins")]
    assert len(ours) <= 15, ours
    assert len(inside) <= 45, [where for where, _, _ in inside]
    assert [where for where, _, line in inside if "  # " not in line] == []


# What a test that starts a process or trains a whole run names: such a test belongs in
# tests/integration (make test), not in the tier a developer runs after each change.
PROCESSES_AND_WHOLE_RUNS = {
    "subprocess",
    "Popen",
    "zygote",
    "run_process",
    "start_cli",
    "mlflow_server",
    "postgres",
    "slurm",
    "trained",
}


def test_the_fast_tier_mirrors_src_and_starts_no_process():
    unit = ROOT / "tests" / "unit"
    packages = {p.name for p in (SRC / "seqlab").iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= packages, (
        f"tests/unit/ folders that are no package of seqlab: {folders - packages}"
    )
    found = []
    for path in sorted(unit.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # an attribute counts where it is the process's (pack.trained is a count of steps)
            attr = getattr(node, "attr", None)
            name = getattr(node, "id", None) or getattr(node, "arg", None)
            name = name or (attr if attr in ("Popen", "subprocess") else None)
            name = name or (
                node.names[0].name if isinstance(node, (ast.Import, ast.ImportFrom)) else None
            )
            if name in PROCESSES_AND_WHOLE_RUNS or getattr(node, "module", None) == "subprocess":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not found, "move to tests/integration: " + "; ".join(found)
