// scaling.h: how well data-parallel training should scale, predicted on the host before any GPU runs.
// Pure host C (no CUDA, no NCCL): `./trainer --plan-only --nodes N --gpus-per-node G --net-gbps X` prints
// it, and `--grad-accum auto` uses it to pick the accumulation that hides the gradient all-reduce.
//
// The model, per optimizer step of one GPU:
//   compute   = accum x B x T x (model FLOPs per token) / (device peak x MFU)
//   all-reduce of the gradients (numel x 4 bytes in fp32, x 2 in bf16), alpha-beta ring model:
//     ring over p ranks, link bandwidth bw, latency alpha per ring step:
//       t_ring(p) = 2 (p-1)/p x bytes / bw + 2 (p-1) x alpha
//     (reduce-scatter then all-gather: each rank sends and receives 2 (p-1)/p of the buffer, in
//     2 (p-1) steps). Two ways to run it on N nodes x G GPUs:
//     hierarchical: reduce-scatter inside the node over NVLink, G rings of bytes/G across the N nodes at
//       the same time (sharing the node's network link: bytes in all), all-gather inside the node:
//         t = t_ring_nvlink(G) + 2 (N-1)/N x bytes / net + 2 (N-1) x alpha_net
//     flat: one ring through all N x G ranks; its slowest links are the network ones:
//         t = 2 (p-1)/p x bytes / (N > 1 ? net : nvlink) + 2 (p-1) x (N > 1 ? alpha_net : alpha_nvlink)
//     The prediction takes the faster of the two (NCCL chooses its algorithm too).
//   exposed   = max(all-reduce - 2/3 x one micro-batch's compute, all-reduce of the tail): the bucketed
//               reduction overlaps the backward (about 2/3 of a micro-batch's FLOPs), only the last micro-batch
//               of an accumulation communicates, and the tail (the embedding tables' gradients, final only
//               after the backward's last kernel, and the vectors: biases, LayerNorm) is reduced after it;
//   step      = compute + exposed;
//   efficiency = (time per sample on 1 GPU) / (time per sample per GPU on N) = compute / step.
// --grad-accum auto: the smallest accumulation whose exposed time is at most 5% of the step.
#pragma once
#include <math.h>
#include <stdio.h>

// The model FLOP utilisation mlm.c reaches on one GPU: paper-120m, T=512, B=571 (the planner's), 664,867
// tokens/s = 40.4% of an H100 SXM's 989 TFLOP/s (`./trainer --bench --preset paper-120m,paper-350m`, code of
// c3b3b7d, 2026-11-23; paper-350m: 46.0%). Assumed the same on an H100 NVL (835 TFLOP/s). --mfu overrides it
// (e.g. with the mfu= that ./trainer --bench prints on the target GPU).
#define SCALING_MFU 0.404
// NVLink between the two GPUs of an H100 NVL pair: 600 GB/s bidirectional over the NVLink bridge (NVIDIA's
// H100 datasheet), 300 GB/s = 2400 Gbit/s each way. All bandwidths here are Gbit/s in one direction.
#define SCALING_NVLINK_GBPS 2400.0
#define SCALING_NET_GBPS 25.0  // the seed paper's cluster: 25 Gb Ethernet between nodes
// Latency per ring step (alpha), assumed, not measured: NCCL's own tuning model charges a few microseconds
// per step inside a node (5 us here); one step over TCP sockets on Ethernet costs a network round of about
// 30 us (kernel network stack both ends, the switch).
#define SCALING_ALPHA_NVLINK_S 5e-6
#define SCALING_ALPHA_NET_S 30e-6
#define SCALING_OVERLAP 0.6667       // the backward's share of a micro-batch's FLOPs (4 of 6 per weight)
#define SCALING_EXPOSED_MAX 0.05     // --grad-accum auto: exposed all-reduce at most this share of a step
#define SCALING_MAX_ACCUM (1 << 20)  // the largest --grad-accum

typedef struct {
    int nodes, gpus_per_node;
    double net_gbps, nvlink_gbps;        // Gbit/s one way: a node's network link; NVLink between two GPUs of a node
    double alpha_net_s, alpha_nvlink_s;  // seconds per ring step
} ScalingCluster;

typedef struct {
    double flops_per_token;   // model FLOPs per token (bert_flops_per_token(...).model)
    double peak_tflops;       // the device's dense bf16 peak
    double mfu;               // the share of the peak the training step reaches
    double tokens_per_micro;  // B x T: one GPU's micro-batch
    double grad_bytes;        // bytes all-reduced per step: numel x 4 (fp32) or x 2 (bf16)
    double tail_bytes;        // of which the backward produces last: reduced after it ends, never overlapped
} ScalingWork;

typedef struct {
    int gpus, accum;
    double micro_s;            // one micro-batch's forward + backward
    double compute_s;          // accum x micro_s
    double flat_s, hier_s;     // the two all-reduce algorithms
    double comm_s;             // the faster one
    int hierarchical;          // 1: comm_s is the hierarchical one
    double tail_s;             // the tail's all-reduce (same algorithm)
    double exposed_s, step_s;  // after overlap; the whole step
    double efficiency;         // compute_s / step_s
    double tokens_per_s;       // all GPUs together
} ScalingPrediction;

