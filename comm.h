// comm.h: data-parallel communication. One process per GPU; srun starts them and tells each its
// rank (SLURM_PROCID), the world size (SLURM_NTASKS) and its rank on the node (SLURM_LOCALID,
// which picks the GPU). Ranks meet through NCCL: rank 0 makes a unique id and publishes it as a
// file in a directory every rank can see (the run's output directory, on a shared file system);
// the others wait for the file, then all join the communicator. Gradients are averaged in buckets
// that overlap the backward, optionally with ZeRO-1 (the last section). With one process there is no
// NCCL at all.
#pragma once
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int rank;         // 0 .. world-1, over all nodes
    int world;        // number of processes (one per GPU)
    int local_rank;   // rank within this node: selects the GPU
    ncclComm_t nccl;  // NULL when world == 1
} Comm;

#define NCCL_CHECK(call)                                                                                  \
    do {                                                                                                  \
        ncclResult_t r_ = (call);                                                                         \
        if (r_ != ncclSuccess) {                                                                          \
            fprintf(stderr, "NCCL error at %s:%d: %s (%s)\n", __FILE__, __LINE__, ncclGetErrorString(r_), \
                    ncclGetLastError(NULL));                                                              \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

// comm_env_int: an integer environment variable, or dflt when unset; exits on a malformed value.
static int comm_env_int(const char* name, int dflt) {
    const char* s = getenv(name);
    if (!s || !*s) return dflt;
    char* end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1000000) {
        fprintf(stderr, "comm: environment variable %s=%s is not a non-negative integer\n", name, s);
        exit(1);
    }
    return (int)v;
}

// comm_from_env: rank/world from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun), else one process.
static Comm comm_from_env(void) {
    Comm c;
    memset(&c, 0, sizeof c);
    c.world = comm_env_int("SLURM_NTASKS", 1);
    c.rank = comm_env_int("SLURM_PROCID", 0);
    c.local_rank = comm_env_int("SLURM_LOCALID", 0);
    if (c.world < 1 || c.rank >= c.world) {
        fprintf(stderr, "comm: SLURM_PROCID=%d is not below SLURM_NTASKS=%d\n", c.rank, c.world);
        exit(1);
    }
    return c;
}

// comm_init: joins the NCCL communicator of all ranks (nothing when world == 1). The unique id travels
// through DIR/nccl_id.JOB.STEP, written atomically by rank 0; other ranks wait up to timeout_s for it.
static void comm_init(Comm* c, const char* dir, int timeout_s) {
    if (c->world == 1) return;
    char path[4096], tmp[4200];
    const char* job = getenv("SLURM_JOB_ID");
    const char* step = getenv("SLURM_STEP_ID");
    snprintf(path, sizeof path, "%s/nccl_id.%s.%s", dir, job ? job : "local", step ? step : "0");
    ncclUniqueId id;
    if (c->rank == 0) {
        NCCL_CHECK(ncclGetUniqueId(&id));
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE* f = fopen(tmp, "wb");
        if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
            fprintf(stderr, "comm: cannot write the NCCL id to %s (is --out a directory every rank can write?)\n",
                    path);
            exit(1);
        }
    } else {
        int waited_ms = 0;
        FILE* f;
        while (!(f = fopen(path, "rb"))) {
            if (waited_ms >= timeout_s * 1000) {
                fprintf(stderr, "comm: rank %d waited %d s for %s from rank 0 (is --out on a shared file system?)\n",
                        c->rank, timeout_s, path);
                exit(1);
            }
            usleep(20000);
            waited_ms += 20;
        }
        size_t got = fread(&id, sizeof id, 1, f);
        fclose(f);
        if (got != 1) {
            fprintf(stderr, "comm: %s is truncated\n", path);
            exit(1);
        }
    }
    NCCL_CHECK(ncclCommInitRank(&c->nccl, c->world, id, c->rank));
    if (c->rank == 0) unlink(path);  // everyone has joined: the id is no longer needed
}

// comm_sum: in-place sum over all ranks of n floats on the device (nothing when world == 1).
static void comm_sum(Comm* c, float* x, size_t n, cudaStream_t s) {
    if (c->world == 1) return;
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c->nccl, s));
}

static void comm_free(Comm* c) {
    if (c->nccl) ncclCommDestroy(c->nccl);
    c->nccl = NULL;
}

