// compress.h: --comm onebit, 1-bit Adam (Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale
// Training with Adam's Convergence Speed"; DeepSpeed's OnebitAdam).
//
// The first --comm-warmup steps are plain AdamW with the bf16 gradient all-reduce (comm.h's buckets, as --comm
// bf16: as good as fp32 in the mini runs of docs/scaling.md, at half the bytes). After the warm-up the variance
// v changes only on the variance steps, AdamW steps ever further apart (0/1 Adam's schedule: onebit_schedule);
// on every other step no gradient crosses the network, only the momentum, as one bit per element plus one fp32
// scale per group of ONEBIT_GROUP elements. With v fixed between variance steps the update
// w -= lr (m / bc1 D + wd w), D = 1 / (sqrt(v / bc2) + eps) (bc2 = 1 - b2^t_v fixed too; bc1 = 1 - b1^t
// keeps counting, so the step continues the warm-up's AdamW), is linear in m, so averaging m over ranks and
// then scaling by D is the same as averaging u = D m. mlm.c compresses u, the momentum in the units of the
// update, rather than m itself as the paper does: within a group every element of u is of the same order
// (Adam's normalized step), so one sign and one scale per group fit it better (measured on the tiny model, 1
// rank, 5 warm-up steps, 15 compressed, groups of 2048: the loss after step 20 was 4.647 compressing u and 4.693
// compressing m; fp32 AdamW 4.563).
//
// The slab is cut into parts (onebit_layout: the gradient buckets of comm.h merged up to ONEBIT_PART_BUCKETS, those
// final only after layer 0's backward one part), and each part goes through steps 1 to 3 and the all-gather on
// the communication stream, after the step's host sync, when the step's norm and so --clip's factor c are known,
// in the forward's order, and updates each part's weights there too (step 4), so the next step's forward, which
// waits for each layer's part, runs under the exchange of the layers above (onebit_step_forward). (An
// --comm onebit-overlap that sent the parts during the backward, unclipped, was deleted on 2026-11-28: in the 500-step
// mini runs, seeds 1337 and 42, it ended 0.02 to 0.07 points further from fp32's loss than this, at the same bytes.)
//   1. worker (every rank r, its accumulated gradient g_r): x = D (b1 m + (1 - b1) c g_r) + e_r, where m is the
//      averaged momentum of the last step and e_r this rank's worker error;
//      x is compressed (below) and e_r = x - decompress(compress(x)).
//   2. all-to-all (ncclSend/ncclRecv in a group): the part, padded to P chunks of `chunk` elements, is cut
//      into P chunks; rank j receives every rank's compressed chunk j.
//   3. server (rank j): y = (1/P) sum_q decompress(q's chunk j) + s_j (its server error), compressed again,
//      s_j = y - decompress(compress(y)).
//   4. all-gather of the P compressed chunks: every rank decompresses the same bits, u, takes it as the averaged
//      momentum m = u / D and applies w -= lr (u / bc1 + wd w).
// A step runs all four or none: it starts after the host sync has found the step's loss and norm finite, so a
// skipped step never touches the errors (they are updated in place).
// The errors are not in checkpoints: a resumed run starts them from zero, as DeepSpeed does ("occasionally
// resetting the compression error at checkpoint loading does not affect the convergence"; measured here:
// docs/scaling.md), so a checkpoint is the same size on 1 rank or 256.
// Compression of a group of n elements x: one bit per element, set when x >= 0, and the scale
// s = |x|_1 / n; decompressed, x_i ~ (bit ? s : -s). (|x|_1 / n is the scale that minimizes the squared
// error of s * sign(x).) Elements past the part's end (the last chunk's padding) are 0 and not counted.
// A compressed chunk of C elements (a message): C / 32 uint32 sign words (bit b of word w: element
// 32 w + b), then C / ONEBIT_GROUP fp32 scales: C / 8 + 4 C / ONEBIT_GROUP bytes.
// Bytes a rank sends per step: (P - 1) messages of each part in the all-to-all and (P - 1) in the all-gather,
// about 2 (P-1)/P (n/8 + 4 n / ONEBIT_GROUP) for n parameters, against fp32's ring all-reduce 2 (P-1)/P 4 n: 28.4x
// fewer (ONEBIT_GROUP 2048 would give 31.5x; 256 lowered the tiny model's loss after step 20 from 4.647 to 4.631).
// With P = 1 the same compression runs (the all-to-all and all-gather are copies), so its effect on the loss
// shows on one GPU.
#pragma once
#include "kernels.cuh"  // warp_sum, hash_u32, store_rounded, launch
#include "comm.h"       // Comm, comm_check, comm_count

