"""The front door and the manual (issue 37): the README's five-minute tour runs as written, its
page stays short, the documentation site builds with every link checked, and ruff passes."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, cli_env, runs_of

README = ROOT / "README.md"


def tour() -> list[str]:
    """The commands of the README's tour: its first bash block after the heading."""
    text = README.read_text()
    section = text.split("## A five-minute tour", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_is_a_front_door_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_the_documentation_site_builds_with_every_link_checked(tmp_path):
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable))
    if mkdocs is None:
        pytest.skip(
            "mkdocs is not installed in this Python's environment (make install puts it in .venv)"
        )
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "packing" / "index.html").is_file()


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable))
    if ruff is None:
        pytest.skip(
            "ruff is not installed in this Python's environment (make install puts it in .venv)"
        )
    paths = ["src", "tests", "scripts", "train.py", "predict.py"]
    for command in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [ruff, *command, *paths], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"ruff {' '.join(command)}: " + proc.stdout[-3000:]


def test_the_five_minute_tour_runs_as_written(tmp_path, _empty_store):
    """Each tour line in a copy of the project (its files, this .venv), as a newcomer types it. A line
    that starts the project's Python on a script (make train's recipe included) runs forked from the
    suite's warm interpreter (tests/zygote.py: the same argv, folder and environment, minus the 5-8 s
    of imports); the others through the shell."""
    from harness import zygote

    project = tmp_path / "seqlab"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "mlruns", "logs", "site", "__pycache__", "*.db"
    )
    shutil.copytree(
        ROOT, project, ignore=ignore
    )  # copy2: the install stamp stays newer than the copies
    (project / ".venv").symlink_to(ROOT / ".venv")
    (project / "mlruns").mkdir()
    shutil.copy(
        _empty_store, project / "mlruns" / "mlflow.db"
    )  # the tables MLflow would make at the first run
    env = cli_env()
    for line in tour():
        command = line
        if line.startswith("make "):  # what make runs, once it finds the project installed
            # Under `make test` this make is a nested one: without make's own variables it prints only the recipe.
            plain = {k: v for k, v in env.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
            recipe = subprocess.run(
                ["make", "--no-print-directory", "-n", *shlex.split(line)[1:]],
                cwd=project,
                capture_output=True,
                text=True,
                env=plain,
            )
            # One line: the project is installed. More would (re)install it, from the copy: never here.
            assert recipe.returncode == 0 and recipe.stdout.strip().count("\n") == 0, (
                "the project's install is older than its pyproject.toml, requirements.lock or Makefile: run make install "
                "first\n" + recipe.stdout + recipe.stderr
            )
            command = recipe.stdout.strip()
        words = shlex.split(command)
        if words[0] == ".venv/bin/python" and not set("|;&<>") & set(command):
            proc = zygote.run([str(project / words[1]), *words[2:]], project, env, timeout=600)
        else:
            proc = subprocess.run(
                command,
                shell=True,
                cwd=project,
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
        assert proc.returncode == 0, (line, (proc.stdout + proc.stderr)[-3000:])
        if "--cfg job" in line:
            assert "batch_size" in proc.stdout
        if "compare.py" in line:
            assert "tied" in proc.stdout or "faster" in proc.stdout, proc.stdout[-2000:]
    import mlflow

    store = mlflow.MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    runs = runs_of(store, "seqlab")
    assert (
        sum(r.info.status == "FINISHED" and "pack_id" in r.data.tags for r in runs) == 4
    )  # the packed line
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) >= 1 + 4 + 4