// ---------------------------------------------------------------------------------------------
// Gradient reduction and ZeRO-1
//
// Buckets. On the last micro-step of a step the gradients are reduced in buckets, on a communication
// stream, while the backward goes on: bert_backward records grad_ready[k] on the compute stream as the
// gradients [bert_grad_ready_lo(k), n_decay) of the slab's matrix region become final (the head, then
// layers L-1 .. 0: the matrix region from its end down), and everything at k = L+1. A bucket is a
// contiguous range of the slab; it waits for its event on the communication stream (cudaStreamWaitEvent),
// then its collective runs there; the compute stream waits only for what is left when the backward ends
// (an event recorded after the last bucket), before the gradient norm and AdamW.
// Launch order: buckets of --bucket-mb from the matrix region's end down, each as soon as the backward
// has made it; at the end the vector region (biases, LayerNorm: final only after the backward's last
// kernel), then what is left of the matrix region (the embeddings, whose word-embedding gradient the
// tied decoder wrote first and the embedding backward writes last).
//
// fp32 (default): ncclAllReduce (ncclAvg) of the bucket in place. bf16 (--grad-reduce bf16): a kernel on
// the communication stream casts the bucket into a bf16 staging buffer, the ranks sum it in bf16 (half
// the bytes on the wire), and a kernel casts the sum back to fp32 times 1/world. One staging buffer of
// the largest bucket suffices: the cast, the collective and the cast back of one bucket are in order
// on the communication stream before the next bucket's cast.
//
// ZeRO-1 (--zero 1): each bucket is split into world equal pieces of `piece` elements (a multiple of 4);
// rank r owns piece r of every bucket: it holds the fp32 master weights and AdamW m, v of those
// elements only (its shard: the sum of the pieces, 1/world of the slab plus padding). The gradients
// are reduce-scattered (ncclReduceScatter, in place: rank r gets the average of piece r), each rank
// updates its pieces, and ncclAllGather gives every rank all the new floatX weights. Sharding each
// bucket (rather than cutting the flat slab into world ranges) keeps every collective a plain
// ReduceScatter of one bucket, so the reduction overlaps the backward as above. Every bucket's size is
// a multiple of 4 * world except the topmost one (the slab's end), whose padding reaches into `slack`
// elements allocated after the gradients and the floatX weights: in-place collectives never touch a
// neighbour bucket. The gradient norm for clipping is global: each rank sums the squares of its
// pieces, and the step's one all-reduce adds them up.
//
// Checkpoints keep the full format: the shards are gathered (copied into place in a full-size buffer,
// then one in-place AllGather per bucket) into the gradient buffer, which is free between steps, and
// --resume copies each rank's pieces out of the full arrays, whatever world size or --zero wrote them.

#include "kernels.cuh"  // grad_to_bf16, grad_from_bf16, grad_norm_partial, grad_sumsq_add, launch

typedef struct {
    size_t lo, n;      // the bucket: the slab's elements [lo, lo + n)
    size_t piece;      // ZeRO-1: elements per rank (the bucket padded to world * piece); rank r's at lo + r * piece
    size_t state_off;  // ZeRO-1: where this rank's piece starts in its shard of master weights and AdamW state
    int event;         // the bucket is final once the backward recorded grad_ready[event]
} GradBucket;

typedef struct {
    Comm* comm;
    int zero, bf16;       // --zero 1; --grad-reduce bf16
    int n;                // buckets, in launch order
    GradBucket* b;        // (n)
    size_t numel, slack;  // the slab's elements; ZeRO-1: elements after it that the topmost bucket's padding uses
    size_t state_numel;   // elements of master weights and AdamW m, v this rank holds (numel without ZeRO-1)
    size_t stage_elems;   // --grad-reduce bf16 with world > 1: elements of the bf16 staging buffer; else 0
    // the device side (grad_reduce_start)
    cudaStream_t stream;  // the communication stream
    cudaEvent_t* ready;   // (n_events) the events bert_backward records (BertModel.grad_ready)
    int n_events;
    cudaEvent_t done;      // recorded on the communication stream after the last bucket
    __nv_bfloat16* stage;  // (stage_elems)
} GradReduce;

