// compress.h: --comm onebit, 1-bit Adam (Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale
// Training with Adam's Convergence Speed"; DeepSpeed's OnebitAdam).
//
// The first --comm-warmup steps are plain AdamW with fp32 gradient all-reduce (comm.h's buckets). At the end
// of the warm-up the variance v is frozen; from then on no gradient crosses the network, only the momentum,
// as one bit per element plus one fp32 scale per group of ONEBIT_GROUP elements. With v frozen the update
// w -= lr (m / bc1 D + wd w), D = 1 / (sqrt(v / bc2) + eps) (bc2 = 1 - b2^warmup frozen too; bc1 = 1 - b1^t
// keeps counting, so the step continues the warm-up's AdamW), is linear in m, so averaging m over ranks and
// then scaling by D is the same as averaging u = D m. mlm.c compresses u, the momentum in the units of the
// update, rather than m itself as the paper does: within a group every element of u is of the same order
// (Adam's normalized step), so one sign and one scale per group fit it better; and an element whose v is 0
// (a parameter with no gradient in the warm-up, such as the positions past --seq) gets u = 0 instead of
// m / eps (its decompressed u is still +-scale of its group: such a weight moves by about lr per step;
// DeepSpeed's 1-bit Adam v2 masks them, mlm.c does not). Measured on the tiny model (1 rank, 5 warm-up steps,
// 15 compressed, groups of 2048), the loss after step 20 was 4.647 compressing u and 4.693 compressing m
// (fp32 AdamW 4.563; frozen v without compression 4.460).
//   1. worker (every rank r, its accumulated gradient g_r, clipped): x = D (b1 m + (1 - b1) g_r) + e_r, where
//      m is the averaged momentum of the last step (the same on every rank) and e_r this rank's worker error;
//      x is compressed (below) and e_r = x - decompress(compress(x)).
//   2. all-to-all (ncclSend/ncclRecv in a group): the slab, padded to P chunks of `chunk` elements, is cut
//      into P chunks; rank j receives every rank's compressed chunk j.
//   3. server (rank j): y = (1/P) sum_q decompress(q's chunk j) + s_j (its server error), compressed again,
//      s_j = y - decompress(compress(y)).
//   4. all-gather of the P compressed chunks: every rank decompresses the same bits, u, so every rank holds
//      the same averaged momentum m = u / D and applies w -= lr (u / bc1 + wd w).
// Compression of a group of n elements x: one bit per element, set when x >= 0, and the scale
// s = |x|_1 / n; decompressed, x_i ~ (bit ? s : -s). (|x|_1 / n is the scale that minimizes the squared
// error of s * sign(x).) Elements past the slab's end (the last chunk's padding) are 0 and not counted.
// A compressed chunk of C elements (a message): C / 32 uint32 sign words (bit b of word w: element
// 32 w + b), then C / ONEBIT_GROUP fp32 scales: C / 8 + 4 C / ONEBIT_GROUP bytes.
// Bytes a rank sends per step: (P - 1) messages in the all-to-all and (P - 1) in the all-gather, about
// 2 (P-1)/P (n/8 + 4 n / ONEBIT_GROUP) for n parameters, against fp32's ring all-reduce 2 (P-1)/P 4 n: 28.4x
// fewer (ONEBIT_GROUP 2048 would give 31.5x; 256 lowered the tiny model's loss after step 20 from 4.647 to 4.631).
// With P = 1 the same compression runs (the all-to-all and all-gather are copies), so its effect on the loss
// shows on one GPU.
#pragma once
#include "kernels.cuh"  // warp_sum, hash_u32, store_rounded, launch
#include "comm.h"       // Comm, comm_check, comm_count

#define ONEBIT_GROUP 256  // elements per scale: one block of ONEBIT_THREADS threads, ONEBIT_PER_THREAD each
#define ONEBIT_THREADS 256
#define ONEBIT_PER_THREAD (ONEBIT_GROUP / ONEBIT_THREADS)
// --comm-refresh's default: every 100th step after the warm-up is an fp32 AdamW step that refreshes the frozen
// variance (lazily: v = b2^100 v + (1 - b2^100) g^2). In the 500-step 4-rank mini runs (README) it brings
// onebit from +1.62% to +0.96% of fp32's validation loss (every 10, 40 or 50 steps: the same within 0.1%), at
// 22x fewer bytes than fp32 instead of 28x.
#define ONEBIT_REFRESH_DEFAULT 100

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

