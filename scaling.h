// scaling.h: how well data-parallel training should scale, predicted on the host before any GPU runs.
// Pure host C (no CUDA, no NCCL): `./trainer --plan-only --nodes N --gpus-per-node G --net-gbps X` prints
// one table per communication mode, and `--grad-accum auto` uses it to pick the accumulation that hides the
// communication.
//
// The model, per optimizer step of one GPU (P = N x G ranks; every bandwidth in Gbit/s one way):
//   compute = accum x micro,  micro = B x T x (model FLOPs per token) / (device peak x MFU)
//     (or --micro-ms, a measured micro-batch of the planner's B, scaled to the row's B)
//   One collective of a buffer of `bytes` (NCCL's count x element size; for reduce-scatter and all-gather the
//   whole buffer, for all-to-all a rank's whole send buffer) costs latency + the bytes on its slowest link:
//     bytes a rank sends (NCCL's ring and all-to-all algorithms, the trainer's comm_bytes count):
//       all-reduce 2 (P-1)/P x bytes; reduce-scatter, all-gather, all-to-all (P-1)/P x bytes
//     ring (all-reduce, reduce-scatter, all-gather): NCCL's rings enter and leave each node once, so the node's
//       network link carries what one rank sends:  t = lat_ring + sent / (net x link efficiency)
//         lat_ring = base + (steps - net steps) x alpha_nvlink + net steps x alpha_net,
//         steps = 2 (P-1) (all-reduce) or P-1, net steps = 2 (N-1) or N-1 (NCCL's tuning model, tuning.cc)
//     tree (all-reduce only, N > 1): up and down NCCL's double binary tree, about 2 x bytes through the link
//       at 90% of the ring's bandwidth (NCCL's tuning model):
//         t = base + 2 ((G-1) alpha_nvlink + ceil(log2 N) alpha_net) + 2 bytes / (0.9 x net x link efficiency)
//       an all-reduce costs the faster of the two (NCCL picks its algorithm per call from the same model);
//     all-to-all (onebit): every rank's P-1 sends at once; the G ranks of a node send G (P-G)/P x bytes off it:
//         t = base + alpha_net + G (P-G)/P x bytes / (net x link efficiency)
//     In one node (N = 1) the same with NVLink's bandwidth and alpha, no link efficiency.
//   Communication per mode (ScalingModeDesc: the lead adjusts a mode there):
//     fp32, bf16: one all-reduce per gradient bucket (4 or 2 bytes per gradient), on one communication
//       stream in launch order, each after the backward of the step's LAST micro-batch made its gradients:
//       bucket i starts at max(its backward event, the end of bucket i-1). The backward is 2/3 of a
//       micro-batch (4 of a weight's 6 FLOPs), its events at the share of its FLOPs done (the head, then
//       layer by layer). --zero 1: a reduce-scatter per bucket instead (same overlap), then after the
//       optimizer an all-gather of the bf16 weights per bucket, never overlapped.
//     onebit (1-bit Adam, after --comm-warmup steps at fp32): compress.h's parts (the buckets
//       merged up to ONEBIT_PART_BUCKETS buckets, and one part for all the buckets final after layer 0's backward:
//       the embeddings, layer 0 and the vector region), each its compression (memory-bound:
//       SCALING_ONEBIT_WORKER_BYTES of device memory per element), one all-to-all and one all-gather of P messages
//       of C/8 bytes of signs + 4 bytes of scale per group of 256 (C = the part's n/P rounded up to 256:
//       compress.h's onebit_msg_bytes) and its update (SCALING_ONEBIT_UPDATE_BYTES per parameter),
//       after the backward (and the host sync, which the model puts after them: latency only), in the
//       forward's order, each updated as it arrives; the next step's forward runs layer by layer (the head
//       event_frac[0] of it, the layers the rest in equal shares), layer l no sooner than the part that holds
//       its weights (layer_part): exposed = how much later that forward ends than alone.
//       Once its variance steps are K apart (--comm-refresh K, default 100), one step in K is an AdamW step with
//       the bf16 all-reduce instead, so the time, the communication and the bytes of that steady state ("after the
//       warm-up") are (K-1)/K onebit's + 1/K bf16's.
//     every mode: the step's host sync, one all-reduce of a few floats (latency only).
//   exposed = the communication still running when the last backward ends + what runs after it
//   step = compute + exposed; efficiency = compute / step (time per sample on 1 GPU / per GPU on P).
//   onebit's whole-run average: its AdamW steps (the warm-up and the variance steps, compress.h's onebit_schedule,
//   over the run's --steps or SCALING_RUN_STEPS) at bf16's step time, the rest at onebit's.
// --grad-accum auto: the smallest accumulation whose exposed time is at most 5% of the step, capped so that
// the global batch stays within --max-global-batch (default 65,536 sequences).
#pragma once
#include <math.h>
// The run length the onebit table's whole-run average is of when the run's --steps is not known (--plan-only
// without it): examples/slurm/paper_cluster.sbatch's.
#define SCALING_RUN_STEPS 100000
#include <stdio.h>