#define ONEBIT_GROUP 256  // elements per scale: one block of ONEBIT_THREADS threads, ONEBIT_PER_THREAD each
#define ONEBIT_THREADS 256
#define ONEBIT_PER_THREAD (ONEBIT_GROUP / ONEBIT_THREADS)
// --comm-refresh's default: once the variance steps (onebit_schedule) are this far apart they stay so: one step in
// 100 is an AdamW step with the bf16 all-reduce, so after the first 2,000 or so steps 1-bit Adam sends 25x fewer
// bytes than fp32 instead of 28x. Measured with v frozen after a 10% warm-up (docs/scaling.md): every 10, 40, 50
// or 100 steps ended within 0.1% of each other and 0.6 points closer to fp32 than none.
#define ONEBIT_REFRESH_DEFAULT 100
// --comm-var-steps's default: the variance steps' spacing doubles after every ONEBIT_VAR_SCALER of them (0/1 Adam's
// kappa, DeepSpeed's var_update_scaler, whose default this is). Measured on one GPU (docs/scaling.md: the mini
// preset, 3 seeds, T=32 and 64): after a 1-step warm-up, 8 left runs up to 3.8% above fp32's loss, 16 up to 2.9%
// and 32 up to 0.3%; after the default warm-up (--warmup's 25 steps) 16 stayed within 0.21%.
#define ONEBIT_VAR_SCALER 16
// The deadline of the start-up all-to-all that opens 1-bit Adam's point-to-point connections (the trainer's
// onebit_setup): NCCL connects a pair of ranks on its first exchange, and the first all-to-all at 240 GPUs took
// minutes (nccl-tests issue 78); 10 minutes, or --nccl-timeout where that is longer.
#define ONEBIT_CONNECT_S 600.0
// --comm-warmup's default: the learning rate's warm-up (--warmup; its default 1% of --steps), at least 1 step and
// below --steps: AdamW with the bf16 all-reduce while v changes fastest; after it, the variance steps (below) keep
// updating v ever more rarely. DeepSpeed's 0/1 Adam ends its variance updates at the end of the learning-rate
// warm-up too ("var_freeze_step ... is usually the end of the learning rate warmup"). Measured (docs/scaling.md:
// one GPU, the mini preset, 3 seeds, T=32 and 64): with --warmup's 25 steps the runs ended within 0.21% of fp32's
// loss, with a 1-step warm-up up to 2.9% above it; 20% of --steps with v frozen after it but for one update every
// 100 steps (the scheme before 2026-11-28) up to 2.9% above it at T=32.
static inline int onebit_default_warmup(int steps, int lr_warmup) {
    int w = lr_warmup >= 0 ? lr_warmup : steps / 100;
    if (w > steps - 1) w = steps - 1;
    return w > 1 ? w : 1;
}
// The parts' size before the backward's end (onebit_layout): at most this many of --bucket-mb's fp32 buckets (100 MB
// at the default 25; a part's messages are 1/28 of that). Each part pays one all-gather latency, about 5 ms at 128
// nodes over TCP sockets: with a part per 25 MB bucket, paper-350m's 50 parts would keep the communication stream
// busy past the backward (the predictor on the seed cluster, 65,536 sequences, when the parts were sent during the
// backward only: 83.6% at 25 MB, 94.8% at 50, 94.5% at 100 and 200, 92.9% at 400; paper-120m 90.9% from 25 to 200
// MB, 87.6% at 400). Now onebit (under the next forward): paper-120m 90.8%, 90.7%, 90.9%, 90.4% and paper-350m
// 96.3%, 96.0%, 96.0%, 94.4% at parts of 50, 100, 200 and 400 MB.
#define ONEBIT_PART_BUCKETS 4

// onebit_msg_bytes: bytes of one compressed chunk of `chunk` elements (a multiple of ONEBIT_GROUP).
__host__ __device__ inline size_t onebit_msg_bytes(size_t chunk) {
    return chunk / 8 + chunk / ONEBIT_GROUP * sizeof(float);
}

// onebit_block_sum: the sum of s over the block (ONEBIT_THREADS threads), in a fixed order (warps, then the
// 8 warp sums in order); every thread gets it. red: 8 floats of shared memory.
__device__ inline float onebit_block_sum(float s, float* red) {
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < ONEBIT_THREADS / 32; i++) t += red[i];
    __syncthreads();  // red may be written again
    return t;
}

