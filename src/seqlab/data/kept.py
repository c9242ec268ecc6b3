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
from typing import Any, Optional

from seqlab.data.sources import SeqData

# At most a quarter of this machine's memory, and 8 GiB, held between jobs: 32 sets of 16,384
# days fit (3 GB), what a study's pack of 32 needs at once anyway.
MAX_BYTES = min(8 << 30, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4)


# Sources whose samples depend on their config alone.
GENERATORS = ("seqlab.data.synthetic_daily_load",)


def generated(data_cfg: Any) -> bool:
    """Whether a data config's samples are generated (the same for the same config, in any job)."""
    source = data_cfg.get("source")
    return source is not None and source.get("_target_") in GENERATORS


def _bytes(data: SeqData) -> int:
    sets = [data] + ([data.val] if data.val is not None else [])
    return sum(
        s.x.nbytes + s.y.nbytes + (0 if s.lengths is None else s.lengths.nbytes) for s in sets
    )


class KeptSamples:
    """The most recently used generated sets, by key, up to `max_bytes` (the least recently used
    dropped first)."""

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
        while sum(_bytes(d) for d in self._sets.values()) > self.max_bytes:
            self._sets.popitem(last=False)


# This process's: packing.build.load_samples reads and fills it.
KEPT = KeptSamples()
