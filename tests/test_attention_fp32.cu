// test_attention_fp32.cu: test_attention.cu with fp32 storage (MLM_FP32).
#define MLM_FP32 1
#include "test_attention.cu"
