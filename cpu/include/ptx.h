// cpu/include/ptx.h: the CPU build's tensor-core and asynchronous-copy primitives (the GPU build's are
// inline PTX in gpu/ptx.h; build.sh puts the right directory first on each build's include path).
//
// Each function is one PTX instruction, emulated exactly as the PTX ISA documents every lane's registers
// (section "Matrix multiply-accumulate operation using mma instruction", shape m16n8k16, and "ldmatrix").
// Notation: lane l of a warp, group g = l / 4, thread-in-group t = l % 4; a 32-bit register holding two
// 16-bit elements keeps the lower-indexed one in its low half.
//
//   mma_m16n8k16_bf16(d, a, b, c): D (16 x 8, fp32) = A (16 x 16, bf16, row) . B (16 x 8, bf16, col) + C.
//     A: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//     B: b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]
//     C, D: c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1]
//     A warp collective (all 32 lanes). The products of bf16 values are exact; the emulator sums them in
//     double and rounds once (the tensor core's internal order and precision are unspecified; the tests
//     allow for it).
//   ldmatrix_x4(r, p) / ldmatrix_x4_trans(r, p): four 8 x 8 matrices of 16-bit elements from shared memory.
//     Lane l gives the address of row l % 8 of matrix l / 8 (8 contiguous elements, 16-byte aligned).
//     r[i] of lane l = matrix i's elements (row g, columns 2t, 2t+1); with .trans, (rows 2t, 2t+1, column g).
//   cp_async_16(dst, src, src_bytes): an asynchronous 16-byte copy global -> shared; bytes past src_bytes
//     (0 or 16 in practice) are zero-filled and src is not read for them. cp_async_commit() closes the
//     thread's group of copies; cp_async_wait<N>() returns when at most N of its most recent groups are
//     pending. The data is visible to other threads after their own barrier that follows the wait.
//     The emulator performs the copies at the wait (cpu/runtime.cpp), so a missing wait shows up in tests.
//
// Hopper's warpgroup MMA (section "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Operation using
// wgmma.mma_async instruction"). A warpgroup is 4 consecutive warps (the first a multiple of 4); all 128
// threads execute each of these. Warp w % 4 of the group owns rows 16 (w % 4) .. + 15 of the 64 rows.
//   smem_addr(p): p's shared-memory address (32 bits), what descriptors and the alignment rules use.
//   wgmma_desc(addr, layout, lbo, sbo): a shared-memory matrix descriptor: start address, leading and
//     stride byte offsets (each >> 4 in 14 bits), base offset 0, layout (WGMMA_SWIZZLE_NONE, _128B, _64B,
//     _32B). cpu/runtime.cpp (wgmma_operand) spells out where each element of a K- or MN-major operand is.
//   wgmma_m64k16_bf16<N, TRANS_B>(d, adesc, bdesc, scale_d): D (64 x N, fp32) = A (64 x 16, bf16, K-major
//     in shared memory) . B (N x 16 as N rows, bf16, shared memory; TRANS_B = 1: MN-major) + (scale_d ? D : 0).
//     N = 64 or 128. Lane l (g = l / 4, t = l % 4) of warp w holds d[4j + i] =
//     D[16 (w % 4) + g + 8 (i / 2)][8j + 2t + i % 2], j < N / 8: N / 2 floats, mma.sync's C layout repeated.
//   wgmma_m64k16_bf16_rs<N, TRANS_B>(d, a, bdesc, scale_d): the same with A from registers, a[4] in
//     mma.sync's A layout for the warp's 16 rows (a[0] = A[g][2t, 2t+1], a[1] = A[g+8][..], a[2] =
//     A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]), so an accumulator of 16 columns becomes an A operand
//     once packed to bf16.
//   wgmma_fence(): before the first wgmma_m64k16_* and whenever the registers it uses were changed by
//     other instructions. wgmma_commit_group(): closes the warpgroup's open group of wgmma operations.
//     wgmma_wait_group<N>(): returns when at most N groups are pending; only then may the accumulators
//     and A registers be read or written, and the shared memory be overwritten.
//   wgmma_fence_operand(d, n), wgmma_fence_fragment(a, n): the GPU build's compiler barriers on registers the
//     hardware writes (accumulators) or reads (A fragments) behind the compiler's back, placed after the wait;
//     nothing to do on the CPU.
//   fence_proxy_async(): makes the thread's shared-memory writes (st.shared, and cp.async's once waited for)
//     visible to wgmma (the async proxy); needed between writing an operand and the wgmma that reads it, with a
//     barrier.
//   The emulator checks the descriptors, the fence rule (strictly: a fence after every wait that completed
//   an operation, before the next wgmma) and that every wgmma was waited for; it performs the products at
//   the wait (cpu/runtime.cpp), so reading accumulators early shows up in tests. It also reports what is
//   undefined on a GPU between a wgmma's issue and its wait: its accumulators or A registers written, the shared
//   memory it reads changed (by any store or copy), and a cp.async over it landing; and a wgmma issued over
//   bytes a cp.async wrote with no fence_proxy_async by the copying thread since. A missing fence after
//   ordinary st.shared writes is not seen (the CPU has one proxy): only a GPU catches that. Shared addresses
//   start at 528, not at a multiple of 1024, so a tile aligned by anything but smem_addr shows up too.
//
// mbarrier and the tensor memory accelerator (TMA; PTX ISA "mbarrier" and "cp.async.bulk.tensor"). An mbarrier
// is a 64-bit object in shared memory that counts, per phase, the arrivals still to come and the transaction
// bytes still to come; when both reach zero its phase completes and the next begins.
//   mbar_init(bar, count): phase 0, count arrivals expected (one thread; then fence_mbarrier_init() and a
//     barrier before any other use). mbar_arrive(bar): one arrival. mbar_arrive_expect_tx(bar, n): n more
//     transaction bytes expected in this phase, then one arrival (the thread that issues the copies does it).
//   mbar_wait(bar, parity): returns once the phase of that parity has completed (loops on try_wait.parity):
//     a consumer waits for parity 0 on its first use of a "full" barrier, then 1, 0, ...
//   tma_load_2d/3d(dst, map, c0, c1[, c2], bar): one thread copies the box of the tensor map (made on the host by
//     cuTensorMapEncodeTiled) whose first element is at coordinates (c0, c1, c2), innermost first, to dst (128-byte
//     aligned shared memory): its rows (boxDim[0] elements) one after another, with the map's swizzle applied
//     to the shared address as wgmma reads it (the 128-byte swizzle: bits 4-6 ^= bits 7-9), elements outside
//     the tensor as zeros; then the box's bytes complete on bar. The map must be a __grid_constant__ kernel
//     parameter (its address is the generic address of the parameter).
//
// setmaxnreg (PTX ISA "setmaxnreg"): setmaxnreg_inc<N>() / setmaxnreg_dec<N>(): the warpgroup's threads ask for, or
// give back, registers, to N a thread (a multiple of 8 in [24, 256]: checked when compiled). A hint for the
// register file, with nothing to do on the CPU; the emulator checks what the ISA requires of its use: all 32 lanes
// of a warp execute it together (.sync.aligned) and the 4 warps of a warpgroup execute the same ones; and that the
// counts the warpgroups end with fit in the most registers a block of that size can have (else a .inc hangs).
// The emulator keeps each block's barriers by address and performs a copy when a thread waits on its barrier
// and the phase cannot complete without it, so reading a tile before the wait reads stale bytes in the tests;
// a waiter whose phase cannot complete blocks, and a block where no thread can run is reported as a deadlock
// (naming each barrier's missing arrivals and bytes) where a GPU would hang. It also reports an arrival too
// many, more bytes than expected, a block that ends with a copy nobody waited for, and a copy over bytes a
// pending wgmma reads. cuTensorMapEncodeTiled (through cudaGetDriverEntryPointByVersion) checks its arguments as
// cuda.h documents them; the emulator supports interleave NONE, element strides 1, zero fill, and a swizzled
// box whose inner dimension is the swizzle span.
#pragma once
#include <cuda.h>  // CUtensorMap (the driver API's types; nothing of the driver is linked)
#include <cuda_runtime.h>
#include <cuda_bf16.h>

