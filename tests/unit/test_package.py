"""seqlab/__init__.py: what every module of the package shares."""

from __future__ import annotations

import gc

from seqlab import imports_without_gc


def test_a_heavy_modules_first_import_runs_without_the_collector_and_is_frozen_after():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with imports_without_gc("seqlab_not_loaded_yet"):
            assert not gc.isenabled()
            made = [[i] for i in range(1000)]  # what an import makes: long-lived objects
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(made)
        # Loaded already (a sweep's later job): nothing is paused, nothing more frozen.
        now = gc.get_freeze_count()
        with imports_without_gc("gc"):
            assert gc.isenabled()
            more = [[i] for i in range(1000)]
        # (frozen objects that die meanwhile, another thread's, leave the count: it can only drop)
        assert gc.get_freeze_count() <= now and more
    finally:
        gc.enable()


def test_the_collector_comes_back_when_the_import_fails():
    try:
        with imports_without_gc("seqlab_not_loaded_yet"):
            raise ImportError("no such module")
    except ImportError:
        pass
    assert gc.isenabled()
