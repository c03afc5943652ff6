#!/usr/bin/env bash
# candidates.sh: kernel-source changes written but not yet measured on the GPU, kept on main as patches
# (bench/candidates/NAME.patch: a paragraph saying what, why and the prediction, then a `git diff` of kernel_src/ and
# of anything that must land with it),
# because branches and ignored directories have not survived from one session's checkout to the next.
#
#   here (no GPU):  bench/candidates.sh prepare DIR [-s T,H,NUM_KV,TOPK]... [-a] [-k] [NAME...]
#       applies each patch (all of them, or the NAMEs) to a copy of kernel_src/ (its kernel_src/ hunks; hunks elsewhere,
#       e.g. a test that lands with it, must apply to the checkout but stay out of the copy) and runs `bench/src_ab.sh
#       prepare` with main's embedded sources as the first variant ("main") and one variant per patch: a patch that no
#       longer applies, or a tree that does not compile for sm_90a, fails here. -a adds a variant "all": every one of
#       the patches applied in turn to one copy (they must apply together). Run from the repository root
#       (BUILD: the build directory, as for src_ab.sh). A patch that also changes host code (runtime/, include/,
#       tools/: e.g. a kernel's launch size) is refused, since its variant here would run with main's host code:
#       measure it as a build instead (a worktree with the patch applied, built; `src_ab.sh prepare ... NAME=@BUILD`);
#       -k takes it anyway, for a compile check of its kernel sources only (the ctests).
#   device:         bash bench/src_ab.sh run DIR     (CHECK=1: --check every variant; see src_ab.sh)
#   PATCH_DIR=bench/probes: the same for the probes there (knock-outs that time a piece of a kernel by leaving it out;
#       their results are wrong by design: never CHECK=1, never landed; bench/probes/README.md).
#
# A candidate that measures faster goes into kernel_src/ in its own commit and its patch is deleted; one that does
# not is deleted too, with its numbers in docs/perf-notes.md.
set -uo pipefail
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }  # the header comment
[ "${1:-}" = prepare ] && [ $# -ge 2 ] || usage
dir=${2%/}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
patch_dir=${PATCH_DIR:-bench/candidates}
case $patch_dir in /*) ;; *) patch_dir=$root/$patch_dir ;; esac  # relative: to the repository root
shapes=() names=() all=0 kernels_only=0
while [ $# -gt 0 ]; do
  case $1 in
    -s) [ $# -ge 2 ] || usage; shapes+=(-s "$2"); shift 2 ;;
    -a) all=1; shift ;;
    -k) kernels_only=1; shift ;;
    -*) usage ;;
    *) names+=("$1"); shift ;;
  esac
done
if [ ${#names[@]} -eq 0 ]; then
  for f in "$patch_dir"/*.patch; do [ -e "$f" ] && names+=("$(basename "$f" .patch)"); done
fi
[ ${#names[@]} -gt 0 ] || { echo "candidates: no patches in $patch_dir/" >&2; exit 1; }
trees=$(mktemp -d /tmp/candidates.XXXXXX) || exit 1
trap 'rm -rf "$trees"' EXIT
variants=(main=-)
for n in "${names[@]}"; do
  f=$patch_dir/$n.patch
  [ -f "$f" ] || { echo "candidates: no $f" >&2; exit 1; }
  mkdir -p "$trees/$n" && cp -r "$root/kernel_src" "$trees/$n/" || exit 1
  # A patch may carry the test or host hunks that must land with it: the whole of it must apply to the checkout,
  # and only its kernel_src/ hunks go into the variant's tree.
  (cd "$root" && git apply --check "$f") || { echo "candidates: $n.patch does not apply to this checkout" >&2; exit 1; }
  host=$(cd "$root" && git apply --numstat "$f" | awk '{print $3}' | grep -E '^(runtime|include|tools)/' | tr '\n' ' ')
  if [ -n "$host" ] && [ $kernels_only = 0 ]; then
    echo "candidates: $n.patch changes host code ($host): its variant would run with this build's host code;" \
      "measure it as a build (src_ab.sh prepare ... $n=@BUILDDIR), or pass -k for a compile check only" >&2
    exit 1
  fi
  (cd "$trees/$n" && git apply --include='kernel_src/*' "$f") ||
    { echo "candidates: $n.patch's kernel_src/ hunks do not apply" >&2; exit 1; }
  variants+=("$n=$trees/$n/kernel_src")
done
if [ $all = 1 ]; then
  [ ${#names[@]} -ge 2 ] || { echo "candidates: -a needs two patches or more" >&2; exit 1; }
  mkdir -p "$trees/all" && cp -r "$root/kernel_src" "$trees/all/" || exit 1
  for n in "${names[@]}"; do
    (cd "$trees/all" && git apply --include='kernel_src/*' "$patch_dir/$n.patch") ||
      { echo "candidates: $n.patch does not apply on top of the ones before it (variant all)" >&2; exit 1; }
  done
  variants+=("all=$trees/all/kernel_src")
fi
bash "$root/bench/src_ab.sh" prepare "$dir" "${shapes[@]}" "${variants[@]}"