void emu_cp_async(void* dst, const void* src, int bytes, int src_bytes);
void emu_cp_async_commit(void);
void emu_cp_async_wait(int n);

static inline float emu_bf16_lo(uint32_t x) {  // the element in the low half of a packed pair
    uint32_t u = x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float emu_bf16_hi(uint32_t x) {
    uint32_t u = x & 0xffff0000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---------------------------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
struct emu_mma_lane {
    const uint32_t* a;
    const uint32_t* b;
    const float* c;
    float* d;
};
static inline void emu_mma_16816(void* const* all) {
    for (int l = 0; l < 32; l++)
        if (!all[l]) return;  // a lane is missing: already reported as a kernel error
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const emu_mma_lane* x = (const emu_mma_lane*)all[l];
        int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) {  // a[i]: rows g (i even) or g + 8 (i odd), columns 2t + 8 (i / 2)
            int r = g + 8 * (i & 1), c = 2 * t + 8 * (i >> 1);
            A[r][c] = emu_bf16_lo(x->a[i]);
            A[r][c + 1] = emu_bf16_hi(x->a[i]);
        }
        for (int i = 0; i < 2; i++) {  // b[i]: rows 2t + 8i, 2t + 8i + 1 of column g
            B[2 * t + 8 * i][g] = emu_bf16_lo(x->b[i]);
            B[2 * t + 8 * i + 1][g] = emu_bf16_hi(x->b[i]);
        }
        for (int i = 0; i < 4; i++) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = x->c[i];
    }
    float D[16][8];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double s = C[r][n];
            for (int k = 0; k < 16; k++) s += (double)A[r][k] * B[k][n];
            D[r][n] = (float)s;
        }
    for (int l = 0; l < 32; l++) {
        float* d = ((emu_mma_lane*)all[l])->d;
        int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) d[i] = D[g + 8 * (i >> 1)][2 * t + (i & 1)];
    }
}
static inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    float out[4];  // d may alias c
    emu_mma_lane mine = {a, b, c, out};
    emu_warp_gather(0xffffffffu, &mine, emu_mma_16816, "mma.sync.m16n8k16");
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

