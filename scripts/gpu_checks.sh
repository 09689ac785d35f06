#!/usr/bin/env bash
# The GPU checks of a lent device, in one call, each step under its own time limit so that one
# slow step cannot eat the lease (a py-spy recording once did):
#
#   bash scripts/gpu_checks.sh SITE OUT
#
# SITE is what scripts/unpack_offline_gpu.sh filled (onnxruntime-gpu, the model wheels); OUT gets
# one STEP.txt per step (its output) and steps.tsv (step, exit status, seconds). Run from the
# checkout's root. The steps, in order of what a lease most needs:
#
#   doctor      what onnxruntime and CuPy see
#   cuda-tests  the CUDA tests of the device path (pytest -m cuda)
#   gram        the Gram spectra's eigensolvers on the model's own matrices
#   target      the whole audit at batch BATCH on BATCH * BATCHES_PER_AUDIT inputs, with --stages
#               (300 s: on a machine where nothing had run yet, an H200's took more than 180)
#   target-held0
#               the same with every batch's dominance cases waited for before the batch after
#               next runs (--held-share 0: the design before they could outlive their batch)
#   gram-host   the same with the Gram spectra by LAPACK on the host threads (--gram-on-host)
#   target-panel, target-fused, target-raw
#               the same with the Gram tridiagonal in panels (one pass over the trailing block
#               per panel of steps), by the fused kernels or by four raw kernels per step
#               (--gram-solver panel|fused|raw) instead of the audit's single launch
#   session     where the audit's session costs more than plain inference at batch BATCH:
#               plain, the reductions with and without the Gram matrices, with the attention
#   ops         the same sessions node by node, by onnxruntime's profiler: kernels, the time
#               between them, the time on each provider (a node left on the CPU shows there);
#               then the layers' reductions a chain each against one chain over the layers
#               stacked along the batch axis (benchmarks/stacked.py), and whether the bits agree
#
# STEPS (default all eleven) names the steps to run when a lease is short; they run in the order
# above, whatever the order named.
# A dry run elsewhere: PROVIDER=cpu MODEL=minilm-l3 BATCH=8 BATCHES_PER_AUDIT=2 GRAM_COUNT=50.
set -uo pipefail

known="doctor cuda-tests gram target target-held0 target-panel gram-host target-fused target-raw session ops"
steps=" ${STEPS:-$known} "
for name in $steps; do
    if [[ " $known " != *" $name "* ]]; then
        echo "STEPS names an unknown step '$name'; expected some of: $known" >&2
        exit 2
    fi
done

site=$(cd "${1:?usage: $0 SITE OUT}" && pwd)
mkdir -p "${2:?usage: $0 SITE OUT}"
out=$(cd "$2" && pwd)
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
provider=${PROVIDER:-cuda}
model=${MODEL:-dinov2-vits14}
batch=${BATCH:-64}
per_audit=${BATCHES_PER_AUDIT:-16}
gram_count=${GRAM_COUNT:-800}

printf 'step\texit\tseconds\n' >"$out/steps.tsv"

# step NAME SECONDS COMMAND...: run COMMAND for at most SECONDS, its output in OUT/NAME.txt
step() {
    local name=$1 limit=$2 began status
    shift 2
    [[ $steps == *" $name "* ]] || return 0
    began=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >"$out/$name.txt" 2>&1
    status=$?
    printf '%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - began))" >>"$out/steps.tsv"
    echo "$name: exit $status in $(($(date +%s) - began)) s"
}

device=(-m benchmarks device --providers "$provider" --models "$model" --batches "$batch"
    --batches-per-audit "$per_audit" --min-seconds 0.5 --stages)
step doctor 30 "$python" -m oversmooth doctor
step cuda-tests 90 "$python" -m pytest -q -p no:cacheprovider -m cuda \
    tests/importers/runtime/test_reductions.py tests/importers/runtime/test_cuda.py \
    tests/importers/runtime/test_device_path.py tests/importers/runtime/test_device_spectra.py \
    tests/importers/runtime/test_householder_kernels.py tests/importers/runtime/test_panel_kernel.py
step gram 90 "$python" -m benchmarks gram --model "$model" --provider "$provider" \
    --count "$gram_count"
step target 300 "$python" "${device[@]}"
step target-held0 120 "$python" "${device[@]}" --held-share 0
step target-panel 120 "$python" "${device[@]}" --gram-solver panel
step gram-host 180 "$python" "${device[@]}" --gram-on-host
step target-fused 180 "$python" "${device[@]}" --gram-solver fused
step target-raw 180 "$python" "${device[@]}" --gram-solver raw
step session 120 "$python" -m benchmarks runner --providers "$provider" --models "$model" \
    --batches "$batch" --min-seconds 2 --audit-inputs "$batch" --audit-batch "$batch"
step ops 120 "$python" -m benchmarks ops --model "$model" --provider "$provider" --batch "$batch"
cat "$out/steps.tsv"
