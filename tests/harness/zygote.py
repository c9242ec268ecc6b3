"""Processes for the tests that need one, without paying a Python start each time.

A fresh `python train.py` spends 5-8 s of CPU here importing torch, Lightning and MLflow before
it does anything; the suite starts about twenty such processes. A zygote (the way Android starts
its apps; multiprocessing's forkserver is the same idea) is one Python that has made those
imports, and nothing else: no thread, no store opened, no tensor computed. For each command
line it is sent it forks a child, and the child becomes `python SCRIPT ARGS...`: its own pid and
process group (or session), working folder, environment, argv, stdin from /dev/null, its stdout
and stderr the pipes or files the test gave, its signals, its atexit, its exit status, its file
locks. What a child shares with the zygote is only what an import leaves behind.

What is not tested through it: the interpreter's own start (test_config runs a real
`python train.py` to see what `--help` imports and how a sweep list is checked), and the
processes seqlab itself starts (DDP's other ranks, joblib's workers, the MLflow server), which are
real new Pythons wherever their parent runs. One exception: a run inside a test process (its
in-process command lines, its direct `train(cfg)` calls) starts its delivery process here
(`popen`, tests/integration/conftest.py), `python -m seqlab.delivery.helper` with its stdin and
stdout pipes, where a new Python would pay 0.5 s of Matplotlib's import for each figure's helper:
a run started here (start_cli) still starts a new one.

    python tests/harness/zygote.py FD    # serves the SOCK_SEQPACKET socket FD until its peer closes it
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Optional, Union

ROOT = Path(__file__).resolve().parents[2]
MAX_MESSAGE = 1 << 20


# -- the zygote's side ------------------------------------------------------------------------------
def _warm_up() -> None:
    """Import what a run imports, lazily or not, so that a child starts where a run's work does."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import mlflow  # noqa: F401
    import mlflow.pytorch  # noqa: F401
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import pytorch_lightning  # noqa: F401
    import torch  # noqa: F401
    from hydra.core.plugins import Plugins

    import seqlab.predict  # noqa: F401
    import seqlab.train  # noqa: F401

    Plugins.instance()  # Hydra's plugin discovery imports every installed launcher and sweeper
    if (
        threading.active_count() != 1
    ):  # a fork copies only the forking thread: a lock another held stays held
        raise SystemExit(
            f"zygote: {threading.active_count()} threads after the imports; a fork would not be safe"
        )