// The model FLOP utilisation mlm.c reaches on one GPU, measured: `./trainer --bench` (T=512, default flags, the
// planner's largest micro-batch) on an H200, 2026-11-28, commit bcb0c42: bert-base 47.8% (B=860), bert-large 53.5%
// (B=324) of 989 TFLOP/s. The predictor takes the first for a model of hidden size up to 768 and the second above
// (scaling_default_mfu), on every device: the other Hopper parts were not measured at this commit (an H100 SXM gave
// 40.4% and 46.0% for paper-120m and paper-350m on 2026-11-23, with the kernels of then). --mfu overrides it (the
// mfu= that ./trainer --bench prints on the target GPU).
#define SCALING_MFU_BASE 0.478
#define SCALING_MFU_LARGE 0.535
#define SCALING_MFU_SOURCE "./trainer --bench on an H200, 2026-11-28"
static inline double scaling_default_mfu(int hidden) { return hidden <= 768 ? SCALING_MFU_BASE : SCALING_MFU_LARGE; }
// NVLink between the two GPUs of an H100 NVL pair: 600 GB/s bidirectional over the NVLink bridge (NVIDIA's
// H100 datasheet), 300 GB/s = 2400 Gbit/s each way.
#define SCALING_NVLINK_GBPS 2400.0
#define SCALING_NET_GBPS 25.0  // the seed paper's cluster: 25 Gb Ethernet between nodes
// The share of the line rate NCCL's socket transport reaches on large messages over Ethernet (TCP): NCCL
// issue #209 (NVIDIA/nccl): "not ... more than 60% of wire speed over 32Gpbs networks" in nccl-tests'
// all_reduce_perf; issue #450: 4-6 GB/s bus bandwidth on 100 Gbit/s TCP (32-48%). --link-efficiency.
#define SCALING_LINK_EFFICIENCY 0.6
// Latencies. Per collective NCCL's base latency for its Simple protocol (8.4 us, tuning.cc's baseLat); per
// step inside a node NCCL's NVLink ring hop (3.4 us, hwLat); per step over the network a TCP round: an 8-byte
// nccl-tests broadcast between 2 nodes over NCCL's sockets took 38-46 us (NVIDIA/nccl-tests issue #82; NCCL's
// own table has 9.6 us for InfiniBand). --alpha-us overrides the network one.
#define SCALING_BASE_S 8.4e-6
#define SCALING_ALPHA_NVLINK_S 3.4e-6
#define SCALING_ALPHA_NET_S 40e-6
#define SCALING_TREE_BW 0.9             // NCCL's tuning model: the tree all-reduce at 90% of the ring's bus bandwidth
#define SCALING_OVERLAP 0.6667          // the backward's share of a micro-batch's FLOPs (4 of 6 per weight)
#define SCALING_EXPOSED_MAX 0.05        // --grad-accum auto: exposed communication at most this share of a step
#define SCALING_MAX_ACCUM (1 << 20)     // the largest --grad-accum
#define SCALING_MAX_GLOBAL_BATCH 65536  // --max-global-batch default: sequences per step
// onebit: device-memory traffic per element at an H100 NVL's 3.9 TB/s (NVIDIA's datasheet): the worker reads g,
// m, v and the error and writes the new error (5 fp32; its signs and the server's 1/P are small); the update reads
// v and the master weight and writes the master weight, m (fp32) and the bf16 weight
#define SCALING_ONEBIT_WORKER_BYTES 20.0
#define SCALING_ONEBIT_UPDATE_BYTES 18.0
#define SCALING_HBM_GBS 3900.0
#define SCALING_ONEBIT_GROUP 256  // elements per fp32 scale (compress.h's ONEBIT_GROUP)
#define SCALING_MAX_EVENTS 1024
#define SCALING_MAX_BUCKETS 65536

