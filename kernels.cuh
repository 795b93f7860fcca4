// kernels.cuh: the GPU arithmetic of mlm.c. Every kernel the trainer runs is defined here,
// and the same source runs on an H100 (nvcc) and on the CPU runtime in cpu/ (g++).
#pragma once
#include <cuda_runtime.h>  // the CUDA runtime (on the CPU build: cpu/include/cuda_runtime.h, the emulator)
#include <cuda_bf16.h>     // __nv_bfloat16 and its conversions

// launch(kernel, grid, block, smem_bytes, stream, args...): the one way a kernel is started.
// Under nvcc it is kernel<<<grid, block, smem_bytes, stream>>>(args...). g++ cannot parse <<<>>>,
// so the CPU runtime defines launch() itself (cpu/include/cuda_runtime.h); this is the only place
// above cpu/ that looks at which compiler is running, and it selects syntax, not behaviour.
#ifdef __CUDACC__
template <typename... KArgs, typename... Args>
static inline void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          Args... args) {
    kernel<<<grid, block, smem_bytes, stream>>>(args...);
}
#endif
