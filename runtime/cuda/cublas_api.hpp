// cublas_api.hpp: the few cuBLAS calls a dense-GEMM reference rate needs, through dlopen.
//
// Only the tools use it (smla-bench --breakdown compares the op with a bf16 GEMM measured in the
// same process); the runtime never calls cuBLAS. As with the driver (cuda_api.hpp) and NCCL
// (nccl_api.hpp), nothing links against libcublas and no cuBLAS header is needed to build: the
// handful of signatures and enum values used are declared here (checked against cuBLAS 13.1's
// cublas_api.h and library_types.h; they have been stable since CUDA 11).
#pragma once
#include <cuda.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace smla::cuda {

/// The function table of one opened libcublas. Enums travel as int (their C ABI).
struct Cublas {
  using Handle = void*;  // cublasHandle_t
  using CreateFn = int (*)(Handle*);
  using DestroyFn = int (*)(Handle);
  using SetStreamFn = int (*)(Handle, CUstream);  // cudaStream_t and CUstream are one type
  using GemmExFn = int (*)(Handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* A,
                           int a_type, int lda, const void* B, int b_type, int ldb, const void* beta, void* C,
                           int c_type, int ldc, int compute_type, int algo);
  using StatusStringFn = const char* (*)(int);

  // cublasStatus_t, cublasOperation_t, cudaDataType, cublasComputeType_t, cublasGemmAlgo_t values.
  static constexpr int kStatusSuccess = 0;     // CUBLAS_STATUS_SUCCESS
  static constexpr int kOpN = 0;               // CUBLAS_OP_N
  static constexpr int kBf16 = 14;             // CUDA_R_16BF
  static constexpr int kCompute32F = 68;       // CUBLAS_COMPUTE_32F
  static constexpr int kGemmDefault = -1;      // CUBLAS_GEMM_DEFAULT

  CreateFn Create = nullptr;                   // cublasCreate_v2
  DestroyFn Destroy = nullptr;                 // cublasDestroy_v2
  SetStreamFn SetStream = nullptr;             // cublasSetStream_v2
  GemmExFn GemmEx = nullptr;                   // cublasGemmEx
  StatusStringFn StatusName = nullptr;         // cublasGetStatusName (optional: for messages)
  StatusStringFn StatusString = nullptr;       // cublasGetStatusString (optional: for messages)

  bool ok = false;
  std::string why;   ///< why it is not usable: which file could not be opened, or which symbol is missing
  std::string path;  ///< the file that opened (as the dynamic loader names it)
};

/// Where libcublas is looked for, in order: $SMLA_CUBLAS_LIBRARY alone when it is set (an
/// explicit choice that fails is reported, never replaced by another copy), else
/// libcublas.so.13, libcublas.so.12, libcublas.so. Reads the environment on every call.
std::vector<std::string> cublas_candidates();

/// Opens the first of `names` that loads, uncached (tests point it at missing files). Never
/// throws and never null: check `ok` / `why`.
std::shared_ptr<const Cublas> open_cublas(const std::vector<std::string>& names);

/// open_cublas(cublas_candidates()), once per process (thread-safe).
std::shared_ptr<const Cublas> cublas();

/// One measured dense GEMM rate.
struct GemmRate {
  int n = 0;            ///< C[n x n] = A[n x n] B[n x n]
  double ms = 0;        ///< median of the timed products
  double tflops = 0;    ///< 2 n^3 / ms
  int repeats = 0;
  std::string library;  ///< the libcublas that ran it
};

/// Times C = A B with cuBLAS on `stream` (its context must be current; with none current, device
/// 0's primary context is made current and stays so): bf16 A, B, C, fp32 accumulation (CUBLAS_COMPUTE_32F),
/// random nonzero A and B, warm-up then the median of `repeats` products timed with driver events;
/// four elements of C are checked against host dot products. Allocates 3 n^2 bf16 and frees
/// them. Never throws: returns nullopt with `*why` saying why nothing was measured (cuBLAS
/// missing, no CUDA driver, a failed call or allocation, a wrong result).
std::optional<GemmRate> dense_gemm_rate(int n, CUstream stream, std::string* why, int repeats = 10);

/// dense_gemm_rate(...)->tflops.
std::optional<double> dense_gemm_tflops(int n, CUstream stream, std::string* why);

}  // namespace smla::cuda
