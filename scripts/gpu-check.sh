#!/usr/bin/env bash
# `make gpu-check GPU_OUT=FOLDER`: the `gpu` tests and `python -m thinkviz bench gpu` on a CUDA
# machine, their outputs written into FOLDER (at most 6 files, one level down).
#
# Made for the borrowed GPU machines: no network, python3 with a CUDA build of PyTorch,
# transformers and accelerate, but no bitsandbytes, gradio, plotly or gguf.  Whatever
# scripts/gpu-wheels.sh put into .gpu-wheels (run it beforehand where there is network, and
# carry the folder) is installed from there without an index.  No weight file is needed: the
# tests and the benchmark build their models in code (the embedded model only where its files
# happen to be present).  Sized to end within 8 minutes on an H200.
#
# Without a CUDA GPU it says so in one line and exits 1; it exits 1 too if a test or the
# benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu-check.sh OUT_FOLDER}
PYTHON=${GPU_PYTHON:-python3}
WHEELS=${GPU_WHEELS:-.gpu-wheels}
GPU_TESTS=(tests/test_gpu.py tests/test_memory.py)  # every test marked gpu lives in these files

if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    echo "gpu-check: no CUDA GPU here ($PYTHON has no torch that sees one); run it on a machine with an NVIDIA GPU" >&2
    exit 1
fi
mkdir -p "$OUT"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    SITE=$(mktemp -d)
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
            "$WHEELS"/*.whl; then
        echo "gpu-check: could not install the wheels in $WHEELS" >&2
        exit 1
    fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -d "$WHEELS/tokenizer" ]; then
    export THINKVIZ_TOKENIZER="$PWD/$WHEELS/tokenizer"
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

"$PYTHON" - >"$OUT/environment.txt" 2>&1 <<'PY'
import importlib.metadata as m, platform, torch
print("python", platform.python_version(), "on", platform.machine())
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0),
      f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB")
for name in ("transformers", "accelerate", "bitsandbytes", "tokenizers", "huggingface-hub", "safetensors", "pytest"):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, "missing")
PY
nvidia-smi >>"$OUT/environment.txt" 2>&1 || true
cat "$OUT/environment.txt"

"$PYTHON" -m pytest -m gpu -rs -q -p no:cacheprovider "${GPU_TESTS[@]}" --junitxml="$OUT/pytest.xml" 2>&1 \
    | tee "$OUT/pytest.log"
tests=${PIPESTATUS[0]}
"$PYTHON" -m thinkviz bench gpu --out "$OUT" 2>&1 | tee "$OUT/bench-gpu.log"
bench=${PIPESTATUS[0]}
echo "gpu-check: pytest exited $tests, bench gpu exited $bench; outputs in $OUT"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