// onebit_worker: step 1 for the slab's n elements, padded to `groups` groups (world chunks of `chunk`):
//   x = (b1 m + (1 - b1) clip g) / (sqrt(v / bc2) + eps) + err,  clip = min(1, max_norm / norm[0]) (none when
//   max_norm <= 0)
//   msgs: the compressed x, chunk j at j * onebit_msg_bytes(chunk); err = x - decompressed (i < n).
// Layout: one block of 256 threads per group (grid-stride over groups); thread t: elements k * 256 + t.
__global__ void onebit_worker(unsigned char* msgs, float* err, const float* g, const float* m, size_t n, size_t chunk,
                              size_t groups, float b1, const float* norm, float max_norm, const float* v, float bc2,
                              float eps) {
    __shared__ float red[ONEBIT_THREADS / 32];
    float clip = 1.f;
    if (max_norm > 0.f && norm[0] > max_norm) clip = max_norm / norm[0];
    size_t per_chunk = chunk / ONEBIT_GROUP, mb = onebit_msg_bytes(chunk);
    for (size_t G = blockIdx.x; G < groups; G += gridDim.x) {
        size_t base = G * ONEBIT_GROUP, j = G / per_chunk, gg = G % per_chunk;
        uint32_t* words = (uint32_t*)(msgs + j * mb) + gg * (ONEBIT_GROUP / 32);
        float* scale = (float*)(msgs + j * mb + chunk / 8) + gg;
        int n_valid = base >= n ? 0 : (n - base < ONEBIT_GROUP ? (int)(n - base) : ONEBIT_GROUP);
        float x[ONEBIT_PER_THREAD], q[ONEBIT_PER_THREAD];
        for (int k = 0; k < ONEBIT_PER_THREAD; k++) {
            size_t i = base + k * ONEBIT_THREADS + threadIdx.x;
            x[k] = i < n ? (b1 * m[i] + (1.f - b1) * clip * g[i]) / (sqrtf(v[i] / bc2) + eps) + err[i] : 0.f;
        }
        onebit_compress_group(x, n_valid, words, scale, red, q);
        for (int k = 0; k < ONEBIT_PER_THREAD; k++) {
            size_t i = base + k * ONEBIT_THREADS + threadIdx.x;
            if (i < n) err[i] = x[k] - q[k];
        }
    }
}

// onebit_server: step 3 on this rank's chunk (its elements start at slab index `first`): recv holds the
// world ranks' messages for it, rank q's at q * onebit_msg_bytes(chunk);
//   y = (sum over q = 0 .. world-1, in that order, of q's decompressed value) / world + err
// compressed into out (one message); err = y - decompressed (elements first + e < n only; past the slab's
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

// onebit_adam_update: step 4 for the slab's n elements: u = the decompressed average (all: the world
// messages, chunk j at j * onebit_msg_bytes(chunk)), then with the frozen v
//   w -= lr * (u / bc1 + wd * w)   (weight decay on the first n_decay elements);  m = u * (sqrt(v / bc2) + eps)
// and the floatX copy of w refreshed with stochastic rounding, hashed as adamw_update hashes (slab index,
// step). Layout: one thread per element, grid-stride.
__global__ void onebit_adam_update(float* master, floatX* params, float* m, const float* v, const unsigned char* all,
                                   size_t n, size_t n_decay, size_t chunk, float lr, float eps, float wd, float bc1,
                                   float bc2, uint32_t seed) {
    size_t mb = onebit_msg_bytes(chunk);
    uint32_t hs = hash_u32(seed);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t j = i / chunk, e = i % chunk;
        const unsigned char* msg = all + j * mb;
        float ui = onebit_sign((const uint32_t*)msg, ((const float*)(msg + chunk / 8))[e / ONEBIT_GROUP], (int)e);
        float w = master[i];
        w -= lr * (ui / bc1 + (i < n_decay ? wd * w : 0.f));
        m[i] = ui * (sqrtf(v[i] / bc2) + eps);
        master[i] = w;
        store_rounded(params + i, w, hash_u32((uint32_t)i * 0x9E3779B9u ^ hs));
    }
}