// An all-to-all (1-bit Adam's: ncclSend/ncclRecv to every rank in one group) is not one network latency: NCCL
// runs a group's point-to-point operations in rounds of a few peers at a time, about 16 (16 rounds for the 254 peers
// off the node at 128 nodes of 2: 0.64 ms at 40 us a round). An estimate of NCCL's schedule, not measured here.
#define SCALING_A2A_PEERS_PER_ROUND 16
typedef enum { SCALING_ALLREDUCE, SCALING_REDUCE_SCATTER, SCALING_ALLGATHER, SCALING_ALLTOALL } ScalingColl;

typedef struct {
    int nodes, gpus_per_node;
    double net_gbps, nvlink_gbps;        // Gbit/s one way: a node's network link; NVLink between two GPUs of a node
    double link_efficiency;              // the share of net_gbps NCCL reaches on large messages
    double alpha_net_s, alpha_nvlink_s;  // seconds per ring step over the network, inside a node
    double base_s;                       // seconds per collective
} ScalingCluster;

// How a communication mode crosses the network (one per --comm mode; scaling_modes below).
typedef struct {
    const char* name;
    double grad_bytes;  // bytes per gradient element in each bucket's collective (0: not per bucket)
    int overlapped;     // 1: the buckets are reduced while the last micro-batch's backward runs
    int compressed;     // 1: 1-bit Adam: per part an all-to-all and an all-gather of n/8 bytes + 4 per group
    int warmup_bf16;    // 1: some steps (the warm-up, the variance steps) run as bf16 (AdamW, the bf16 all-reduce)
} ScalingModeDesc;

enum { SCALING_FP32, SCALING_BF16, SCALING_ONEBIT, SCALING_NUM_MODES };
static const ScalingModeDesc scaling_modes[SCALING_NUM_MODES] = {
    {"fp32", 4, 1, 0, 0},
    {"bf16", 2, 1, 0, 0},
    {"onebit", 0, 0, 1, 1},
};

typedef struct {
    double flops_per_token;  // model FLOPs per token (bert_flops_per_token(...).model)
    double peak_tflops;      // the device's dense bf16 peak
    double mfu;              // the share of the peak the training step reaches
    int mfu_given;           // 1: --mfu; 0: scaling_default_mfu's measurement
    double micro_s_at_B;     // > 0: one micro-batch of B measured (--micro-ms), instead of FLOPs / (peak x MFU)
    int B, T;                // the largest micro-batch (sequences) and the sequence length
    double params;           // gradient elements (the slab)
    int zero;                // --zero 1: reduce-scatter + all-gather instead of all-reduce
    double weight_bytes;     // bytes per weight in ZeRO-1's all-gather (the floatX weights: 2)
    double sync_bytes;       // the step's host-sync all-reduce
    int n_buckets;           // the gradient buckets in launch order (comm.h's grad_reduce_layout)
    double* bucket_elems;    // (n_buckets) elements a bucket's collective covers (ZeRO-1: P x piece)
    int* bucket_event;       // (n_buckets) the backward event it waits for
    int n_parts;             // --comm onebit's parts in launch order (compress.h's onebit_layout)
    double* part_elems;      // (n_parts) elements of each
    int* part_event;         // (n_parts) the backward event it waits for
    int n_events;            // bert_grad_ready_count
    int n_layers;            // onebit: the encoder's layers; layer_part[l]: the part (of part_elems) that holds
    int layer_part[SCALING_MAX_EVENTS];     // layer l's weights (l = n_layers: the head's), which its forward waits for
    double event_frac[SCALING_MAX_EVENTS];  // the share of the backward done when event k is recorded
    double adamw_share;                     // onebit: the share of the run's steps that are AdamW steps (bf16)
    int run_steps;                          // onebit: the run's length that share is of
    int refresh;                            // onebit: in the steady state every refresh-th step is AdamW (0: none)
} ScalingWork;

