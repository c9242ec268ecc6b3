"""Sign-in to the tracking server, from both sides.

The server (`make server`, `python -m seqlab.store.server`): one that listens beyond this machine runs
MLflow's basic-auth app (`mlflow server --app-name basic-auth`), whose admin user is created on
the first start with a password the user gives (MLFLOW_AUTH_ADMIN_PASSWORD, or a file); there is
no default password. Serving it open takes ALLOW_UNAUTHENTICATED=1.

The clients (train.py, compare): MLflow sends MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD
itself; `client_credentials` moves a user:password written into the tracking URI there too (so
the address that is recorded and printed holds none), and `check_credentials` turns a refused
sign-in into one line before a run is opened.

Cheap to import: the standard library only (requests is imported where a check is made)."""

from __future__ import annotations

import configparser
import ipaddress
import os
import secrets
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlsplit, urlunsplit

import requests

from seqlab import SeqlabError

APP_NAME = "basic-auth"
# MLflow's own variables, read by its server (the admin) and its client (everyone).
ADMIN_PASSWORD = "MLFLOW_AUTH_ADMIN_PASSWORD"
ADMIN_USERNAME = "MLFLOW_AUTH_ADMIN_USERNAME"
CONFIG_PATH = "MLFLOW_AUTH_CONFIG_PATH"
SECRET_KEY = "MLFLOW_FLASK_SERVER_SECRET_KEY"
USERNAME = "MLFLOW_TRACKING_USERNAME"
PASSWORD = "MLFLOW_TRACKING_PASSWORD"
ALLOW_OPEN = "ALLOW_UNAUTHENTICATED"
MIN_PASSWORD = 12  # MLflow refuses shorter passwords (mlflow.utils.validation._validate_password)
SIGN_IN_CACHE_S = 60


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def read_password(password_file: Optional[str]) -> Optional[str]:
    """The admin's password: from a file (its first line) or MLFLOW_AUTH_ADMIN_PASSWORD."""
    if password_file:
        path = Path(password_file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as error:
            raise SeqlabError(
                f"--admin-password-file {path}: cannot read it ({error.strerror or error})"
            ) from None
        return (lines[0].strip() if lines else "") or None
    return os.environ.get(ADMIN_PASSWORD) or None


def auth_environment(
    host: str,
    auth_dir: Path,
    want_auth: bool = False,
    password_file: Optional[str] = None,
    admin_username: Optional[str] = None,
    password: Optional[str] = None,
) -> Optional[dict[str, str]]:
    """What the server process needs to start with sign-in (its extra environment), or None to
    start open: on a loopback host unless asked for (`want_auth`), or beyond it only with
    ALLOW_UNAUTHENTICATED=1. Refuses, before anything binds, a shared server without an admin
    password (unless its user store already has the admin from an earlier start). `password`: the
    admin's, given (a sweep's own server); else from `password_file` or MLFLOW_AUTH_ADMIN_PASSWORD."""
    open_allowed = os.environ.get(ALLOW_OPEN) == "1"
    if not want_auth and (is_loopback(host) or open_allowed):
        return None
    password = password or read_password(password_file)
    username = admin_username or os.environ.get(ADMIN_USERNAME) or "admin"
    users_db = auth_dir / "basic_auth.db"
    if password is None and not users_db.is_file():
        why = (
            f"--host {host} lets other machines in"
            if not is_loopback(host)
            else "--auth asks for sign-in"
        )
        raise SeqlabError(
            f"{why}, so the server signs users in and needs its admin's password: set {ADMIN_PASSWORD} "
            f"(or --admin-password-file FILE; make server ADMIN_PASSWORD_FILE=FILE), {MIN_PASSWORD} characters or "
            f"more; or serve it open with {ALLOW_OPEN}=1"
        )
    if password is not None and len(password) < MIN_PASSWORD:
        raise SeqlabError(
            f"the admin password must be at least {MIN_PASSWORD} characters (MLflow's rule); "
            f"this one has {len(password)}"
        )
    auth_dir.mkdir(parents=True, exist_ok=True)
    config = configparser.ConfigParser()
    config["mlflow"] = {
        # Signed-in users may read every experiment; writing to another's needs a grant.
        "default_permission": "READ",
        "database_uri": f"sqlite:///{users_db.resolve()}",
        "admin_username": username,
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
        # A password check is scrypt, about 0.1 s of the server's CPU, and a run sends a request
        # per batch of metrics: uncached, a short run's requests cost the server 20 s instead of 1.
        # A successful sign-in is kept for a minute (a changed password takes that long to apply).
        "auth_cache_ttl_seconds": str(SIGN_IN_CACHE_S),
    }
    ini = auth_dir / "basic_auth.ini"  # no password in it: that goes through the environment
    with open(ini, "w") as f:
        config.write(f)
    env = {
        CONFIG_PATH: str(ini.resolve()),
        SECRET_KEY: os.environ.get(SECRET_KEY) or _secret_key(auth_dir),
    }
    if password is not None:
        env[ADMIN_PASSWORD] = password
    return env


def _secret_key(auth_dir: Path) -> str:
    """The key that signs the UI's forms (CSRF): made once and kept beside the user store, so
    a restarted server accepts the pages it served before."""
    path = auth_dir / "flask_secret_key"
    if path.is_file():
        return path.read_text().strip()
    key = secrets.token_hex(32)
    path.touch(mode=0o600)
    path.write_text(key)
    return key


# -- the client side -----------------------------------------------------------------------------
def client_credentials(uri: str) -> str:
    """http://user:password@host:port -> http://host:port, the credentials moved to MLflow's
    own variables, which its client (and every artifact request) sends. A URI without any is
    returned as it is."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or parts.password is None and parts.username is None:
        return uri
    if parts.username:
        os.environ[USERNAME] = unquote(parts.username)
    if parts.password is not None:
        os.environ[PASSWORD] = unquote(parts.password)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_credentials(uri: str, timeout_s: float = 10.0) -> None:
    """One request that needs a signed-in user: a server with sign-in that refuses this process's
    credentials is one line here, not a traceback from the first write."""

    username, password = os.environ.get(USERNAME), os.environ.get(PASSWORD)
    auth = (username, password) if username and password else None
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")  # MLflow sends it when no user is set
    headers = {"Authorization": f"Bearer {token}"} if token and auth is None else None
    try:
        response = requests.get(
            uri.rstrip("/") + "/api/2.0/mlflow/experiments/search",
            params={"max_results": 1},
            auth=auth,
            headers=headers,
            timeout=timeout_s,
        )
    except requests.RequestException:
        return  # not answering is check_server's to say
    if response.status_code == 401:
        who = f"user '{username}'" if auth else "no user"
        raise SeqlabError(
            f"the tracking server at {uri} refused the sign-in ({who}): "
            + (
                f"check {PASSWORD} (or the password in logger.tracking_uri)"
                if auth
                else f"set {USERNAME} and {PASSWORD} to a user of that server"
            )
        )
    if response.status_code == 403:
        raise SeqlabError(
            f"the tracking server at {uri} signed in user '{username}' but refused access (HTTP 403): "
            "ask its admin for permission"
        )
