// The cuda build of blas.h: cuBLAS (64-bit size API) and cuSOLVER, loaded
// with dlopen the first time a Blas is made. Linking them would map several
// hundred MiB of libraries into every run of the CLI (even `--version`),
// GPU or not; loaded on use, only runs on the GPU pay for them.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>
#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "device/blas.h"

namespace qf::cuda {

namespace {

// A failure of the device (execution, allocation, internal, mapping) is an
// i/o error of the run; a library that cannot run here (not initialized,
// architecture, unsupported) is Unsupported; an invalid value is a bug.
void check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  const char* name = "unknown status";
  ErrorKind kind = ErrorKind::Io;
  switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: name = "CUBLAS_STATUS_NOT_INITIALIZED", kind = ErrorKind::Unsupported; break;
    case CUBLAS_STATUS_ARCH_MISMATCH: name = "CUBLAS_STATUS_ARCH_MISMATCH", kind = ErrorKind::Unsupported; break;
    case CUBLAS_STATUS_NOT_SUPPORTED: name = "CUBLAS_STATUS_NOT_SUPPORTED", kind = ErrorKind::Unsupported; break;
    case CUBLAS_STATUS_INVALID_VALUE: name = "CUBLAS_STATUS_INVALID_VALUE", kind = ErrorKind::Internal; break;
    case CUBLAS_STATUS_ALLOC_FAILED: name = "CUBLAS_STATUS_ALLOC_FAILED"; break;
    case CUBLAS_STATUS_MAPPING_ERROR: name = "CUBLAS_STATUS_MAPPING_ERROR"; break;
    case CUBLAS_STATUS_EXECUTION_FAILED: name = "CUBLAS_STATUS_EXECUTION_FAILED"; break;
    case CUBLAS_STATUS_INTERNAL_ERROR: name = "CUBLAS_STATUS_INTERNAL_ERROR"; break;
    default: break;
  }
  throw Error(kind, std::string("device: cuBLAS ") + what + " failed: " + name + " (" +
                        std::to_string(static_cast<int>(st)) + ")");
}

void check(cusolverStatus_t st, const char* what) {
  if (st == CUSOLVER_STATUS_SUCCESS) return;
  const char* name = "unknown status";
  ErrorKind kind = ErrorKind::Io;
  switch (st) {
    case CUSOLVER_STATUS_NOT_INITIALIZED: name = "CUSOLVER_STATUS_NOT_INITIALIZED", kind = ErrorKind::Unsupported; break;
    case CUSOLVER_STATUS_ARCH_MISMATCH: name = "CUSOLVER_STATUS_ARCH_MISMATCH", kind = ErrorKind::Unsupported; break;
    case CUSOLVER_STATUS_NOT_SUPPORTED: name = "CUSOLVER_STATUS_NOT_SUPPORTED", kind = ErrorKind::Unsupported; break;
    case CUSOLVER_STATUS_INVALID_VALUE: name = "CUSOLVER_STATUS_INVALID_VALUE", kind = ErrorKind::Internal; break;
    case CUSOLVER_STATUS_ALLOC_FAILED: name = "CUSOLVER_STATUS_ALLOC_FAILED"; break;
    case CUSOLVER_STATUS_EXECUTION_FAILED: name = "CUSOLVER_STATUS_EXECUTION_FAILED"; break;
    case CUSOLVER_STATUS_INTERNAL_ERROR: name = "CUSOLVER_STATUS_INTERNAL_ERROR"; break;
    default: break;
  }
  throw Error(kind, std::string("device: cuSOLVER ") + what + " failed: " + name + " (" +
                        std::to_string(static_cast<int>(st)) + ")");
}

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  throw Error(ErrorKind::Io, std::string("device: CUDA ") + what + ": " + cudaGetErrorString(err));
}

#define QF_NAME2(x) #x
#define QF_NAME(x) QF_NAME2(x)  // the exported name behind cublas_v2.h's macros

// The entry points used, resolved from the toolkit's libraries of the major
// versions this was compiled against.
struct Libs {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasDgemm_64) dgemm;
  decltype(&cublasSgemm_64) sgemm;
  decltype(&cublasSgemmStridedBatched_64) sgemm_batched;
  decltype(&cublasGemmEx_64) gemm_ex;
  decltype(&cublasDsyrk_64) dsyrk;
  decltype(&cublasDtrsm_64) dtrsm;
  decltype(&cusolverDnCreate) solver_create;
  decltype(&cusolverDnDestroy) solver_destroy;
  decltype(&cusolverDnDpotrf_bufferSize) dpotrf_buffer_size;
  decltype(&cusolverDnDpotrf) dpotrf;
};

void* open_library(const std::string& name) {
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    throw Error(ErrorKind::Unsupported, "cannot load " + name + " (CUDA toolkit libraries): " + (why ? why : "?"));
  }
  return h;
}

template <class F>
void resolve(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) throw Error(ErrorKind::Unsupported, std::string("CUDA library has no ") + name);
}

