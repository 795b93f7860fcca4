// cpu/emu_stream.h: how cpu/cublas.cpp and cpu/nccl.cpp put their work on a stream (private to cpu/).
#pragma once
#include <cuda_runtime.h>
#include <functional>

// emu_stream_enqueue: run fn on stream s after the work enqueued on s before it, as a GPU runs a
// stream. device = 1: fn computes on the device (a matmul): it runs alone on the emulated device,
// like a kernel. device = 0: it does not hold the device (a collective, which mostly waits for its
// peers, runs beside the other streams' kernels as NCCL's kernels do). On the legacy default
// stream (NULL) fn runs now, in the caller, once the blocking streams have finished their work.
void emu_stream_enqueue(cudaStream_t s, int device, std::function<void()> fn);