// ----------------------------------------------------------------------------
// The host side: buffers, and one step.

typedef struct OneBit {
    int refresh;  // --comm-refresh: every `refresh` steps after the warm-up an fp32 AdamW step updates v (0: never)
    int warmup;   // --comm-warmup: steps of AdamW with fp32 all-reduce; v is frozen after step `warmup`
    int world, rank;
    size_t numel;      // the slab's elements
    size_t chunk;      // elements per rank's chunk: world * chunk >= numel, a multiple of ONEBIT_GROUP
    size_t msg_bytes;  // bytes of one compressed chunk
    // the device side (onebit_alloc)
    float* worker_err;        // (numel) this rank's worker error e_r
    float* server_err;        // (chunk) this rank's server error s_j, for its chunk j = rank
    unsigned char* send;      // (world * msg_bytes) this rank's compressed x, chunk j for rank j
    unsigned char* recv;      // (world * msg_bytes) every rank's compressed chunk `rank`
    unsigned char* gathered;  // (world * msg_bytes) the compressed averaged momentum, chunk j from rank j
} OneBit;

// onebit_chunk: elements per rank's chunk for a slab of numel elements on `world` ranks: world * chunk >= numel,
// a multiple of ONEBIT_GROUP.
static inline size_t onebit_chunk(size_t numel, int world) {
    size_t per = (numel + (size_t)world - 1) / (size_t)world;
    size_t chunk = (per + ONEBIT_GROUP - 1) / ONEBIT_GROUP * ONEBIT_GROUP;
    return chunk ? chunk : ONEBIT_GROUP;
}
// onebit_server_elems: elements of rank q's chunk that lie inside the slab (the rest of its server error is 0).
static inline size_t onebit_server_elems(size_t numel, size_t chunk, int q) {
    size_t lo = (size_t)q * chunk;
    return lo >= numel ? 0 : (numel - lo < chunk ? numel - lo : chunk);
}

// Variance refresh (--comm-refresh K, default ONEBIT_REFRESH_DEFAULT; 0/1 Adam's idea): steps warmup + K, warmup + 2K,
// ... are fp32 AdamW steps (the averaged gradient g; m and v updated), the others compressed. A refresh is lazy: v,
// last updated K steps before, is updated as if each of the K steps since had seen this step's g^2,
//   v = b2^K v + (1 - b2^K) g^2          (onebit_refresh_decay: b2^K)
// so that v keeps the horizon of AdamW's (1 / (1 - b2) steps) rather than of K updates, and its bias correction
// is AdamW's at the step of v's last update t_v (onebit_v_step): bc2 = 1 - b2^t_v (if every step's g^2 has the
// same mean s, E[v] = (1 - b2^t_v) s). The kept share b2^K bounds how far one noisy g^2 can shrink v: an
// element's step grows at most 1 / sqrt(b2^K) (1.66x at K = 50, b2 = 0.98).
static inline int onebit_is_refresh(const OneBit* ob, int t) {
    return ob->refresh > 0 && t > ob->warmup && (t - ob->warmup) % ob->refresh == 0;
}
// onebit_v_step: the step of v's last update by the end of step t (t itself during the warm-up).
static inline int onebit_v_step(const OneBit* ob, int t) {
    if (t <= ob->warmup) return t;
    return ob->warmup + (ob->refresh > 0 ? (t - ob->warmup) / ob->refresh * ob->refresh : 0);
}
// onebit_refresh_decay: the share b2^K of v that a refresh keeps.
static inline float onebit_refresh_decay(const OneBit* ob, float b2) { return powf(b2, (float)ob->refresh); }

// onebit_layout: the sizes for a slab of numel elements on `world` ranks (no device memory yet).
static inline void onebit_layout(OneBit* ob, size_t numel, int world, int rank, int warmup) {
    memset(ob, 0, sizeof *ob);
    ob->warmup = warmup, ob->world = world, ob->rank = rank, ob->numel = numel;
    ob->chunk = onebit_chunk(numel, world);
    ob->msg_bytes = onebit_msg_bytes(ob->chunk);
}

