# Two commands do all set-up: `make train` and `make test` create .venv and install pinned versions first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.seqlab-installed
# Hydra's next line (1.4, a prerelease) beside the pinned 1.3, for tests/integration/test_hydra_next.py only
# (put first on PYTHONPATH there); where pip cannot fetch it, that test skips and says so.
HYDRA_NEXT := hydra-core==1.4.0rc3 omegaconf==2.4.1rc1
PORT ?= 5000
HOST ?= 127.0.0.1
# make server: where the server keeps runs and artifacts (defaults: mlruns/server/). A team server:
# BACKEND_STORE_URI=postgresql://user:password@dbhost:5432/mlflow (best in the environment: BACKEND_STORE_URI=... make server)
# ARTIFACTS=s3://bucket/mlflow HOST=0.0.0.0
BACKEND_STORE_URI ?=
ARTIFACTS ?=
# make server with a HOST other than loopback signs users in (MLflow basic-auth): the admin's password
# from MLFLOW_AUTH_ADMIN_PASSWORD or ADMIN_PASSWORD_FILE=path (first start); ALLOW_UNAUTHENTICATED=1 serves it open.
ADMIN_PASSWORD_FILE ?=
ARGS ?=
# make serve: the model to serve (a run's, or a registered version) and where
MODEL ?=
SERVE_PORT ?= 5001
DOCS_PORT ?= 8000
# make dashboard: the study storage (default: OPTUNA_STORAGE, else mlruns/optuna.db); PORT= as for make ui (default 8080)
STORAGE ?=
# make sync: where the runs are (default: this project's store) and the server they go to (default: MLFLOW_TRACKING_URI)
FROM ?=
TO ?=

.DEFAULT_GOAL := help
.PHONY: help install train test test-fast lint docs docs-serve ui dashboard server serve sync clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'
	@echo "  pass options with ARGS, e.g. make train ARGS='data.batch_size=128 trainer.accelerator=cpu'"

install: $(STAMP) ## create .venv and install the project with pinned versions (requirements.lock)

$(STAMP): pyproject.toml requirements.lock Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev,postgres]'
	-@$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $(VENV)/hydra-next $(HYDRA_NEXT) \
		|| echo "note: $(HYDRA_NEXT) could not be installed: tests/integration/test_hydra_next.py skips"
	@touch $@

train: $(STAMP) ## train the default experiment (override anything with ARGS='key=value ...')
	$(PY) train.py $(ARGS)

test: $(STAMP) ## run the test suite
	$(PY) -m pytest $(ARGS)

test-fast: $(STAMP) ## tests/unit: no process of their own, a few steps at most; a check after each change (a minute on 2 cores)
	$(PY) -m pytest tests/unit -q --dist load $(ARGS)

lint: $(STAMP) ## ruff check and ruff format --check over src/, tests/ and scripts/ (pyproject.toml: [tool.ruff])
	$(VENV)/bin/ruff check src tests scripts train.py predict.py
	$(VENV)/bin/ruff format --check src tests scripts train.py predict.py

docs: $(STAMP) ## build the documentation site (docs/ -> site/) with every link checked
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(STAMP) ## serve the documentation on http://127.0.0.1:8000 (another port: DOCS_PORT=8001)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

ui: $(STAMP) ## open the MLflow UI over this project's store on http://127.0.0.1:5000 (another port: PORT=5001)
	@mkdir -p mlruns/artifacts
	@echo "open http://127.0.0.1:$(PORT)/#/experiments?workflowType=machine_learning (MLflow's model-training view; its home page opens on GenAI)"
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlruns/mlflow.db \
		--default-artifact-root $(CURDIR)/mlruns/artifacts --host 127.0.0.1 --port $(PORT)

dashboard: $(STAMP) ## open optuna-dashboard over a search's study on http://127.0.0.1:8080 (STORAGE=url; PORT=8081)
	$(PY) -m seqlab.sweeps.dashboard --host 127.0.0.1 --port $(if $(filter command line environment,$(origin PORT)),$(PORT),8080)

# The storage goes in the environment: a PostgreSQL URL on a command line (make's echo, ps) would
# show its password to everyone on the machine.
dashboard: export SEQLAB_DASHBOARD_STORAGE = $(STORAGE)

server: $(STAMP) ## start an MLflow tracking server on http://127.0.0.1:5000 (HOST=0.0.0.0 to share it, with sign-in; PORT=...) that stores runs and serves artifacts
	$(PY) -m seqlab.store.server --host $(HOST) --port $(PORT) \
		$(if $(ADMIN_PASSWORD_FILE),--admin-password-file '$(ADMIN_PASSWORD_FILE)')

# The stores go to the server in its environment: on a command line (make's echo, ps) a
# PostgreSQL URL would show its password to everyone on the machine.
server: export MLFLOW_BACKEND_STORE_URI = $(BACKEND_STORE_URI)
server: export MLFLOW_ARTIFACTS_DESTINATION = $(ARTIFACTS)

sync: $(STAMP) ## copy runs from a local store into a tracking server, once: make sync FROM=sqlite:///path/mlflow.db TO=http://host:5000
	$(PY) scripts/sync.py $(if $(FROM),--from '$(FROM)') $(if $(TO),--to '$(TO)')

serve: $(STAMP) ## serve a trained network over REST: make serve MODEL=runs:/<run id>/model (or models:/NAME/VERSION; SERVE_PORT=5001)
	@test -n "$(MODEL)" || { echo "error: say which model: make serve MODEL=runs:/<run id>/model"; exit 1; }
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" MLFLOW_TRACKING_URI=$${MLFLOW_TRACKING_URI:-sqlite:///$(CURDIR)/mlruns/mlflow.db} \
		mlflow models serve -m '$(MODEL)' --env-manager local -h 127.0.0.1 -p $(SERVE_PORT)

clean: ## remove Hydra output folders (keeps mlruns/ and .venv)
	rm -rf logs outputs multirun .pytest_cache
