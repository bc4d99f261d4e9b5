#!/usr/bin/env bash
# tests/bench/torch_cost_probe.sh BUILD OUT: where allocscope's time goes in
# the PyTorch FSDP2 FP8 run (NPROC ranks, default 2 GPUs): one run with
# ALLOCSCOPE_LOG=debug (the interposer's stack capture, the bridge's Python
# frame walk and every shim hook report what they cost, in OUT/debug.log),
# then rank 0's main thread under cProfile without and with allocscope
# (OUT/profiles.txt). Builds what it needs in BUILD first
# (tools/gpu-build-min). PROFILES=0 skips the cProfile runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: tests/bench/torch_cost_probe.sh BUILD OUT}
out=${2:?usage: tests/bench/torch_cost_probe.sh BUILD OUT}
steps=${STEPS:-60}
mkdir -p "$out"
tools/gpu-build-min "$build" "$out/build.log" || exit 1
cli="$build/tools/allocscope"
script=tests/gpu/fsdp2_fp8_train.py
torchrun=(python3 -m torch.distributed.run --standalone --nproc_per_node "${NPROC:-2}")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

ALLOCSCOPE_LOG=debug "$cli" run --force --out "$scratch/debug" -- "${torchrun[@]}" "$script" \
  --mode seed --steps "$steps" --time >"$out/debug.log" 2>&1
echo "debug run exit status $?"
grep -E "^allocscope|STEP_MS rank 0 step $((steps - 1)) " "$out/debug.log"

[ "${PROFILES:-1}" = 0 ] && exit 0
"${torchrun[@]}" tests/bench/pyprofile.py "$out/profile-plain" "$script" --mode seed \
  --steps "$steps" >"$out/profile-plain.log" 2>&1
echo "cProfile plain exit status $?"
"$cli" run --force --out "$scratch/prof" -- "${torchrun[@]}" tests/bench/pyprofile.py \
  "$out/profile-allocscope" "$script" --mode seed --steps "$steps" \
  >"$out/profile-allocscope.log" 2>&1
echo "cProfile allocscope exit status $?"
for f in "$out"/profile-plain/profile.rank0.txt "$out"/profile-allocscope/profile.rank0.txt; do
  echo "=== $f"
  cat "$f"
done >"$out/profiles.txt" 2>&1
rm -rf "$out/profile-plain" "$out/profile-allocscope"
