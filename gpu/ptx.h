// gpu/ptx.h: the GPU build's tensor-core and asynchronous-copy primitives, one PTX instruction each
// (cpu/include/ptx.h is the CPU build's; it documents every lane's registers, which are the PTX ISA's).
//   mma_m16n8k16_bf16(d, a, b, c)   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
//   ldmatrix_x4(r, p)               ldmatrix.sync.aligned.m8n8.x4.shared.b16
//   ldmatrix_x4_trans(r, p)         ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
//   cp_async_16(dst, src, n)        cp.async.cg.shared.global [dst], [src], 16, n   (zero-fills past n)
//   cp_async_commit()               cp.async.commit_group
//   cp_async_wait<N>()              cp.async.wait_group N
#pragma once
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
