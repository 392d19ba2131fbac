#!/usr/bin/env bash
# Run where there is network, before a GPU machine without it runs `make gpu-check`:
# downloads the wheels its image lacks, for Linux x86_64 and CPython 3.12, and saves the
# shared SmolLM2 tokenizer (no weights) beside them, into one folder ignored by git.
#
#   PYTHON=.venv/bin/python scripts/gpu-wheels.sh [FOLDER]     (FOLDER defaults to .gpu-wheels)
#
# The versions are those installed for PYTHON (the project's tested ones): bitsandbytes and
# gguf are missing there, and transformers is added because the image's 5.17 does not take
# the `cache=` argument the engine passes to the model (5.24 does).  The folder travels with
# the working tree (64 MiB in all); the script checks that both together fit.
set -euo pipefail
cd "$(dirname "$0")/.."
FOLDER=${1:-.gpu-wheels}
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
LIMIT=$((64 * 1024 * 1024))  # what may travel to the GPU machine

version() { "$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
PACKAGES=()
for name in bitsandbytes gguf transformers; do
    PACKAGES+=("$name==$(version "$name")")
done

STAGING=$(mktemp -d)
trap 'rm -rf "$STAGING"' EXIT
# manylinux tags up to 2.28 are what an image with glibc >= 2.28 accepts; bitsandbytes ships 2.24.
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform any -d "$STAGING/wheels" "${PACKAGES[@]}"
PYTHONPATH=. "$PYTHON" -c "import sys; from thinkviz.models.loading import _embedded_tokenizer; \
_embedded_tokenizer().save_pretrained(sys.argv[1])" "$STAGING/tokenizer"

rm -rf "$FOLDER"
mkdir -p "$FOLDER"
mv "$STAGING"/wheels/*.whl "$FOLDER"/
mv "$STAGING/tokenizer" "$FOLDER/tokenizer"

folder_bytes=$(du -sb "$FOLDER" | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null \
    | awk '{ s += $1 } END { print s + 0 }')
total=$((folder_bytes + tree_bytes))
ls -l "$FOLDER"
awk -v f="$folder_bytes" -v t="$tree_bytes" -v name="$FOLDER" 'BEGIN { m = 1048576;
    printf "gpu-wheels: %s (%.1f MiB) + working tree (%.1f MiB) = %.1f MiB of the 64 MiB that may travel\n",
        name, f / m, t / m, (f + t) / m }'
if [ "$total" -gt "$LIMIT" ]; then
    echo "gpu-wheels: too big to travel: over 64 MiB together" >&2
    exit 1
fi
