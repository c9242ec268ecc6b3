"""What the tests in `integration/test_ghosts.py` and `unit/store/test_ghosts.py` share (under
tests/)."""

from __future__ import annotations

import os
import socket

from seqlab.store import ghosts

HERE = socket.gethostname()
NOW = 1_800_000_000.0  # the fake clock's time


def _tags(host=HERE, pid=None, started=None, beat=None) -> dict[str, str]:
    tags = {ghosts.HOST: host, ghosts.PID: str(pid if pid is not None else os.getpid())}
    if started is not None:
        tags[ghosts.STARTED] = str(started)
    if beat is not None:
        tags[ghosts.HEARTBEAT] = str(int(beat))
    return tags