// onebit_compress_group: one group's x (thread t holds elements e = k * 256 + t, k < ONEBIT_PER_THREAD;
// e >= n_valid is padding) into its ONEBIT_GROUP / 32 sign words and its scale, and q = the decompressed values.
// Block-wide: every thread calls it. Word k * 8 + t / 32 holds elements [32 (k * 8 + t / 32), +32): one warp
// ballot per k.
__device__ inline void onebit_compress_group(const float* x, int n_valid, uint32_t* words, float* scale, float* red,
                                             float* q) {
    float s = 0.f;
    for (int k = 0; k < ONEBIT_PER_THREAD; k++)
        if (k * ONEBIT_THREADS + (int)threadIdx.x < n_valid) s += fabsf(x[k]);
    float sc = onebit_block_sum(s, red) / (float)(n_valid > 0 ? n_valid : 1);
    for (int k = 0; k < ONEBIT_PER_THREAD; k++) {
        int pos = x[k] >= 0.f;
        uint32_t bits = __ballot_sync(0xffffffffu, pos);
        if (threadIdx.x % 32 == 0) words[k * (ONEBIT_THREADS / 32) + threadIdx.x / 32] = bits;
        q[k] = pos ? sc : -sc;
    }
    if (threadIdx.x == 0) *scale = sc;
}

// onebit_sign: the decompressed element e of a group or chunk (words: its sign words, scale: e's scale).
__device__ inline float onebit_sign(const uint32_t* words, float scale, int e) {
    return (words[e / 32] >> (e % 32)) & 1u ? scale : -scale;
}

// onebit_at: the slab index of element j of a part whose elements are the slab's [lo, lo + n1) and then
// [lo2, lo2 + (n - n1)) (every part but the last has one range: n1 = n).
__host__ __device__ inline size_t onebit_at(size_t j, size_t lo, size_t n1, size_t lo2) {
    return j < n1 ? lo + j : lo2 + (j - n1);
}

// onebit_worker: step 1 for a part's n elements (slab indices onebit_at(j, lo, n1, lo2)), padded to `groups`
// groups (world chunks of `chunk`):
//   x = (b1 m + (1 - b1) clip g) / (sqrt(v / bc2) + eps) + err     (m: the last step's averaged momentum)
//   msgs: the compressed x, chunk j at j * onebit_msg_bytes(chunk); err = x - decompressed (j < n), in place.
// Layout: one block of 256 threads per group (grid-stride over groups); thread t: elements k * 256 + t.
__global__ void onebit_worker(unsigned char* msgs, float* err, const float* g, const float* m, const float* v,
                              size_t lo, size_t n1, size_t lo2, size_t n, size_t chunk, size_t groups, float b1,
                              float clip, float bc2, float eps) {
    __shared__ float red[ONEBIT_THREADS / 32];
    size_t per_chunk = chunk / ONEBIT_GROUP, mb = onebit_msg_bytes(chunk);
    for (size_t G = blockIdx.x; G < groups; G += gridDim.x) {
        size_t base = G * ONEBIT_GROUP, j = G / per_chunk, gg = G % per_chunk;
        uint32_t* words = (uint32_t*)(msgs + j * mb) + gg * (ONEBIT_GROUP / 32);
        float* scale = (float*)(msgs + j * mb + chunk / 8) + gg;
        int n_valid = base >= n ? 0 : (n - base < ONEBIT_GROUP ? (int)(n - base) : ONEBIT_GROUP);
        float x[ONEBIT_PER_THREAD], q[ONEBIT_PER_THREAD];
        for (int k = 0; k < ONEBIT_PER_THREAD; k++) {
            size_t e = base + k * ONEBIT_THREADS + threadIdx.x, i = onebit_at(e, lo, n1, lo2);
            x[k] = e < n ? (b1 * m[i] + (1.f - b1) * clip * g[i]) / (sqrtf(v[i] / bc2) + eps) + err[i] : 0.f;
        }
        onebit_compress_group(x, n_valid, words, scale, red, q);
        for (int k = 0; k < ONEBIT_PER_THREAD; k++) {
            size_t e = base + k * ONEBIT_THREADS + threadIdx.x;
            if (e < n) err[onebit_at(e, lo, n1, lo2)] = x[k] - q[k];
        }
    }
}

