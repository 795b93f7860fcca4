// cpu/include/mma.h: the CPU build's stand-in for the toolkit's <mma.h> (nvcuda::wmma).
//
// Tensor-core fragments for the shape the project uses: m16n16k16, bf16 inputs, fp32 accumulators.
// A fragment is spread over the 32 lanes of a warp, 8 elements each; as on the GPU, which lane
// holds which element is unspecified, and code may only apply the same operation to every x[i].
// Here lane l holds elements 8l .. 8l+7 of the tile in row-major order.
//   load_matrix_sync / store_matrix_sync: each lane moves its 8 elements; warp-synchronous.
//   mma_sync(d, a, b, c): a warp collective; once all 32 lanes have arrived, D = A*B + C is
//   computed once in fp32 over the whole tile and every lane receives its part of D.
// The GPU's rules are enforced as kernel errors: the pointer must be 256-bit (32-byte) aligned and
// ldm a multiple of 16 bytes; every lane of the warp must take part.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {
    static constexpr bool is_col = false;
};
struct col_major {
    static constexpr bool is_col = true;
};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int m, int n, int k, typename T, typename Layout = void>
struct fragment {
    static_assert(m == 16 && n == 16 && k == 16, "the CPU runtime emulates the m16n16k16 WMMA shape");
    typedef T element_type;
    static constexpr int num_elements = 8;
    T x[num_elements];
};

template <typename Use, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T v) {
    for (int i = 0; i < 8; i++) f.x[i] = v;
}

static inline void emu_wmma_check(const void* p, unsigned ldm, size_t elem_bytes, const char* fn) {
    if ((uintptr_t)p % 32) emu_kernel_error("%s: pointer %p is not 256-bit aligned", fn, p);
    if ((ldm * elem_bytes) % 16) emu_kernel_error("%s: ldm %u is not a multiple of 16 bytes", fn, ldm);
}

// (r, c) of the tile for element i of this lane's fragment
static inline void emu_wmma_pos(int i, int* r, int* c) {
    int e = emu_lane_id() * 8 + i;
    *r = e / 16;
    *c = e % 16;
}

template <typename Use, typename T, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
    __syncwarp();
    emu_wmma_check(p, ldm, sizeof(T), "load_matrix_sync");
    for (int i = 0; i < 8; i++) {
        int r, c;
        emu_wmma_pos(i, &r, &c);
        f.x[i] = Layout::is_col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    }
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                                    layout_t layout) {
    __syncwarp();
    emu_wmma_check(p, ldm, 4, "load_matrix_sync");
    for (int i = 0; i < 8; i++) {
        int r, c;
        emu_wmma_pos(i, &r, &c);
        f.x[i] = layout == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    }
}

static inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                                     layout_t layout) {
    __syncwarp();
    emu_wmma_check(p, ldm, 4, "store_matrix_sync");
    for (int i = 0; i < 8; i++) {
        int r, c;
        emu_wmma_pos(i, &r, &c);
        (layout == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[i];
    }
    __syncwarp();
}

// The operands one lane posts to mma_sync.
struct emu_mma_args {
    const __nv_bfloat16* a;
    const __nv_bfloat16* b;
    const float* c;
    float* d;
};
static inline void emu_mma_compute(void* const* all) {  // D = A*B + C over the whole 16x16 tile
    for (int l = 0; l < 32; l++)
        if (!all[l]) return;  // a lane is missing: already reported as a kernel error
    float d[256];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            int e = r * 16 + c;
            float acc = ((emu_mma_args*)all[e / 8])->c[e % 8];
            for (int k = 0; k < 16; k++) {
                int ea = r * 16 + k, eb = k * 16 + c;
                acc += __bfloat162float(((emu_mma_args*)all[ea / 8])->a[ea % 8]) *
                       __bfloat162float(((emu_mma_args*)all[eb / 8])->b[eb % 8]);
            }
            d[e] = acc;
        }
    for (int e = 0; e < 256; e++) ((emu_mma_args*)all[e / 8])->d[e % 8] = d[e];
}

template <typename LayoutA, typename LayoutB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
                            const fragment<accumulator, 16, 16, 16, float>& c) {
    emu_mma_args mine = {a.x, b.x, c.x, d.x};
    emu_warp_gather(0xffffffffu, &mine, emu_mma_compute, "mma_sync");
}

}  // namespace wmma
}  // namespace nvcuda
