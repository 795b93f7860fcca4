// test_lamb_fp32.cu: test_lamb.cu with fp32 storage (MLM_FP32).
#define MLM_FP32 1
#include "test_lamb.cu"