typedef struct {
    int gpus, accum, B;        // B: the micro-batch of this row (at most the planner's)
    long long global_batch;    // gpus x accum x B sequences
    double micro_s;            // one micro-batch's forward + backward
    double compute_s;          // accum x micro_s
    double comm_s;             // every collective's time, added up
    int collectives;           // collectives per step
    double exposed_s, step_s;  // not hidden by the backward; the whole step
    double efficiency;         // compute_s / step_s
    double run_efficiency;     // onebit: over the whole run, its AdamW steps at bf16's step; else = efficiency
    double tokens_per_s;       // all GPUs together
    double bytes_sent;         // bytes one rank sends per step
    int capped;                // --grad-accum auto stopped by --max-global-batch short of its 5% target
} ScalingPrediction;

static inline ScalingCluster scaling_cluster_default(int nodes, int gpus_per_node) {
    ScalingCluster c;
    c.nodes = nodes, c.gpus_per_node = gpus_per_node;
    c.net_gbps = SCALING_NET_GBPS, c.nvlink_gbps = SCALING_NVLINK_GBPS;
    c.link_efficiency = SCALING_LINK_EFFICIENCY;
    c.alpha_net_s = SCALING_ALPHA_NET_S, c.alpha_nvlink_s = SCALING_ALPHA_NVLINK_S;
    c.base_s = SCALING_BASE_S;
    return c;
}

// scaling_sent: the bytes one rank sends in one collective of a `bytes` buffer over p ranks.
static inline double scaling_sent(ScalingColl k, double bytes, int p) {
    if (p <= 1) return 0;
    return (k == SCALING_ALLREDUCE ? 2.0 : 1.0) * (p - 1) / p * bytes;
}

static inline int scaling_log2_ceil(int n) {
    int l = 0;
    while ((1 << l) < n) l++;
    return l;
}

// scaling_coll_s: the time of one collective of a `bytes` buffer on cluster c (the model above).
static inline double scaling_coll_s(const ScalingCluster* c, ScalingColl k, double bytes) {
    int N = c->nodes, G = c->gpus_per_node, P = N * G;
    if (P <= 1) return 0;
    double sent = scaling_sent(k, bytes, P);
    double net = c->net_gbps * 1e9 / 8 * c->link_efficiency, nvl = c->nvlink_gbps * 1e9 / 8;
    if (N == 1) {  // inside one node: NVLink rings (all-to-all: every pair at once)
        int steps = k == SCALING_ALLTOALL ? 1 : k == SCALING_ALLREDUCE ? 2 * (P - 1) : P - 1;
        return c->base_s + steps * c->alpha_nvlink_s + sent / nvl;
    }
    if (k == SCALING_ALLTOALL)  // the P - G peers off the node in rounds, each a network latency
        return c->base_s + ceil((double)(P - G) / SCALING_A2A_PEERS_PER_ROUND) * c->alpha_net_s +
               (double)G * (P - G) / P * bytes / net;
    int steps = k == SCALING_ALLREDUCE ? 2 * (P - 1) : P - 1, net_steps = k == SCALING_ALLREDUCE ? 2 * (N - 1) : N - 1;
    double ring = c->base_s + (steps - net_steps) * c->alpha_nvlink_s + net_steps * c->alpha_net_s + sent / net;
    if (k != SCALING_ALLREDUCE) return ring;
    double tree = c->base_s + 2 * ((G - 1) * c->alpha_nvlink_s + scaling_log2_ceil(N) * c->alpha_net_s) +
                  2 * bytes / (SCALING_TREE_BW * net);
    return tree < ring ? tree : ring;
}

// scaling_onebit_msg_bytes: one rank's compressed chunk of n parameters over P ranks: C = n/P rounded up to
// SCALING_ONEBIT_GROUP elements, a sign bit each and one fp32 scale per group.
static inline double scaling_onebit_msg_bytes(double n, int P) {
    double C = ceil(ceil(n / P) / SCALING_ONEBIT_GROUP) * SCALING_ONEBIT_GROUP;
    return C / 8 + 4 * C / SCALING_ONEBIT_GROUP;
}

