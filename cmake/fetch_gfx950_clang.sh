#!/usr/bin/env bash
# fetch_gfx950_clang.sh DIR: a clang of LLVM 20 with the AMDGPU backend, for the offline gfx950 compile check
# (test_hip_kernels_offline's HipKernelsGfx950.*): Debian's ROCm 5.2 hipRTC cannot target gfx950 and Debian 12 has no
# LLVM >= 20, while PyPI's ziglang wheel bundles clang 20.1. Downloads that wheel (pinned: version and sha256), and
# unpacks only the zig binary and clang's builtin headers (ziglang/zig, ziglang/lib/include: ~180 MB of the 380) into
# DIR/ziglang-VERSION. Idempotent; the test finds it there (or wherever SMLA_GFX950_CLANG points). Needs python3 with
# pip and PyPI; on any failure it says so and exits 1 (the test then skips, saying why).
set -euo pipefail
version=0.15.1
sha256=4e45994a0e608d9b16ecad255698f5557a2e24de0bd7ba9efb156ab3f3683d9a
wheel=ziglang-$version-py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64.whl
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dest=$1/ziglang-$version
[ -x "$dest/ziglang/zig" ] && exit 0
[ "$(uname -m)" = x86_64 ] || { echo "fetch_gfx950_clang.sh: only the x86_64 wheel is pinned" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/smla-zig.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "ziglang==$version --hash=sha256:$sha256" > "$tmp/req.txt"
# pip checks the hash; --only-binary: the manylinux wheel, never a source build; bounded, so that a network that does
# not answer costs CI minutes at most.
timeout 600 python3 -m pip download -q --timeout 30 --retries 2 --no-deps --only-binary=:all: --require-hashes \
  -r "$tmp/req.txt" -d "$tmp/whl"
[ -f "$tmp/whl/$wheel" ] || { echo "fetch_gfx950_clang.sh: pip gave no $wheel" >&2; exit 1; }
mkdir -p "$tmp/x"
python3 - "$tmp/whl/$wheel" "$tmp/x" <<'PY'
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n == "ziglang/zig" or n.startswith("ziglang/lib/include/"):
        z.extract(n, sys.argv[2])
os.chmod(os.path.join(sys.argv[2], "ziglang/zig"), 0o755)
PY
"$tmp/x/ziglang/zig" clang --version | grep -q "clang version 20" || { echo "fetch_gfx950_clang.sh: not clang 20" >&2; exit 1; }
mkdir -p "$1"
rm -rf "$dest.partial" && mv "$tmp/x" "$dest.partial" && mv "$dest.partial" "$dest"  # whole or absent
echo "fetch_gfx950_clang.sh: clang 20 (zig $version) in $dest"
