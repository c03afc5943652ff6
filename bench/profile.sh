#!/usr/bin/env bash
# profile.sh (GPU machine): where a shape's time goes, from the hardware rather than from knock-outs.
#
#   bash bench/profile.sh [T,H,NUM_KV,TOPK]        (default: the seed, 4096,128,5120,512)
#
# 1. Clocks and power: nvidia-smi sampled every 50 ms while smla-bench runs the shape SUSTAIN times back to back
#    (default 800, ~3 s at the seed), then a summary: samples above 600 W, their median SM clock, and how many carry
#    the software power cap (clocks_event_reasons bit 0x4).
# 2. Nsight Compute (--clock-control none: the clocks as found, METHOD.md) with --set full on one launch of each
#    kernel in KERNELS (default "dq dkv_interm gather"), then its details, raw metrics and SASS source page (with the
#    warp-state samples; summarize it here with bench/ncu_sass.py) as CSV.
# Everything goes to $OUT as two files (the device tool returns at most eight): prof.tgz (CSV and logs) and
# reps.tgz (the .ncu-rep reports).
# Env: BENCH (default build/bin/smla-bench; a src_ab DIR's bin/smla-bench works with SMLA_CACHE_DIR and
# SMLA_KERNEL_SRC_DIR set as src_ab sets them), KERNELS, SUSTAIN, NCU (default: ncu on PATH or /usr/local/cuda/bin).
# Why (perf notes v16): knock-outs change the data the tensor cores see, and so the power and the clocks (a long run
# of the backward sits at the 700 W cap, ~1.83-1.90 GHz); the samples show the kernel as it is.
set -uo pipefail
shape=${1:-4096,128,5120,512}
bench=${BENCH:-build/bin/smla-bench}
kernels=${KERNELS:-dq dkv_interm gather}
sustain=${SUSTAIN:-800}
out=${OUT:-/tmp/out}
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
[ -x "$bench" ] || { echo "profile: no $bench (build it and carry it)" >&2; exit 1; }
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
export SMLA_LOG_LEVEL=${SMLA_LOG_LEVEL:-warn}
args=(--backend cuda --shape "$shape")

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 50 > "$work/smi.csv" &
smi=$!
sleep 0.5
"$bench" "${args[@]}" --repeat "$sustain" > "$work/sustained.log" 2>&1
sleep 0.3
kill $smi 2>/dev/null
wait $smi 2>/dev/null
cat "$work/sustained.log"
# Samples above 600 W: the sustained part of the run.
python3 - "$work/smi.csv" <<'PY' | tee "$work/clocks.txt"
import sys
def num(x, base=10):
    try:
        return int(x.strip(), 16) if base == 16 else float(x)
    except ValueError:  # "[N/A]" and the like
        return 0
rows = [l.split(",") for l in open(sys.argv[1]) if l.count(",") >= 6]
hot = [r for r in rows if num(r[3]) > 600]
if not rows:
    print("clocks: nvidia-smi gave no samples")
elif not hot:
    print(f"clocks: none of {len(rows)} samples above 600 W")
else:
    c = sorted(int(num(r[1])) for r in hot)
    cap = sum(1 for r in hot if num(r[6], 16) & 0x4)
    print(f"clocks: {len(hot)} of {len(rows)} samples above 600 W, median SM clock {c[len(c) // 2]} MHz "
          f"(min {c[0]}, max {c[-1]}), {cap} with the software power cap")
PY

for k in $kernels; do
  timeout 300 "$ncu" --clock-control none --kernel-name "smla_$k" --launch-skip 3 --launch-count 1 --set full \
    -o "$work/$k" "$bench" "${args[@]}" --repeat 1 --warmup 3 > "$work/ncu_$k.log" 2>&1
  if [ ! -f "$work/$k.ncu-rep" ]; then
    echo "profile: no report for smla_$k (ncu_$k.log):"; tail -5 "$work/ncu_$k.log"; continue
  fi
  "$ncu" --import "$work/$k.ncu-rep" --page details --csv > "$work/${k}_details.csv" 2>&1
  "$ncu" --import "$work/$k.ncu-rep" --page raw --csv > "$work/${k}_raw.csv" 2>&1
  "$ncu" --import "$work/$k.ncu-rep" --page source --csv --print-source sass > "$work/${k}_sass.csv" 2>&1
  python3 - "$work/${k}_details.csv" "$k" <<'PY'
import csv, sys
# L2 and L1 throughput (% of peak) answer perf notes v22's question: is dq's start-up wait L2 bandwidth shared with
# the kv gathers (then fewer L2 bytes is the lever) or latency (then prefetching is)?
want = ("Duration", "SM Frequency", "DRAM Throughput", "Compute (SM) Throughput", "L2 Cache Throughput",
        "L1/TEX Cache Throughput", "Memory Throughput")
for r in csv.DictReader(open(sys.argv[1])):
    if r.get("Metric Name") in want and r.get("Section Name", "").startswith("GPU Speed Of Light"):
        print(f"{sys.argv[2]}: {r['Metric Name']} {r['Metric Value']} {r['Metric Unit']}")
PY
done
(cd "$work" && tar czf "$out/prof.tgz" ./*.csv ./*.log ./*.txt && { ls ./*.ncu-rep > /dev/null 2>&1 &&
  tar czf "$out/reps.tgz" ./*.ncu-rep || true; })
ls -la "$out"
