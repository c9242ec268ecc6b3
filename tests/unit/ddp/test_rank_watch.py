"""DDP: a rank that dies ends the job's run FAILED with one line naming the rank, instead of a
traceback, or rank 0 killed with it and its run left RUNNING."""

from __future__ import annotations

import signal
import time

from seqlab import SeqlabError
from seqlab.ddp.rank_watch import RankWatch, describe_exit


class _FakeProcess:
    """A child process as the watch sees one: its pid, its exit status once it has one, signals."""

    def __init__(self, pid: int, returncode=None) -> None:
        self.pid, self.returncode, self.signals = pid, returncode, []

    def poll(self):
        return self.returncode

    def send_signal(self, signum) -> None:
        self.signals.append(signum)
        self.returncode = -signum


def test_the_first_rank_that_died_is_named_and_the_others_are_stopped(tmp_path):
    watch = RankWatch(tmp_path)
    watch.procs = ranks = [_FakeProcess(101), _FakeProcess(102, returncode=1), _FakeProcess(103)]
    assert watch.check()
    assert watch.failure == (
        f"DDP process rank 2 (pid 102) exited with status 1, so the job stopped; "
        f"its output: {tmp_path}/train_ddp_process_2.log"
    )
    assert ranks[0].signals == ranks[2].signals == [signal.SIGKILL] and ranks[1].signals == []
    # Rank 0's own lost collective becomes that line; its own one-line errors stay its own.
    error = watch.reason_for(RuntimeError("Connection closed by peer"), wait_s=0)
    assert isinstance(error, SeqlabError) and str(error) == watch.failure and watch.handled.is_set()
    assert watch.reason_for(SeqlabError("the training loss became nan at step 3"), wait_s=0) is None


def test_no_rank_died_leaves_rank_zeros_error_alone(tmp_path):
    watch = RankWatch(tmp_path)
    watch.procs = [_FakeProcess(101), _FakeProcess(102, returncode=0)]  # one running, one done
    assert not watch.check()
    assert watch.reason_for(RuntimeError("something else"), wait_s=0) is None
    assert (
        describe_exit(-9) == "was killed by SIGKILL" and describe_exit(3) == "exited with status 3"
    )


def test_a_rank_zero_stuck_after_a_death_is_ended_by_the_watch(tmp_path):
    ended = []
    watch = RankWatch(tmp_path, on_stuck=ended.append, poll_s=0.01, grace_s=0.05)
    dying = _FakeProcess(102)
    watch.start([dying])
    dying.returncode = -signal.SIGKILL
    deadline = time.monotonic() + 10
    while not ended and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ended == [
        f"DDP process rank 1 (pid 102) was killed by SIGKILL, so the job stopped; "
        f"its output: {tmp_path}/train_ddp_process_1.log"
    ]