// onebit_server: step 3 on this rank's chunk of a part of n elements (the chunk's elements start at the part's
// element `first`): recv holds the world ranks' messages for it, rank q's at q * onebit_msg_bytes(chunk);
//   y = (sum over q = 0 .. world-1, in that order, of q's decompressed value) / world + err
// compressed into out (one message); err = y - decompressed (in place) (elements first + e < n only; past the part's
// end y = 0). Layout: one block of 256 threads per group of the chunk (grid-stride); thread t: k * 256 + t.
__global__ void onebit_server(unsigned char* out, float* err, const unsigned char* recv, int world, size_t chunk,
                              size_t first, size_t n) {
    __shared__ float red[ONEBIT_THREADS / 32];
    size_t per_chunk = chunk / ONEBIT_GROUP, mb = onebit_msg_bytes(chunk);
    for (size_t G = blockIdx.x; G < per_chunk; G += gridDim.x) {
        size_t base = first + G * ONEBIT_GROUP;
        int n_valid = base >= n ? 0 : (n - base < ONEBIT_GROUP ? (int)(n - base) : ONEBIT_GROUP);
        float y[ONEBIT_PER_THREAD], q[ONEBIT_PER_THREAD];
        for (int k = 0; k < ONEBIT_PER_THREAD; k++) y[k] = 0.f;
        for (int r = 0; r < world; r++) {
            const uint32_t* words = (const uint32_t*)(recv + r * mb) + G * (ONEBIT_GROUP / 32);
            float sc = ((const float*)(recv + r * mb + chunk / 8))[G];
            for (int k = 0; k < ONEBIT_PER_THREAD; k++)
                y[k] += onebit_sign(words, sc, k * ONEBIT_THREADS + threadIdx.x);
        }
        for (int k = 0; k < ONEBIT_PER_THREAD; k++) {
            int e = k * ONEBIT_THREADS + threadIdx.x;
            y[k] = e < n_valid ? y[k] / (float)world + err[G * ONEBIT_GROUP + e] : 0.f;
        }
        onebit_compress_group(y, n_valid, (uint32_t*)out + G * (ONEBIT_GROUP / 32), (float*)(out + chunk / 8) + G, red,
                              q);
        for (int k = 0; k < ONEBIT_PER_THREAD; k++) {
            int e = k * ONEBIT_THREADS + threadIdx.x;
            if (e < n_valid) err[G * ONEBIT_GROUP + e] = y[k] - q[k];
        }
    }
}

// onebit_adam_update: step 4 for a part's n elements (slab indices onebit_at(j, lo, n1, lo2)): u = the
// decompressed average (all: the world messages, chunk c at c * onebit_msg_bytes(chunk)) of the ranks' clipped
// D (b1 m + (1 - b1) c g), D = 1 / (sqrt(v / bc2) + eps) with v as the last variance step left it, is the averaged
// momentum in the update's units:
//   w -= lr * (u / bc1 + wd * w)   (weight decay on the first n_decay);  m = u / D
// and the floatX copy of w refreshed with stochastic rounding, hashed as adamw_update hashes (slab index,
// step). Layout: one thread per element, grid-stride.
__global__ void onebit_adam_update(float* master, floatX* params, float* m, const float* v, const unsigned char* all,
                                   size_t lo, size_t n1, size_t lo2, size_t n, size_t n_decay, size_t chunk, float lr,
                                   float eps, float wd, float bc1, float bc2, uint32_t seed) {
    size_t mb = onebit_msg_bytes(chunk);
    uint32_t hs = hash_u32(seed);
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        size_t c = j / chunk, e = j % chunk, i = onebit_at(j, lo, n1, lo2);
        const unsigned char* msg = all + c * mb;
        float ui = onebit_sign((const uint32_t*)msg, ((const float*)(msg + chunk / 8))[e / ONEBIT_GROUP], (int)e);
        float d = sqrtf(v[i] / bc2) + eps, w = master[i];
        w -= lr * (ui / bc1 + (i < n_decay ? wd * w : 0.f));
        m[i] = ui * d;
        master[i] = w;
        store_rounded(params + i, w, hash_u32((uint32_t)i * 0x9E3779B9u ^ hs));
    }
}

// ----------------------------------------------------------------------------
// The host side: buffers, and one step.

// A part: a range of the slab compressed and exchanged on its own, as soon as the backward has made it final
// (onebit_layout). Its elements j = 0 .. n-1 are the slab's [lo, lo + n1) and then [lo2, lo2 + n - n1).
typedef struct {
    size_t lo, n1, lo2, n;
    size_t chunk;       // elements per rank's chunk of the part: world * chunk >= n, a multiple of ONEBIT_GROUP
    size_t msg_bytes;   // bytes of one compressed chunk
    size_t msg_off;     // where the part's world messages start in send, recv and gathered
    size_t server_off;  // where this rank's server error for its chunk of the part starts in server_err
    int event;          // the backward event (GradReduce.ready) after which the part's gradients are final
} OneBitPart;

