"""Issue 15, points 3 and 4: the time-based checkpoint (checkpoint.interval_s) that a run killed
with kill -9 continues from, and checkpoint writes that fail in one line and never leave a
truncated checkpoint behind."""

from __future__ import annotations

import shutil

import pytest


def _tracker(tmp_path):
    from seqlab.tracking import MlflowTracker

    tracker = MlflowTracker(
        f"sqlite:///{tmp_path}/mlruns/mlflow.db",
        artifact_root=str(tmp_path / "artifacts"),
    )
    tracker.start("writes", {})
    return tracker


def test_a_failed_copy_into_the_artifact_folder_keeps_the_stored_checkpoint_whole(
    tmp_path, store, monkeypatch
):
    import errno

    from seqlab.resume.points import store_checkpoint
    from seqlab.safe_writes import WriteFailed

    tracker = _tracker(tmp_path)
    ckpt = tmp_path / "interrupted.ckpt"
    ckpt.write_bytes(b"good" * 1000)
    store_checkpoint(tracker, ckpt)
    folder = tmp_path / "artifacts" / "seqlab" / tracker.run_id / "artifacts" / "checkpoints"
    assert (folder / "interrupted.ckpt").read_bytes() == b"good" * 1000

    def copy_half_then_fill_the_disk(src, dst):
        with open(dst, "wb") as f:
            f.write(b"newer")
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    ckpt.write_bytes(b"newer" * 1000)
    monkeypatch.setattr(shutil, "copyfile", copy_half_then_fill_the_disk)
    with pytest.raises(WriteFailed) as failed:
        store_checkpoint(tracker, ckpt)
    assert str(failed.value).startswith(
        f"could not write {folder / 'interrupted.ckpt'}: No space left on device; "
    )
    assert (folder / "interrupted.ckpt").read_bytes() == b"good" * 1000  # the previous one, whole
    assert sorted(p.name for p in folder.iterdir()) == [
        "interrupted.ckpt"
    ]  # no part of the new one
    tracker.end("FAILED", str(failed.value))


def test_an_artifact_write_that_fails_is_one_line_naming_the_path(tmp_path, store, monkeypatch):
    import errno

    from seqlab.safe_writes import WriteFailed

    tracker = _tracker(tmp_path)
    png = tmp_path / "training_curves.png"
    png.write_bytes(b"png")
    target = (
        tmp_path / "artifacts" / "seqlab" / tracker.run_id / "artifacts" / "training_curves.png"
    )

    def unwritable(run_id, local_path, artifact_path=None):
        raise PermissionError(errno.EACCES, "Permission denied", str(target))

    monkeypatch.setattr(tracker.client, "log_artifact", unwritable)
    with pytest.raises(
        WriteFailed, match=rf"^could not write {target}: Permission denied; free space there"
    ):
        tracker.log_artifact(png)
    tracker.end("FAILED")


def test_an_atomic_write_reaches_the_disk_before_and_after_its_rename(tmp_path, monkeypatch):
    # Issue 24, point 9: without an fsync of the file before the rename and of its folder after,
    # a power loss (XFS, NFS) can leave an empty checkpoint under the final name.
    import os

    from seqlab import safe_writes

    synced, real_fsync = [], os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "checkpoints" / "last.ckpt"
    safe_writes.replace_atomically(target, lambda tmp: tmp.write_bytes(b"weights"))
    assert target.read_bytes() == b"weights"
    assert synced == [str(safe_writes.tmp_name(target)), str(target.parent)]


def test_an_interrupt_in_the_middle_of_a_write_leaves_no_temporary_file(tmp_path):
    # A second Ctrl-C while a checkpoint is being written: the previous file stays whole and no
    # .last.ckpt.tmp is left to be uploaded among the run's artifacts.
    from seqlab import safe_writes

    target = tmp_path / "checkpoints" / "last.ckpt"
    safe_writes.replace_atomically(target, lambda tmp: tmp.write_bytes(b"good"))

    def interrupted(tmp):
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        safe_writes.replace_atomically(target, interrupted)
    assert target.read_bytes() == b"good"
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]