def _serve(sock: socket.socket) -> tuple[dict, list[int]]:
    """Fork a child per request; return (in the child only) the request and its [stdout, stderr] fds."""
    status_fds: dict[int, int] = {}  # child pid -> where its exit status goes

    def reap(*_: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = status_fds.pop(pid, None)
            if fd is not None:
                os.write(fd, str(os.waitstatus_to_exitcode(status)).encode())
                os.close(fd)

    signal.signal(signal.SIGCHLD, reap)
    while True:
        message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
        if not message:
            sys.exit(0)  # the test process ended
        request = json.loads(message)
        signal.pthread_sigmask(
            signal.SIG_BLOCK, {signal.SIGCHLD}
        )  # reap() waits until the pid is known
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            sock.close()
            for fd in [*status_fds.values(), fds[3]]:
                os.close(fd)
            return request, fds[:3]
        status_fds[pid] = fds[3]
        for fd in fds[:3]:
            os.close(fd)
        sock.send(json.dumps(pid).encode())
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def _become(request: dict, stdin: int, out: int, err: int) -> None:
    """This forked child becomes `python ARGV...` as the request gives it."""
    if request["new_session"]:
        os.setsid()
    os.dup2(stdin, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {stdin, out, err} - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = request["argv"]
    if request["module"] is not None:  # python -m MODULE ARGS...
        sys.path[0] = os.getcwd()
        sys.modules.pop(request["module"], None)  # imported here: run anew as __main__
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    elif request["code"] is None:
        sys.path[0] = str(Path(sys.argv[0]).resolve().parent)  # as for `python SCRIPT`
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:  # python -c CODE ARGS...
        sys.path[0] = ""
        exec(
            compile(request["code"], "<string>", "exec"),
            {"__name__": "__main__", "__builtins__": __builtins__},
        )


# -- the tests' side --------------------------------------------------------------------------------
Stream = Union[None, int, IO]


class Child:
    """The part of subprocess.Popen that the tests and seqlab's Delivery use, for a child of the
    zygote: pid, stdin, stdout, stderr, returncode, poll, wait, communicate, send_signal,
    terminate, kill."""

    def __init__(
        self,
        pid: int,
        status_fd: int,
        stdout: Optional[IO],
        stderr: Optional[IO],
        args: list[str],
        stdin: Optional[IO] = None,
    ) -> None:
        self.pid, self.args = pid, args
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: Optional[int] = None
        self._status = status_fd

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self._read_status(0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None and not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _read_status(self, timeout: Optional[float]) -> bool:
        with selectors.DefaultSelector() as sel:
            sel.register(self._status, selectors.EVENT_READ)
            if not sel.select(timeout):
                return False
        text = b""
        while chunk := os.read(self._status, 64):
            text += chunk
        os.close(self._status)
        if not text:
            raise RuntimeError(f"the zygote ended without the exit status of pid {self.pid}")
        self.returncode = int(text)
        return True

    def communicate(self, timeout: Optional[float] = None) -> tuple[Optional[str], Optional[str]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        pipes = {f: [] for f in (self.stdout, self.stderr) if f is not None}
        with selectors.DefaultSelector() as sel:
            for f in pipes:
                os.set_blocking(f.fileno(), False)
                sel.register(f.fileno(), selectors.EVENT_READ, f)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        pipes[key.data].append(chunk)
                    else:
                        sel.unregister(key.fd)
        texts = {f: b"".join(chunks).decode(errors="replace") for f, chunks in pipes.items()}
        for f in pipes:
            f.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return texts.get(self.stdout), texts.get(self.stderr)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # a pid the zygote has reaped may already be another process's
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    def __init__(self) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Its own environment reaches only what its imports read (OMP_NUM_THREADS): each child
        # gets the environment its request gives.
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.lock = threading.Lock()
        ready = self.sock.recv(64)  # sent once the imports are done
        if ready != b"ready":
            raise RuntimeError(f"the zygote did not start (exit status {self.proc.wait()})")

    def start(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        stdout: Stream = None,
        stderr: Stream = None,
        code: Optional[str] = None,
        new_session: bool = False,
        module: Optional[str] = None,
        stdin_pipe: bool = False,
        binary: bool = False,
    ) -> Child:
        """Like Popen([sys.executable, *argv], ...) (or [sys.executable, "-c", code, *argv], or
        [sys.executable, "-m", module, *argv]); stdout and stderr: None (this process's),
        subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT (stderr only) or an open file; stdin
        /dev/null, or with stdin_pipe a pipe this side writes; pipes read as text, or bytes."""
        mine: list[int] = []  # fds to close here once the zygote has its own copies

        def target(stream: Stream, default: int) -> tuple[int, Optional[IO]]:
            if stream is None:
                return default, None
            if stream == subprocess.PIPE:
                read, write = os.pipe()
                mine.append(write)
                return write, open(read, "rb") if binary else open(read, "r", errors="replace")
            if stream == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_WRONLY)
                mine.append(fd)
                return fd, None
            return stream.fileno(), None

        out_fd, out = target(stdout, 1)
        err_fd, err = (out_fd, None) if stderr == subprocess.STDOUT else target(stderr, 2)
        if stdin_pipe:
            in_fd, write = os.pipe()
            stdin = open(write, "wb")
        else:
            in_fd, stdin = os.open(os.devnull, os.O_RDONLY), None
        mine.append(in_fd)
        status_read, status_write = os.pipe()
        mine.append(status_write)
        if module is not None:
            argv = [module, *argv]  # sys.argv[0] becomes the module's file, as for python -m
        request = {
            "argv": argv if code is None else ["-c", *argv],
            "cwd": str(cwd),
            "env": env,
            "code": code,
            "module": module,
            "new_session": new_session,
        }
        try:
            with self.lock:
                socket.send_fds(
                    self.sock,
                    [json.dumps(request).encode()],
                    [in_fd, out_fd, err_fd, status_write],
                )
                pid = json.loads(self.sock.recv(64))
        finally:
            for fd in mine:
                os.close(fd)
        return Child(pid, status_read, out, err, [sys.executable, *argv], stdin)

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(timeout=30)


_shared: Optional[Zygote] = None


def shared() -> Zygote:
    """This test process's zygote, started on first use (a few seconds), ended with the process."""
    global _shared
    if _shared is None:
        import atexit

        _shared = Zygote()
        atexit.register(_shared.close)
    return _shared


def start(argv: list[str], cwd: Path, env: dict[str, str], **kwargs) -> Child:
    return shared().start(argv, cwd, env, **kwargs)


def popen(
    args: list[str], stdin: Stream = None, stdout: Stream = None, stderr: Stream = None, env=None
) -> Child:
    """subprocess.Popen for seqlab's `[sys.executable, "-m", MODULE, ...]` with bytes pipes (its
    Delivery's helper, as `Delivery.launch`), forked from this process's zygote."""
    executable, flag, module, *rest = args
    assert executable == sys.executable and flag == "-m", args
    return start(
        rest,
        Path.cwd(),
        dict(os.environ if env is None else env),
        stdout=stdout,
        stderr=stderr,
        module=module,
        stdin_pipe=stdin == subprocess.PIPE,
        binary=True,
    )


def run(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: Optional[float] = None,
    code: Optional[str] = None,
) -> subprocess.CompletedProcess:
    """Like subprocess.run([sys.executable, *argv], capture_output=True, text=True)."""
    child = start(argv, cwd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, code=code)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise
    return subprocess.CompletedProcess([sys.executable, *argv], child.returncode, out, err)


if __name__ == "__main__":
    _sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(
            1, signal.SIGTERM
        )  # PR_SET_PDEATHSIG: ends with the tests
    except (OSError, AttributeError):
        pass
    _warm_up()
    # The imports' objects (millions: torch, Lightning, MLflow) out of the collector's reach: a
    # child's every full collection would otherwise walk them all, and write to each one's page
    # (copy-on-write), which made a forked delivery helper cost more CPU than a new Python.
    gc.freeze()
    _sock.send(b"ready")
    _request, _fds = _serve(_sock)
    del _sock
    _become(_request, *_fds)