// grad_reduce_layout: the buckets for a slab of numel elements whose matrix region ends at top, when
// after event k < n_events - 1 the range [ready_lo[k], top) is final and after the last event everything
// is. bucket_elems: the target bucket size. Host only; the same on every rank.
static inline void grad_reduce_layout(GradReduce* g, Comm* c, size_t numel, size_t top, const size_t* ready_lo,
                                      int n_events, size_t bucket_elems, int zero, int bf16) {
    memset(g, 0, sizeof *g);
    g->comm = c, g->zero = zero, g->bf16 = bf16, g->numel = numel, g->n_events = n_events;
    size_t W = (size_t)c->world, A = 4 * W;  // every bucket but the topmost: a multiple of A elements
    size_t S = bucket_elems / A * A;
    if (S < 2 * A) S = 2 * A;
    size_t cap = numel / S + (size_t)n_events + 4;
    g->b = (GradBucket*)calloc(cap, sizeof(GradBucket));
    if (!g->b) {
        fprintf(stderr, "comm: out of host memory for %zu gradient buckets\n", cap);
        exit(1);
    }
#define GR_EMIT(lo_, n_, ev_) (g->b[g->n].lo = (lo_), g->b[g->n].n = (n_), g->b[g->n].event = (ev_), g->n++)
    size_t v_lo = top / A * A, hi = v_lo;  // the tail [v_lo, numel): the vector region and < A matrix elements
    for (int k = 0; k + 1 < n_events; k++)
        while (hi >= S && hi - S >= ready_lo[k]) GR_EMIT(hi - S, S, k), hi -= S;
    for (size_t t = v_lo; t < numel; t += S) GR_EMIT(t, numel - t < S ? numel - t : S, n_events - 1);
    for (; hi > 0; hi -= hi < S ? hi : S) GR_EMIT(hi - (hi < S ? hi : S), hi < S ? hi : S, n_events - 1);
#undef GR_EMIT
    size_t off = 0;
    for (int i = 0; i < g->n; i++) {
        GradBucket* b = &g->b[i];
        b->piece = ((b->n + W - 1) / W + 3) / 4 * 4;
        b->state_off = off;
        off += b->piece;
        if (zero && b->lo + W * b->piece > numel + g->slack) g->slack = b->lo + W * b->piece - numel;
        size_t staged = zero ? W * b->piece : b->n;
        if (bf16 && W > 1 && staged > g->stage_elems) g->stage_elems = staged;
    }
    g->state_numel = zero ? off : numel;
}

// grad_reduce_piece: rank r's piece of bucket b: the slab's elements [*off, *off + *n) (*n may be 0).
static inline void grad_reduce_piece(const GradReduce* g, const GradBucket* b, int r, size_t* off, size_t* n) {
    size_t start = (size_t)r * b->piece;
    *off = b->lo + start;
    *n = b->n > start ? (b->n - start < b->piece ? b->n - start : b->piece) : 0;
}

// grad_reduce_start: the communication stream, the events and the bf16 staging buffer (stage_elems).
static inline void grad_reduce_start(GradReduce* g) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    g->ready = (cudaEvent_t*)malloc(g->n_events * sizeof(cudaEvent_t));
    for (int k = 0; k < g->n_events; k++) CUDA_CHECK(cudaEventCreateWithFlags(&g->ready[k], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
    if (g->stage_elems) CUDA_CHECK(cudaMalloc((void**)&g->stage, g->stage_elems * sizeof(__nv_bfloat16)));
}

static inline void grad_reduce_free(GradReduce* g) {
    if (g->ready) {
        for (int k = 0; k < g->n_events; k++) cudaEventDestroy(g->ready[k]);
        cudaEventDestroy(g->done);
        cudaStreamDestroy(g->stream);
        cudaFree(g->stage);
    }
    free(g->ready);
    free(g->b);
    memset(g, 0, sizeof *g);
}

static inline dim3 gr_grid(size_t n) {
    size_t b = (n + 255) / 256;
    return dim3((unsigned)(b < 1 ? 1 : b > (size_t)launch_grid_cap() ? (size_t)launch_grid_cap() : b));
}

// grad_reduce_launch: enqueues every bucket's reduction of grad on the communication stream, each after
// its event (nothing when world == 1). Call it after the last micro-step's bert_backward was enqueued with
// BertModel.grad_ready = g->ready (the device is then still running that backward, and the buckets start
// as their events pass); then grad_reduce_wait before anything reads the gradients.
static inline void grad_reduce_launch(GradReduce* g, float* grad) {
    Comm* c = g->comm;
    if (c->world == 1) return;
    float inv_world = 1.f / (float)c->world;
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        float* x = grad + b->lo;
        size_t mine = (size_t)c->rank * b->piece, off, n;
        CUDA_CHECK(cudaStreamWaitEvent(g->stream, g->ready[b->event], 0));
        if (!g->bf16 && g->zero) {
            NCCL_CHECK(ncclReduceScatter(x, x + mine, b->piece, ncclFloat32, ncclAvg, c->nccl, g->stream));
        } else if (!g->bf16) {
            NCCL_CHECK(ncclAllReduce(x, x, b->n, ncclFloat32, ncclAvg, c->nccl, g->stream));
        } else if (g->zero) {
            size_t padded = (size_t)c->world * b->piece;
            launch(grad_to_bf16, gr_grid(padded), dim3(256), 0, g->stream, g->stage, (const float*)x, b->n, padded);
            NCCL_CHECK(
                ncclReduceScatter(g->stage, g->stage + mine, b->piece, ncclBfloat16, ncclSum, c->nccl, g->stream));
            grad_reduce_piece(g, b, c->rank, &off, &n);
            if (n)
                launch(grad_from_bf16, gr_grid(n), dim3(256), 0, g->stream, grad + off,
                       (const __nv_bfloat16*)g->stage + mine, n, inv_world);
        } else {
            launch(grad_to_bf16, gr_grid(b->n), dim3(256), 0, g->stream, g->stage, (const float*)x, b->n, b->n);
            NCCL_CHECK(ncclAllReduce(g->stage, g->stage, b->n, ncclBfloat16, ncclSum, c->nccl, g->stream));
            launch(grad_from_bf16, gr_grid(b->n), dim3(256), 0, g->stream, x, (const __nv_bfloat16*)g->stage, b->n,
                   inv_world);
        }
    }
    CUDA_CHECK(cudaEventRecord(g->done, g->stream));
}

