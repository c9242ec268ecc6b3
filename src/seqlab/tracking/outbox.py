"""Writes to a tracking server that may go away mid-run. Every write to the run goes through one
background thread, in order; while the server does not answer, the writes wait here and are
retried (training goes on), and they are sent when it answers again. A run whose server has not
come back by the end is copied whole to a local store, and the user is told where."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import requests
from mlflow.exceptions import MlflowException

log = logging.getLogger("seqlab")


def transient(error: BaseException) -> bool:
    """A failure worth retrying: no answer, a timeout, or a server-side error (5xx, 429), as
    opposed to a request the server refused (4xx), which would fail again."""
    if isinstance(error, (requests.RequestException, ConnectionError, TimeoutError, OSError)):
        return True
    if isinstance(error, MlflowException):
        status = error.get_http_status_code()
        return status >= 500 or status == 429
    return False


class Outbox:
    """One sender thread for a run's writes (`send(item)` is called with each item, in order)."""

    def __init__(
        self, send: Callable[[dict[str, Any]], None], uri: str, retry_s: float = 2.0
    ) -> None:
        self.send = send
        self.uri = uri
        self.retry_s = retry_s
        self.queue: deque[dict[str, Any]] = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.down_since: Optional[float] = None
        self.refused: list[str] = []  # writes the server rejected (not retried)
        self.sent = 0  # items the server has taken: a slow server makes progress, an away one none
        self.thread = threading.Thread(target=self._run, name="seqlab-outbox", daemon=True)
        self.thread.start()

    def put(self, item: dict[str, Any]) -> None:
        with self.cond:
            self.queue.append(item)
            self.cond.notify_all()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if not self.queue:
                    return
                item = self.queue[0]
            try:
                self.send(item)
            except Exception as error:  # noqa: BLE001 - classified below
                if transient(error):
                    if self.down_since is None:
                        self.down_since = time.monotonic()
                        log.warning(
                            "tracking  the server at %s does not answer: training goes on, its metrics wait "
                            "here and are sent when it is back",
                            self.uri,
                        )
                    with self.cond:
                        self.cond.wait(self.retry_s)
                    continue
                self.refused.append(
                    " ".join(str(error).split())[:300]
                )  # then dropped: it would fail again
            with self.cond:
                if self.queue:  # close() may have emptied it meanwhile
                    self.queue.popleft()
                self.sent += 1
                self.cond.notify_all()
            if self.down_since is not None:
                log.warning(
                    "tracking  the server is back after %.0f s: the waiting metrics were sent",
                    time.monotonic() - self.down_since,
                )
                self.down_since = None

    def drain(self, timeout_s: float, idle: bool = False) -> bool:
        """Wait until everything queued is sent; False if the server has not taken it in time.
        `idle`: the time counts only while nothing is sent, so a server that is up but slower
        than training (one worker, SQLite) is waited for as long as it keeps taking writes: slow
        is not down."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            sent = self.sent
            while self.queue:
                if idle and self.sent != sent:
                    sent, deadline = self.sent, time.monotonic() + timeout_s
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.5))
        return True

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.queue.clear()
            self.cond.notify_all()
