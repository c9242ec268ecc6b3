"""Writes that fail in one line and never leave part of a file behind: a full disk, a file-size
limit, a read-only or unwritable folder end the run FAILED with a line that names the path
(not a traceback), and a file is written under a temporary name and renamed into place, so a
reader (a resume) finds the previous file whole or the new one whole."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable

from seqlab import ResumableStop

# Failures a user fixes where the file goes (space, permissions, quota, a read-only mount, a
# file-size limit), as opposed to a bug.
_WHERE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}


class WriteFailed(ResumableStop):
    """A checkpoint, artifact or journal could not be written: the run continues from its last good
    checkpoint once there is room (its run ends KILLED)."""


def is_write_failure(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in _WHERE_ERRNOS


def write_failed(path: Path | str, error: BaseException) -> WriteFailed:
    """One line naming the path, what the system said and what to do."""
    if isinstance(error, OSError) and error.strerror:
        why = error.strerror
    else:  # torch's writer reports a failed write as a RuntimeError without the errno
        why = " ".join(str(error).split())[:200] or type(error).__name__
    return WriteFailed(
        f"could not write {path}: {why}; free space there (or lift the file-size limit, or make the folder "
        "writable), or write elsewhere (paths.log_dir, paths.mlruns_dir)"
    )


def tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def replace_atomically(path: Path, write: Callable[[Path], None], owner: bool = True) -> None:
    """`write(tmp)` a temporary file next to `path`, then rename it over `path`. A failed write
    removes the temporary file, leaves `path` as it was and raises WriteFailed; so does an
    interrupt (a second Ctrl-C) in the middle, re-raised. Durable: the file's data reaches the
    disk before the rename, and the rename before this returns (without the two fsyncs a power
    loss on XFS or NFS can leave an empty file under the final name). `owner=False`: this process
    takes part in the write (a DDP rank other than 0) but another one renames."""
    path = Path(path)
    tmp = tmp_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        if owner and tmp.exists():  # under DDP only rank 0 writes a checkpoint's file
            _fsync(tmp)
            os.replace(tmp, path)
            _fsync(path.parent)
    except BaseException as error:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        # torch.save reports a failed write as a RuntimeError ("file write failed")
        if is_write_failure(error) or (
            isinstance(error, RuntimeError) and "write" in str(error).lower()
        ):
            raise write_failed(path, error) from None
        raise


def _fsync(path: Path) -> None:
    """The file's (or the folder's: its entries) data on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
