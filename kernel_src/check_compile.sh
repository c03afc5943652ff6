#!/usr/bin/env bash
# check_compile.sh: offline compile sweep of the CUDA kernels (no GPU needed).
#
# 1. Builds a small generator from runtime/cuda/kernels_cuda.cpp that lists every distinct
#    kernel (stem, entry, defines) for H in {16,64,128} x TOPK in {64,160,512,640,1152} x
#    r_chunk in {topk, a smaller divisor} (with and without sink / index checks), for a plain
#    target and for sm_90a (the wgmma bodies), renders each translation unit as the runtime does
#    (#define lines, then the .cu), and compiles it with NVRTC for sm_90a (every kernel_src
#    header handed over by name, as the runtime does).
# 2. Compiles the same rendered units with nvcc for sm_90a and (mma.sync units only) sm_80, and
#    each .cu with no defines.
# 3. Fails on any error, on spills or stack in dq/dkv_interm, when their SASS has no HMMA (HGMMA
#    for the wgmma bodies), and when ptxas serializes wgmma (C7514/C7518: every wgmma of the
#    kernel waits for the previous one; found once in a dkv_interm pipeline, see perf-notes).
# Usage: kernel_src/check_compile.sh [work_dir]     exit status 0 = all good
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CUDA="${CUDA_HOME:-/usr/local/cuda}"
WORK="${1:-$(mktemp -d /tmp/smla_check_compile.XXXXXX)}"
mkdir -p "$WORK/units"
NVCC_FLAGS=(-cubin -std=c++17 -Xptxas -v -I"$HERE" -I"$CUDA/include/cccl" -I"$CUDA/include")
fail=0
# cuobjdump is not in every toolkit install (pip: nvidia-cuda-cuobjdump; it also needs nvdisasm on PATH); without it HMMA is
# checked on the PTX instead.
CUOBJDUMP="${CUOBJDUMP:-$(command -v cuobjdump || true)}"
if [ -n "$CUOBJDUMP" ]; then echo "SASS checked with $CUOBJDUMP"; else
  echo "note: no cuobjdump (set CUOBJDUMP=..., or make test-tools); checking mma.sync in PTX instead of HMMA in SASS"; fi

cat > "$WORK/gen.cpp" <<'CPP'
#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <nvrtc.h>
#include "runtime/cuda/kernels_cuda.hpp"
#include "runtime/cuda/nvrtc_options.hpp"
#include "smla/smla.hpp"
static std::string slurp(const std::string& p) { std::ifstream f(p); std::stringstream s; s << f.rdbuf(); return s.str(); }
int main(int argc, char** argv) {
  const std::string src = argv[1], out = argv[2], cuda_inc = argv[3];
  std::vector<smla::ShapeInfo> shapes;
  for (int sm90a = 0; sm90a < 2; ++sm90a)
  for (int H : {16, 64, 128}) for (int topk : {64, 160, 512, 640, 1152})
    for (int div : {1, 2, 5}) for (int flags = 0; flags < 2; ++flags) {
      if (topk % div) continue;
      smla::ShapeInfo s; s.T = 4096; s.H = H; s.topk = topk; s.num_kv = 5120;
      s.r_chunk = topk / div; s.n_chunks = div; s.has_sink = flags; s.check_indices = flags; s.sm90a = sm90a;
      int bits = 0; while ((s.num_kv >> bits) != 0) ++bits;  // keys 0..num_kv
      s.radix_passes = (bits + s.radix_bits - 1) / s.radix_bits;
      std::string why;
      if (!smla::cuda_shape_supported(s, &why)) { std::fprintf(stderr, "unsupported H=%d topk=%d: %s\n", H, topk, why.c_str()); return 1; }
      shapes.push_back(s);
    }
  // every header of kernel_src (.h, .cuh), by name
  std::vector<std::string> hdr_name_s, hdr_text;
  if (DIR* d = opendir(src.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if ((n.size() > 2 && n.substr(n.size() - 2) == ".h") || (n.size() > 4 && n.substr(n.size() - 4) == ".cuh"))
        hdr_name_s.push_back(n), hdr_text.push_back(slurp(src + "/" + n));
    }
    closedir(d);
  }
  std::vector<const char*> hdr_names, hdrs;
  for (size_t i = 0; i < hdr_text.size(); ++i) hdr_names.push_back(hdr_name_s[i].c_str()), hdrs.push_back(hdr_text[i].c_str());
  std::map<std::string, std::string> units;  // file name -> text (one per stem + defines)
  int bad = 0;
  for (const smla::KernelSpec& k : smla::cuda_all_kernels(shapes)) {
    std::string text, name = k.stem;
    for (auto& d : k.defines) { text += "#define " + d.first + " " + std::to_string(d.second) + "\n"; name += "_" + d.first + std::to_string(d.second); }
    text += slurp(src + "/" + k.stem + ".cu");
    std::printf("%s %s smem=%u grid=%u,%u block=%u\n", name.c_str(), k.entry.c_str(), k.smem_bytes, k.grid.x, k.grid.y, k.block.x);
    if (!units.emplace(name, text).second) continue;
    std::ofstream(out + "/" + name + ".cu") << text;
    nvrtcProgram prog;
    nvrtcCreateProgram(&prog, text.c_str(), (k.stem + ".cu").c_str(), (int)hdrs.size(), hdrs.data(), hdr_names.data());
    // the runtime's options (NvrtcCompiler::options), then the include paths as compile() appends them
    std::vector<std::string> o = smla::cuda::nvrtc_base_options("sm_90a");
    o.push_back("-I" + cuda_inc + "/cccl");
    o.push_back("-I" + cuda_inc);
    std::vector<const char*> opts;
    for (const auto& x : o) opts.push_back(x.c_str());
    nvrtcResult r = nvrtcCompileProgram(prog, (int)opts.size(), opts.data());
    if (r != NVRTC_SUCCESS) {
      size_t n; nvrtcGetProgramLogSize(prog, &n); std::string log(n, '\0'); nvrtcGetProgramLog(prog, &log[0]);
      std::fprintf(stderr, "NVRTC FAILED %s:\n%s\n", name.c_str(), log.c_str()); ++bad;
    }
    nvrtcDestroyProgram(&prog);
  }
  return bad ? 1 : 0;
}
CPP
echo "== generator (runtime/cuda/kernels_cuda.cpp) + NVRTC sm_90a"
g++ -std=c++17 -O1 -I"$ROOT" -I"$ROOT/include" -I"$CUDA/include" "$WORK/gen.cpp" "$ROOT/runtime/cuda/kernels_cuda.cpp" "$ROOT/runtime/error.cpp" \
    -L"$CUDA/lib64" -lnvrtc -Wl,-rpath,"$CUDA/lib64" -o "$WORK/gen"
