"""Opening a local (SQLite) MLflow store safely. MLflow creates and migrates a SQLite store's
tables the first time a client opens it, and processes that do so at the same moment race each
other's migrations (`table _alembic_tmp_experiments already exists`), which can leave the file
broken for every later client. Here one process at a time opens the store, under a file lock
next to it (`mlflow.db.lock`): the first creates the tables, the others wait and find them made.
A store left half-created (by an older seqlab, or a set-up that was killed) is named in one line
with the fix before MLflow touches it."""

from __future__ import annotations

import fcntl
import os
import socket
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional
from urllib.parse import urlparse

import mlflow

from seqlab import SeqlabError, imports_without_gc, one_line
from seqlab.secrets import mask_uris

# Creating and migrating a new store takes a few seconds; many processes may queue behind it.
LOCK_TIMEOUT_S = 300.0
# Filesystems on which SQLite's locking is not to be trusted (its own documentation: "SQLite over
# a network": file locking on network filesystems is often broken), as /proc/mounts names them.
NETWORK_FILESYSTEMS = (
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "glusterfs",
    "fuse.sshfs",
)
MOUNTS = Path("/proc/mounts")


class StoreError(SeqlabError):
    """A local MLflow store that cannot be opened as it is."""


def sqlite_path(tracking_uri: str) -> Optional[Path]:
    """The file of a `sqlite:///...` store; None for any other store (a server, PostgreSQL)."""
    prefix = "sqlite:///"
    return Path(tracking_uri[len(prefix) :]) if tracking_uri.startswith(prefix) else None


def filesystem_of(path: Path, mounts: Optional[Path] = None) -> Optional[str]:
    """The type of the filesystem `path` is on, from the mount table (the longest mount point
    above it); None where there is no mount table to read."""
    try:
        lines = (mounts or MOUNTS).read_text().splitlines()
    except OSError:
        return None
    path = path.resolve()
    best: tuple[int, Optional[str]] = (-1, None)
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(fields[1].replace("\\040", " "))
        if (path == point or point in path.parents) and len(point.parts) > best[0]:
            best = (len(point.parts), fields[2])
    return best[1]


def check_local_filesystem(db: Path) -> None:
    """One line for a SQLite store on a network filesystem, where its locking is unreliable and
    simultaneous jobs would corrupt it: a tracking server or PostgreSQL is the way there."""
    kind = filesystem_of(db.parent if db.parent.exists() else db.parent.parent)
    if kind is not None and kind.lower() in NETWORK_FILESYSTEMS:
        raise StoreError(
            f"the MLflow store {db} is on a {kind} filesystem, where SQLite's file locking is unreliable (SQLite's own "
            "documentation says so): keep mlruns/ on a local disk (paths.root_dir=...), or track to a server "
            "(make server; logger=mlflow_server) or PostgreSQL (logger.tracking_uri=postgresql://...)"
        )


def store_folder(db: Path) -> None:
    """The folder of a SQLite store: a new one is this user's only (0700), since its database and
    artifacts hold every run's params and metrics; an existing one keeps its mode (a store a team
    shares on purpose)."""
    if not db.parent.is_dir():
        db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)


def lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".lock")