// scaling_exposed: the communication of one step in mode m that the backward does not hide (seconds),
// with the step's collectives (their count, summed time, bytes sent by a rank) in *p. micro_s: one micro-batch.
static inline double scaling_exposed(const ScalingCluster* c, const ScalingWork* w, const ScalingModeDesc* m,
                                     double micro_s, ScalingPrediction* p) {
    int P = c->nodes * c->gpus_per_node;
    p->comm_s = 0, p->collectives = 0, p->bytes_sent = 0;
    if (P <= 1) return 0;
#define SC_ADD(kind_, bytes_, t_)                                              \
    (t_ = scaling_coll_s(c, kind_, bytes_), p->comm_s += t_, p->collectives++, \
     p->bytes_sent += scaling_sent(kind_, bytes_, P), t_)  // the collective's time
    double t, exposed = 0;
    double hbm = SCALING_HBM_GBS * 1e9;
    if (m->compressed) {
        // onebit: the parts leave after the backward, in the forward's order (the layout's, reversed), each updated
        // as soon as it is in; the next step's forward runs layer l once the part with its weights is in (the
        // head: all of them), timed from the backward's end; exposed = how much later the forward ends than alone
        double fwd = (1 - SCALING_OVERLAP) * micro_s, end = 0, f = 0;
        int done = 0;  // parts exchanged and updated, in the forward's order
        for (int l = 0; l <= w->n_layers; l++) {
            for (int need = w->n_parts - 1 - w->layer_part[l]; done <= need; done++) {
                double n = w->part_elems[w->n_parts - 1 - done], bytes = P * scaling_onebit_msg_bytes(n, P);
                end += n * (SCALING_ONEBIT_WORKER_BYTES + SCALING_ONEBIT_UPDATE_BYTES) / hbm;
                end += SC_ADD(SCALING_ALLTOALL, bytes, t);
                end += SC_ADD(SCALING_ALLGATHER, bytes, t);
            }
            double share = l == w->n_layers ? w->event_frac[0] : (1 - w->event_frac[0]) / w->n_layers;
            f = (end > f ? end : f) + share * fwd;
        }
        exposed = f - fwd;
    } else {
        // the buckets on the communication stream, timed from the start of the last backward
        double bwd = SCALING_OVERLAP * micro_s, end = 0;
        ScalingColl k = w->zero ? SCALING_REDUCE_SCATTER : SCALING_ALLREDUCE;
        for (int i = 0; i < w->n_buckets; i++) {
            double ready = m->overlapped ? w->event_frac[w->bucket_event[i]] * bwd : bwd;
            double start = ready > end ? ready : end;
            end = start + SC_ADD(k, w->bucket_elems[i] * m->grad_bytes, t);
        }
        exposed = end > bwd ? end - bwd : 0;
        if (w->zero)  // after the optimizer: the weights, bucket by bucket
            for (int i = 0; i < w->n_buckets; i++)
                exposed += SC_ADD(SCALING_ALLGATHER, w->bucket_elems[i] * w->weight_bytes, t);
    }
    exposed += SC_ADD(SCALING_ALLREDUCE, w->sync_bytes, t);  // the step's host sync
#undef SC_ADD
    return exposed;
}

// scaling_micro_s: one micro-batch of B sequences (forward + backward): the measured one (--micro-ms, scaled
// from the planner's B), else B x T x model FLOPs per token / (peak x MFU).
static inline double scaling_micro_s(const ScalingWork* w, int B) {
    return w->micro_s_at_B > 0 ? w->micro_s_at_B * B / w->B
                               : (double)B * w->T * w->flops_per_token / (w->peak_tflops * 1e12 * w->mfu);
}