typedef struct OneBit {
    int refresh;    // --comm-refresh: the longest spacing of the variance steps after the warm-up (0: none)
    int var_steps;  // --comm-var-steps: the variance steps at each spacing below `refresh` (0/1 Adam's kappa)
    int warmup;     // --comm-warmup: steps of AdamW with the bf16 all-reduce; then the variance steps (onebit_schedule)
    int world, rank;
    size_t numel;         // the slab's elements
    int n_parts;          // parts, in launch order
    OneBitPart* part;     // (n_parts)
    size_t msg_total;     // bytes of world messages of every part (the size of send, recv and gathered)
    size_t server_total;  // elements of this rank's server errors (its chunk of every part)
    // the device side (onebit_alloc)
    float* worker_err;           // (numel) this rank's worker error e_r, by slab index
    float* server_err;           // (server_total) this rank's server error s_j for its chunk j = rank of every part
    unsigned char* send;         // (msg_total) this rank's compressed x, part p's chunk j for rank j
    unsigned char* recv;         // (msg_total) every rank's compressed chunk `rank` of every part
    unsigned char* gathered;     // (msg_total) the compressed averaged momentum, part p's chunk j from rank j
    cudaEvent_t* updated;        // (n_parts) --comm onebit: recorded on the communication stream once part p's weights
                                 // are updated (onebit_step_forward)
    cudaEvent_t* weights_ready;  // --comm onebit: BertModel.weights_ready (the trainer's onebit_setup; NULL: none)
} OneBit;

// onebit_chunk: elements per rank's chunk for a slab of numel elements on `world` ranks: world * chunk >= numel,
// a multiple of ONEBIT_GROUP.
static inline size_t onebit_chunk(size_t numel, int world) {
    size_t per = (numel + (size_t)world - 1) / (size_t)world;
    size_t chunk = (per + ONEBIT_GROUP - 1) / ONEBIT_GROUP * ONEBIT_GROUP;
    return chunk ? chunk : ONEBIT_GROUP;
}
// onebit_server_elems: elements of rank q's chunk that lie inside a part (or slab) of numel elements (the rest of its
// server error is 0).
static inline size_t onebit_server_elems(size_t numel, size_t chunk, int q) {
    size_t lo = (size_t)q * chunk;
    return lo >= numel ? 0 : (numel - lo < chunk ? numel - lo : chunk);
}

// The variance steps (0/1 Adam's policy, Lu et al. 2022, as DeepSpeed's ZeroOneAdam schedules them): after the
// --comm-warmup steps of AdamW, v is updated only on AdamW steps (the averaged gradient g, all-reduced in bf16; m
// and v updated), the other steps compressed. Their spacing starts at 1 and doubles after every S of them
// (--comm-var-steps, default ONEBIT_VAR_SCALER; 1, 2, 4, ...) until it would reach --comm-refresh K; from then on every
// K steps. An update is lazy: v, last updated I steps before, is updated as if each of the I steps since had seen this
// step's g^2,
//   v = b2^I v + (1 - b2^I) g^2          (onebit_var_decay: b2^I)
// so that v keeps the horizon of AdamW's (1 / (1 - b2) steps) rather than of I updates, and its bias correction
// is AdamW's at the step of v's last update t_v (onebit_v_step): bc2 = 1 - b2^t_v (if every step's g^2 has the
// same mean s, E[v] = (1 - b2^t_v) s).
// onebit_schedule: for warm-up W, S variance steps at each spacing and longest spacing K (0: no variance step after
// the warm-up), the last step <= t that updated v (t itself during the warm-up), and in *count the AdamW steps up
// to t (warm-up included).
static inline int onebit_schedule(int W, int S, int K, int t, int* count) {
    int64_t s = W, n = W, gap = 1, span;
    if (t <= W || K <= 0) {
        *count = t <= W ? t : W;
        return t <= W ? t : W;
    }
    for (; gap < K && S > 0; gap *= 2, s += span, n += S) {
        span = (int64_t)S * gap;  // the steps at this spacing
        if (t - s < span) {
            *count = (int)(n + (t - s) / gap);
            return (int)(s + (t - s) / gap * gap);
        }
    }
    *count = (int)(n + (t - s) / K);
    return (int)(s + (t - s) / K * K);
}
// onebit_v_step: the step of v's last update by the end of step t.
static inline int onebit_v_step(const OneBit* ob, int t) {
    int n;
    return onebit_schedule(ob->warmup, ob->var_steps, ob->refresh, t, &n);
}
// onebit_is_refresh: step t, after the warm-up, is a variance step (an AdamW step).
static inline int onebit_is_refresh(const OneBit* ob, int t) { return t > ob->warmup && onebit_v_step(ob, t) == t; }
// onebit_var_decay: the share of v that variance step t keeps: b2^I, I the steps since v's last update.
static inline float onebit_var_decay(const OneBit* ob, int t, float b2) {
    return powf(b2, (float)(t - onebit_v_step(ob, t - 1)));
}

