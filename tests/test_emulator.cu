// test_emulator.cu: checks of the CPU runtime itself that cannot run on a GPU (they provoke
// deadlocks, races and limit violations on purpose): the shuffled order catches a missing
// __syncthreads, a divergent barrier is reported instead of hanging, the H100's launch limits are
// enforced through cudaGetLastError, misused warp collectives are reported, device memory is
// bounded and checked, and (in the AddressSanitizer build) an out-of-bounds access inside a kernel
// is caught. Built for the CPU only (build.sh lists it in CPU_ONLY_TESTS).
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ptx.h>
#include "../kernels.cuh"
#include "testing.h"

long long emu_host_memory_bytes(void);  // cpu/runtime.cpp: physical memory, or the cgroup limit when lower

// A kernel with a missing barrier: each thread writes s[t], then reads its neighbour's s[t+1]
// without __syncthreads. In thread order every neighbour has not written yet... so to make the
// in-order run correct and only a reordering wrong, thread t reads s[t-1] (written before it).
__global__ void neighbour_missing_sync(const float* x, float* out) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = x[t];
    // __syncthreads();  <- the bug
    out[t] = t > 0 ? s[t - 1] : s[0];
}
__global__ void neighbour_with_sync(const float* x, float* out) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = x[t];
    __syncthreads();
    out[t] = t > 0 ? s[t - 1] : s[0];
}

// Divergent barrier: even threads wait in __syncthreads, odd threads in a full-warp __syncwarp.
__global__ void divergent_barrier(int* out) {
    if (threadIdx.x % 2 == 0)
        __syncthreads();
    else
        __syncwarp();
    out[threadIdx.x] = 1;
}

// A shuffle whose mask names lanes that have returned: allowed (CUDA requires only the non-exited
// lanes of the mask to take part); with n odd, lane n - 1 reads lane n, which has exited (undefined).
__global__ void shuffle_after_exit(float* out, int n) {
    int t = threadIdx.x;
    if (t >= n) return;
    float v = __shfl_xor_sync(0xffffffffu, (float)t, 1);
    out[t] = v;
}
// __activemask in the two sides of a branch, and after lanes >= 20 have exited.
__global__ void activemask_groups(unsigned* out) {
    int t = threadIdx.x;
    if (t >= 20) return;
    if (t < 8) {
        out[t] = __activemask();
        out[32 + t] = 1;
    } else {
        out[32 + t] = 2;
        out[t] = __activemask();
    }
    out[32 + t] = __activemask();
}

__global__ void noop(int* out) {
    if (out) out[0] = 1;
}
__global__ void big_smem(float* out) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    ((float*)dyn_smem)[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = ((float*)dyn_smem)[threadIdx.x];
}
// Reads dynamic shared memory it never wrote: must see the 0xFF fill (NaN), not zeros.
__global__ void read_unwritten_smem(float* out) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    out[threadIdx.x] = ((float*)dyn_smem)[threadIdx.x];
}
// Writes one element past the end of its buffer.
__global__ void write_out_of_bounds(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;  // the bug: <= instead of <
}
// Reads past the dynamic shared memory it asked for.
__global__ void read_past_dyn_smem(float* out, int n) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    float* s = (float*)dyn_smem;
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x + n];  // n past the end of a 32-float allocation
}

// Runs fn in a child process; returns its exit status, with its stderr captured into `err`.
static int run_child(void (*fn)(void), char* err, size_t errlen) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while ((r = read(fds[0], err + got, errlen - 1 - got)) > 0) got += (size_t)r;
    err[got] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}
static void child_oob_write(void) {
    float* d;
    cudaMalloc(&d, 100 * sizeof(float));
    launch(write_out_of_bounds, dim3(1), dim3(128), 0, (cudaStream_t)0, d, 100);
}
static void child_smem_overread(void) {
    float* d;
    cudaMalloc(&d, 32 * sizeof(float));
    launch(read_past_dyn_smem, dim3(1), dim3(32), 32 * sizeof(float), (cudaStream_t)0, d, 32);
}

