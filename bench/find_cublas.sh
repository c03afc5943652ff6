# find_cublas.sh (sourced by the bench scripts): exports SMLA_CUBLAS_LIBRARY for the dense GEMM rate of
# smla-bench --breakdown. The H200 image has a CUDA toolkit copy under /usr/local and torch's pip package
# nvidia-cublas ships another; an SMLA_CUBLAS_LIBRARY already set is kept.
if [ -z "${SMLA_CUBLAS_LIBRARY:-}" ]; then
  SMLA_CUBLAS_LIBRARY=$(find /usr/local -name 'libcublas.so.13*' 2>/dev/null | head -1)
  [ -n "$SMLA_CUBLAS_LIBRARY" ] || SMLA_CUBLAS_LIBRARY=$(python3 -c 'import glob, os, nvidia
for v in ("13", "12"):
    hits = sorted(f for p in nvidia.__path__ for f in glob.glob(os.path.join(p, "**", "libcublas.so." + v), recursive=True))
    if hits: print(hits[0]); break' 2>/dev/null)
  [ -n "$SMLA_CUBLAS_LIBRARY" ] && export SMLA_CUBLAS_LIBRARY
fi
echo "cuBLAS for the GEMM rate: ${SMLA_CUBLAS_LIBRARY:-none found (smla-bench falls back to libcublas.so.13/.12 on the loader path)}"
