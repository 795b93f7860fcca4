// test_kernels_fp32.cu: test_kernels.cu with fp32 storage (MLM_FP32).
#define MLM_FP32 1
#include "test_kernels.cu"
