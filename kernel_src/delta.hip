// delta.hip: the AMD build of delta.cu. The body is the one that runs on the H200: it uses only
// what common.cuh makes portable (bf16 bits, 32-lane reductions, integer atomics), so the file
// is simply included. Its constants and their #ifndef defaults are those of delta.cu.
#include "delta.cu"