// onebit_device_bytes: what onebit_alloc allocates (for the memory plan).
static inline size_t onebit_device_bytes(const OneBit* ob) {
    return (ob->numel + ob->chunk) * sizeof(float) + 3 * (size_t)ob->world * ob->msg_bytes;
}

// onebit_step_bytes: bytes this rank sends in one compressed step (the all-to-all and the all-gather).
static inline uint64_t onebit_step_bytes(const OneBit* ob) {
    return ob->world > 1 ? 2 * (uint64_t)(ob->world - 1) * ob->msg_bytes : 0;
}

static inline void onebit_alloc(OneBit* ob) {
    size_t mbs = (size_t)ob->world * ob->msg_bytes;
    CUDA_CHECK(cudaMalloc((void**)&ob->worker_err, ob->numel * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ob->server_err, ob->chunk * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ob->send, mbs));
    CUDA_CHECK(cudaMalloc((void**)&ob->recv, mbs));
    CUDA_CHECK(cudaMalloc((void**)&ob->gathered, mbs));
    CUDA_CHECK(cudaMemset(ob->worker_err, 0, ob->numel * sizeof(float)));
    CUDA_CHECK(cudaMemset(ob->server_err, 0, ob->chunk * sizeof(float)));
    CUDA_CHECK(cudaMemset(ob->send, 0, mbs));
    CUDA_CHECK(cudaMemset(ob->recv, 0, mbs));
    CUDA_CHECK(cudaMemset(ob->gathered, 0, mbs));
}

static inline void onebit_free(OneBit* ob) {
    cudaFree(ob->worker_err);
    cudaFree(ob->server_err);
    cudaFree(ob->send);
    cudaFree(ob->recv);
    cudaFree(ob->gathered);
    ob->worker_err = ob->server_err = NULL;
    ob->send = ob->recv = ob->gathered = NULL;
}

static inline dim3 onebit_grid(size_t blocks) {
    size_t cap = (size_t)launch_grid_cap();
    return dim3((unsigned)(blocks < 1 ? 1 : blocks > cap ? cap : blocks));
}

// onebit_exchange: the all-to-all of step 2 (send -> recv), in one group of sends and receives.
static inline void onebit_exchange(OneBit* ob, Comm* c, cudaStream_t s) {
    if (ob->world == 1) {
        CUDA_CHECK(cudaMemcpyAsync(ob->recv, ob->send, ob->msg_bytes, cudaMemcpyDeviceToDevice, s));
        return;
    }
    size_t mb = ob->msg_bytes;
    comm_check(c, ncclGroupStart(), "1-bit all-to-all (ncclGroupStart)");
    for (int q = 0; q < ob->world; q++) {
        comm_check(c, ncclSend(ob->send + q * mb, mb, ncclUint8, q, c->nccl, s), "1-bit all-to-all (ncclSend)");
        comm_check(c, ncclRecv(ob->recv + q * mb, mb, ncclUint8, q, c->nccl, s), "1-bit all-to-all (ncclRecv)");
        comm_count(c, COMM_SEND, mb, q);
    }
    comm_check(c, ncclGroupEnd(), "1-bit all-to-all");
    c->calls++;
}

