// tests/test_optim.cu: the host-side rules of --comm onebit's optimizer (optim.h, compress.h), in plain C:
//   - the norm --clip compares on a compressed step (onebit_clip_norm): the ranks' norm until a variance step has
//     measured the ratio |averaged g|^2 / |g_r|^2 (onebit_clip_observe, against the compressed step before it),
//     then sqrt(ratio) x the ranks' norm; a variance step before any compressed one measures nothing;
//   - --comm-warmup's default (onebit_default_warmup): --warmup's, else 1% of --steps, at least 1, below --steps.
// CPU build only (build.sh's CPU_ONLY_TESTS): it includes the whole trainer.
#define main trainer_main
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-truncation"  // (comm.h's, seen only at -O1, the ASan build's)
#include "../trainer.cu"
#pragma GCC diagnostic pop
#undef main
#include "testing.h"

static void test_clip_norm(void) {
    Optimizer op;
    memset(&op, 0, sizeof op);
    onebit_clip_observe(&op, 3.f);  // the warm-up's last step: no compressed step yet, nothing measured
    CHECK(op.avg_ratio == 0, "a variance step before any compressed step set the ratio to %g", op.avg_ratio);
    CHECK(onebit_clip_norm(&op, 2.f) == 2.f, "no ratio yet: the ranks' norm itself");
    onebit_clip_observe(&op, 1.f);  // averaged 1 against the ranks' 2: ratio 1/4
    CHECK(fabs(op.avg_ratio - 0.25) < 1e-12, "ratio %g, want 0.25 (1^2 / 2^2)", op.avg_ratio);
    CHECK(fabsf(onebit_clip_norm(&op, 4.f) - 2.f) < 1e-6f, "ranks' norm 4 at ratio 1/4: estimate %g, want 2",
          onebit_clip_norm(&op, 4.f));
    onebit_clip_observe(&op, 2.f);  // against the last compressed step's 4: ratio 1/4 again
    CHECK(fabs(op.avg_ratio - 0.25) < 1e-12, "ratio %g after the second variance step, want 0.25", op.avg_ratio);
    onebit_clip_observe(&op, 4.f);  // two variance steps in a row: still against that compressed step
    CHECK(fabs(op.avg_ratio - 1.0) < 1e-12, "ratio %g, want 1 (4^2 / 4^2)", op.avg_ratio);
}

static void test_default_warmup(void) {
    CHECK(onebit_default_warmup(1000, -1) == 10, "1000 steps, --warmup not given: %d, want 10 (1%%)",
          onebit_default_warmup(1000, -1));
    CHECK(onebit_default_warmup(1000, 25) == 25, "--warmup 25: %d", onebit_default_warmup(1000, 25));
    CHECK(onebit_default_warmup(50, -1) == 1 && onebit_default_warmup(50, 0) == 1, "at least 1: %d %d",
          onebit_default_warmup(50, -1), onebit_default_warmup(50, 0));
    CHECK(onebit_default_warmup(16, 40) == 15, "below --steps: --warmup 40 of 16 steps gives %d, want 15",
          onebit_default_warmup(16, 40));
}

int main(void) {
    test_clip_norm();
    test_default_warmup();
    return test_summary();
}
