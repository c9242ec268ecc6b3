"""Credentials never leave the process in the clear: a password in a URI (tracking server,
database, artifact store) and any value under a key that names a secret (password, token, api_key,
...) are shown as `***` wherever a run records or prints them (params, tags, artifacts, console,
train.log), while the process itself keeps using the real values to connect.

Three layers, because each leak path carries text of a different shape: `mask_tree` for the
config (by key), `mask_text` for free text (URIs, `key=value` overrides, YAML lines, and any
secret value seen before, wherever it appears), and `SecretFilter` for log records.

Cheap to import (the CLI imports it at start-up): the standard library only."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

MASK = "***"

# A key names a secret when one of its words is one of these (password, db_password, api-token,
# AWS_SECRET_ACCESS_KEY, private_key, ...), or when it is `key` itself. `x_key` and `y_key` (the
# names of arrays in a data file) are not secrets: `key` counts only as `api_key`, `access_key`,
# `private_key`, `secret_key` or alone.
_SECRET_WORDS = r"password|passwd|pwd|passphrase|token|secret|credentials?|apikey|api_key|access_key|private_key|auth"
_SECRET_KEY = re.compile(rf"(?:^|[._\-])(?:{_SECRET_WORDS})(?:$|[._\-])|^key$", re.IGNORECASE)

# scheme://user:password@host -> scheme://user:***@host (the user name says whose, not how); also
# as Hydra writes a multirun's overrides, with its colons escaped (http\://user\:password@host).
_URI_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*\\?://[^\s:/@'\"\\]*\\?):(?P<secret>[^\s@/'\"]+)@"
)
# Where text gives a key and its value, in the three shapes a run's text has: an override or a
# query (`logger.token=abc`, `?token=abc`), a YAML line (`  password: abc`), JSON
# (`"password": "abc"`); masked when the key names a secret. Prose is left alone.
_KEY_VALUE = (
    re.compile(r"(?P<head>(?<![\w.])[+~]*(?P<key>[\w.\-]+)=)(?P<secret>[^\s'\",&;]+)"),
    re.compile(
        r"(?P<head>^[ \t]*(?:-[ \t]+)?(?P<key>[\w.\-]+):[ \t]+)(?P<secret>\S[^\n]*)", re.MULTILINE
    ),
    re.compile(r"(?P<head>\"(?P<key>[\w.\-]+)\"\s*:\s*\")(?P<secret>[^\"]+)"),
)

# Every secret value this process has seen (from its config, URIs, credentials variables), so
# that it is masked wherever it turns up again, in whatever form (an error message, a path).
_known: set[str] = set()
_MIN_KNOWN = 4  # shorter values would mask ordinary words


def names_a_secret(key: str) -> bool:
    """Whether a (dotted) config key names a secret or lies under one (`db.credentials.user`)."""
    return any(_SECRET_KEY.search(part) for part in str(key).split("."))


def remember(value: Any) -> None:
    """Mask this value wherever it appears from now on."""
    text = str(value) if value is not None else ""
    if len(text) >= _MIN_KNOWN and text != MASK:
        _known.add(text)


def _mask_uri(match: re.Match) -> str:
    remember(match.group("secret"))
    return f"{match.group('head')}:{MASK}@"


def _mask_key_value(match: re.Match) -> str:
    secret = match.group("secret").strip()
    if secret in (MASK, "null", "None", "''", '""') or not names_a_secret(match.group("key")):
        return match.group(0)
    remember(secret)
    return match.group("head") + MASK


def mask_uris(text: str) -> str:
    """Only the passwords in URIs (for messages of this project's own, which name settings)."""
    return _URI_USERINFO.sub(_mask_uri, text) if text else text


def mask_text(text: str) -> str:
    """Free text with its credentials shown as ***: passwords in URIs, values after a secret key
    (`logger.token=abc`, `password: abc`), and every secret value seen before."""
    if not text:
        return text
    text = mask_uris(text)
    for pattern in _KEY_VALUE:
        text = pattern.sub(_mask_key_value, text)
    for secret in sorted(
        _known, key=len, reverse=True
    ):  # the longest first: one may contain another
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def mask_value(key: str, value: Any) -> Any:
    """A config value as it may be shown: *** under a key that names a secret, else the value
    with any credentials in it masked."""
    if names_a_secret(key) and value not in (None, "", MASK):
        remember(value)
        return MASK
    return mask_text(value) if isinstance(value, str) else value


def mask_tree(tree: Any, key: str = "") -> Any:
    """A plain config tree (dicts, lists, scalars) with every secret masked; the input is unchanged."""
    if isinstance(tree, Mapping):  # under a secret key, everything is secret
        return {k: mask_tree(v, key if names_a_secret(key) else str(k)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [mask_tree(v, key) for v in tree]
    return mask_value(key, tree)


def mask_flat(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{dotted.key: value} (params, tags) with every secret masked."""
    return {k: mask_value(k, v) for k, v in flat.items()}


def remember_tree(tree: Any, key: str = "") -> None:
    """Learn every secret in a config tree (values under secret keys, URI passwords), so that
    masking free text (logs, Hydra's files) catches them in any form."""
    mask_tree(tree, key)


# Credentials a process may be given through its environment rather than its config.
_SECRET_VARIABLES = (
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_AUTH_ADMIN_PASSWORD",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "PGPASSWORD",
)


def guard(cfg: Any) -> None:
    """Before a job logs anything: learn its config's and environment's secrets and mask them on
    every log handler (console, train.log)."""

    remember_tree(OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg)
    for name in _SECRET_VARIABLES:
        remember(os.environ.get(name))
    install_filter()


class SecretFilter(logging.Filter):
    """Masks credentials in every record a handler emits (console, train.log), including the
    arguments and a traceback's text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's problem, not ours
            return True
        masked = mask_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = mask_text(record.exc_text)
        return True


def install_filter(logger: Optional[logging.Logger] = None) -> None:
    """Put a SecretFilter on every handler of `logger`, once. Without a logger: mask every log
    record of this process as it is made (console, train.log, any logger): Hydra replaces its
    handlers between a multirun's jobs, so a filter on them would not last."""
    if logger is None:
        _mask_every_record()
        return
    for handler in logger.handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(SecretFilter())


def _mask_every_record() -> None:
    make = logging.getLogRecordFactory()
    if getattr(make, "masks_secrets", False):
        return
    mask = SecretFilter()

    def masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        mask.filter(record)
        return record

    masked_record.masks_secrets = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(masked_record)


# Artifacts that are text and may quote the config or the command line; anything else
# (checkpoints, images) is uploaded as it is.
_TEXT_SUFFIXES = {
    ".yaml",
    ".yml",
    ".log",
    ".txt",
    ".json",
    ".csv",
    ".md",
    ".ini",
    ".cfg",
    ".toml",
    "",
}


def _masked_file(source: Path, target: Path) -> None:
    if source.suffix.lower() in _TEXT_SUFFIXES:
        try:
            text = source.read_text()
        except UnicodeDecodeError:
            shutil.copyfile(source, target)
            return
        target.write_text(mask_text(text))
    else:
        shutil.copyfile(source, target)


@contextmanager
def masked_copy(path: Path) -> Iterator[Path]:
    """A temporary copy of a file or folder with credentials masked in its text files: what is
    uploaded instead of the user's own files, which stay as they are. A file that is not text
    (a checkpoint, a plot) is itself: nothing to mask, and not worth copying."""
    if path.is_file() and path.suffix.lower() not in _TEXT_SUFFIXES:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="seqlab-masked-") as tmp:
        target = Path(tmp) / path.name
        if path.is_dir():
            for source in sorted(path.rglob("*")):
                dest = target / source.relative_to(path)
                if source.is_dir():
                    dest.mkdir(parents=True, exist_ok=True)
                elif source.is_file():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    _masked_file(source, dest)
            target.mkdir(exist_ok=True)
        else:
            _masked_file(path, target)
        yield target


def private(folder: Path) -> None:
    """A run's (or a sweep's) folder for this user only: its files hold the resolved config, which
    may hold a password (config.yaml, Hydra's .hydra/, train.log before masking took over), and a
    shared machine's other users must not read them. The folder, not each file: whatever is
    written inside later is covered too."""
    try:
        Path(folder).chmod(0o700)
    except OSError:
        pass  # a folder this user does not own (a shared log folder given as paths.output_dir)
