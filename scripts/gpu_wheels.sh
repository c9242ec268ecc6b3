#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs on a GPU machine that has Python 3.12 with PyTorch,
# Lightning, torchmetrics and SciPy, but not Hydra, OmegaConf, MLflow or Optuna, and no network
# (this project's lent GPU machines): downloaded here, for that Python, at the versions
# requirements.lock pins, less the packages that machine already has (its list is below).
# Writes them to DIR (default .whl/) and prints their total size: a device run carries at most
# 64 MiB with the working tree (measured 2026-12-01: 44 wheels, 36 MB).
#
#   scripts/gpu_wheels.sh [DIR]
#   # then, on the GPU machine, from the repository's root:
#   WHEELS=DIR PYTHON=python3 scripts/gpu_check.sh OUT_DIR
#
# Hydra's parser (antlr4-python3-runtime) is published as source only: it is built into a wheel
# here (pure Python, so it serves any platform).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
mkdir -p "$dir"
pip=(python3 -m pip)
platforms=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
antlr=$(grep -i '^antlr4-python3-runtime==' requirements.lock)
"${pip[@]}" wheel -q --no-deps -w "$dir" "$antlr"
"${pip[@]}" download -q --only-binary=:all: "${platforms[@]}" -d "$dir" -f "$dir" -c requirements.lock \
  "mlflow[auth]" hydra-core omegaconf optuna hydra-joblib-launcher hydra-submitit-launcher

# What the GPU machine's image already holds (read there 2026-11-17): their wheels stay here.
present="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"
for wheel in "$dir"/*.whl; do
  name=$(basename "$wheel" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
  if [[ " ${present//$'\n'/ } " == *" $name "* ]]; then rm -f "$wheel"; fi
done
echo "$(ls "$dir"/*.whl | wc -l) wheels, $(du -ch "$dir"/*.whl | tail -n 1 | cut -f1) in $dir"