@contextmanager
def store_lock(
    db: Path,
    timeout_s: float = LOCK_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[None]:
    """Hold the store's lock. flock is released by the kernel when its holder dies, so a killed
    process never leaves the store locked."""
    store_folder(db)
    fd = os.open(lock_path(db), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = clock() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() >= deadline:
                    raise StoreError(
                        f"the MLflow store {db} has been locked by another process for {timeout_s:.0f} s "
                        f"({lock_path(db).name}); wait for it to finish, or stop it"
                    ) from None
                sleep(0.05)
        yield
    finally:
        os.close(fd)


def half_created(db: Path) -> Optional[str]:
    """One line (what is wrong, the fix) for a store whose tables were left half made; None for a
    new, empty or complete one. Read with sqlite3, so that MLflow never migrates it further."""
    if not db.is_file() or db.stat().st_size == 0:
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            tables = {
                row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            version = None
            if "alembic_version" in tables:
                version = next(
                    iter(con.execute("SELECT version_num FROM alembic_version")), (None,)
                )[0]
            runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if "runs" in tables else 0
        finally:
            con.close()
    except sqlite3.DatabaseError as error:
        return (
            f"{db} is not an MLflow store ({one_line(error)}); move it away, or point "
            "paths.mlruns_dir (or logger.tracking_uri) elsewhere"
        )
    if not tables:
        return None  # an empty file: MLflow creates the tables
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if not leftovers and version is not None:
        return (
            None  # complete (an older schema gets MLflow's own one-line upgrade hint: open_client)
        )
    what = (
        f"table {leftovers[0]} is a leftover of a migration"
        if leftovers
        else "it has no schema version"
    )
    if runs == 0:
        fix = f"it holds no runs: delete it (rm {db}) and run again; the next run creates it afresh"
    else:
        fix = (
            f"it holds {runs} run(s): keep a copy of it, then drop the leftover "
            f"(sqlite3 {db} 'DROP TABLE {leftovers[0]}') and run: mlflow db upgrade sqlite:///{db}"
            if leftovers
            else f"it holds {runs} run(s): keep a copy of it, then run: mlflow db upgrade sqlite:///{db}"
        )
    return (
        f"the MLflow store {db} was left half-created by an interrupted set-up (an older seqlab, or runs "
        f"that created it at the same moment): {what}; {fix}"
    )


# A local store's client, once opened and checked, for every later run of this process on the
# same file (a pack's members, an in-process sweep's jobs): opening one costs MLflow about 0.3 s
# (its engine and schema check), a second of an 8-member pack. Keyed by the file's identity, so
# a store deleted and made again is opened again.
_OPENED: dict[tuple[str, int, int], Any] = {}


# MLflow stores on a database server, opened by SQLAlchemy (not through a tracking server), and their ports.
DATABASES = {"postgresql": 5432, "mysql": 3306, "mssql": 1433, "oracle": 1521}


def is_database(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+")[0] in DATABASES


def check_database(uri: str, timeout_s: float = 5.0) -> None:
    """A database server's port answers; else one line at once (MLflow would retry a refused
    connection for about 100 s, a warning a try, then raise SQLAlchemy's traceback)."""

    parts = urlparse(uri)
    if not parts.hostname:  # a local socket: left to the driver
        return
    try:
        socket.create_connection(
            (parts.hostname, parts.port or DATABASES[parts.scheme.split("+")[0]]), timeout_s
        ).close()
    except OSError as error:
        raise StoreError(
            f"{mask_uris(uri)}: the tracking database does not answer ({one_line(error)}); "
            "check that its server is up and the URL is right"
        ) from None


def open_client(tracking_uri: str):
    """An MlflowClient on `tracking_uri`; for a local store, created (or migrated) by one process
    at a time, and refused in one line when it was left half-created; a database server that does
    not answer is one line."""

    db = sqlite_path(tracking_uri)
    if db is None:
        if is_database(tracking_uri):
            check_database(tracking_uri)
        return mlflow.MlflowClient(tracking_uri=tracking_uri)
    key = _identity(tracking_uri, db)
    if key in _OPENED:
        return _OPENED[key]
    check_local_filesystem(db)  # once per store and process, as the store is opened
    with store_lock(db):
        problem = half_created(db)
        if problem:
            raise StoreError(problem)
        try:
            # MLflow's SQL store loads with the first client of a store (SQLAlchemy, alembic)
            with imports_without_gc("mlflow.store.tracking.sqlalchemy_store"):
                client = mlflow.MlflowClient(tracking_uri=tracking_uri)
                client.search_experiments(
                    max_results=1
                )  # the registry's tables too, while the lock is held
        except Exception as error:  # a newer or older schema, a damaged file
            raise StoreError(f"the MLflow store {db}: {one_line(error)}") from None
    key = _identity(tracking_uri, db)
    if key is not None:
        _OPENED[key] = client
    return client


def _identity(tracking_uri: str, db: Path) -> Optional[tuple[str, int, int]]:
    try:
        found = db.stat()
    except OSError:
        return None
    return tracking_uri, found.st_dev, found.st_ino
