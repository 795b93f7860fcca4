// test_scaling.cu: the scaling predictor (scaling.h) against values computed by hand from its formulas.
//   - bytes a rank sends: all-reduce 2 (P-1)/P, reduce-scatter / all-gather / all-to-all (P-1)/P; 0 on one rank
//   - one collective: ring (latency per NVLink and network step), tree (log2 N network steps, 2 x bytes at 90%),
//     all-reduce the faster of the two, all-to-all (G (P-G)/P of the buffer through a node's link), one node
//   - the step: the buckets on one communication stream after their backward events (queueing behind each
//     other), exposed = what runs past the backward; ZeRO-1's all-gather after it; the host sync; the bytes a
//     rank sends; onebit's parts after the backward in the forward's order, each updated before
//     the next forward's layers that read it (hidden under the forward, or stalling it when the forward is short)
//   - --grad-accum auto (the smallest accumulation with exposed <= 5%) and --max-global-batch's cap;
//     --global-batch's accumulation and smaller micro-batch; onebit's whole-run average with fp32 warm-up
// Pure host code: no device is touched.
#include "../scaling.h"
#include "testing.h"

static int near(double got, double want) { return fabs(got - want) <= 1e-9 + 1e-9 * fabs(want); }

int main(void) {
    // 1. bytes a rank sends
    CHECK(near(scaling_sent(SCALING_ALLREDUCE, 1e9, 8), 1.75e9), "all-reduce sends 2 x 7/8");
    CHECK(near(scaling_sent(SCALING_REDUCE_SCATTER, 1e9, 8), 0.875e9), "reduce-scatter sends 7/8");
    CHECK(near(scaling_sent(SCALING_ALLGATHER, 1e9, 4), 0.75e9), "all-gather sends 3/4");
    CHECK(near(scaling_sent(SCALING_ALLTOALL, 1e9, 2), 0.5e9), "all-to-all sends 1/2");
    CHECK(scaling_sent(SCALING_ALLREDUCE, 1e9, 1) == 0, "one rank sends nothing");

    // 2. one collective. 4 nodes x 2 GPUs; network 8 Gbit/s x 0.5 = 5e8 B/s, NVLink 80 Gbit/s = 1e10 B/s;
    // alpha 10 us per network step, 1 us per NVLink step, 1 us per collective.
    ScalingCluster d = scaling_cluster_default(4, 2);
    CHECK(d.net_gbps == 25 && d.nvlink_gbps == 2400 && d.link_efficiency == 0.6 && d.alpha_net_s == 40e-6 &&
              d.alpha_nvlink_s == 3.4e-6 && d.base_s == 8.4e-6,
          "defaults: net %g nvlink %g efficiency %g alphas %g %g base %g", d.net_gbps, d.nvlink_gbps, d.link_efficiency,
          d.alpha_net_s, d.alpha_nvlink_s, d.base_s);
    ScalingCluster c = d;
    c.net_gbps = 8, c.link_efficiency = 0.5, c.nvlink_gbps = 80, c.alpha_net_s = 1e-5, c.alpha_nvlink_s = 1e-6,
    c.base_s = 1e-6;
    // ring all-reduce of 1e9 B over 8: 1.75e9 B / 5e8 = 3.5 s; 14 steps, 6 over the network: 1 + 8 x 1 + 6 x 10 us.
    // tree: 1 + 2 (1 x 1 + 2 x 10) us + 2e9 / (0.9 x 5e8) = 4.44 s: the ring wins
    double ring = 3.5 + 69e-6;
    CHECK(near(scaling_coll_s(&c, SCALING_ALLREDUCE, 1e9), ring), "all-reduce 1 GB: %.9f, want %.9f",
          scaling_coll_s(&c, SCALING_ALLREDUCE, 1e9), ring);
    // 1000 B: ring 69 us + 3.5 us; tree 43 us + 2000 / 4.5e8 s: the tree wins
    double tree = 43e-6 + 2000 / 4.5e8;
    CHECK(near(scaling_coll_s(&c, SCALING_ALLREDUCE, 1000), tree), "all-reduce 1 KB: %.9f, want the tree's %.9f",
          scaling_coll_s(&c, SCALING_ALLREDUCE, 1000), tree);
    // reduce-scatter: 7/8 x 1e9 / 5e8 = 1.75 s; 7 steps, 3 over the network: 1 + 4 x 1 + 3 x 10 us
    CHECK(near(scaling_coll_s(&c, SCALING_REDUCE_SCATTER, 1e9), 1.75 + 35e-6), "reduce-scatter: %.9f",
          scaling_coll_s(&c, SCALING_REDUCE_SCATTER, 1e9));
    CHECK(near(scaling_coll_s(&c, SCALING_ALLGATHER, 1e9), 1.75 + 35e-6), "all-gather: %.9f",
          scaling_coll_s(&c, SCALING_ALLGATHER, 1e9));
    // all-to-all: 1 + 10 us + 2 x 6/8 x 1e9 / 5e8 = 3 s
    CHECK(near(scaling_coll_s(&c, SCALING_ALLTOALL, 1e9), 3.0 + 11e-6), "all-to-all: %.9f",
          scaling_coll_s(&c, SCALING_ALLTOALL, 1e9));
    // ... on 128 nodes of 2: the 254 peers off the node in ceil(254 / 16) = 16 rounds of 10 us; 1 KB (the bytes
    // negligible: 2 x 254/256 x 1000 / 5e8 = 4 us)
    ScalingCluster big = c;
    big.nodes = 128;
    double a2a256 = 1e-6 + 16 * 10e-6 + 2.0 * 254 / 256 * 1000 / 5e8;
    CHECK(near(scaling_coll_s(&big, SCALING_ALLTOALL, 1000), a2a256),
          "all-to-all on 256 GPUs: %.9f, want %.9f (16 rounds)", scaling_coll_s(&big, SCALING_ALLTOALL, 1000), a2a256);
    ScalingCluster one = c;
    one.nodes = 1;  // 2 GPUs over NVLink: 1 + 2 x 1 us + 1e9 / 1e10 (no link efficiency)
    CHECK(near(scaling_coll_s(&one, SCALING_ALLREDUCE, 1e9), 0.1 + 3e-6), "all-reduce in one node: %.9f",
          scaling_coll_s(&one, SCALING_ALLREDUCE, 1e9));
    one.gpus_per_node = 1;
    CHECK(scaling_coll_s(&one, SCALING_ALLREDUCE, 1e9) == 0, "one GPU: no collective");

    // 3. the step. 1e9 FLOPs/token x T=100, 100 TFLOP/s x 0.5: B=1500 is a 3 s micro-batch; its backward
    // SCALING_OVERLAP x 3 s. Three events at 1/4, 1/2 and all of the backward; buckets of 1e8, 1e8 and 1e6
    // gradients, one per event.
    double elems[3] = {1e8, 1e8, 1e6};
    int events[3] = {0, 1, 2};
    ScalingWork w;
    memset(&w, 0, sizeof w);
    w.flops_per_token = 1e9, w.peak_tflops = 100, w.mfu = 0.5, w.B = 1500, w.T = 100;
    w.params = 2.01e8, w.weight_bytes = 2, w.sync_bytes = 32;
    w.n_buckets = 3, w.bucket_elems = elems, w.bucket_event = events, w.n_events = 3;
    double part_elems[2] = {1e8, 1.01e8};  // onebit: bucket 0, then buckets 1 and 2 (final after layer 0's event)
    int part_event[2] = {0, 2};
    w.n_parts = 2, w.part_elems = part_elems, w.part_event = part_event;
    w.event_frac[0] = 0.25, w.event_frac[1] = 0.5, w.event_frac[2] = 1;
    const ScalingModeDesc* fp32 = &scaling_modes[SCALING_FP32];
    ScalingPrediction p = scaling_predict(&c, &w, fp32, 1, 1500, 0);
    double bwd = SCALING_OVERLAP * 3.0, t0 = 1.4 + 69e-6, t2 = 0.014 + 69e-6;  // 4e8 B and 4e6 B all-reduces (ring)
    double sync = 43e-6 + 64 / 4.5e8;                                          // 32 B: the tree
    // bucket 0 starts at bwd/4 and runs past bwd/2, so bucket 1 queues behind it; bucket 2 waits for the end
    double end1 = 0.25 * bwd + 2 * t0, end2 = (end1 > bwd ? end1 : bwd) + t2;
    CHECK(near(p.micro_s, 3.0) && near(p.compute_s, 3.0), "micro %.9f compute %.9f, want 3", p.micro_s, p.compute_s);
    CHECK(near(p.exposed_s, end2 - bwd + sync), "exposed %.9f, want %.9f", p.exposed_s, end2 - bwd + sync);
    CHECK(p.collectives == 4 && near(p.comm_s, 2 * t0 + t2 + sync), "collectives %d, comm %.9f", p.collectives,
          p.comm_s);
    CHECK(near(p.bytes_sent, 1.75 * 4 * 2.01e8 + 1.75 * 32), "bytes sent %.0f", p.bytes_sent);
    CHECK(near(p.step_s, 3.0 + p.exposed_s) && near(p.efficiency, 3.0 / p.step_s), "step %.9f efficiency %.9f",
          p.step_s, p.efficiency);
    CHECK(near(p.tokens_per_s, 8 * 1500 * 100 / p.step_s), "tokens/s %.3f", p.tokens_per_s);
    // a 30 s micro-batch: bucket 0 and 1 end long before the backward; only the last bucket is exposed
    ScalingPrediction q = scaling_predict(&c, &w, fp32, 1, 15000, 0);
    CHECK(near(q.exposed_s, t2 + sync), "long backward: exposed %.9f, want the last bucket's %.9f", q.exposed_s,
          t2 + sync);
    // bf16: half the bytes per bucket
    ScalingPrediction h = scaling_predict(&c, &w, &scaling_modes[SCALING_BF16], 1, 15000, 0);
    CHECK(near(h.bytes_sent, 1.75 * 2 * 2.01e8 + 1.75 * 32), "bf16 bytes sent %.0f", h.bytes_sent);
    // ZeRO-1: reduce-scatter (7/8 x 4e6 B / 5e8 + 35 us for the last) + an all-gather of 2-byte weights per bucket
    w.zero = 1;
    ScalingPrediction z = scaling_predict(&c, &w, fp32, 1, 15000, 0);
    double zag = 2 * (0.875 * 2e8 / 5e8 + 35e-6) + 0.875 * 2e6 / 5e8 + 35e-6;
    CHECK(near(z.exposed_s, 0.875 * 4e6 / 5e8 + 35e-6 + zag + sync), "ZeRO-1 exposed %.9f, want %.9f", z.exposed_s,
          0.875 * 4e6 / 5e8 + 35e-6 + zag + sync);
    CHECK(z.collectives == 7 && near(z.bytes_sent, 0.875 * 6 * 2.01e8 + 1.75 * 32), "ZeRO-1: %d collectives, %.0f B",
          z.collectives, z.bytes_sent);
    w.zero = 0;
    // onebit, the 30 s micro-batch (a 20 s backward): each part compressed (20 B per element at 3.9 TB/s), an
    // all-to-all and an all-gather of 8 messages of C/8 + 4 C/256 bytes (part 1, buckets 1 and 2, the last two events:
    // C = 1.01e8 / 8 rounded up to 256 = 12,625,152: 1,775,412 B; part 0: C = 12,500,224, 1,757,844 B), then updated
    // (18 B per parameter), after the backward, in the forward's order (the tail, part 1, first), each before the next
    // forward's layers that read it: layer 0 part 1's, layer 1 and the head part 0's; the forward (10 s of the 30 s
    // micro-batch) a quarter the head's (event_frac[0]), 3/8 each layer's. Part 1 is in at tp1, part 0 at tp0 = tp1
    // + its own: the forward of layer 0 (3.75 s) hides part 0, so only tp1 shows
    const ScalingModeDesc* ob = &scaling_modes[SCALING_ONEBIT];
    double cb = 8 * 1775412.0, cb0 = 8 * 1757844.0;
    double a2a = 11e-6 + 2 * 0.75 * cb / 5e8, ag = 35e-6 + 0.875 * cb / 5e8;
    w.n_layers = 2, w.layer_part[0] = 1, w.layer_part[1] = 0, w.layer_part[2] = 0;
    double tp1 = 1.01e8 * 38 / 3.9e12 + a2a + ag,
           tp0 = tp1 + 1e8 * 38 / 3.9e12 + (11e-6 + 2 * 0.75 * cb0 / 5e8) + (35e-6 + 0.875 * cb0 / 5e8);
    ScalingPrediction o = scaling_predict(&c, &w, ob, 1, 15000, 0), after = o;
    CHECK(near(o.exposed_s, tp1 + sync) && o.collectives == 5 && near(o.bytes_sent, 2 * 0.875 * (cb + cb0) + 1.75 * 32),
          "onebit exposed %.9f (want %.9f), %d collectives (want 5), %.0f B", o.exposed_s, tp1 + sync, o.collectives,
          o.bytes_sent);
    // a 30 ms micro-batch (a 10 ms forward, fwd): layer 1 waits for part 0, so the forward ends at tp0 + 5/8 fwd
    after = scaling_predict(&c, &w, &scaling_modes[SCALING_ONEBIT], 1, 15, 0);
    double fwd = (1 - SCALING_OVERLAP) * 0.03;
    CHECK(near(after.exposed_s, tp0 - 0.375 * fwd + sync), "onebit, 30 ms micro-batch: exposed %.9f, want %.9f",
          after.exposed_s, tp0 - 0.375 * fwd + sync);
    CHECK(near(o.run_efficiency, o.efficiency), "no warm-up: the run's average is the step's");
    w.adamw_share = 0.1;  // (w.refresh 0: the compressed phase has no AdamW step)
    o = scaling_predict(&c, &w, ob, 1, 15000, 0);
    ScalingPrediction hb = scaling_predict(&c, &w, &scaling_modes[SCALING_BF16], 1, 15000, 0);  // the warm-up's
    double bf16_step = 30 + hb.exposed_s;
    CHECK(near(o.run_efficiency, 30 / (0.1 * bf16_step + 0.9 * o.step_s)), "whole-run efficiency %.9f",
          o.run_efficiency);
    CHECK(o.run_efficiency > fmin(hb.efficiency, o.efficiency) && o.run_efficiency < fmax(hb.efficiency, o.efficiency),
          "the run's average %.6f lies between bf16's %.6f and onebit's %.6f (bf16 is faster here)", o.run_efficiency,
          hb.efficiency, o.efficiency);
    // one step in K = 10 an AdamW step after the warm-up: the steady state mixes 9 compressed steps with 1 bf16 step;
    // the whole run's share (0.1) counts every AdamW step, so it mixes compressed steps with bf16's, not the steady
    w.refresh = 10;
    ScalingPrediction k = scaling_predict(&c, &w, ob, 1, 15000, 0);
    CHECK(near(k.step_s, 0.9 * o.step_s + 0.1 * bf16_step) && near(k.run_efficiency, o.run_efficiency),
          "--comm-refresh 10: steady step %.9f (want %.9f), whole run %.9f (want %.9f)", k.step_s,
          0.9 * o.step_s + 0.1 * bf16_step, k.run_efficiency, o.run_efficiency);
    w.refresh = 0;

    // 4. --grad-accum auto: accum >= exposed x 0.95 / (0.05 x micro), and one less is not enough
    ScalingPrediction a = scaling_predict(&c, &w, fp32, 0, 1500, 0);
    int want = (int)ceil(p.exposed_s * 0.95 / (0.05 * 3.0) - 1e-9);
    CHECK(a.accum == want && !a.capped, "auto accumulation %d, want %d", a.accum, want);
    CHECK(a.exposed_s <= 0.05 * a.step_s, "auto: exposed %.4f s of a %.4f s step", a.exposed_s, a.step_s);
    CHECK(scaling_predict(&c, &w, fp32, want - 1, 1500, 0).exposed_s > 0.05 * (3.0 * (want - 1) + p.exposed_s),
          "%d micro-batches already hide it: auto is not the smallest", want - 1);
    // capped: at most 30000 sequences = 2 micro-batches of 1500 on 8 GPUs
    ScalingPrediction cap = scaling_predict(&c, &w, fp32, 0, 1500, 30000);
    CHECK(cap.accum == 2 && cap.capped && cap.global_batch == 24000, "capped: accum %d capped %d global %lld",
          cap.accum, cap.capped, cap.global_batch);
    CHECK(scaling_predict(&c, &w, fp32, 0, 1500, 100).accum == 1, "a cap below one micro-batch leaves 1");

    // 5. --global-batch: 20,000 sequences on 8 GPUs of B=1500: 2500 each = 2 micro-batches of 1250
    ScalingPrediction g = scaling_row(&c, &w, fp32, 1, 20000, 0);
    CHECK(g.accum == 2 && g.B == 1250 && g.global_batch == 20000, "global batch: accum %d B %d global %lld", g.accum,
          g.B, g.global_batch);
    g = scaling_row(&c, &w, fp32, 1, 8000, 0);  // 1000 each: one micro-batch of 1000
    CHECK(g.accum == 1 && g.B == 1000 && near(g.micro_s, 2.0), "smaller micro-batch: accum %d B %d micro %.3f", g.accum,
          g.B, g.micro_s);
    CHECK(scaling_row(&c, &w, fp32, 1, 4, 0).B == 0, "a global batch below one sequence per GPU is marked");

    // 6. one GPU: nothing to communicate
    ScalingCluster solo = scaling_cluster_default(1, 1);
    ScalingPrediction s = scaling_predict(&solo, &w, fp32, 0, 1500, 0);
    CHECK(s.comm_s == 0 && s.exposed_s == 0 && s.accum == 1 && s.efficiency == 1 && s.bytes_sent == 0,
          "one GPU: comm %g exposed %g accum %d efficiency %g", s.comm_s, s.exposed_s, s.accum, s.efficiency);
    return test_summary();
}
