// gpu/ptx.h: the GPU build's tensor-core and asynchronous-copy primitives, one PTX instruction each
// (cpu/include/ptx.h is the CPU build's; it documents every lane's registers, which are the PTX ISA's).
//   mma_m16n8k16_bf16(d, a, b, c)   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
//   ldmatrix_x4(r, p)               ldmatrix.sync.aligned.m8n8.x4.shared.b16
//   ldmatrix_x4_trans(r, p)         ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
//   cp_async_16(dst, src, n)        cp.async.cg.shared.global [dst], [src], 16, n   (zero-fills past n)
//   cp_async_commit()               cp.async.commit_group
//   cp_async_wait<N>()              cp.async.wait_group N
//   smem_addr(p)                    cvta.to.shared (the 32-bit shared address)
//   wgmma_desc(addr, layout, lbo, sbo)  a shared-memory matrix descriptor (64 bits)
//   wgmma_m64k16_bf16<N, T>(d, adesc, bdesc, scale_d)    wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16
//   wgmma_m64k16_bf16_rs<N, T>(d, a, bdesc, scale_d)     ... with A from registers
//   wgmma_fence(), wgmma_commit_group(), wgmma_wait_group<N>()   wgmma.fence / .commit_group / .wait_group N
//   wgmma_fence_operand(d, n)       a compiler barrier on the accumulator registers (no instruction)
//   wgmma_fence_fragment(a, n)      the same on registers holding an A operand (.._rs)
//   fence_proxy_async()             fence.proxy.async.shared::cta
//   mbar_init(bar, count)           mbarrier.init.shared::cta.b64
//   fence_mbarrier_init()           fence.mbarrier_init.release.cluster
//   mbar_arrive(bar)                mbarrier.arrive.shared::cta.b64
//   mbar_arrive_expect_tx(bar, n)   mbarrier.arrive.expect_tx.shared::cta.b64
//   mbar_wait(bar, parity)          mbarrier.try_wait.parity.shared::cta.b64, until true
//   tma_load_2d/3d(dst, map, c.., bar)
//   cp.async.bulk.tensor.{2,3}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
//   setmaxnreg_inc<N>(), setmaxnreg_dec<N>()   setmaxnreg.{inc,dec}.sync.aligned.u32 N
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>
#include <stdint.h>

__device__ inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ inline void ldmatrix_x4(uint32_t r[4], const void* row) {
    unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
__device__ inline void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
    unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
__device__ inline void cp_async_16(void* dst, const void* src, int src_bytes) {
    unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(src_bytes) : "memory");
}
__device__ inline void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ inline void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Hopper warpgroup MMA (sm_90a; see cpu/include/ptx.h for every lane's registers). Built for another
// architecture, these trap: ARCH=sm_90a (build.sh's default) is what runs them.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define WGMMA_ASM(...) __trap()
#endif
enum { WGMMA_SWIZZLE_NONE = 0, WGMMA_SWIZZLE_128B = 1, WGMMA_SWIZZLE_64B = 2, WGMMA_SWIZZLE_32B = 3 };
__device__ inline uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__host__ __device__ inline uint64_t wgmma_desc(uint32_t addr, int layout, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)layout << 62;
}
__device__ inline void wgmma_fence(void) { WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit_group(void) { WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ inline void wgmma_wait_group(void) {
    WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The hardware writes d after the asm statement that names it: this keeps the compiler from moving
// reads of d above the wait, or from reusing its registers meanwhile.
__device__ inline void wgmma_fence_operand(float* d, int n) {
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// ... and on registers that hold wgmma's A operand (a, n of them): the hardware may read them until the wait,
// so this, after the wait, keeps them alive and unchanged until then.
__device__ inline void wgmma_fence_fragment(uint32_t* a, int n) {
    for (int i = 0; i < n; i++) asm volatile("" : "+r"(a[i])::"memory");
}
__device__ inline void fence_proxy_async(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
#define WGMMA_D8(i)                                                                                             \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define WGMMA_D32(i) WGMMA_D8(i), WGMMA_D8(i + 8), WGMMA_D8(i + 16), WGMMA_D8(i + 24)
// the accumulators' operand lists in the PTX text: %0 .. %31 (N 64) and %0 .. %63 (N 128)
#define WGMMA_ACC32                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WGMMA_ACC64                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "  \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 d, a-desc | {a}, b-desc, scale-d, 1, 1[, 0], TRANS_B:
// scale-d is a predicate (0: D = A B, else D += A B); imm-scale-a/b 1; trans-a 0 (A K-major).
template <int N, int TRANS_B>
__device__ inline void wgmma_m64k16_bf16(float* d, uint64_t adesc, uint64_t bdesc, int scale_d) {
    static_assert(N == 64 || N == 128, "wgmma_m64k16_bf16: N is 64 or 128");
    if constexpr (N == 64)
        WGMMA_ASM(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WGMMA_ACC32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
            : WGMMA_D32(0)
            : "l"(adesc), "l"(bdesc), "r"(scale_d), "n"(TRANS_B));
    else
        WGMMA_ASM(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WGMMA_ACC64 ", %64, %65, p, 1, 1, 0, %67;\n}\n"
            : WGMMA_D32(0), WGMMA_D32(32)
            : "l"(adesc), "l"(bdesc), "r"(scale_d), "n"(TRANS_B));
}
template <int N, int TRANS_B>
__device__ inline void wgmma_m64k16_bf16_rs(float* d, const uint32_t a[4], uint64_t bdesc, int scale_d) {
    static_assert(N == 64 || N == 128, "wgmma_m64k16_bf16_rs: N is 64 or 128");
    if constexpr (N == 64)
        WGMMA_ASM(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WGMMA_ACC32
            ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
            : WGMMA_D32(0)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(scale_d), "n"(TRANS_B));
    else
        WGMMA_ASM(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WGMMA_ACC64
            ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
            : WGMMA_D32(0), WGMMA_D32(32)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(scale_d), "n"(TRANS_B));
}

// mbarrier and the tensor memory accelerator (sm_90; see cpu/include/ptx.h for what each does).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define HOPPER_ASM(...) asm volatile(__VA_ARGS__)
#else
#define HOPPER_ASM(...) __trap()
#endif
__device__ inline void mbar_init(uint64_t* bar, int count) {
    HOPPER_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ inline void fence_mbarrier_init(void) { HOPPER_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ inline void mbar_arrive(uint64_t* bar) {
    HOPPER_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    HOPPER_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ inline void mbar_wait(uint64_t* bar, int parity) {
    HOPPER_ASM(
        "{\n"
        ".reg .pred p;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}
__device__ inline void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
    HOPPER_ASM(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(smem_addr(dst)),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
        : "memory");
}
__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
    HOPPER_ASM(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
        "%4}], [%5];\n" ::"r"(smem_addr(dst)),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
}
// setmaxnreg (sm_90a): the warpgroup's threads ask for (inc) or give back (dec) registers, to N a thread (24 to
// 256, a multiple of 8); every thread of the warpgroup executes the same one. ptxas compiles the code after it to N.
template <int N>
__device__ inline void setmaxnreg_inc(void) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: N is a multiple of 8 in [24, 256]");
    WGMMA_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ inline void setmaxnreg_dec(void) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: N is a multiple of 8 in [24, 256]");
    WGMMA_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