"$WORK/gen" "$HERE" "$WORK/units" "$CUDA/include" > "$WORK/specs.txt" || { echo "FAIL: generator/NVRTC"; fail=1; }
sort -u "$WORK/specs.txt" | sed 's/^/   /'

compile() {  # file arch label
  local f="$1" arch="$2" out="$WORK/$(basename "${1%.cu}").$2"
  if ! nvcc "${NVCC_FLAGS[@]}" -gencode=arch=compute_${arch#sm_},code=$arch -o "$out.cubin" "$f" > "$out.log" 2>&1; then
    echo "FAIL: nvcc $arch $f"; cat "$out.log"; fail=1; return
  fi
  case "$(basename "$f")" in dq*|dkv_interm*)
    if grep -Eq "[1-9][0-9]* bytes (stack frame|spill)" "$out.log"; then echo "FAIL: spills/stack in $f ($arch)"; grep -E "registers|stack|spill" "$out.log"; fail=1; fi
    if grep -Eq "C7514|C7518" "$out.log"; then echo "FAIL: ptxas serializes wgmma in $f ($arch)"; grep -E "C751" "$out.log"; fail=1; fi
    local mma=HMMA; grep -Eq "^#define (DQ|DKV)_WGMMA 1$" "$f" && mma=HGMMA
    if [ -n "$CUOBJDUMP" ]; then
      if ! "$CUOBJDUMP" -sass "$out.cubin" > "$out.sass" 2>&1; then echo "FAIL: cuobjdump $out.cubin"; cat "$out.sass"; fail=1
      elif ! grep -q "$mma" "$out.sass"; then echo "FAIL: no $mma in $f ($arch)"; fail=1; fi
    else  # weaker: the PTX must carry mma.sync (no cuobjdump on this machine)
      local ptx_mma=mma.sync; [ "$mma" = HGMMA ] && ptx_mma=wgmma.mma_async
      if ! nvcc "${NVCC_FLAGS[@]/-cubin/-ptx}" -arch="${arch/sm_/compute_}" -o "$out.ptx" "$f" > /dev/null 2>&1 ||
         ! grep -q "$ptx_mma" "$out.ptx"; then
        echo "FAIL: no $ptx_mma in $f ($arch)"; fail=1; fi
    fi ;;
  esac
  printf '   %-6s %-70s %s\n' "$arch" "$(basename "$f")" "$(grep -E 'Used [0-9]+ registers' "$out.log" | sed -E 's/.*Used ([0-9]+) registers.*/\1/' | paste -sd, -) regs"
}
echo "== nvcc: rendered units, sm_90a and sm_80"
for f in "$WORK"/units/*.cu; do
  for a in sm_90a sm_80; do
    if [ "$a" = sm_80 ] && grep -Eq "^#define (DQ|DKV)_WGMMA 1$" "$f"; then continue; fi  # the wgmma bodies are sm_90a only
    compile "$f" "$a"
  done
done
echo "== nvcc: each .cu alone (defaults)"
for f in "$HERE"/*.cu; do for a in sm_90a sm_80; do compile "$f" "$a"; done; done
if [ "$fail" -ne 0 ]; then echo "check_compile: FAILED (work dir $WORK)"; exit 1; fi
echo "check_compile: OK (work dir $WORK)"
