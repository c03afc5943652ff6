#!/usr/bin/env bash
# sass_digest.sh: a digest of the SASS of the matrix kernels (dq, dkv_interm) for sm_90a, compiled here (no GPU), to
# show that a change of kernel_src/ meant to be a pure refactor leaves the machine code as it was: run it on the tree
# before and after, and compare the digests (same digest = the same instructions; addresses and comments left out).
#
#   bench/sass_digest.sh [-s T,H,NUM_KV,TOPK[,R_CHUNK]]... [-o DIR] KERNEL_SRC_DIR
#
# The kernels are the ones the planner launches for the shapes (default: the seed, 4096,128,4128,160 and
# 4096,64,5120,640, sink on), as `smla-warmup --dry-run --json` lists them, plus each producer dq body in its persistent
# form (DQW_PERSIST, dq_impl 4; not the fused interm's, DQW_INTERM, which has none). Each is compiled with nvcc -cubin
# and the runtime's defines (the runtime uses NVRTC; the same ptxas, so the two agree on whether a change moved
# anything, not necessarily on the code itself). Prints, a
# line a kernel: the tag, the digest, the instruction count and ptxas's register and spill report. DIR (default a
# temporary directory) keeps the cubins, the SASS and ptxas's output.
# Needs cuobjdump and nvdisasm (not in every toolkit install: CUOBJDUMP=/path/to/cuobjdump, else on PATH, else the
# ones `make test` fetched into BUILD/_tools, cmake/fetch_test_tools.sh) and BUILD's smla-warmup (BUILD: the build
# directory, default build).
set -euo pipefail
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }  # the header comment
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
shapes=() out=""
while getopts "s:o:h" opt; do
  case $opt in
    s) shapes+=(--shape "$OPTARG") ;;
    o) out=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] && [ -f "$1/dq.cu" ] || usage
src=$(cd "$1" && pwd)
[ ${#shapes[@]} -gt 0 ] || shapes=(--shape 4096,128,5120,512 --shape 4096,128,4128,160 --shape 4096,64,5120,640)
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
[ -n "$cuobjdump" ] || ! [ -x "$build/_tools/cuobjdump-13.2.51/bin/cuobjdump" ] ||
  cuobjdump=$build/_tools/cuobjdump-13.2.51/bin/cuobjdump
[ -n "$cuobjdump" ] || { echo "sass_digest.sh: no cuobjdump (set CUOBJDUMP; see the header)" >&2; exit 2; }
PATH=$(dirname "$cuobjdump"):$PATH  # its nvdisasm beside it
cuda=${CUDA_HOME:-/usr/local/cuda}
[ -n "$out" ] || out=$(mktemp -d /tmp/smla_sass.XXXXXX)
mkdir -p "$out"
[ -x "$build/bin/smla-warmup" ] || { echo "sass_digest.sh: no $build/bin/smla-warmup (build first)" >&2; exit 2; }

"$build/bin/smla-warmup" --arch sm_90a "${shapes[@]}" --sink on --no-tuned --dry-run --json --out "$out/dry" \
  > "$out/plan.json"
# stem and tag of each matrix kernel, and the persistent form of each producer dq body
python3 - "$out/plan.json" > "$out/units" <<'PY'
import json, sys
units = {}  # (stem, the set of defines) -> tag: one unit however the defines are ordered
for k in json.load(open(sys.argv[1]))["kernels"]:
    if k["kernel"] not in ("dq", "dkv_interm"):
        continue
    pieces = k["tag"].split("-")
    units.setdefault((k["kernel"], frozenset(pieces)), k["tag"])
    # (the persistent form of each producer body, but the fused interm's: dq_wgmma.cuh refuses that pair)
    if k["kernel"] == "dq" and "DQW_PRODUCER1" in pieces and not {"DQW_PERSIST1", "DQW_INTERM1"} & set(pieces):
        units.setdefault(("dq", frozenset(pieces + ["DQW_PERSIST1"])), k["tag"] + "-DQW_PERSIST1")
for (stem, _), tag in sorted(units.items(), key=lambda u: (u[0][0], u[1])):
    print(stem, tag)
PY
[ -s "$out/units" ] || { echo "sass_digest.sh: smla-warmup listed no dq or dkv_interm kernel" >&2; exit 1; }

status=0
while read -r stem tag; do
  defs=()
  for piece in ${tag//-/ }; do  # NAME123 -> -DNAME=123
    [[ $piece =~ ^([A-Za-z_]+[A-Za-z_0-9]*[A-Za-z_])([0-9]+)$ ]] || { echo "unparsed define $piece in $tag" >&2; exit 1; }
    defs+=("-D${BASH_REMATCH[1]}=${BASH_REMATCH[2]}")
  done
  n=$out/$stem-$tag
  if ! nvcc -cubin -arch=sm_90a -std=c++17 -DSMLA_NVRTC=1 "${defs[@]}" -I"$src" -I"$cuda/include/cccl" \
       -I"$cuda/include" -Xptxas -v -o "$n.cubin" "$src/$stem.cu" 2> "$n.ptxas"; then
    echo "$stem $tag: compile failed ($n.ptxas)"; status=1; continue
  fi
  "$cuobjdump" -sass "$n.cubin" | grep -E '^\s+/\*[0-9a-f]{4,}\*/' | sed -E 's@/\*[0-9a-f]+\*/@@; s@;.*@@' > "$n.sass"
  regs=$(grep -o 'Used [0-9]* registers' "$n.ptxas" | head -1 | grep -o '[0-9]*')
  spill=$(grep -o '[0-9]* bytes spill stores' "$n.ptxas" | head -1 | grep -o '^[0-9]*')
  printf '%-11s %s  %s  %5d instructions  %s registers  %s bytes spilled\n' "$stem" "$tag" \
    "$(md5sum < "$n.sass" | cut -c1-16)" "$(wc -l < "$n.sass")" "$regs" "$spill"
done < "$out/units"
exit $status
