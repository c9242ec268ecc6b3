"""train.py or predict.py run inside the test process, as a user's command line would run it:
the same entry (the script's `cli()`), the same argv, working folder and environment, its stdout
and stderr captured, its exit status taken from SystemExit. A new Python costs 5-8 s of imports
here (torch, Lightning, MLflow); this costs the run itself. Tests whose point is the process
(signals, kill, parallel launchers, simultaneous starts, what happens at interpreter exit for a
sweep cut short) start one of its own (tests/harness/zygote.py).

What a process would drop at its exit is undone after each call: environment variables, Hydra's
global state, the logging set-up Hydra's job_logging installs, signal handlers, and seqlab's own
atexit handlers (run here, as the interpreter would run them)."""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_entries: dict = {}


def _entry_script(script: str):
    """train.py or predict.py as a module (not __main__): imported once, as the interpreter would load it."""
    if script not in _entries:
        spec = importlib.util.spec_from_file_location(
            f"seqlab_entry_{Path(script).stem}", ROOT / script
        )
        entry = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(entry)
        # Hydra finds conf/ beside the task function's file only for a __main__ script (for
        # another module it looks in that module's package).
        entry.main.__wrapped__.__module__ = "__main__"
        _entries[script] = entry
    return _entries[script]


@contextlib.contextmanager
def _exit_handlers():
    """atexit handlers that seqlab registers during the call run at its end, as at a process's
    exit; anything else (MLflow's, torch's) stays registered for the real exit."""
    ours: list = []
    register, unregister = atexit.register, atexit.unregister

    def _register(func, *args, **kwargs):
        # A builtin (torch._C registers one) may have __module__ None.
        if (getattr(func, "__module__", None) or "").startswith("seqlab"):
            ours.append((func, args, kwargs))
            return func
        return register(func, *args, **kwargs)

    def _unregister(func):
        ours[:] = [entry for entry in ours if entry[0] != func]
        unregister(func)

    atexit.register, atexit.unregister = _register, _unregister
    try:
        yield
    finally:
        atexit.register, atexit.unregister = register, unregister
        for func, args, kwargs in reversed(ours):
            func(*args, **kwargs)


def run_in_process(
    args: list[str], cwd: Path, env: dict[str, str], script: str = "train.py"
) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS...` (train.py or predict.py: their `cli()`) in this process."""
    from hydra.core.global_hydra import GlobalHydra

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    entry = _entry_script(script)
    root = logging.getLogger()
    saved_root = (root.handlers[:], root.level)
    saved_levels = {
        name: (lg.level, lg.disabled)
        for name, lg in logging.root.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    out, err = io.StringIO(), io.StringIO()
    code = 0
    os.environ.clear()
    os.environ.update(env)
    # What train.py's import sets in a process of its own (it is imported once here).
    os.environ.setdefault("SEQLAB_ROOT", str(ROOT))
    if script == "train.py":
        os.environ["SEQLAB_ENTRY"] = str(ROOT / "train.py")
    os.chdir(cwd)
    sys.argv = [script, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                with _exit_handlers():
                    entry.cli()
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
            except BaseException:  # what the interpreter prints for an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        GlobalHydra.instance().clear()
        for handler in root.handlers:
            if handler not in saved_root[0]:
                handler.close()
        root.handlers[:], _ = saved_root[0], root.setLevel(saved_root[1])
        for name, lg in logging.root.manager.loggerDict.items():
            if isinstance(lg, logging.Logger):
                for handler in lg.handlers[:]:
                    if isinstance(handler, logging.FileHandler) or getattr(
                        handler, "stream", None
                    ) in (out, err):
                        lg.removeHandler(handler)
                        handler.close()
                lg.setLevel(saved_levels.get(name, (logging.NOTSET, False))[0])
                lg.disabled = saved_levels.get(name, (logging.NOTSET, False))[1]
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
    return subprocess.CompletedProcess(sys.argv[:1] + args, code, out.getvalue(), err.getvalue())


def run_script(
    path: Path, args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """A script's `main(argv)` (scripts/*.py, or a module's) in this process, its output captured
    and its exit status as `python script.py args` would give it (main's return, or SystemExit)."""
    if isinstance(path, Path):
        spec = importlib.util.spec_from_file_location(f"seqlab_script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(path)
    saved_env = dict(os.environ)
    os.environ.update(env or {})
    out, err = io.StringIO(), io.StringIO()
    # A script may set its loggers' levels, as a process of its own would (benchmark.py quiets seqlab's).
    saved_levels = {
        name: lg.level
        for name, lg in logging.root.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    # A process of its own starts without logging handlers: a warning that a script does not
    # print itself reaches stderr through logging's last resort (pytest's handlers are set aside).
    saved_handlers = logging.root.handlers[:]
    logging.root.handlers[:] = []
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = module.main(args) or 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        logging.root.handlers[:] = saved_handlers
        os.environ.clear()
        os.environ.update(saved_env)
        for name, lg in logging.root.manager.loggerDict.items():
            if isinstance(lg, logging.Logger):
                lg.setLevel(saved_levels.get(name, logging.NOTSET))
    return subprocess.CompletedProcess([str(path), *args], code, out.getvalue(), err.getvalue())
