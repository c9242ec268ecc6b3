#!/usr/bin/env bash
# Every GPU check in one go, for a machine with an NVIDIA GPU (about 8 minutes at most):
#   1. the GPU tests (pytest -m gpu): CUDA-graph capture, no host synchronisation in the loop;
#   2. the benchmark with cpu and gpu rows: the seed shape at batch 64, 512 and 4096, every loop
#      but naive (plain, bare, default), so the default is held to its bare loop on both devices;
#   3. many networks in one step on the GPU: the packed loop beside bare at batch 64, K = 1, 8, 32, 256;
#   4. a short device x batch study (sweep=device_batch: cpu and gpu at batch 64, 512, 4096, the default
#      loop, 2 seeds, 5 s a job: 12 jobs).
# Everything it writes goes under OUT_DIR (machine.txt, pytest_gpu.txt, benchmark.{txt,json},
# packed.{txt,json}, sweep.txt, and the sweep's MLflow store under OUT_DIR/root/mlruns).
#
#   scripts/gpu_check.sh OUT_DIR
#
# Python: $PYTHON if set, else .venv/bin/python if it exists, else python3 (a machine whose own
# PyTorch has CUDA: the project's sources are used from src/ without installing them). A machine
# without Hydra, OmegaConf, MLflow or Optuna and without a network gets them from WHEELS=DIR, made
# here by scripts/gpu_wheels.sh (a path from the repository's root): installed first into a folder
# of their own (no network, no deps).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$out/root"
out=$(cd "$out" && pwd)
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SEQLAB_ROOT="$out/root"
status=0
if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d /tmp/seqlab-site.XXXXXX)
  trap 'rm -rf "$site"' EXIT
  if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl; then
    echo "error: the wheels in $WHEELS did not install (make them with scripts/gpu_wheels.sh $WHEELS)"; exit 2
  fi
  export PYTHONPATH="$PYTHONPATH:$site" PATH="$site/bin:$PATH"  # mlflow's command: the tracking server
fi

step() {  # step NAME SECONDS COMMAND...: run with a time limit, output to OUT_DIR/NAME.txt
  local name=$1 limit=$2; shift 2
  echo "== $name (at most ${limit} s)"
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.txt"
  echo "== $name: exit $rc"
  [ $rc -eq 0 ] || status=1
}

{ date -u; nvidia-smi 2>&1; "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'; } > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "no CUDA GPU visible to $py: nothing to check"; exit 2
fi

step pytest_gpu 120 "$py" -m pytest -m gpu -q -p no:cacheprovider -o addopts="-ra"
step benchmark 180 "$py" scripts/benchmark.py --devices cpu,gpu --shapes seed --loops plain,bare,default --batch-sizes 64,512,4096 \
  --repeats 2 --out "$out/benchmark.json"
step packed 60 "$py" scripts/benchmark.py --devices gpu --shapes seed --loops bare --pack 1,8,32,256 --batch-sizes 64 \
  --repeats 2 --out "$out/packed.json"
step sweep 120 "$py" train.py -m sweep=device_batch seed=0,1 data.batch_size=64,512,4096 perf=fast \
  "trainer.max_time=00:00:00:05" paths.root_dir="$out/root"
exit $status