// wgmma misuse, each in one warpgroup (threads 128, or 96 for `bad` 3): A and B are a 64 x 16 tile of
// ones in dynamic shared memory (K-major, no swizzle: 8 core matrices of 8 x 16 bytes per 8 rows).
//   bad 0: correct; out[tid] = d[0] after the wait (16)
//   bad 1: no wgmma.fence before the first wgmma            -> reported
//   bad 2: out[tid] = d[0] read before the wait              -> the value before the product (7)
//   bad 3: a block of 96 threads (no whole warpgroup)        -> reported
//   bad 4: exits without wgmma.wait_group                    -> reported
//   bad 5: warp 1 does not issue the wgmma (the others do)   -> reported (on the GPU: undefined, a hang)
//   bad 6: warp 2 gives another B descriptor                 -> reported
//   bad 7: a cp.async into the operand, not waited for, then the wgmma            -> reported (a race on the GPU)
//   bad 8: the wgmma, then a cp.async into its operand completed before its wait  -> reported (a race)
//   bad 9: the wgmma waited for by every warp (wait, barrier), then the cp.async  -> correct (16)
//   bad 10: an accumulator written between the wgmma and its wait                 -> reported
//   bad 11: a st.shared into its operand between the wgmma and its wait           -> reported
//   bad 12: A from registers, one of them written between the wgmma and its wait  -> reported
//   bad 13: a cp.async (of ones) into the operand, waited for, no fence.proxy.async, a barrier, the wgmma -> reported
//   bad 14: the same with the copying thread's fence.proxy.async after its wait   -> correct (16)
__global__ void wgmma_misuse(float* out, const __nv_bfloat16* ones, int bad) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __nv_bfloat16* s = (__nv_bfloat16*)dyn_smem;
    for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) s[i] = __float2bfloat16(1.f);
    fence_proxy_async();
    __syncthreads();
    if ((bad == 13 || bad == 14) && threadIdx.x == 0) {
        cp_async_16(s, ones, 16);
        cp_async_commit();
        cp_async_wait<0>();
        if (bad == 14) fence_proxy_async();
    }
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 7.f;
    uint32_t a[4];  // bad 12: A (64 x 16 ones) from registers, two bf16 ones in each
    for (int i = 0; i < 4; i++) a[i] = 0x3F803F80u;
    uint64_t desc = wgmma_desc(smem_addr(s), WGMMA_SWIZZLE_NONE, 128, 256);  // 8 rows: 2 core matrices in K
    if (bad == 7 && threadIdx.x == 0) cp_async_16(s, out, 16);               // (the source: any device memory)
    cp_async_commit();
    if (bad != 1) wgmma_fence();
    if (bad == 12)
        wgmma_m64k16_bf16_rs<64, 0>(d, a, desc, 0);
    else if (!(bad == 5 && threadIdx.x / 32 == 1))
        wgmma_m64k16_bf16<64, 0>(d, desc, bad == 6 && threadIdx.x / 32 == 2 ? desc + 1 : desc, 0);
    wgmma_commit_group();
    if (bad == 10) d[3] = 1.f;
    if (bad == 11 && threadIdx.x == 5) s[40] = __float2bfloat16(2.f);
    if (bad == 12) a[2] = 0;
    if (bad == 8 && threadIdx.x == 0) {
        cp_async_16(s, out, 16);
        cp_async_commit();
        cp_async_wait<0>();
    }
    if (bad == 2) out[threadIdx.x] = d[0];
    if (bad == 4) return;
    wgmma_wait_group<0>();
    if (bad == 9) {
        __syncthreads();  // every warp's wgmma is done: its operands may be overwritten
        if (threadIdx.x == 0) cp_async_16(s, out + 32, 16);
        cp_async_commit();
        cp_async_wait<0>();
    }
    if (bad != 2) out[threadIdx.x] = d[0];
}

