// trainer.cu: mlm.c's one program, BERT-style masked-language-model pretraining.
// This is the only translation unit: nvcc compiles it for the GPU (./trainer) and g++ compiles the
// very same file against cpu/ for the CPU (./trainer_cpu). Each header has one role:
#include <cuda_runtime.h>  // the CUDA runtime (cpu/include/cuda_runtime.h on the CPU build)
#include "kernels.cuh"     // every GPU kernel, and launch()
#include "comm.h"          // rank and world size of a data-parallel job
#include <stdio.h>
#include <string.h>

static void usage(void) {
    printf(
        "usage: trainer --info\n"
        "  --info   print the device, its memory and this process's place in the job, then exit\n"
        "Training arrives with the model (model.h) and the data loader (data.h).\n");
}

int main(int argc, char** argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    if (strcmp(argv[1], "--info") != 0) {
        fprintf(stderr, "trainer: unknown argument '%s' (expected --info or --help)\n", argv[1]);
        return 1;
    }
    Comm comm = comm_from_env();
    CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    size_t free_bytes, total_bytes;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("rank %d of %d (local %d): %s, sm_%d%d, %d SMs, %.1f GB free of %.1f GB\n", comm.rank, comm.world,
           comm.local_rank, prop.name, prop.major, prop.minor, prop.multiProcessorCount, free_bytes / 1e9,
           total_bytes / 1e9);
    return 0;
}
