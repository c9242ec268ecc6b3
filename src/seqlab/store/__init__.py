"""Where runs are kept, and who may reach them.

- `local`:       a local SQLite store opened under a file lock (simultaneous first runs); a half-created one named
- `ghosts`:      which process owns a run, its heartbeat; runs left RUNNING by a dead process ended KILLED
- `server`:      make server: the MLflow tracking server (also started by parallel sweeps and tests)
- `server_auth`: sign-in: a shared server's basic-auth set-up; the client's credentials
- `models`:      a run's logged models, every page of the store's answer
- `ui`:          links into the MLflow UI's model-training view and the experiment kind tag
"""