// mbarrier and TMA misuse, in a block of 64 threads; thread 0 sets up a barrier (count 1) and copies a 16 x 64 bf16
// box (2048 bytes) of a 2D map into shared memory, then every thread waits for phase 0:
//   bad 0: correct                                                            -> success
//   bad 1: the barrier's count is 2 and only one thread arrives               -> a deadlock reported (a GPU hangs)
//   bad 2: thread 0 arrives again after its expect_tx, before the copy lands  -> reported (an arrival too many)
//   bad 3: the copy is issued and nobody waits                                -> reported when the block ends
//   bad 4: expect_tx of 1024 bytes for the 2048-byte box                      -> reported (more bytes than expected)
//   bad 5: the barrier not initialized                                         -> reported
__global__ void mbar_misuse(const __grid_constant__ CUtensorMap map, int bad) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t bar;
    unsigned char* dst = dyn_smem + (1024 - smem_addr(dyn_smem) % 1024) % 1024;
    if (threadIdx.x == 0 && bad != 5) {
        mbar_init(&bar, bad == 1 ? 2 : 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&bar, bad == 4 ? 1024 : 2048);
        if (bad == 2) mbar_arrive(&bar);
        tma_load_2d(dst, &map, 0, 0, &bar);
    }
    if (bad != 3) mbar_wait(&bar, 0);
}

// setmaxnreg_use: 256 threads (2 warpgroups), warpgroup 0 gives registers back, warpgroup 1 asks for more:
//   bad 0: as the ISA requires                                                 -> runs
//   bad 1: warp 3 skips its warpgroup's setmaxnreg.dec                          -> reported when the block ends
//   bad 2: lanes 16-31 of warp 5 skip setmaxnreg.inc (not .aligned)             -> reported
//   bad 3: warp 6 asks for 224, its warpgroup's other warps for 232             -> reported when the block ends
//   bad 4: both warpgroups ask for 256: 65,536 registers, past the 63,488 that a block of 256 threads can have (248
//          a thread), so on a GPU the second .inc would wait forever              -> reported when the block ends
__global__ void setmaxnreg_use(int bad) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (bad == 4) {
        setmaxnreg_inc<256>();
    } else if (warp < 4) {
        if (!(bad == 1 && warp == 3)) setmaxnreg_dec<40>();
    } else if (bad == 3 && warp == 6) {
        setmaxnreg_inc<224>();
    } else if (!(bad == 2 && warp == 5 && lane >= 16)) {
        setmaxnreg_inc<232>();
    }
}

// The CPU cuBLASLt's algorithms (cpu/cublas.cpp, cublasLtMatmulAlgoGetHeuristic): for a deep k (512 x 8 here)
// with workspace for the parts it offers split-K 1, 2 and 4 in that order; without that workspace, or with a
// reduction mask that leaves out COMPUTE_TYPE, only the plain product; a split-K algorithm is refused without its
// workspace; and split-K 2 adds in another order than the plain product, so that bits change with the algorithm as
// on the GPU.
static void test_cpu_heuristic(void) {
    const int m = 8, n = 4, k = 4096;
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    int splits[3][4], found[3];
    for (int c = 0; c < 3; c++) {  // c 0: workspace for the parts; 1: none; 2: a mask without COMPUTE_TYPE
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        uint64_t ws = c == 1 ? 0 : 1 << 20;
        uint32_t mask = c == 2 ? CUBLASLT_REDUCTION_SCHEME_INPLACE : CUBLASLT_REDUCTION_SCHEME_MASK;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
        cublasLtMatmulHeuristicResult_t h[4];
        found[c] = 0;
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 4, h, &found[c]);
        for (int i = 0; i < found[c]; i++) {
            uint32_t split = 0;
            size_t size = 0;
            cublasLtMatmulAlgoConfigGetAttribute(&h[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split,
                                                 &size);
            splits[c][i] = (int)split;
        }
        if (c == 0 && found[0] == 3) {  // the plain product against split-K 2, and split-K 2 without workspace
            float *A, *B, *D, *W, a[m * k], b[k * n], d1[m * n], d2[m * n], alpha = 1, beta = 0;
            for (int i = 0; i < m * k; i++) a[i] = (float)((i * 7919) % 1000) / 1000.f - 0.5f;
            for (int i = 0; i < k * n; i++) b[i] = (float)((i * 104729) % 997) / 997.f - 0.5f;
            CUDA_OK(cudaMalloc(&A, sizeof a));
            CUDA_OK(cudaMalloc(&B, sizeof b));
            CUDA_OK(cudaMalloc(&D, sizeof d1));
            CUDA_OK(cudaMalloc(&W, ws));
            CUDA_OK(cudaMemcpy(A, a, sizeof a, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(B, b, sizeof b, cudaMemcpyHostToDevice));
            cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &h[0].algo, W, ws, 0);
            CUDA_OK(cudaMemcpy(d1, D, sizeof d1, cudaMemcpyDeviceToHost));
            cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &h[1].algo, W, ws, 0);
            CUDA_OK(cudaMemcpy(d2, D, sizeof d2, cudaMemcpyDeviceToHost));
            int differ = 0;
            double worst = 0;
            for (int i = 0; i < m * n; i++) differ += d1[i] != d2[i], worst = fmax(worst, fabs(d1[i] - d2[i]));
            CHECK(differ > 0 && worst < 1e-3, "split-K 2 against the plain product: %d of %d differ, by at most %g",
                  differ, m * n, worst);
            cublasStatus_t st = cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &h[1].algo, W,
                                               h[1].workspaceSize - 1, 0);
            CHECK(st == CUBLAS_STATUS_INVALID_VALUE,
                  "split-K 2 with a byte too little workspace: %s, want INVALID_VALUE", cublasGetStatusName(st));
            cudaFree(A), cudaFree(B), cudaFree(D), cudaFree(W);
        }
        cublasLtMatmulPreferenceDestroy(pref);
    }
    CHECK(found[0] == 3 && splits[0][0] == 1 && splits[0][1] == 2 && splits[0][2] == 4,
          "with workspace: %d offers (want split-K 1, 2, 4)", found[0]);
    CHECK(found[1] == 1 && splits[1][0] == 1, "without workspace: %d offers (want split-K 1 alone)", found[1]);
    CHECK(found[2] == 1 && splits[2][0] == 1, "with reduction mask INPLACE: %d offers (want split-K 1 alone)",
          found[2]);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
}