static inline ScalingCluster scaling_cluster_default(int nodes, int gpus_per_node) {
    ScalingCluster c;
    c.nodes = nodes, c.gpus_per_node = gpus_per_node;
    c.net_gbps = SCALING_NET_GBPS, c.nvlink_gbps = SCALING_NVLINK_GBPS;
    c.alpha_net_s = SCALING_ALPHA_NET_S, c.alpha_nvlink_s = SCALING_ALPHA_NVLINK_S;
    return c;
}

// t_ring(p) = 2 (p-1)/p x bytes / bw + 2 (p-1) x alpha; bw in Gbit/s. 0 for one rank.
static inline double scaling_ring_s(double bytes, int p, double gbps, double alpha_s) {
    if (p <= 1) return 0;
    return 2.0 * (p - 1) / p * bytes / (gbps * 1e9 / 8) + 2.0 * (p - 1) * alpha_s;
}

static inline double scaling_flat_s(const ScalingCluster* c, double bytes) {
    int p = c->nodes * c->gpus_per_node;
    if (c->nodes > 1) return scaling_ring_s(bytes, p, c->net_gbps, c->alpha_net_s);
    return scaling_ring_s(bytes, p, c->nvlink_gbps, c->alpha_nvlink_s);
}

static inline double scaling_hierarchical_s(const ScalingCluster* c, double bytes) {
    return scaling_ring_s(bytes, c->gpus_per_node, c->nvlink_gbps, c->alpha_nvlink_s) +
           scaling_ring_s(bytes, c->nodes, c->net_gbps, c->alpha_net_s);
}

// scaling_predict: one step with `accum` micro-batches per GPU (accum 0: --grad-accum auto, the smallest
// accumulation with exposed <= 5% of the step, i.e. accum >= exposed (1 - 5%) / (5% x micro)).
static inline ScalingPrediction scaling_predict(const ScalingCluster* c, const ScalingWork* w, int accum) {
    ScalingPrediction p;
    p.gpus = c->nodes * c->gpus_per_node;
    p.micro_s = w->tokens_per_micro * w->flops_per_token / (w->peak_tflops * 1e12 * w->mfu);
    p.flat_s = scaling_flat_s(c, w->grad_bytes);
    p.hier_s = scaling_hierarchical_s(c, w->grad_bytes);
    p.hierarchical = c->nodes > 1 && c->gpus_per_node > 1 && p.hier_s < p.flat_s;
    p.comm_s = p.hierarchical ? p.hier_s : p.flat_s;
    p.tail_s = p.hierarchical ? scaling_hierarchical_s(c, w->tail_bytes) : scaling_flat_s(c, w->tail_bytes);
    double window = SCALING_OVERLAP * p.micro_s;
    p.exposed_s = p.comm_s - window > p.tail_s ? p.comm_s - window : p.tail_s;
    if (accum <= 0) {
        double need = p.exposed_s * (1 - SCALING_EXPOSED_MAX) / (SCALING_EXPOSED_MAX * p.micro_s);
        accum = need <= 1 ? 1 : need >= SCALING_MAX_ACCUM ? SCALING_MAX_ACCUM : (int)ceil(need - 1e-9);
    }
    p.accum = accum;
    p.compute_s = accum * p.micro_s;
    p.step_s = p.compute_s + p.exposed_s;
    p.efficiency = p.compute_s / p.step_s;
    p.tokens_per_s = p.gpus * accum * w->tokens_per_micro / p.step_s;
    return p;
}

// scaling_print: the assumptions, then one row per node count 1, 2, 4, ... up to c->nodes (and c->nodes
// itself), each with its own accumulation when accum is 0 (auto). B and T give the global batch.
static inline void scaling_print(const ScalingCluster* c, const ScalingWork* w, int accum, int B, int T) {
    printf(
        "scaling prediction: %.0f TFLOP/s peak x MFU %.1f%%, %.3g model FLOPs/token, gradients %.1f MB per "
        "all-reduce\n",
        w->peak_tflops, 100 * w->mfu, w->flops_per_token, w->grad_bytes / 1e6);
    printf(
        "  network %g Gbit/s per node (alpha %g us), NVLink %g Gbit/s (alpha %g us); exposed = the larger of "
        "all-reduce - 2/3 of a micro-batch and the all-reduce of the last %.1f MB (embeddings, vectors)\n",
        c->net_gbps, c->alpha_net_s * 1e6, c->nvlink_gbps, c->alpha_nvlink_s * 1e6, w->tail_bytes / 1e6);
    printf(
        "| nodes | GPUs | accum | global batch (seqs) | tokens/step | compute ms | all-reduce ms | exposed ms | "
        "step ms | efficiency | tokens/s |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int n = 1;; n = n * 2 > c->nodes && n < c->nodes ? c->nodes : n * 2) {
        ScalingCluster ci = *c;
        ci.nodes = n;
        ScalingPrediction p = scaling_predict(&ci, w, accum);
        long long seqs = (long long)p.gpus * p.accum * B;
        printf("| %d | %d | %d | %lld | %.3g | %.1f | %.1f %s | %.1f | %.1f | %.1f%% | %.3g |\n", n, p.gpus, p.accum,
               seqs, (double)seqs * T, p.compute_s * 1e3, p.comm_s * 1e3,
               p.gpus == 1      ? ""
               : p.hierarchical ? "(hier.)"
                                : "(flat)",
               p.exposed_s * 1e3, p.step_s * 1e3, 100 * p.efficiency, p.tokens_per_s);
        if (n >= c->nodes) break;
    }
}