// onebit_tail_event: the first backward event (of n_events: comm.h's) whose buckets go into the last part: layer
// 0's (bert_grad_ready_lo: after it only the embedding backward runs, a gather with no matmul) and the last.
static inline int onebit_tail_event(int n_events) { return n_events > 2 ? n_events - 2 : n_events - 1; }

// onebit_layout: the parts of the slab of g's gradient buckets (comm.h: grad_reduce_layout) on g->comm's world
// ranks, and their sizes (no device memory yet). The buckets final before layer 0's backward ends, in launch
// order (each directly below the one before), are merged into parts of at most part_elems elements (a bucket
// at least that large alone; 0: a part per bucket), each exchanged once its last bucket is final, while the
// backward goes on; the buckets final after it (layer 0's, the vector region [v, numel) and the embeddings:
// two ranges, [v, numel) and [0, h)) are one part, exchanged after the backward's last event, so that what the
// backward cannot hide pays one latency. Each part's all-gather costs a latency that grows with the number of
// nodes (a ring), so parts larger than the fp32 buckets pay off (ONEBIT_PART_BUCKETS). part_elems SIZE_MAX: the
// whole slab is one part (--comm onebit, which sends after the backward: one latency). Exits with a message if the
// last part's buckets are not two ranges.
static inline void onebit_layout(OneBit* ob, const GradReduce* g, int rank, int warmup, size_t part_elems) {
    memset(ob, 0, sizeof *ob);
    ob->warmup = warmup, ob->world = g->comm->world, ob->rank = rank, ob->numel = g->numel;
    ob->part = (OneBitPart*)calloc((size_t)g->n + 1, sizeof(OneBitPart));
    if (!ob->part) {
        fprintf(stderr, "compress: out of host memory for %d parts\n", g->n + 1);
        exit(1);
    }
    int last = part_elems == SIZE_MAX ? 0 : onebit_tail_event(g->n_events), ranges = 0;
    size_t lo[2] = {0, 0}, hi[2] = {0, 0};  // the last part's buckets as ranges, merged
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        if (b->event < last) {  // into the part before (the range just above it), or a new part
            OneBitPart* p = ob->n_parts ? &ob->part[ob->n_parts - 1] : NULL;
            if (p && p->lo == b->lo + b->n && p->n + b->n <= part_elems) {
                p->lo = p->lo2 = b->lo, p->n1 = p->n = p->n + b->n, p->event = b->event;
            } else {
                p = &ob->part[ob->n_parts++];
                p->lo = p->lo2 = b->lo, p->n1 = p->n = b->n, p->event = b->event;
            }
            continue;
        }
        int r = 0;
        while (r < ranges && b->lo + b->n != lo[r] && b->lo != hi[r]) r++;
        if (r == 2) {
            fprintf(stderr, "compress: the gradients final at the backward's end are not two ranges of the slab\n");
            exit(1);
        }
        if (r == ranges) lo[r] = hi[r] = b->lo, ranges++;
        if (b->lo < lo[r]) lo[r] = b->lo;
        if (b->lo + b->n > hi[r]) hi[r] = b->lo + b->n;
    }
    if (ranges) {
        OneBitPart* p = &ob->part[ob->n_parts++];
        p->lo = lo[0], p->n1 = hi[0] - lo[0], p->lo2 = ranges > 1 ? lo[1] : hi[0];
        p->n = p->n1 + (ranges > 1 ? hi[1] - lo[1] : 0), p->event = g->n_events - 1;
    }
    for (int i = 0; i < ob->n_parts; i++) {
        OneBitPart* p = &ob->part[i];
        p->chunk = onebit_chunk(p->n, ob->world);
        p->msg_bytes = onebit_msg_bytes(p->chunk);
        p->msg_off = ob->msg_total, p->server_off = ob->server_total;
        ob->msg_total += (size_t)ob->world * p->msg_bytes;
        ob->server_total += p->chunk;
    }
}

// onebit_part_of: the part that holds slab element x (-1: none).
static inline int onebit_part_of(const OneBit* ob, size_t x) {
    for (int i = 0; i < ob->n_parts; i++) {
        const OneBitPart* p = &ob->part[i];
        if ((x >= p->lo && x < p->lo + p->n1) || (x >= p->lo2 && x < p->lo2 + (p->n - p->n1))) return i;
    }
    return -1;
}