// scaling_predict: one step of mode m with `accum` micro-batches of B sequences per GPU (accum 0:
// --grad-accum auto, the smallest accumulation with exposed <= 5% of the step, but at most
// max_global / (GPUs x B), and at least 1).
static inline ScalingPrediction scaling_predict(const ScalingCluster* c, const ScalingWork* w, const ScalingModeDesc* m,
                                                int accum, int B, long long max_global) {
    ScalingPrediction p;
    p.gpus = c->nodes * c->gpus_per_node, p.B = B, p.capped = 0;
    p.micro_s = scaling_micro_s(w, B);
    p.exposed_s = scaling_exposed(c, w, m, p.micro_s, &p);  // independent of accum: only the last one overlaps
    double pure_x = p.exposed_s, bf16_x = 0;                // (onebit: a compressed step's; an AdamW step's)
    ScalingPrediction f;
    if (m->compressed) bf16_x = scaling_exposed(c, w, &scaling_modes[SCALING_BF16], p.micro_s, &f);
    if (m->compressed && w->refresh > 0) {  // the steady state: one step in K is an AdamW step, bf16's
        double fx = bf16_x, K = w->refresh;
        p.exposed_s = ((K - 1) * p.exposed_s + fx) / K;
        p.comm_s = ((K - 1) * p.comm_s + f.comm_s) / K;
        p.bytes_sent = ((K - 1) * p.bytes_sent + f.bytes_sent) / K;
    }
    if (accum <= 0) {
        double need = p.exposed_s * (1 - SCALING_EXPOSED_MAX) / (SCALING_EXPOSED_MAX * p.micro_s);
        accum = need <= 1 ? 1 : need >= SCALING_MAX_ACCUM ? SCALING_MAX_ACCUM : (int)ceil(need - 1e-9);
        long long cap = max_global > 0 ? max_global / ((long long)p.gpus * B) : SCALING_MAX_ACCUM;
        if (cap < 1) cap = 1;
        if (accum > cap) accum = (int)cap, p.capped = 1;
    }
    p.accum = accum;
    p.global_batch = (long long)p.gpus * accum * B;
    p.compute_s = accum * p.micro_s;
    p.step_s = p.compute_s + p.exposed_s;
    p.efficiency = p.compute_s / p.step_s;
    p.run_efficiency = p.efficiency;
    if (m->warmup_bf16 && w->adamw_share > 0) {  // total compute / total time over the run
        double s = w->adamw_share;
        p.run_efficiency = p.compute_s / (s * (p.compute_s + bf16_x) + (1 - s) * (p.compute_s + pure_x));
    }
    p.tokens_per_s = (double)p.global_batch * w->T / p.step_s;
    return p;
}

// scaling_row: the prediction for the cluster c in mode m: with global_batch > 0 the accumulation (and, when
// one micro-batch of B would exceed it, the smaller micro-batch) that global batch implies on c's GPUs,
// else accum (0: auto, capped by max_global; where one micro-batch of B on every GPU is already above
// max_global, as --global-batch max_global). B 0 in the result: the global batch is smaller than the GPUs.
static inline ScalingPrediction scaling_row(const ScalingCluster* c, const ScalingWork* w, const ScalingModeDesc* m,
                                            int accum, long long global_batch, long long max_global) {
    int gpus = c->nodes * c->gpus_per_node, B = w->B;
    if (accum == 0 && global_batch <= 0 && max_global > 0 && (long long)gpus * B > max_global)
        global_batch = max_global;  // auto, but one micro-batch is already above the cap: the cap's global batch
    if (global_batch > 0) {
        long long per_gpu = global_batch / gpus;
        if (per_gpu < 1) {
            ScalingPrediction none;
            none.gpus = gpus, none.B = 0;
            return none;
        }
        long long a = (per_gpu + B - 1) / B;  // (64 bits: the trainer refuses one above SCALING_MAX_ACCUM first)
        if (a > SCALING_MAX_ACCUM) {
            ScalingPrediction none;
            none.gpus = gpus, none.B = 0;
            return none;
        }
        accum = (int)a;
        B = (int)(per_gpu / accum);
    }
    return scaling_predict(c, w, m, accum, B, max_global);
}