const Libs& libs() {
  static Libs l{};
  static std::once_flag once;
  std::call_once(once, [] {
    void* blas = open_library("libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
    void* solver = open_library("libcusolver.so." + std::to_string(CUSOLVER_VER_MAJOR));
    resolve(blas, QF_NAME(cublasCreate), l.create);
    resolve(blas, QF_NAME(cublasDestroy), l.destroy);
    resolve(blas, QF_NAME(cublasDgemm_64), l.dgemm);
    resolve(blas, QF_NAME(cublasSgemm_64), l.sgemm);
    resolve(blas, QF_NAME(cublasSgemmStridedBatched_64), l.sgemm_batched);
    resolve(blas, QF_NAME(cublasGemmEx_64), l.gemm_ex);
    resolve(blas, QF_NAME(cublasDsyrk_64), l.dsyrk);
    resolve(blas, QF_NAME(cublasDtrsm_64), l.dtrsm);
    resolve(solver, QF_NAME(cusolverDnCreate), l.solver_create);
    resolve(solver, QF_NAME(cusolverDnDestroy), l.solver_destroy);
    resolve(solver, QF_NAME(cusolverDnDpotrf_bufferSize), l.dpotrf_buffer_size);
    resolve(solver, QF_NAME(cusolverDnDpotrf), l.dpotrf);
  });
  if (!l.dpotrf) throw Error(ErrorKind::Unsupported, "the CUDA libraries could not be loaded earlier in this run");
  return l;
}

cublasOperation_t op(Op o) { return o == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T; }
cublasFillMode_t fill(Uplo u) { return u == Uplo::Lower ? CUBLAS_FILL_MODE_LOWER : CUBLAS_FILL_MODE_UPPER; }

}  // namespace

void load_blas_libraries() { libs(); }

// This thread's cuBLAS and cuSOLVER handles on one device, and the
// factorization's workspace, kept for the thread's life.
struct Blas::Context {
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  dvec<double> work;
  dvec<int> info;
  Context() {
    const Libs& l = libs();
    check(l.create(&blas), "create");
    const cusolverStatus_t st = l.solver_create(&solver);
    if (st != CUSOLVER_STATUS_SUCCESS) {
      l.destroy(blas);
      check(st, "create");
    }
    info = dvec<int>(1);
  }
  ~Context() {
    if (solver) libs().solver_destroy(solver);
    if (blas) libs().destroy(blas);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};

Blas::Context& Blas::context() {
  thread_local std::map<int, std::unique_ptr<Context>> per_device;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::unique_ptr<Context>& c = per_device[dev];
  if (!c) {
    c = std::make_unique<Context>();
    device::count_blas_context();
  }
  return *c;
}

Blas::Blas() : ctx_(&context()) {}

Blas::~Blas() = default;

void Blas::gemm(Op ta, Op tb, int64_t m, int64_t n, int64_t k, double alpha, const double* A, int64_t lda,
                const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  blas_fault_point("Dgemm");
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  check(libs().dgemm(ctx_->blas, op(ta), op(tb), m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc), "Dgemm");
}

void Blas::gemm(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  blas_fault_point("Sgemm");
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  check(libs().sgemm(ctx_->blas, op(ta), op(tb), m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc), "Sgemm");
}

void Blas::gemm_16(Half type, Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* A,
                   int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  blas_fault_point("GemmEx");
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  const cudaDataType_t t = type == Half::F16 ? CUDA_R_16F : CUDA_R_16BF;
  check(libs().gemm_ex(ctx_->blas, op(ta), op(tb), m, n, k, &alpha, A, t, lda, B, t, ldb, &beta, C, CUDA_R_32F, ldc,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "GemmEx");
}

void Blas::gemm_strided_batched(Op ta, Op tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                                int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b,
                                float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  blas_fault_point("SgemmStridedBatched");
  check_gemm_args(ta, tb, m, n, k, lda, ldb, ldc);
  check_batch_args(batch, stride_c, ldc, m, n);
  check(libs().sgemm_batched(ctx_->blas, op(ta), op(tb), m, n, k, &alpha, A, lda, stride_a, B, ldb, stride_b, &beta,
                             C, ldc, stride_c, batch),
        "SgemmStridedBatched");
}

void Blas::syrk(Uplo uplo, Op trans, int64_t n, int64_t k, double alpha, const double* A, int64_t lda, double beta,
                double* C, int64_t ldc) {
  blas_fault_point("Dsyrk");
  check_syrk_args(trans, n, k, lda, ldc);
  check(libs().dsyrk(ctx_->blas, fill(uplo), op(trans), n, k, &alpha, A, lda, &beta, C, ldc), "Dsyrk");
}

int Blas::potrf(Uplo uplo, int64_t n, double* A, int64_t lda) {
  blas_fault_point("Dpotrf");
  check_potrf_args(n, lda);
  if (n == 0) return 0;
  int lwork = 0;
  check(libs().dpotrf_buffer_size(ctx_->solver, fill(uplo), static_cast<int>(n), A, static_cast<int>(lda), &lwork),
        "Dpotrf_bufferSize");
  fit(ctx_->work, lwork > 0 ? lwork : 1);
  check(libs().dpotrf(ctx_->solver, fill(uplo), static_cast<int>(n), A, static_cast<int>(lda), raw(ctx_->work), lwork,
                         raw(ctx_->info)),
        "Dpotrf");
  int i = 0;
  check(cudaMemcpy(&i, raw(ctx_->info), sizeof(int), cudaMemcpyDeviceToHost), "potrf");
  if (i < 0) throw Error(ErrorKind::Internal, "cuSOLVER Dpotrf: argument " + std::to_string(-i) + " is invalid");
  return i;
}

void Blas::trsm(Side side, Uplo uplo, Op ta, Diag diag, int64_t m, int64_t n, double alpha, const double* A,
                int64_t lda, double* B, int64_t ldb) {
  blas_fault_point("Dtrsm");
  check_trsm_args(side, m, n, lda, ldb);
  check(libs().dtrsm(ctx_->blas, side == Side::Left ? CUBLAS_SIDE_LEFT : CUBLAS_SIDE_RIGHT, fill(uplo), op(ta),
                       diag == Diag::Unit ? CUBLAS_DIAG_UNIT : CUBLAS_DIAG_NON_UNIT, m, n, &alpha, A, lda, B, ldb),
        "Dtrsm");
}

}  // namespace qf::cuda