// onebit_device_bytes: what onebit_alloc allocates (for the memory plan).
static inline size_t onebit_device_bytes(const OneBit* ob) {
    return (ob->numel + ob->server_total) * sizeof(float) + 3 * ob->msg_total;
}

// onebit_step_bytes: bytes this rank sends in one compressed step (every part's all-to-all and all-gather).
static inline uint64_t onebit_step_bytes(const OneBit* ob) {
    uint64_t b = 0;
    for (int i = 0; ob->world > 1 && i < ob->n_parts; i++) b += 2 * (uint64_t)(ob->world - 1) * ob->part[i].msg_bytes;
    return b;
}

static inline void onebit_alloc(OneBit* ob) {
    CUDA_CHECK(cudaMalloc((void**)&ob->worker_err, ob->numel * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ob->server_err, ob->server_total * sizeof(float)));
    CUDA_CHECK(cudaMemset(ob->worker_err, 0, ob->numel * sizeof(float)));
    CUDA_CHECK(cudaMemset(ob->server_err, 0, ob->server_total * sizeof(float)));
    unsigned char** bufs[3] = {&ob->send, &ob->recv, &ob->gathered};
    for (int k = 0; k < 3; k++) {
        CUDA_CHECK(cudaMalloc((void**)bufs[k], ob->msg_total));
        CUDA_CHECK(cudaMemset(*bufs[k], 0, ob->msg_total));
    }
    ob->updated = (cudaEvent_t*)malloc(ob->n_parts * sizeof(cudaEvent_t));
    for (int i = 0; i < ob->n_parts; i++) CUDA_CHECK(cudaEventCreateWithFlags(&ob->updated[i], cudaEventDisableTiming));
}

static inline void onebit_free(OneBit* ob) {
    cudaFree(ob->worker_err), cudaFree(ob->server_err);
    cudaFree(ob->send);
    cudaFree(ob->recv);
    cudaFree(ob->gathered);
    for (int i = 0; ob->updated && i < ob->n_parts; i++) cudaEventDestroy(ob->updated[i]);
    free(ob->updated);
    free(ob->weights_ready);
    free(ob->part);
    memset(ob, 0, sizeof *ob);
}

static inline dim3 onebit_grid(size_t blocks) {
    size_t cap = (size_t)launch_grid_cap();
    return dim3((unsigned)(blocks < 1 ? 1 : blocks > cap ? cap : blocks));
}

// onebit_exchange: the all-to-all of step 2 for part p (its send -> recv), in one group of sends and receives.
static inline void onebit_exchange(OneBit* ob, const OneBitPart* p, Comm* c, cudaStream_t s) {
    unsigned char *send = ob->send + p->msg_off, *recv = ob->recv + p->msg_off;
    size_t mb = p->msg_bytes;
    if (ob->world == 1) {
        CUDA_CHECK(cudaMemcpyAsync(recv, send, mb, cudaMemcpyDeviceToDevice, s));
        return;
    }
    comm_check(c, ncclGroupStart(), "1-bit all-to-all (ncclGroupStart)");
    for (int q = 0; q < ob->world; q++) {
        comm_check(c, ncclSend(send + q * mb, mb, ncclUint8, q, c->nccl, s), "1-bit all-to-all (ncclSend)");
        comm_check(c, ncclRecv(recv + q * mb, mb, ncclUint8, q, c->nccl, s), "1-bit all-to-all (ncclRecv)");
        comm_count(c, COMM_SEND, mb, q);
    }
    comm_check(c, ncclGroupEnd(), "1-bit all-to-all");
    c->calls++;
}

