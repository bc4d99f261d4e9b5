#!/usr/bin/env bash
# tests/bench/torch_perf_diff.sh BUILD OUT: a sampled profile of what
# allocscope adds to the host-bound PyTorch step. A plain run and an
# `allocscope run` (the defaults) of tests/gpu/fsdp2_fp8_train.py (one rank,
# seed mode, the proof's sizes) run at the same time, each on its own half
# of the CPUs, each under `perf record -e cpu-clock:u` (user time; virtual
# machines often expose no hardware counters). Writes OUT/perf-threads.txt
# (samples by thread and library, both runs), OUT/perf-symbols.txt (the
# hottest symbols of each run), OUT/clock.txt (the machine's clock source
# and what one CLOCK_MONOTONIC read costs) and each run's step times.
#   PERF=path      perf to use (default: perf on PATH)
#   PERF_LIB=dir   libraries that perf alone needs (put before LD_LIBRARY_PATH
#                  for perf, never for the workload)
#   STEPS=N        steps per run (default 400)
#   DELAY_MS=N     start sampling this long after the start, so that start-up
#                  (imports, CUDA, the first steps) is left out (default 20000)
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: tests/bench/torch_perf_diff.sh BUILD OUT}
out=${2:?usage: tests/bench/torch_perf_diff.sh BUILD OUT}
perf=${PERF:-perf}
steps=${STEPS:-400}
delay=${DELAY_MS:-20000}
mkdir -p "$out"
tools/gpu-build-min "$build" "$out/build.log" || exit 1
cli=$build/tools/allocscope
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The clock every event is stamped with.
{
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
  cat >"$scratch/clock.c" <<'C'
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>
int main(void) {
    struct timespec a, b, t;
    const int n = 5000000;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i) clock_gettime(CLOCK_MONOTONIC, &t);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("clock_gettime(CLOCK_MONOTONIC): %.1f ns a call\n", ns / n);
    unsigned long long s = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; ++i) s += __rdtsc();
    clock_gettime(CLOCK_MONOTONIC, &b);
    ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("rdtsc: %.1f ns a read (%llu)\n", ns / n, s & 1);
    return 0;
}
C
  cc -O2 -o "$scratch/clock" "$scratch/clock.c" && "$scratch/clock"
} >"$out/clock.txt" 2>&1

orig=${LD_LIBRARY_PATH:-}
perf_env=(env "LD_LIBRARY_PATH=${PERF_LIB:+$PERF_LIB${orig:+:}}$orig")
if [ -n "$orig" ]; then work_env=(env "LD_LIBRARY_PATH=$orig"); else work_env=(env -u LD_LIBRARY_PATH); fi
cmd=(python3 -m torch.distributed.run --standalone --nproc_per_node 1
  tests/gpu/fsdp2_fp8_train.py --mode seed --steps "$steps" --time)
n=$(nproc)
half=$((n / 2))
taskset -c "0-$((half - 1))" "${perf_env[@]}" "$perf" record -q -e cpu-clock:u -F 2000 -D "$delay" \
  -o "$scratch/plain.data" -- "${work_env[@]}" "${cmd[@]}" >"$out/plain.log" 2>&1 &
plain=$!
taskset -c "$half-$((n - 1))" "${perf_env[@]}" "$perf" record -q -e cpu-clock:u -F 2000 -D "$delay" \
  -o "$scratch/allocscope.data" -- "${work_env[@]}" "$cli" run --force --out "$scratch/run" -- \
  "${cmd[@]}" >"$out/allocscope.log" 2>&1 &
traced=$!
wait "$plain"
echo "plain exit status $?"
wait "$traced"
echo "allocscope exit status $?"

for run in plain allocscope; do
  # Mean step time over the second half of the steps.
  grep -o "STEP_MS rank 0 step [0-9]* [0-9.]*" "$out/$run.log" |
    awk -v s="$steps" -v r="$run" '$5 >= s/2 {t += $6; k++} END {if (k) printf "%s: %.2f ms a step (steps %d-%d)\n", r, t/k, s/2, s-1}'
done | tee "$out/steps.txt"
for run in plain allocscope; do
  echo "=== $run: samples by thread and library"
  "${perf_env[@]}" "$perf" report -i "$scratch/$run.data" --no-children -n --stdio -q \
    --sort comm,dso --percent-limit 0.2 2>/dev/null
done >"$out/perf-threads.txt"
for run in plain allocscope; do
  echo "=== $run: hottest symbols"
  "${perf_env[@]}" "$perf" report -i "$scratch/$run.data" --no-children -n --stdio -q \
    --sort comm,dso,sym --percent-limit 0.05 2>/dev/null | head -400
done >"$out/perf-symbols.txt"
