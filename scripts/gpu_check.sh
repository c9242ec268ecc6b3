#!/usr/bin/env bash
# Every GPU check in one go, for a machine with an NVIDIA GPU (about 11 minutes at most; 7 on the
# H200 of 2026-12-04, docs/performance.md):
#   1. the GPU tests (pytest -m gpu): CUDA-graph capture, no host synchronisation in the loop,
#      16-mixed's gradient treatment on unscaled gradients;
#   2. the benchmark's gpu rows (the seed shape at batch 64, 512 and 4096; plain, bare, default: the
#      default held to its bare loop, both replaying one CUDA graph a step), then the cpu's at 64 and 4096;
#   3. many networks in one step on the GPU: the packed loop beside bare at batch 64, K = 1, 8, 32, 256;
#   4. a short device x batch study (sweep=device_batch: cpu and gpu at batch 64 and 4096, one network
#      and packs of 8, 2 seeds, 5 s a job).
# Everything it writes goes under OUT_DIR (machine.txt, pytest_gpu.txt, benchmark.{txt,json},
# benchmark_cpu.{txt,json}, packed.{txt,json}, sweep.txt, and the sweep's MLflow store under
# OUT_DIR/root/mlruns).
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
# The GPU rows first (about 150 s on an H200: plain's eager steps are the slow ones), then the same
# machine's CPU at the two ends of the batch range (its bs512 rows took as long as the rest).
step benchmark 200 "$py" scripts/benchmark.py --devices gpu --shapes seed --loops plain,bare,default --batch-sizes 64,512,4096 \
  --repeats 2 --out "$out/benchmark.json"
step benchmark_cpu 150 "$py" scripts/benchmark.py --devices cpu --shapes seed --loops bare,default --batch-sizes 64,4096 \
  --repeats 2 --out "$out/benchmark_cpu.json"
step packed 60 "$py" scripts/benchmark.py --devices gpu --shapes seed --loops bare,packed --pack 1,8,32,256 --batch-sizes 64 \
  --repeats 2 --out "$out/packed.json"
# A short study: cpu and gpu at batch 64 and 4096, one network and a pack of 8, 2 seeds, 5 s a job
# (the full sweep=device_batch's 36 launches did not fit: 5 of them in 120 s on the H200).
step sweep 150 "$py" train.py -m sweep=device_batch seed=0,1 data.batch_size=64,4096 perf=fast replicas=1,8 \
  "trainer.max_time=00:00:00:05" paths.root_dir="$out/root"
exit $status