// onebit_part_launch: steps 1 to 3 and the all-gather of part i of a compressed step of the model's step m_step
// (counted from 1, > warmup), on g's communication stream after the part's backward event. grad, m, v: the slab's
// gradient and AdamW moments; clip scales grad.
static inline void onebit_part_launch(OneBit* ob, GradReduce* g, int i, int m_step, const float* grad, const float* m,
                                      const float* v, float b1, float b2, float eps, float clip) {
    Comm* c = g->comm;
    cudaStream_t s = g->stream;
    float bc2 = 1.f - powf(b2, (float)onebit_v_step(ob, m_step));
    const OneBitPart* p = &ob->part[i];
    size_t groups = (size_t)ob->world * p->chunk / ONEBIT_GROUP;
    unsigned char* mine = ob->gathered + p->msg_off + (size_t)ob->rank * p->msg_bytes;
    CUDA_CHECK(cudaStreamWaitEvent(s, g->ready[p->event], 0));
    launch(onebit_worker, onebit_grid(groups), dim3(ONEBIT_THREADS), 0, s, ob->send + p->msg_off, ob->worker_err, grad,
           m, v, p->lo, p->n1, p->lo2, p->n, p->chunk, groups, b1, clip, bc2, eps);
    onebit_exchange(ob, p, c, s);
    launch(onebit_server, onebit_grid(p->chunk / ONEBIT_GROUP), dim3(ONEBIT_THREADS), 0, s, mine,
           ob->server_err + p->server_off, (const unsigned char*)ob->recv + p->msg_off, ob->world, p->chunk,
           (size_t)ob->rank * p->chunk, p->n);
    if (ob->world > 1) {
        comm_check(c, ncclAllGather(mine, ob->gathered + p->msg_off, p->msg_bytes, ncclUint8, c->nccl, s),
                   "1-bit all-gather");
        comm_count(c, COMM_ALLGATHER, p->msg_bytes, 0);
    }
}

// onebit_part_update: step 4 of part i, on stream s.
static inline void onebit_part_update(OneBit* ob, cudaStream_t s, int i, int m_step, float* master, floatX* w, float* m,
                                      const float* v, size_t n_decay, float lr, float b1, float b2, float eps,
                                      float wd) {
    float bc1 = 1.f - powf(b1, (float)m_step), bc2 = 1.f - powf(b2, (float)onebit_v_step(ob, m_step));
    const OneBitPart* p = &ob->part[i];
    launch(onebit_adam_update, onebit_grid((p->n + 255) / 256), dim3(256), 0, s, master, w, m, v,
           (const unsigned char*)ob->gathered + p->msg_off, p->lo, p->n1, p->lo2, p->n, n_decay, p->chunk, lr, eps, wd,
           bc1, bc2, (uint32_t)m_step);
}

// onebit_step_forward: --comm onebit's whole compressed step after the host sync (the clip factor known), on g's
// communication stream, part by part in the forward's order (the layout's reversed: the last part, with the
// embeddings, layer 0 and the vector region, first; then up the layers to the head): steps 1 to 4 of each part,
// then ob->updated[i]; at the end the gradients are zeroed there (the workers have read them) and g->done is
// recorded. The compute stream does not wait: the next step's forward waits for each layer's part
// (BertModel.weights_ready, which the trainer's onebit_setup points at these events), so the exchange of the upper
// layers runs under the forward of the lower ones. Anything else that reads the weights, the moments, the errors or the
// gradients first waits for g->done (the trainer's onebit_settle).
static inline void onebit_step_forward(OneBit* ob, GradReduce* g, int m_step, float* grad, float* master, floatX* w,
                                       float* m, const float* v, size_t n_decay, float lr, float b1, float b2,
                                       float eps, float wd, float clip) {
    for (int i = ob->n_parts - 1; i >= 0; i--) {
        onebit_part_launch(ob, g, i, m_step, grad, m, v, b1, b2, eps, clip);
        onebit_part_update(ob, g->stream, i, m_step, master, w, m, v, n_decay, lr, b1, b2, eps, wd);
        CUDA_CHECK(cudaEventRecord(ob->updated[i], g->stream));
    }
    CUDA_CHECK(cudaMemsetAsync(grad, 0, ob->numel * sizeof(float), g->stream));
    CUDA_CHECK(cudaEventRecord(g->done, g->stream));
}

// onebit_refresh_update: a variance step (onebit_is_refresh(ob, m_step)) of the slab: adamw_update of the averaged
// gradient g with v's decay b2^I (onebit_var_decay) and bc2 = 1 - b2^m_step (onebit_v_step), on stream s:
//   m = b1 m + (1 - b1) g;  v = b2^I v + (1 - b2^I) g^2;  w -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd w)
static inline void onebit_refresh_update(const OneBit* ob, cudaStream_t s, int m_step, float* master, floatX* w,
                                         const float* g, float* m, float* v, size_t n_decay, const float* norm,
                                         float lr, float b1, float b2, float eps, float wd, float max_norm) {
    float bc1 = 1.f - powf(b1, (float)m_step), bc2 = 1.f - powf(b2, (float)onebit_v_step(ob, m_step));
    launch(adamw_update, onebit_grid((ob->numel + 1023) / 1024), dim3(256), 0, s, master, w, g, m, v, ob->numel,
           n_decay, lr, b1, onebit_var_decay(ob, m_step, b2), eps, wd, bc1, bc2, norm, max_norm, (uint32_t)m_step,
           (size_t)0);
}

// ----------------------------------------------------------------------------
