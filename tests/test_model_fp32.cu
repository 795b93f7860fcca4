// test_model_fp32.cu: test_model.cu with fp32 storage (MLM_FP32): tight reference checks and finite differences.
#define MLM_FP32 1
#include "test_model.cu"
