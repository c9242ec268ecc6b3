"""How a run was made, so that it can be made again (issue 36, point 2): the code (the git commit,
whether the tree was dirty, the uncommitted diff, the untracked files by name only) and the
environment (every installed distribution and its version, Python, torch, the CPU and GPU), as a
run's tags and artifacts:

    tags        git_commit, git_dirty (true|false), code_digest (the commit and diff together)
    code/       diff.patch (git diff HEAD: staged and unstaged, text files; empty when clean),
                untracked.txt (untracked, not ignored, files: names only, never contents)
    env/        requirements.txt (as pip freeze lists it), system.json

The environment is read once per process (a pack's members and a sweep's in-process jobs share it);
both are written as files in the job's folder; the tracker uploads them masked, as every text artifact it sends
(secrets.py), so a password a diff holds reaches the run as ***. `rerun=<run id>` compares the
current code's digest with the run's (seqlab.rerun)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from seqlab.training.devices import cpu_name

GIT_TIMEOUT_S = 10


@dataclass(frozen=True)
class CodeState:
    commit: Optional[str]  # None: not a git checkout (or no git)
    dirty: bool
    diff: str  # git diff HEAD
    untracked: tuple[str, ...]

    @property
    def digest(self) -> Optional[str]:
        """The commit and the uncommitted diff, hashed: equal digests, the same code (untracked
        files aside: they are listed, not read)."""
        if self.commit is None:
            return None
        return hashlib.sha256(f"{self.commit}\n{self.diff}".encode()).hexdigest()[:16]

    def tags(self) -> dict[str, str]:
        if self.commit is None:
            return {}
        return {
            "git_commit": self.commit,
            "mlflow.source.git.commit": self.commit,
            "git_dirty": str(self.dirty).lower(),
            "code_digest": self.digest,
        }


def _git(root: Path, *args: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_state(root: Path) -> CodeState:
    """The code under `root` as git sees it now (three git commands, about 20 ms: read each time, as
    a rerun's check must see the tree as it is)."""
    commit = _git(root, "rev-parse", "HEAD")
    if not commit:
        return CodeState(None, False, "", ())
    diff = _git(root, "diff", "HEAD", "--no-color", "--no-ext-diff") or ""
    untracked = tuple(
        line
        for line in (_git(root, "ls-files", "--others", "--exclude-standard") or "").splitlines()
        if line
    )
    return CodeState(commit.strip(), bool(diff or untracked), diff, untracked)


@functools.lru_cache(maxsize=1)
def environment() -> tuple[str, dict[str, Any]]:
    """(requirements.txt as pip freeze lists it, system.json's content): read once per process."""
    seen: dict[str, str] = {}
    # Each installed distribution by its dist-info folder's name (name-version.dist-info): parsing
    # every METADATA file (importlib.metadata) took 0.76 s for 142 distributions here.
    for folder in sys.path:
        try:
            entries = os.scandir(folder or ".")
        except OSError:
            continue
        with entries:
            for entry in entries:
                if entry.name.endswith(".dist-info") and "-" in entry.name:
                    name, _, version = entry.name[: -len(".dist-info")].rpartition("-")
                    seen.setdefault(
                        name.lower().replace("_", "-"), f"{name}=={version}"
                    )  # the first on the path wins
    requirements = "\n".join(sorted(seen.values(), key=str.lower)) + "\n"
    system = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": cpu_name(),
        "cpu_count": len(_affinity()),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
    }
    return requirements, system


def _affinity() -> set[int]:
    return (
        os.sched_getaffinity(0)
        if hasattr(os, "sched_getaffinity")
        else set(range(os.cpu_count() or 1))
    )


def record_provenance(tracker: Any, code: CodeState, job_dir: Path) -> None:
    """The run's code and environment as artifacts (code/, env/), from files in the job's folder."""
    requirements, system = environment()
    code_dir, env_dir = job_dir / "code", job_dir / "env"
    code_dir.mkdir(parents=True, exist_ok=True)
    env_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "diff.patch").write_text(code.diff)
    (code_dir / "untracked.txt").write_text("".join(f"{name}\n" for name in code.untracked))
    (env_dir / "requirements.txt").write_text(requirements)
    (env_dir / "system.json").write_text(json.dumps(system, indent=1) + "\n")
    tracker.log_artifact(code_dir, "code")
    tracker.log_artifact(env_dir, "env")
