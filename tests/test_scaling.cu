// test_scaling.cu: the scaling predictor (scaling.h) against values computed by hand from its formulas.
//   - ring all-reduce: 2 (p-1)/p x bytes / bw + 2 (p-1) alpha; nothing for one rank
//   - hierarchical (NVLink ring in the node + network ring across nodes) and flat (one ring, network links)
//   - compute per micro-batch, the exposed all-reduce after overlap with 2/3 of a micro-batch, the tail
//     (embedding gradients) that is never overlapped, step time, efficiency, tokens/s
//   - --grad-accum auto: the smallest accumulation with exposed <= 5% of the step (and one less is not)
// Pure host code: no device is touched.
#include "../scaling.h"
#include "testing.h"

static int near(double got, double want) { return fabs(got - want) <= 1e-9 + 1e-9 * fabs(want); }

int main(void) {
    // bandwidths in Gbit/s: 8 Gbit/s = 1e9 bytes/s, 80 Gbit/s = 1e10 bytes/s
    CHECK(near(scaling_ring_s(1e9, 4, 8, 1e-5), 1.5 + 6e-5), "ring p=4: %.9f, want 1.50006",
          scaling_ring_s(1e9, 4, 8, 1e-5));
    CHECK(scaling_ring_s(1e9, 1, 8, 1e-5) == 0, "ring p=1 costs nothing");
    CHECK(near(scaling_ring_s(1e9, 2, 80, 1e-6), 0.1 + 2e-6), "ring p=2: %.9f, want 0.100002",
          scaling_ring_s(1e9, 2, 80, 1e-6));

    ScalingCluster c = scaling_cluster_default(4, 2);
    CHECK(c.net_gbps == 25 && c.nvlink_gbps == 2400 && c.alpha_net_s == 30e-6 && c.alpha_nvlink_s == 5e-6,
          "defaults: net %g, nvlink %g, alphas %g %g", c.net_gbps, c.nvlink_gbps, c.alpha_net_s, c.alpha_nvlink_s);
    c.net_gbps = 8, c.nvlink_gbps = 80, c.alpha_net_s = 1e-5, c.alpha_nvlink_s = 1e-6;
    // hierarchical: NVLink ring of 2 (1 x 0.1 s + 2 us) + network ring of 4 nodes (1.5 s + 60 us)
    CHECK(near(scaling_hierarchical_s(&c, 1e9), 0.100002 + 1.50006), "hierarchical: %.9f, want 1.600062",
          scaling_hierarchical_s(&c, 1e9));
    // flat: one ring of 8 over the network links: 2 x 7/8 x 1 s + 14 x 10 us
    CHECK(near(scaling_flat_s(&c, 1e9), 1.75 + 14e-5), "flat: %.9f, want 1.75014", scaling_flat_s(&c, 1e9));
    ScalingCluster one = c;
    one.nodes = 1;  // one node of 2: flat over NVLink
    CHECK(near(scaling_flat_s(&one, 1e9), 0.100002), "flat in one node: %.9f, want 0.100002",
          scaling_flat_s(&one, 1e9));

    // The work: 1e9 FLOPs/token, 100 TFLOP/s x 0.5 = 5e13 FLOP/s, 5e4 tokens per micro-batch: 1 s per micro-batch.
    ScalingWork w;
    w.flops_per_token = 1e9, w.peak_tflops = 100, w.mfu = 0.5, w.tokens_per_micro = 5e4;
    w.grad_bytes = 1e9, w.tail_bytes = 1e8;
    ScalingPrediction p = scaling_predict(&c, &w, 3);
    CHECK(p.gpus == 8 && p.accum == 3, "gpus %d accum %d", p.gpus, p.accum);
    CHECK(near(p.micro_s, 1.0) && near(p.compute_s, 3.0), "micro %.9f compute %.9f, want 1 and 3", p.micro_s,
          p.compute_s);
    CHECK(p.hierarchical && near(p.comm_s, 1.600062), "all-reduce: hierarchical %d, %.9f s", p.hierarchical, p.comm_s);
    // tail: NVLink 2 x 1/2 x 0.01 s + 2 us, network 2 x 3/4 x 0.1 s + 60 us
    CHECK(near(p.tail_s, 0.010002 + 0.15006), "tail %.9f, want 0.160062", p.tail_s);
    double exposed = 1.600062 - SCALING_OVERLAP * 1.0;  // 0.933362 (above the tail)
    CHECK(near(p.exposed_s, exposed) && near(p.step_s, 3.0 + exposed), "exposed %.9f step %.9f, want %.9f and %.9f",
          p.exposed_s, p.step_s, exposed, 3.0 + exposed);
    CHECK(near(p.efficiency, 3.0 / (3.0 + exposed)), "efficiency %.9f", p.efficiency);
    CHECK(near(p.tokens_per_s, 8 * 3 * 5e4 / (3.0 + exposed)), "tokens/s %.3f", p.tokens_per_s);

    // auto: accum >= exposed x 0.95 / (0.05 x micro) = 17.73 -> 18; at 17 the exposed share is above 5%.
    ScalingPrediction a = scaling_predict(&c, &w, 0);
    CHECK(a.accum == 18, "auto accumulation %d, want 18", a.accum);
    CHECK(a.exposed_s <= 0.05 * a.step_s, "auto: exposed %.4f s of a %.4f s step is above 5%%", a.exposed_s, a.step_s);
    ScalingPrediction b = scaling_predict(&c, &w, 17);
    CHECK(b.exposed_s > 0.05 * b.step_s, "17 micro-batches already hide it: auto is not the smallest");

    // A micro-batch of 10 s hides the whole all-reduce but the tail: exposed = tail, auto = 1.
    w.tokens_per_micro = 5e5;
    ScalingPrediction t = scaling_predict(&c, &w, 0);
    CHECK(near(t.exposed_s, 0.160062) && t.accum == 1, "tail only: exposed %.9f accum %d, want 0.160062 and 1",
          t.exposed_s, t.accum);
    CHECK(near(t.efficiency, 10.0 / 10.160062), "tail only: efficiency %.9f", t.efficiency);

    // One GPU: no all-reduce, efficiency 1.
    ScalingCluster solo = scaling_cluster_default(1, 1);
    ScalingPrediction s = scaling_predict(&solo, &w, 0);
    CHECK(s.comm_s == 0 && s.exposed_s == 0 && s.accum == 1 && s.efficiency == 1,
          "one GPU: comm %g exposed %g accum "
          "%d efficiency %g",
          s.comm_s, s.exposed_s, s.accum, s.efficiency);

    // A network so slow that no accumulation is enough: auto stops at the largest --grad-accum.
    c.net_gbps = 1e-6;
    w.tokens_per_micro = 5;
    CHECK(scaling_predict(&c, &w, 0).accum == SCALING_MAX_ACCUM, "auto is capped at %d", SCALING_MAX_ACCUM);
    return test_summary();
}
