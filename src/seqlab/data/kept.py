"""Generated samples kept between the jobs of one process (issue 35: work done once per process,
not once per run).

A multirun's jobs run one after another in one process (Hydra's basic launcher), and a study
trains the same seeds' data again and again: the device x batch study trains seeds 0-31's
synthetic sets at every batch size and perf, each set 94 MB of fresh memory, which on this
project's 2-core VM cost 0.36 s a set to make (most of it the kernel faulting the memory in). A
generated set depends on its data config alone (seqlab.packing.data.samples_key), so the next job
that asks for it gets the very same arrays. Only generated samples are kept: a file (data.path)
may change between two jobs, and is read again, and so may what a source of the user's own reads.

The sets are shared, read-only by convention: nothing in seqlab writes into a SeqData's arrays
(a split takes copies, a pack's device data copies or reads them; packing.data.joined replaces a
set's arrays by views of the same values in its joined buffer)."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Iterable, Optional

import numpy as np

from seqlab.data.sources import SeqData

# At most a quarter of this machine's memory, and 4 GiB, held between jobs: 32 sets of 16,384
# days fit (3 GB), what a study's pack of 32 needs at once anyway, with a pack of 8 beside. Not
# two such packs: the device x batch study's next 32 seeds then take the memory of the last 32
# while it is warm (make_room) instead of 3 GB more, first touched (9-11 s here, against 2-3 s).
MAX_BYTES = min(4 << 30, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4)


# Sources whose samples depend on their config alone.
GENERATORS = ("seqlab.data.synthetic_daily_load",)


def generated(data_cfg: Any) -> bool:
    """Whether a data config's samples are generated (the same for the same config, in any job)."""
    source = data_cfg.get("source")
    return source is not None and source.get("_target_") in GENERATORS


def _memory(data: SeqData) -> dict[int, int]:
    """The memory a set's arrays lie in, by buffer (a pack's sets share one: packing.data.joined,
    packing.build): its id and its bytes."""
    held = {}
    for s in [data] + ([data.val] if data.val is not None else []):
        for array in (s.x, s.y, s.lengths):
            while isinstance(getattr(array, "base", None), np.ndarray):
                array = array.base  # a view's buffer: the array that owns (or wraps) the memory
            if array is not None:
                held[id(array)] = array.nbytes
    return held


class KeptSamples:
    """The most recently used generated sets, by key, up to `max_bytes` of the memory they lie in
    (the least recently used dropped first). A buffer a pack's sets share counts once, and only
    dropping all of its sets frees it."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._sets: OrderedDict[str, SeqData] = OrderedDict()

    def get(self, key: str) -> Optional[SeqData]:
        data = self._sets.get(key)
        if data is not None:
            self._sets.move_to_end(key)
        return data

    def put(self, key: str, data: SeqData) -> None:
        self._sets[key] = data
        self._sets.move_to_end(key)
        self._drop_until(0, keep=())

    def make_room(self, nbytes: int, keep: Iterable[str]) -> None:
        """Drops the least recently used sets but `keep` (those the job at hand trains) until
        `nbytes` more fit, before they are allocated: memory freed and at once allocated again
        is still warm, where memory first touched (or freed a few seconds before) costs a fault
        in the host too on a VM that takes back its guest's free memory (virtio-balloon's free
        page reporting, as on this project's 2-core VM: 3 GB filled in 0.2 s right after it was
        freed, in 3-10 s from memory free for 10 s)."""
        self._drop_until(nbytes, keep=set(keep))

    def held(self) -> int:
        """Bytes of memory the kept sets lie in."""
        memory: dict[int, int] = {}
        for data in self._sets.values():
            memory.update(_memory(data))
        return sum(memory.values())

    def _drop_until(self, nbytes: int, keep: set) -> None:
        while self.held() + nbytes > self.max_bytes:
            old = next((key for key in self._sets if key not in keep), None)
            if old is None:
                return
            del self._sets[old]


# This process's: packing.build.load_samples reads and fills it.
KEPT = KeptSamples()