// scaling_print: for each mode, one table with a row per node count 1, 2, 4, ... up to c->nodes (and c->nodes
// itself), then the line `scaling-result ...` of its last row.
static inline void scaling_print(const ScalingCluster* c, const ScalingWork* w, int accum, long long global_batch,
                                 long long max_global, const char* preset) {
    int P = c->nodes * c->gpus_per_node;
    char speed[96];
    if (w->micro_s_at_B > 0)
        snprintf(speed, sizeof speed, "a micro-batch of B=%d in %.1f ms (--micro-ms)", w->B, 1e3 * w->micro_s_at_B);
    else
        snprintf(speed, sizeof speed, "%.0f TFLOP/s peak x MFU %.1f%% (%s)", w->peak_tflops, 100 * w->mfu,
                 w->mfu_given ? "--mfu" : SCALING_MFU_SOURCE);
    printf("scaling prediction: %s, %.3g model FLOPs/token, %.0f gradients in %d buckets%s\n", speed,
           w->flops_per_token, w->params, w->n_buckets,
           w->zero ? " (ZeRO-1: reduce-scatter, then an all-gather of the weights)" : "");
    printf(
        "  network %g Gbit/s per node x link efficiency %.2f, %g us per network step, %g us per NVLink step "
        "(%g Gbit/s), %g us per collective\n",
        c->net_gbps, c->link_efficiency, c->alpha_net_s * 1e6, c->alpha_nvlink_s * 1e6, c->nvlink_gbps,
        c->base_s * 1e6);
    printf("  %s\n", global_batch > 0
                         ? "global batch fixed (--global-batch): B shrinks where one micro-batch exceeds it"
                     : accum == 0 ? "--grad-accum auto: exposed <= 5% of the step, within --max-global-batch"
                                  : "fixed --grad-accum");
    for (int mi = 0; mi < SCALING_NUM_MODES; mi++) {
        const ScalingModeDesc* m = &scaling_modes[mi];
        printf("\n--comm %s: %s\n", m->name,
               m->compressed ? "1-bit Adam: all-to-all + all-gather of the signs per part after the backward"
               : w->zero     ? "reduce-scatter per bucket during the last backward, weight all-gather after the step"
                             : "all-reduce per bucket during the last backward");
        printf(
            "| nodes | GPUs | B | accum | global batch (seqs) | compute ms | collectives | comm ms | exposed ms | "
            "step ms | efficiency |%s MB sent/GPU | tokens/s |\n",
            m->warmup_bf16 ? " after the warm-up |" : "");
        printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |%s ---: | ---: |\n",
               m->warmup_bf16 ? " ---: |" : "");
        ScalingPrediction last;
        last.B = 0;
        for (int n = 1;; n = n * 2 > c->nodes && n < c->nodes ? c->nodes : n * 2) {
            ScalingCluster ci = *c;
            ci.nodes = n;
            ScalingPrediction p = scaling_row(&ci, w, m, accum, global_batch, max_global);
            p.capped |= accum == 0 && global_batch <= 0 && max_global > 0 && (long long)p.gpus * w->B > max_global;
            if (p.B == 0) {
                printf("| %d | %d | - | - | (below one sequence per GPU) | | | | | | |%s | |\n", n, p.gpus,
                       m->warmup_bf16 ? " |" : "");
            } else {
                char run[32] = "";  // (1-bit Adam: the whole run first, the compressed phase after it)
                if (m->warmup_bf16) snprintf(run, sizeof run, " %.1f%% |", 100 * p.efficiency);
                printf("| %d | %d | %d | %d%s | %lld | %.1f | %d | %.1f | %.1f | %.1f | %.1f%% |%s %.2f | %.3g |\n", n,
                       p.gpus, p.B, p.accum, p.capped ? " (cap)" : "", p.global_batch, p.compute_s * 1e3, p.collectives,
                       p.comm_s * 1e3, p.exposed_s * 1e3, p.step_s * 1e3, 100 * p.run_efficiency, run,
                       p.bytes_sent / 1e6, p.tokens_per_s);
            }
            last = p;
            if (n >= c->nodes) break;
        }
        if (m->warmup_bf16 && last.B)
            printf(
                "%s at %d GPUs: %.1f%% over the whole run (%d steps, %.1f%% of them AdamW steps with the bf16 "
                "all-reduce: the warm-up and the variance steps), %.1f%% after the warm-up (one step in %d AdamW's)\n",
                m->name, P, 100 * last.run_efficiency, w->run_steps, 100 * w->adamw_share, 100 * last.efficiency,
                w->refresh);
        if (accum == 0 && global_batch <= 0 && last.B && last.capped)
            printf(
                "%s at %d GPUs: --max-global-batch %lld keeps --grad-accum auto at %d micro-batch(es) of B=%d, short "
                "of its 5%% target\n",
                m->name, P, max_global, last.accum, last.B);
        printf(
            "scaling-result preset=%s nodes=%d gpus=%d global_batch=%lld comm=%s efficiency=%.4f "
            "after_warmup=%.4f bytes_per_step=%.0f\n",
            preset, c->nodes, P, last.B ? last.global_batch : 0, m->name, last.B ? last.run_efficiency : 0,
            last.B ? last.efficiency : 0, last.B ? last.bytes_sent : 0);
    }
}