// ---------------------------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16
struct emu_ldmatrix_lane {
    const uint16_t* row;  // the row this lane addresses
    uint32_t* r;
};
template <bool TRANS>
static inline void emu_ldmatrix_x4(void* const* all) {
    for (int l = 0; l < 32; l++)
        if (!all[l]) return;
    for (int l = 0; l < 32; l++)
        if ((uintptr_t)((emu_ldmatrix_lane*)all[l])->row % 16) {
            emu_kernel_error("ldmatrix: lane %d's row address %p is not 16-byte aligned", l,
                             (const void*)((emu_ldmatrix_lane*)all[l])->row);
            return;
        }
    uint32_t out[32][4];
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; i++) {
            uint16_t lo, hi;
            if (!TRANS) {  // row g, columns 2t, 2t + 1 of matrix i
                const uint16_t* p = ((emu_ldmatrix_lane*)all[8 * i + g])->row;
                lo = p[2 * t];
                hi = p[2 * t + 1];
            } else {  // rows 2t, 2t + 1, column g
                lo = ((emu_ldmatrix_lane*)all[8 * i + 2 * t])->row[g];
                hi = ((emu_ldmatrix_lane*)all[8 * i + 2 * t + 1])->row[g];
            }
            out[l][i] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) ((emu_ldmatrix_lane*)all[l])->r[i] = out[l][i];
}
static inline void ldmatrix_x4(uint32_t r[4], const void* row) {
    emu_ldmatrix_lane mine = {(const uint16_t*)row, r};
    emu_warp_gather(0xffffffffu, &mine, emu_ldmatrix_x4<false>, "ldmatrix.x4");
}
static inline void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
    emu_ldmatrix_lane mine = {(const uint16_t*)row, r};
    emu_warp_gather(0xffffffffu, &mine, emu_ldmatrix_x4<true>, "ldmatrix.x4.trans");
}

// ---------------------------------------------------------------------------------------------
// cp.async.cg.shared.global [dst], [src], 16, src_bytes;  cp.async.commit_group;  cp.async.wait_group N
static inline void cp_async_16(void* dst, const void* src, int src_bytes) { emu_cp_async(dst, src, 16, src_bytes); }
static inline void cp_async_commit(void) { emu_cp_async_commit(); }
template <int N>
static inline void cp_async_wait(void) {
    emu_cp_async_wait(N);
}

