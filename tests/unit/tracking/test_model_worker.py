"""seqlab.tracking.model_worker: which packs log their models by a process beside the training one
(the process itself: tests/integration/test_model_worker.py)."""

from __future__ import annotations

from seqlab.tracking import model_worker


def test_auto_takes_the_worker_for_wide_packs_only(monkeypatch):
    started = []
    monkeypatch.setattr(model_worker, "_WORKER", None)
    monkeypatch.setattr(model_worker, "ModelWorker", lambda: started.append(1) or _Current())
    assert model_worker.beside("auto", model_worker.AUTO_FROM - 1) is None
    assert model_worker.beside("off", 64) is None
    assert model_worker.beside("auto", model_worker.AUTO_FROM) is not None
    assert model_worker.beside("on", 1) is not None and started == [1]


class _Current:
    def current(self) -> bool:
        return True