int main(void) {
    float x[64], want[64], got[64], *dx, *dout;
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    for (int i = 0; i < 64; i++) want[i] = x[i > 0 ? i - 1 : 0];
    CUDA_OK(cudaMalloc(&dx, sizeof x));
    CUDA_OK(cudaMalloc(&dout, sizeof x));
    CUDA_OK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));

    // 1. Shuffled order: the missing barrier is invisible in thread order, visible when shuffled.
    emu_set_shuffle(0);
    launch(neighbour_missing_sync, dim3(1), dim3(64), 0, (cudaStream_t)0, (const float*)dx, dout);
    CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(memcmp(got, want, sizeof got) == 0, "in thread order the racy kernel happens to be right (the premise)");
    int caught = 0;
    for (int seed = 1; seed <= 5; seed++) {
        emu_set_shuffle(seed);
        CUDA_OK(cudaMemset(dout, 0, sizeof got));
        launch(neighbour_missing_sync, dim3(1), dim3(64), 0, (cudaStream_t)0, (const float*)dx, dout);
        CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
        caught += memcmp(got, want, sizeof got) != 0;
    }
    CHECK(caught == 5, "shuffled order exposes the missing __syncthreads in %d of 5 seeds", caught);
    launch(neighbour_with_sync, dim3(1), dim3(64), 0, (cudaStream_t)0, (const float*)dx, dout);
    CUDA_OK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(memcmp(got, want, sizeof got) == 0, "with the barrier, the shuffled order gives the right answer");
    emu_set_shuffle(0);

    // 2. Divergent barrier: reported as a launch failure, no hang, and the process goes on.
    int* di;
    CUDA_OK(cudaMalloc(&di, 64 * sizeof(int)));
    fprintf(stderr, "(test_emulator: the deadlock and misuse reports below are expected)\n");
    launch(divergent_barrier, dim3(2), dim3(64), 0, (cudaStream_t)0, di);
    cudaError_t e = cudaGetLastError();
    CHECK(e == cudaErrorLaunchFailure, "divergent barrier: cudaGetLastError gave %s, want cudaErrorLaunchFailure",
          cudaGetErrorName(e));
    CHECK(cudaGetLastError() == cudaSuccess, "cudaGetLastError resets the error");
    launch(noop, dim3(1), dim3(1), 0, (cudaStream_t)0, di);
    CHECK(cudaGetLastError() == cudaSuccess, "kernels run normally after a reported deadlock");

    // 2b. The same on a stream: the launch returns at once (the kernel runs on the stream's worker); its
    // failure comes back from the synchronizing calls and cudaGetLastError, which clears it, as on the GPU.
    {
        cudaStream_t s;
        CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        launch(divergent_barrier, dim3(2), dim3(64), 0, s, di);
        e = cudaStreamSynchronize(s);
        CHECK(e == cudaErrorLaunchFailure, "divergent barrier on a stream: cudaStreamSynchronize gave %s",
              cudaGetErrorName(e));
        e = cudaStreamQuery(s);
        CHECK(e == cudaErrorLaunchFailure, "the failure stays until read: cudaStreamQuery gave %s",
              cudaGetErrorName(e));
        e = cudaGetLastError();
        CHECK(e == cudaErrorLaunchFailure, "cudaGetLastError after the sync gave %s", cudaGetErrorName(e));
        CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaGetLastError cleared the stream's failure");
        launch(noop, dim3(1), dim3(1), 0, s, di);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess, "the stream runs kernels after a reported deadlock");
        cudaStreamDestroy(s);
    }

    // 3. Exited lanes in a shuffle's mask: it completes for the others; reading an exited lane is reported.
    launch(shuffle_after_exit, dim3(1), dim3(32), 0, (cudaStream_t)0, dout, 20);
    e = cudaGetLastError();
    CHECK(e == cudaSuccess, "shuffle with exited lanes in its mask: got %s, want success", cudaGetErrorName(e));
    CUDA_OK(cudaMemcpy(got, dout, 20 * sizeof(float), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int t = 0; t < 20; t++) wrong += got[t] != (float)(t ^ 1);
    CHECK(wrong == 0, "shuffle after 12 lanes exited: %d of 20 values wrong", wrong);
    launch(shuffle_after_exit, dim3(1), dim3(32), 0, (cudaStream_t)0, dout, 19);
    e = cudaGetLastError();
    CHECK(e == cudaErrorLaunchFailure, "a shuffle reading an exited lane: got %s, want a reported misuse",
          cudaGetErrorName(e));
    launch(shuffle_after_exit, dim3(1), dim3(32), 0, (cudaStream_t)0, dout, 32);
    CHECK(cudaGetLastError() == cudaSuccess, "the same shuffle with every lane present is fine");
    // __activemask: exactly the lanes on the caller's path (the test_fidelity check allows subsets).
    unsigned* du;
    CUDA_OK(cudaMalloc(&du, 64 * sizeof(unsigned)));
    launch(activemask_groups, dim3(1), dim3(32), 0, (cudaStream_t)0, du);
    CUDA_OK(cudaGetLastError());
    unsigned masks[64];
    CUDA_OK(cudaMemcpy(masks, du, sizeof masks, cudaMemcpyDeviceToHost));
    wrong = 0;
    for (int t = 0; t < 20; t++) wrong += masks[t] != (t < 8 ? 0xffu : 0xfff00u) || masks[32 + t] != 0xfffffu;
    CHECK(wrong == 0, "__activemask per branch (0xff, 0xfff00) and after exits (0xfffff): %d lanes wrong", wrong);
    cudaFree(du);

    // 4. Launch limits as on an H100.
    launch(noop, dim3(1), dim3(1025), 0, (cudaStream_t)0, (int*)NULL);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads per block is rejected");
    launch(noop, dim3(1), dim3(1, 1, 65), 0, (cudaStream_t)0, (int*)NULL);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "blockDim.z = 65 is rejected");
    launch(noop, dim3(1, 65536), dim3(1), 0, (cudaStream_t)0, (int*)NULL);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "gridDim.y = 65536 is rejected");
    launch(noop, dim3(0), dim3(1), 0, (cudaStream_t)0, (int*)NULL);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "an empty grid is rejected");
    launch(big_smem, dim3(1), dim3(32), 64 * 1024, (cudaStream_t)0, dout);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "64 KB dynamic smem without the opt-in is rejected");
    CHECK(cudaFuncSetAttribute(big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) ==
              cudaErrorInvalidValue,
          "opting into more than 227 KB is rejected");
    cudaGetLastError();
    CUDA_OK(cudaFuncSetAttribute(big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    launch(big_smem, dim3(1), dim3(32), 64 * 1024, (cudaStream_t)0, dout);
    CHECK(cudaGetLastError() == cudaSuccess, "64 KB dynamic smem after the opt-in runs");
    launch(big_smem, dim3(1), dim3(32), 64 * 1024 + 4, (cudaStream_t)0, dout);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "more than the opted-in size is rejected");
    cudaDeviceProp p;
    CUDA_OK(cudaGetDeviceProperties(&p, 0));
    CHECK(p.maxThreadsPerBlock == 1024 && p.sharedMemPerBlockOptin == 227 * 1024 && p.warpSize == 32,
          "device properties report H100 limits");
    {  // the compute capability: 8.0 unless EMU_COMPUTE_CAPABILITY says 9.0 (what the trainer's choice of kernels
       // reads)
        const char* saved = getenv("EMU_COMPUTE_CAPABILITY");
        unsetenv("EMU_COMPUTE_CAPABILITY");
        cudaDeviceProp q;
        CUDA_OK(cudaGetDeviceProperties(&q, 0));
        setenv("EMU_COMPUTE_CAPABILITY", "9.0", 1);
        cudaDeviceProp h;
        CUDA_OK(cudaGetDeviceProperties(&h, 0));
        if (saved)
            setenv("EMU_COMPUTE_CAPABILITY", saved, 1);
        else
            unsetenv("EMU_COMPUTE_CAPABILITY");
        CHECK(q.major == 8 && q.minor == 0 && h.major == 9 && h.minor == 0,
              "compute capability %d.%d by default (want 8.0), %d.%d with EMU_COMPUTE_CAPABILITY=9.0", q.major, q.minor,
              h.major, h.minor);
    }

    // 4b. Launch counts (EMU_LAUNCH_STATS): the accepted kernel launches and cuBLASLt matmuls, not the refused.
    {
        long long k0 = emu_launch_count(EMU_COUNT_KERNELS), m0 = emu_launch_count(EMU_COUNT_MATMULS);
        launch(noop, dim3(2), dim3(32), 0, (cudaStream_t)0, (int*)NULL);
        launch(noop, dim3(1), dim3(1025), 0, (cudaStream_t)0, (int*)NULL);  // refused
        cudaGetLastError();
        launch(noop, dim3(1), dim3(1), 0, (cudaStream_t)0, (int*)NULL);
        Blas bl;
        blas_init(&bl, 1 << 20);
        floatX *a, *w, *o;
        CUDA_OK(cudaMalloc((void**)&a, 3 * 16 * 16 * sizeof(floatX)));
        CUDA_OK(cudaMemset(a, 0, 3 * 16 * 16 * sizeof(floatX)));
        w = a + 16 * 16, o = w + 16 * 16;
        matmul_forward(&bl, (cudaStream_t)0, o, 16, a, w, NULL, 16, 16, 16);
        CUDA_OK(cudaDeviceSynchronize());
        long long k = emu_launch_count(EMU_COUNT_KERNELS) - k0, m = emu_launch_count(EMU_COUNT_MATMULS) - m0;
        CHECK(k == 2 && m == 1, "launch counts: %lld kernels (want 2: one refused), %lld matmuls (want 1)", k, m);
        dim3 blk;
        size_t smem = 1;
        long long nk = emu_kernel_launches((const void*)noop, &blk, &smem);
        CHECK(nk >= 2 && blk.x == 32 && blk.y == 1 && smem == 0 &&
                  emu_kernel_launches((const void*)big_smem, &blk, &smem) == 1 && blk.x == 32 && smem == 64 * 1024,
              "per-kernel counts: noop %lld launches (want >= 2; its largest accepted block 32 threads), big_smem 1 "
              "launch with 64 KB (the refused ones not counted)",
              nk);
        blas_free(&bl);
        cudaFree(a);
    }

    // 5. Dynamic shared memory starts as garbage (NaN), so a read-before-write shows.
    launch(read_unwritten_smem, dim3(1), dim3(32), 32 * 4, (cudaStream_t)0, dout);
    CUDA_OK(cudaMemcpy(got, dout, 32 * 4, cudaMemcpyDeviceToHost));
    int nans = 0;
    for (int i = 0; i < 32; i++) nans += isnan(got[i]);
    CHECK(nans == 32, "unwritten dynamic shared memory reads as NaN (%d of 32)", nans);

    // 6. Device memory: bounded by the emulated size, and copies are range-checked.
    size_t free0, total;
    CUDA_OK(cudaMemGetInfo(&free0, &total));
    long long host = emu_host_memory_bytes();
    CHECK(getenv("EMU_DEVICE_BYTES") || (host > 0 && total == (size_t)(host / 2)),
          "default device size is half the host's memory (%lld bytes; got %zu)", host, total);
    void* big = NULL;
    CHECK(cudaMalloc(&big, free0 + 1) == cudaErrorMemoryAllocation && big == NULL, "allocating past the device fails");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "and reports cudaErrorMemoryAllocation");
    void* blk;
    CUDA_OK(cudaMalloc(&blk, 1 << 20));
    size_t free1;
    CUDA_OK(cudaMemGetInfo(&free1, &total));
    CHECK(free0 - free1 == (1 << 20), "cudaMemGetInfo counts allocations (%zu)", free0 - free1);
    CUDA_OK(cudaFree(blk));
    CHECK(cudaMemcpy(dout, x, sizeof x + 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "a copy running past the end of a device buffer is rejected");
    CHECK(cudaMemcpy(x, x + 1, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "a host pointer passed as the device side is rejected");
    CHECK(cudaMemcpy(dout, dx, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "a device pointer passed as the host side is rejected");
    CHECK(cudaFree(x) == cudaErrorInvalidValue, "cudaFree of a host pointer is rejected");
    cudaGetLastError();

    // 7. AddressSanitizer build: out-of-bounds accesses inside kernels are caught.
#if defined(__SANITIZE_ADDRESS__)
    char err[8192];
    int st = run_child(child_oob_write, err, sizeof err);
    CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && strstr(err, "heap-buffer-overflow"),
          "ASan catches a kernel writing one past its cudaMalloc'ed buffer (status %d)", st);
    st = run_child(child_smem_overread, err, sizeof err);
    CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && strstr(err, "AddressSanitizer"),
          "ASan catches a read past the requested dynamic shared memory (status %d)", st);
#else
    (void)run_child, (void)child_oob_write, (void)child_smem_overread;
#endif
    cudaFree(dx), cudaFree(dout), cudaFree(di);
    // wgmma: the rules the emulator enforces, and its asynchrony (the product lands at the wait)
    {
        float* dw;
        float hw[128];
        CUDA_OK(cudaMalloc(&dw, sizeof hw));
        __nv_bfloat16 h_ones[8], *d_ones;
        for (int i = 0; i < 8; i++) h_ones[i] = __float2bfloat16(1.f);
        CUDA_OK(cudaMalloc(&d_ones, sizeof h_ones));
        CUDA_OK(cudaMemcpy(d_ones, h_ones, sizeof h_ones, cudaMemcpyHostToDevice));
        const char* what[15] = {"a correct wgmma",
                                "a wgmma without wgmma.fence",
                                "accumulators read before wgmma.wait_group",
                                "wgmma in a block of 96 threads",
                                "a thread exiting without wgmma.wait_group",
                                "a warp of the warpgroup skipping the wgmma",
                                "a warp of the warpgroup giving another descriptor",
                                "a wgmma reading what a pending cp.async writes",
                                "a cp.async landing on a pending wgmma's operand",
                                "a cp.async after every warp's wgmma wait and a barrier",
                                "an accumulator written before wgmma.wait_group",
                                "a st.shared into a pending wgmma's operand",
                                "an A register written before wgmma.wait_group",
                                "a copied operand without fence.proxy.async",
                                "a copied operand with fence.proxy.async"};
        for (int bad = 0; bad < 15; bad++) {
            CUDA_OK(cudaMemset(dw, 0, sizeof hw));
            launch(wgmma_misuse, dim3(1), dim3(bad == 3 ? 96 : 128), 2048, (cudaStream_t)0, dw,
                   (const __nv_bfloat16*)d_ones, bad);
            e = cudaGetLastError();
            int fails = bad == 1 || (bad >= 3 && bad <= 8) || (bad >= 10 && bad <= 13);
            CHECK(e == (fails ? cudaErrorLaunchFailure : cudaSuccess), "%s: launch gave %s, want %s", what[bad],
                  cudaGetErrorName(e), fails ? "a reported misuse" : "success");
            if (fails) continue;
            CUDA_OK(cudaMemcpy(hw, dw, sizeof hw, cudaMemcpyDeviceToHost));
            int off = 0;
            for (int t = 0; t < 128; t++) off += hw[t] != (bad == 2 ? 7.f : 16.f);
            CHECK(off == 0, "%s: %d of 128 threads read other than %g", what[bad], off, bad == 2 ? 7. : 16.);
        }
        cudaFree(dw);
        cudaFree(d_ones);
    }
    // mbarrier and TMA: misuse reported, a hang reported as a deadlock; cuTensorMapEncodeTiled's checks
    {
        __nv_bfloat16* dt;
        CUDA_OK(cudaMalloc(&dt, 64 * 64 * sizeof(__nv_bfloat16)));
        CUDA_OK(cudaMemset(dt, 0, 64 * 64 * sizeof(__nv_bfloat16)));
        CUtensorMap map;
        uint64_t dims[2] = {64, 64}, strides[1] = {128};
        uint32_t box[2] = {64, 16};
        tma_map(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, dt, 2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
        const char* what[6] = {"a correct copy and wait",
                               "a phase that never completes (a missing arrival)",
                               "an arrival too many",
                               "a copy nobody waits for",
                               "a copy of more bytes than expect_tx says",
                               "an mbarrier never initialized"};
        for (int bad = 0; bad < 6; bad++) {
            launch(mbar_misuse, dim3(1), dim3(64), 1024 + 2048, (cudaStream_t)0, map, bad);
            e = cudaGetLastError();
            CHECK(e == (bad ? cudaErrorLaunchFailure : cudaSuccess), "mbarrier/TMA, %s: launch gave %s, want %s",
                  what[bad], cudaGetErrorName(e), bad ? "a reported misuse" : "success");
        }
        void* fn = NULL;
        cudaDriverEntryPointQueryResult q;
        CUDA_OK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
        PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        cuuint32_t ones[2] = {1, 1}, wide[2] = {128, 16}, big[2] = {64, 300};
        cuuint64_t odd[1] = {120};
        struct {
            const char* what;
            void* base;
            const cuuint64_t* strides;
            const cuuint32_t* box;
        } refused[4] = {{"a base address not 16-byte aligned", (char*)dt + 8, strides, box},
                        {"a stride not a multiple of 16", dt, odd, box},
                        {"a box row (256 bytes) wider than the 128-byte swizzle", dt, strides, wide},
                        {"a box dimension over 256", dt, strides, big}};
        for (int i = 0; i < 4; i++) {
            CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, refused[i].base, dims, refused[i].strides,
                                refused[i].box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
            CHECK(r == CUDA_ERROR_INVALID_VALUE, "cuTensorMapEncodeTiled refuses %s (gave %d)", refused[i].what,
                  (int)r);
        }
        cudaFree(dt);
    }
    {
        const char* what[5] = {"as the ISA requires", "a warp that skips its warpgroup's setmaxnreg",
                               "half a warp's lanes that skip it", "a warp that asks for another count",
                               "more registers than the block has"};
        for (int bad = 0; bad < 5; bad++) {
            launch(setmaxnreg_use, dim3(1), dim3(256), 0, (cudaStream_t)0, bad);
            cudaError_t e = cudaGetLastError();
            CHECK(e == (bad ? cudaErrorLaunchFailure : cudaSuccess), "setmaxnreg, %s: launch gave %s, want %s",
                  what[bad], cudaGetErrorName(e), bad ? "a reported misuse" : "success");
        }
    }
    test_cpu_heuristic();
    return test_summary();
}