// ---------------------------------------------------------------------------------------------
// wgmma.fence / .mma_async.m64nNk16.f32.bf16.bf16 / .commit_group / .wait_group; fence.proxy.async
enum { WGMMA_SWIZZLE_NONE = 0, WGMMA_SWIZZLE_128B = 1, WGMMA_SWIZZLE_64B = 2, WGMMA_SWIZZLE_32B = 3 };
struct EmuWgmmaLane {  // what one lane posts to wgmma.mma_async
    float* d;
    const uint32_t* a;  // NULL: A from shared memory (adesc)
    uint64_t adesc, bdesc;
    int n, trans_b, scale_d;
};
uint32_t emu_smem_addr(const void* p);
void emu_wgmma_fence(void);
void emu_wgmma_issue(EmuWgmmaLane* mine);
void emu_wgmma_commit(void);
void emu_wgmma_wait(int n);
void emu_fence_proxy_async(void);

static inline uint32_t smem_addr(const void* p) { return emu_smem_addr(p); }
static inline uint64_t wgmma_desc(uint32_t addr, int layout, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)layout << 62;
}
template <int N, int TRANS_B>
static inline void wgmma_m64k16_bf16(float* d, uint64_t adesc, uint64_t bdesc, int scale_d) {
    static_assert(N == 64 || N == 128, "wgmma_m64k16_bf16: N is 64 or 128");
    EmuWgmmaLane mine = {d, NULL, adesc, bdesc, N, TRANS_B, scale_d != 0};
    emu_wgmma_issue(&mine);
}
template <int N, int TRANS_B>
static inline void wgmma_m64k16_bf16_rs(float* d, const uint32_t a[4], uint64_t bdesc, int scale_d) {
    static_assert(N == 64 || N == 128, "wgmma_m64k16_bf16_rs: N is 64 or 128");
    EmuWgmmaLane mine = {d, a, 0, bdesc, N, TRANS_B, scale_d != 0};
    emu_wgmma_issue(&mine);
}
static inline void wgmma_fence(void) { emu_wgmma_fence(); }
static inline void wgmma_commit_group(void) { emu_wgmma_commit(); }
template <int N>
static inline void wgmma_wait_group(void) {
    emu_wgmma_wait(N);
}
static inline void wgmma_fence_operand(float* d, int n) { (void)d, (void)n; }
static inline void wgmma_fence_fragment(uint32_t* a, int n) { (void)a, (void)n; }
static inline void fence_proxy_async(void) { emu_fence_proxy_async(); }

// ---------------------------------------------------------------------------------------------
// mbarrier.init / .arrive / .arrive.expect_tx / .try_wait.parity; fence.mbarrier_init;
// cp.async.bulk.tensor.{2,3}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes (TMA)
void emu_mbar_init(uint64_t* bar, int count);
void emu_mbar_arrive(uint64_t* bar, uint32_t tx);
void emu_mbar_wait(uint64_t* bar, int parity);
void emu_tma_load(void* dst, const CUtensorMap* map, int rank, const int* coords, uint64_t* bar);
static inline void mbar_init(uint64_t* bar, int count) { emu_mbar_init(bar, count); }
static inline void fence_mbarrier_init(void) {}
static inline void mbar_arrive(uint64_t* bar) { emu_mbar_arrive(bar, 0); }
static inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) { emu_mbar_arrive(bar, bytes); }
static inline void mbar_wait(uint64_t* bar, int parity) { emu_mbar_wait(bar, parity); }
static inline void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
    int c[2] = {c0, c1};
    emu_tma_load(dst, map, 2, c, bar);
}
static inline void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
    int c[3] = {c0, c1, c2};
    emu_tma_load(dst, map, 3, c, bar);
}

// ---------------------------------------------------------------------------------------------
// setmaxnreg.{inc,dec}.sync.aligned.u32 N
void emu_setmaxnreg(int n, int inc);
template <int N>
static inline void setmaxnreg_inc(void) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: N is a multiple of 8 in [24, 256]");
    emu_setmaxnreg(N, 1);
}
template <int N>
static inline void setmaxnreg_dec(void) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg: N is a multiple of 8 in [24, 256]");
    emu_setmaxnreg(N, 0);
}