// onebit_step: one compressed 1-bit Adam step (steps 1 to 4 above) of the model's step m_step (counted
// from 1, > warmup): g, m, v, master and w are the slab's gradient, AdamW moments, fp32 and floatX
// weights; norm (device) the norm for clipping. All on stream s.
static inline void onebit_step(OneBit* ob, Comm* c, cudaStream_t s, int m_step, float* master, floatX* w,
                               const float* g, float* m, const float* v, size_t n_decay, const float* norm, float lr,
                               float b1, float b2, float eps, float wd, float max_norm) {
    size_t groups = (size_t)ob->world * ob->chunk / ONEBIT_GROUP, mb = ob->msg_bytes;
    float bc1 = 1.f - powf(b1, (float)m_step), bc2 = 1.f - powf(b2, (float)onebit_v_step(ob, m_step));
    launch(onebit_worker, onebit_grid(groups), dim3(ONEBIT_THREADS), 0, s, ob->send, ob->worker_err, g, (const float*)m,
           ob->numel, ob->chunk, groups, b1, norm, max_norm, v, bc2, eps);
    onebit_exchange(ob, c, s);
    unsigned char* mine = ob->gathered + (size_t)ob->rank * mb;
    launch(onebit_server, onebit_grid(ob->chunk / ONEBIT_GROUP), dim3(ONEBIT_THREADS), 0, s, mine, ob->server_err,
           (const unsigned char*)ob->recv, ob->world, ob->chunk, (size_t)ob->rank * ob->chunk, ob->numel);
    if (ob->world > 1) {
        comm_check(c, ncclAllGather(mine, ob->gathered, mb, ncclUint8, c->nccl, s), "1-bit all-gather");
        comm_count(c, COMM_ALLGATHER, mb, 0);
    }
    launch(onebit_adam_update, onebit_grid((ob->numel + 255) / 256), dim3(256), 0, s, master, w, m, v,
           (const unsigned char*)ob->gathered, ob->numel, n_decay, ob->chunk, lr, eps, wd, bc1, bc2, (uint32_t)m_step);
}

// onebit_refresh_update: a refresh step (onebit_is_refresh(ob, m_step)) of the slab: adamw_update of the averaged
// gradient g with v's decay b2^K (onebit_refresh_decay) and bc2 = 1 - b2^m_step (onebit_v_step), on stream s:
//   m = b1 m + (1 - b1) g;  v = b2^K v + (1 - b2^K) g^2;  w -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd w)
static inline void onebit_refresh_update(const OneBit* ob, cudaStream_t s, int m_step, float* master, floatX* w,
                                         const float* g, float* m, float* v, size_t n_decay, const float* norm,
                                         float lr, float b1, float b2, float eps, float wd, float max_norm) {
    float bc1 = 1.f - powf(b1, (float)m_step), bc2 = 1.f - powf(b2, (float)onebit_v_step(ob, m_step));
    launch(adamw_update, onebit_grid((ob->numel + 1023) / 1024), dim3(256), 0, s, master, w, g, m, v, ob->numel,
           n_decay, lr, b1, onebit_refresh_decay(ob, b2), eps, wd, bc1, bc2, norm, max_norm, (uint32_t)m_step,
           (size_t)0);
}

// ----------------------------------------------------------------------------
// Checkpoints. The compression state is each rank's worker error (numel) and server error (its chunk's
// elements inside the slab: onebit_server_elems); the momentum m is the same on every rank and v is AdamW's,
// both already in the checkpoint. The trainer appends, after the AdamW regions, rank 0's worker error, rank 1's,
// ..., then rank 0's server error, rank 1's, ...: (world + 1) numel floats in all (onebit_ckpt_bytes). A run
// resumed on the same number of ranks continues with the very errors (byte-identical to an uninterrupted run).

static inline uint64_t onebit_ckpt_bytes(size_t numel, int world) {
    return world > 0 ? ((uint64_t)world + 1) * numel * sizeof(float) : 0;
}

// onebit_fetch: rank q's worker error (server = 0) or server error (server = 1) into dst on every rank (an
// ncclBroadcast from q; one rank: a copy); gives its number of elements. Synchronizes s.
static inline size_t onebit_fetch(OneBit* ob, Comm* c, int q, int server, float* dst, cudaStream_t s) {
    size_t n = server ? onebit_server_elems(ob->numel, ob->chunk, q) : ob->numel;
    const float* src = server ? ob->server_err : ob->worker_err;
    if (ob->world == 1) {
        if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
    } else {
        if (n) {
            comm_check(c, ncclBroadcast(src, dst, n, ncclFloat32, q, c->nccl, s), "checkpoint Broadcast (1-bit Adam)");
            comm_count(c, COMM_BROADCAST, n * sizeof(float), q);
        }
        comm_wait(c, s, "checkpoint Broadcast (1-bit Adam)");
    }
    return n;
}