// grad_reduce_wait: the compute stream waits for the last bucket (the part of the reduction that the
// backward did not hide).
static inline void grad_reduce_wait(GradReduce* g, cudaStream_t compute) {
    if (g->comm->world > 1) CUDA_CHECK(cudaStreamWaitEvent(compute, g->done, 0));
}

// zero_grad_sumsq: acc[0] += the sum of squares of this rank's reduced gradient pieces (partial: the
// grad-norm scratch of launch_grid_cap() floats). The step's all-reduce then sums acc over ranks.
static inline void zero_grad_sumsq(const GradReduce* g, const float* grad, float* partial, float* acc, cudaStream_t s) {
    for (int i = 0; i < g->n; i++) {
        size_t off, n;
        grad_reduce_piece(g, &g->b[i], g->comm->rank, &off, &n);
        if (!n) continue;
        int blocks = (int)((n + 1023) / 1024 < (size_t)launch_grid_cap() ? (n + 1023) / 1024 : launch_grid_cap());
        launch(grad_norm_partial, dim3(blocks), dim3(256), 0, s, partial, grad + off, n);
        launch(grad_sumsq_add, dim3(1), dim3(256), 0, s, acc, (const float*)partial, blocks);
    }
}

// zero_allgather: every rank's updated pieces of the floatX weights w to every rank (in place).
static inline void zero_allgather(const GradReduce* g, floatX* w, cudaStream_t s) {
    Comm* c = g->comm;
    if (c->world == 1) return;
    ncclDataType_t t = sizeof(floatX) == 2 ? ncclBfloat16 : ncclFloat32;
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        NCCL_CHECK(ncclAllGather(w + b->lo + (size_t)c->rank * b->piece, w + b->lo, b->piece, t, c->nccl, s));
    }
}

// zero_gather: the full array (numel + slack fp32 elements) from every rank's shard of it (in full's
// place on every rank). Synchronizes s.
static inline void zero_gather(const GradReduce* g, const float* shard, float* full, cudaStream_t s) {
    Comm* c = g->comm;
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        size_t off, n;
        grad_reduce_piece(g, b, c->rank, &off, &n);
        if (n)
            CUDA_CHECK(
                cudaMemcpyAsync(full + off, shard + b->state_off, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
        if (c->world > 1) NCCL_CHECK(ncclAllGather(full + off, full + b->lo, b->piece, ncclFloat32, c->nccl, s));
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
}

// zero_scatter: this rank's shard out of a full array (numel fp32 elements). No communication.
static inline void zero_scatter(const GradReduce* g, const float* full, float* shard, cudaStream_t s) {
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        size_t off, n;
        grad_reduce_piece(g, b, g->comm->rank, &off, &n);
        if (n)
            CUDA_CHECK(
                cudaMemcpyAsync(shard + b->state_off, full + off, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
}
