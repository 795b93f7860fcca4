// trainer.cu: mlm.c's one program, BERT-style masked-language-model pretraining.
// This is the only translation unit: nvcc compiles it for the GPU (./trainer) and g++ compiles the
// very same file against cpu/ for the CPU (./trainer_cpu). Each header has one role:
#include <cuda_runtime.h>  // the CUDA runtime (cpu/include/cuda_runtime.h on the CPU build)
#include "kernels.cuh"     // every GPU kernel, and launch()
#include "model.h"         // the BERT configuration, parameter table, memory plan, forward/backward/AdamW
#include "hf.h"            // the Hugging Face export and import (model.safetensors, config.json)
#include "data.h"          // token shards, the ring of loader threads, MLM masking
#include "parse.h"         // the one reading of a number: every flag and environment variable
#include "comm.h"          // rank and world size; NCCL gradient averaging
#include "scaling.h"       // the scaling predictor: compute, all-reduce and overlap on N nodes
#include "compress.h"      // --comm onebit: 1-bit Adam's compressed momentum all-reduce
#include "optim.h"         // the optimizer: the gradients' exchange, their norm, the update (AdamW, ZeRO-1, 1-bit Adam)
#include <ctype.h>
#include <dirent.h>
#include <glob.h>
#include <libgen.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static double now_s(void) {  // seconds, monotonic
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

#include "options.h"  // flags: the table, parsing and checks (Options, parse_options)

// ----------------------------------------------------------------------------
// Memory plan: everything on the device is allocated once, before step 1, from one plan. The MLM
// head always runs on M = 1.1 * 0.15 * B * T + 64 rows, the masked positions of the micro-batch
// followed by padding rows (the loader masks 15% of ordinary tokens exactly on average, so a batch
// above the cap is vanishingly rare: its excess positions are left out of the loss, and the log
// says so).
typedef struct {
    int B, T, M;
    BertMemPlan model;
    size_t reduce_bytes;  // the bf16 staging buffer of --grad-reduce bf16 (comm.h), --comm onebit's state (compress.h)
    size_t batch_bytes;   // each loader's (training, validation) two device batch buffers
    size_t maker_bytes;   // seg_lo, seg_hi (B, T), the head's positions and labels (M), 8 floats of loss sums,
                          // the head rows' hits (M floats: accuracy)
    size_t val_bytes;     // validation's per-micro-batch sums (4 floats per micro-batch; plan_add_validation)
    size_t total;
} Plan;

static int mlm_cap(int B, int T) { return (int)(1.1 * 0.15 * B * T) + 64; }

// make_plan: the plan for micro-batch B; gr: the gradient buckets (ZeRO-1 shards the optimizer state).
static Plan make_plan(const BertConfig* c, int B, int T, int loaders, const GradReduce* gr) {
    Plan p;
    p.B = B, p.T = T, p.M = mlm_cap(B, T);
    p.model = bert_mem_plan_sharded(c, B, T, p.M, (int)sizeof(floatX), gr->zero ? gr->state_numel : 0, gr->slack);
    p.reduce_bytes = gr->stage_elems * sizeof(__nv_bfloat16) + gr->onebit_bytes;
    p.batch_bytes = loaders * dataloader_device_bytes(B, T);
    p.maker_bytes = (2 * (size_t)B * T + 2 * (size_t)p.M) * sizeof(int) + 8 * sizeof(float)  // + the loss sums
                    + (size_t)p.M * sizeof(float);                                           // + the hits
    p.val_bytes = 0;
    p.total = p.model.total + p.reduce_bytes + p.batch_bytes + p.maker_bytes;
    return p;
}
// validation_max_batches: an upper bound on the micro-batches of B rows a validation pass takes over the split
// `pattern` (the shards' headers give its samples; a row holds at least one, so ceil(samples / B) cover it),
// or val_batches (--val-batches) when smaller; 0 takes the whole split.
static long long validation_max_batches(const char* pattern, int val_batches, int B) {
    Shard* shards;
    int n;
    char err[DATA_ERR_LEN];
    if (shards_open_all(pattern, &shards, &n, 1, err)) {
        fprintf(stderr, "trainer: --val: %s\n", err);
        exit(1);
    }
    long long samples = 0;
    for (int i = 0; i < n; i++) samples += (long long)shards[i].h.num_samples, shard_close(&shards[i]);
    free(shards);
    long long batches = (samples + B - 1) / B;
    return val_batches > 0 && val_batches < batches ? val_batches : batches;
}
// plan_add_validation: validation's sums, one slot of 4 floats per micro-batch (see Validation) for at most
// validation_max_batches micro-batches.
static void plan_add_validation(Plan* p, int val_batches, const char* val_pattern) {
    p->val_bytes = 4 * (size_t)validation_max_batches(val_pattern, val_batches, p->B) * sizeof(float);
    p->total += p->val_bytes;
}

// onebit_part_elems: the largest part of the onebit modes but the last, ONEBIT_PART_BUCKETS buckets of --bucket-mb
// (compress.h's onebit_layout).
static size_t onebit_part_elems(const Options* o) {
    return (size_t)(ONEBIT_PART_BUCKETS * o->bucket_mb * (1 << 20) / sizeof(float));
}

// onebit_layer_part: the part of ob (compress.h) that holds the last weight of layer l's matrices (l = layers: the
// head's dense matrix), the top of the weights layer l's forward reads (the lower ones, the embeddings and the vector
// region are in that part or in parts the forward's order exchanges before it: onebit_step_forward).
static int onebit_layer_part(const OneBit* ob, const BertParams* p, int l) {
    int L = p->cfg.layers;
    return onebit_part_of(ob, (l < L ? bert_grad_ready_lo(p, L - l - 1) : p->n_decay) - 1);
}

// grad_reduce_setup: the gradient buckets of cfg's slab for this world size and --bucket-mb, --grad-reduce,
// --zero (comm.h), from the order in which bert_backward makes the gradients.
static void grad_reduce_setup(GradReduce* gr, const BertConfig* cfg, Comm* comm, const Options* o) {
    BertParams p;
    bert_params_build(&p, cfg);
    int n_events = bert_grad_ready_count(&p);
    size_t* ready_lo = (size_t*)malloc(n_events * sizeof(size_t));
    for (int k = 0; k < n_events; k++) ready_lo[k] = bert_grad_ready_lo(&p, k);
    size_t bucket_elems = (size_t)(o->bucket_mb * (1 << 20) / sizeof(float));
    // one process has nothing to shard: --zero 1 then trains as without it
    grad_reduce_layout(gr, comm, p.numel, p.n_decay, ready_lo, n_events, bucket_elems, o->zero && comm->world > 1,
                       o->grad_reduce_bf16 || o->onebit);
    gr->bf16 = o->grad_reduce_bf16;  // onebit: its warm-up and refresh steps reduce in bf16 (optimizer_begin)
    if (o->onebit) {                 // the buffers of compress.h, for the plan
        OneBit ob;
        onebit_layout(&ob, gr, comm->rank, 1, onebit_part_elems(o));
        gr->onebit_bytes = onebit_device_bytes(&ob);
        free(ob.part);
    }
    free(ready_lo);
    bert_params_free(&p);
}

// choose_batch: the largest B whose plan fits in the free device memory, less a reserve for the
// CUDA context, cuBLASLt and NCCL (5% of the device, at least 1 GiB).
static Plan choose_batch(const BertConfig* c, int T, int loaders, const GradReduce* gr, size_t free_bytes,
                         size_t total_bytes) {
    size_t reserve = total_bytes / 20 > ((size_t)1 << 30) ? total_bytes / 20 : ((size_t)1 << 30);
    size_t budget = free_bytes > reserve ? free_bytes - reserve : 0;
    int cap = MAX_MICRO_TOKENS / T < (1 << 20) ? MAX_MICRO_TOKENS / T : (1 << 20);  // the loader's and --batch's
    int lo = 0, hi = 1;
    while (hi <= cap && make_plan(c, hi, T, loaders, gr).total <= budget) lo = hi, hi *= 2;
    if (hi > cap + 1) hi = cap + 1;
    while (hi - lo > 1) {  // largest B with plan <= budget is in [lo, hi)
        int mid = lo + (hi - lo) / 2;
        if (make_plan(c, mid, T, loaders, gr).total <= budget)
            lo = mid;
        else
            hi = mid;
    }
    return make_plan(c, lo > 0 ? lo : 1, T, loaders, gr);  // B = 1 when nothing fits: the caller reports it
}

// PLAN_UNKNOWN_TOKENS: where the device's bf16 peak is unknown (the CPU runtime, or a GPU kernels.cuh's table does
// not know), a run's automatic micro-batch holds at most this many tokens, so that a step takes seconds on the CPU
// runtime rather than the minutes of the largest that fits (--batch, or --device NAME for a known GPU, plans more).
#define PLAN_UNKNOWN_TOKENS 4096
// auto_batch: the plan of a run (training, --eval) with --batch, or with the largest micro-batch that fits, at most
// PLAN_UNKNOWN_TOKENS tokens on a device of unknown speed and at most max_rows rows (0: no bound; --eval: the split's
// rows per process). why (n bytes) says how B was chosen.
static Plan auto_batch(const BertConfig* c, const Options* o, int loaders, const GradReduce* gr, size_t free_bytes,
                       size_t total_bytes, const char* device, long long max_rows, char* why, size_t n) {
    if (o->B) {
        snprintf(why, n, "--batch");
        return make_plan(c, o->B, o->T, loaders, gr);
    }
    Plan p = choose_batch(c, o->T, loaders, gr, free_bytes, total_bytes);
    snprintf(why, n, "the largest that fits");
    int speed_rows = PLAN_UNKNOWN_TOKENS / o->T > 0 ? PLAN_UNKNOWN_TOKENS / o->T : 1;
    if (device_peak_tflops(device) <= 0 && p.B > speed_rows) {
        snprintf(why, n, "%d tokens: %s's speed is unknown, and B=%d would fit; --batch N plans more",
                 speed_rows * o->T, device, p.B);
        p = make_plan(c, speed_rows, o->T, loaders, gr);
    }
    if (max_rows > 0 && p.B > max_rows) {
        snprintf(why, n, "the validation split's %lld rows a process", max_rows);
        p = make_plan(c, (int)max_rows, o->T, loaders, gr);
    }
    return p;
}

#include "checkpoint.h"  // checkpoints: save, verify, load, set aside

// ----------------------------------------------------------------------------
// One micro-batch from the loader, as the model takes it.
typedef struct {
    int *seg_lo, *seg_hi;  // (B, T) device: the key range of each token
    int *pos, *labels;     // (M) device: the head's rows
    float* hits;           // (M) device: 1 where the head's top prediction is the label (validation)
    float* host;           // (BM_HOST) pinned host: the step's sums and gradient norm, read after the step's sync
    cudaEvent_t stop_ev;   // stop_agreed: the compute stream's progress, which its all-reduce waits for
    int pad_id, M;
    long long dropped;  // masked positions left out of the loss because a batch had more than M
} BatchMaker;

// batch_maker_alloc: the plan's maker_bytes, in one allocation; gives the 8 floats of loss sums in it. The
// host side of those sums is pinned: a copy into pageable memory would block the host inside the CUDA
// runtime until the step's collectives are done, out of the watchdog's reach (CUDA's "API synchronization
// behavior"); into pinned memory it returns at once, and comm_wait waits for it.
enum { BM_HOST = 16 };
static float* batch_maker_alloc(BatchMaker* bm, const Plan* plan, int pad_id) {
    memset(bm, 0, sizeof *bm);
    bm->pad_id = pad_id, bm->M = plan->M;
    CUDA_CHECK(cudaMallocHost((void**)&bm->host, BM_HOST * sizeof(float)));
    CUDA_CHECK(cudaEventCreateWithFlags(&bm->stop_ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc((void**)&bm->seg_lo, plan->maker_bytes));
    bm->seg_hi = bm->seg_lo + (size_t)plan->B * plan->T;
    bm->pos = bm->seg_hi + (size_t)plan->B * plan->T;
    bm->labels = bm->pos + plan->M;
    float* scratch = (float*)(bm->labels + plan->M);
    bm->hits = scratch + 8;
    CUDA_CHECK(cudaMemset(scratch, 0, 8 * sizeof(float)));
    return scratch;
}

// make_batch: the model's view of a loader batch; *n_masked gets the rows that count in the loss.
static BertBatch make_batch(BatchMaker* bm, const Batch* b, int B, int T, cudaStream_t s, int* n_masked) {
    int N = B * T, n = b->num_masked < bm->M ? b->num_masked : bm->M;
    bm->dropped += b->num_masked - n;
    launch(segment_ranges, dim3(ceil_div(N, 256)), dim3(256), 0, s, bm->seg_lo, bm->seg_hi, b->segment_ids,
           b->cu_seqlens, b->input_ids, bm->pad_id, N, T);
    launch(pad_masked_rows, dim3(ceil_div(bm->M, 256)), dim3(256), 0, s, bm->pos, bm->labels, b->mask_pos,
           b->mask_target, n, bm->M);
    BertBatch bt;
    bt.tokens = b->input_ids, bt.types = NULL;
    bt.seg_lo = bm->seg_lo, bt.seg_hi = bm->seg_hi;
    bt.mlm_pos = bm->pos, bt.mlm_labels = bm->labels;
    bt.B = B, bt.T = T, bt.M = bm->M;
    *n_masked = n;
    return bt;
}

// add_loss: sum[0] += the micro-batch's mean loss * n_masked, sum[1] += n_masked (device; no host sync).
static void add_loss(float* sum, BertModel* m, int n_masked) {
    launch(accumulate_loss, dim3(1), dim3(1), 0, m->stream, sum, (const float*)ACT_F(m, loss), (float)n_masked);
}

// all_ranks_sum: x (n floats, device) summed over all ranks into host (n floats, pinned, so that the copy
// does not block), then x zeroed. Synchronizes the stream, with the watchdog (comm_wait); `what` names the
// collective. host may be read once it returns.
static void all_ranks_sum(Comm* comm, float* x, int n, float* host, cudaStream_t s, const char* what) {
    comm_sum(comm, x, n, s, what);
    CUDA_CHECK(cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), s));
    comm_wait(comm, s, what);
}

// ----------------------------------------------------------------------------
// Validation: the MLM loss and the masked-token accuracy (the head's top prediction is the label) on the
// same masked samples every time and whatever the number of ranks. The validation loader reads the shards
// in file order with a fixed masking seed, packed into rows as training packs them; its global row stream
// is the same for any world size, so micro-batch j of B rows (global rows [j B, (j+1) B)) is always the
// same batch. A pass takes micro-batches 0 .. N-1, N = ceil(rows / B) for the split's rows (epoch 0's,
// never wrapped): every validation sequence once, the last micro-batch partial (its rows past the split
// are padding, nothing masked), so the sequences and masked tokens it sees do not depend on B or W.
// --val-batches N takes the first N micro-batches instead (at most the split's).
// Rank r evaluates j = r, r + W, r + 2W, ...
// and writes micro-batch j's sums (loss x masked count, masked count, hits, samples) into slot j of a
// device array that is zero elsewhere; one all-reduce (a sum of one value and zeros: exact) gives every
// rank all N slots, added on the host in the order j = 0 .. N-1. So 1 or 64 GPUs give the same bits.
#define VAL_SEED 1337  // the validation masking seed, whatever --seed is: results comparable across runs

typedef struct {
    DataLoader loader;
    DataLoaderState start;  // the loader's position right after init: every evaluation restarts there
    int batches;            // micro-batches per pass: the whole split's, or --val-batches' sample of them
    long long all;          // micro-batches of B rows in the whole split (all ranks together)
    int sample;             // 1: a sample spread evenly over the split (--val-batches), 0: all of it
    int B;                  // rows per micro-batch
    long long split;        // sequences (samples) in the split
    float* slots;           // device, 4 x batches: (loss sum, masked, hits) per micro-batch, then samples
    float* host;            // pinned host, 4 x batches
} Validation;

typedef struct {
    double loss, accuracy;  // per masked token
    long long masked, samples;
    long long split;  // the split's sequences: samples == split when the pass covered every one (once)
    int batches, B;   // micro-batches of B rows
    int sample;       // a sample spread over the split (--val-batches)
} EvalResult;

// validation_init: the loader over pattern (B rows of T per micro-batch per rank) and the plan's val_bytes;
// val_batches is --val-batches (0: the whole split), and a count beyond the split is said and cut to it.
static void validation_init(Validation* v, const char* pattern, const Plan* plan, const Comm* comm, int vocab,
                            int val_batches, int verbose) {
    DataLoaderConfig c = dataloader_default_config(pattern, plan->B, plan->T);
    c.rank = comm->rank, c.world = comm->world, c.num_threads = 1, c.shuffle = 0, c.seed = VAL_SEED;
    c.vocab_size = vocab, c.verbose = verbose;
    if (dataloader_init(&v->loader, &c)) {
        fprintf(stderr, "trainer: %s\n", v->loader.error);  // names the --val shards
        exit(1);
    }
    v->start = dataloader_state(&v->loader);
    v->B = plan->B;
    v->split = (long long)v->loader.num_samples;
    long long rows = (long long)dataloader_epoch0_rows(&v->loader), all = (rows + plan->B - 1) / plan->B;
    v->all = all;
    v->sample = val_batches > 0 && val_batches < all;
    v->batches = (int)(v->sample ? val_batches : all);
    if (v->sample && verbose)
        printf(
            "validation: a sample of %d of the split's %lld micro-batches of B=%d rows, spread evenly over it (the "
            "same ones at every validation; --val-batches 0 takes the whole split)\n",
            v->batches, all, plan->B);
    if (val_batches > all && verbose)
        printf(
            "note: --val-batches %d: the validation split holds %lld micro-batches of B=%d rows (%lld sequences); "
            "validating those, each sequence once\n",
            val_batches, all, plan->B, v->split);
    if (4 * (size_t)v->batches * sizeof(float) > plan->val_bytes) {  // cannot be: rows <= samples (the plan's bound)
        fprintf(stderr, "trainer: validation: %d micro-batches, more than the plan's %zu slots\n", v->batches,
                plan->val_bytes / (4 * sizeof(float)));
        exit(1);
    }
    CUDA_CHECK(cudaMalloc((void**)&v->slots, plan->val_bytes));
    CUDA_CHECK(cudaMemset(v->slots, 0, plan->val_bytes));
    v->host = NULL;  // pinned: all_ranks_sum's copy into it must not block (see batch_maker_alloc)
    if (cudaMallocHost((void**)&v->host, 4 * (size_t)v->batches * sizeof(float)) == cudaSuccess)
        memset(v->host, 0, 4 * (size_t)v->batches * sizeof(float));
    else
        v->host = NULL;
    if (!v->host) {
        fprintf(stderr, "trainer: out of host memory for %d validation micro-batches\n", v->batches);
        exit(1);
    }
}
static void validation_free(Validation* v) {
    dataloader_free(&v->loader);
    cudaFree(v->slots);
    cudaFreeHost(v->host);
}

// evaluate: the model on the validation micro-batches (forward only), all ranks: micro-batch j of the pass is the
// split's micro-batch g = j (the whole split) or j * all / batches (a sample spread evenly over it), whatever the
// number of ranks; rank g % world computes it (its loader's micro-batches are g = pos * world + rank), its sums go to
// slot j, and the slots are added in order: the same result on any number of ranks.
static EvalResult evaluate(BertModel* m, Validation* v, BatchMaker* bm, Comm* comm) {
    int n = v->batches;
    float* samples = v->host + 3 * (size_t)n;  // this rank's sample counts, zero in the other ranks' slots
    memset(samples, 0, n * sizeof(float));
    for (int j = 0; j < n; j++) {
        long long g = v->sample ? j * v->all / n : j;
        if (g % comm->world != comm->rank) continue;
        if (j == comm->rank || v->sample) {  // the same batches every time: from the start, or from each sampled one
            DataLoaderState at = v->start;
            at.row = (uint64_t)(g / comm->world * comm->world * v->B);
            if (dataloader_restore(&v->loader, &at)) {
                fprintf(stderr, "trainer: validation: %s\n", v->loader.error);
                exit(1);
            }
        }
        Batch b;
        if (dataloader_next(&v->loader, m->stream, &b)) {
            fprintf(stderr, "trainer: validation: %s\n", v->loader.error);
            exit(1);
        }
        int n_masked;
        BertBatch bt = make_batch(bm, &b, m->B, m->T, m->stream, &n_masked);
        m->hits = bm->hits;  // the head writes each masked row's hit (its top prediction is the label) there
        bert_forward(m, &bt, 0.f);
        m->hits = NULL;
        float* slot = v->slots + 3 * (size_t)j;
        add_loss(slot, m, n_masked);  // slot[0] += mean loss x n_masked, slot[1] += n_masked
        launch(accumulate_sum, dim3(1), dim3(256), 0, m->stream, slot + 2, (const float*)bm->hits, bm->M);
        samples[j] = (float)b.num_samples;
    }
    CUDA_CHECK(
        cudaMemcpyAsync(v->slots + 3 * (size_t)n, samples, n * sizeof(float), cudaMemcpyHostToDevice, m->stream));
    all_ranks_sum(comm, v->slots, 4 * n, v->host, m->stream, "validation AllReduce");
    double loss = 0, masked = 0, hits = 0, nsamples = 0;
    for (int j = 0; j < n; j++) {  // in order: the same sum for any number of ranks
        loss += v->host[3 * (size_t)j], masked += v->host[3 * (size_t)j + 1], hits += v->host[3 * (size_t)j + 2];
        nsamples += samples[j];
    }
    EvalResult r;
    r.loss = masked > 0 ? loss / masked : 0;
    r.accuracy = masked > 0 ? hits / masked : 0;
    r.masked = (long long)masked, r.samples = (long long)nsamples;
    r.split = v->split, r.batches = n, r.B = v->B, r.sample = v->sample;
    return r;
}
// validation_coverage: what a pass covered, for the log: "3 micro-batches of B=8: every validation sequence
// once" or "2 micro-batches of B=8: 40 of the split's 57 sequences".
static const char* validation_coverage(const EvalResult* e, char* buf, size_t size) {
    int n = snprintf(buf, size, "%d micro-batches of B=%d: ", e->batches, e->B);
    if (e->samples == e->split)
        snprintf(buf + n, size - n, "every validation sequence once");
    else
        snprintf(buf + n, size - n, "%s%lld of the split's %lld sequences",
                 e->sample ? "a sample spread over it, " : "", e->samples, e->split);
    return buf;
}

// A signal asks the run to stop cleanly: Slurm sends SIGTERM before it kills a job (scancel,
// preemption), `sbatch --signal=USR1@300` sends SIGUSR1 300 s before the time limit, Ctrl-C sends SIGINT
// and a closed terminal SIGHUP. All four do the same: the ranks agree on the stop after the current
// micro-batch (train_step: with --grad-accum N > 1 after each micro-batch, else in the step's AllReduce);
// a step cut short is dropped, and the run saves a checkpoint of the last complete step and exits 0;
// --resume continues. The handlers are installed first thing in main: a signal before step 1 (during
// shard checks, loading, the NCCL rendezvous: minutes on a big job) has nothing to save, and ends the
// process at once with exit code 128 + the signal's number, saying so. SIGXFSZ is ignored, so a file
// size limit (ulimit -f) fails a write with EFBIG, handled as a full disk, instead of killing the run.
// A closed stdout (`./trainer ... | head`: the reader has gone) is a stop too, but never kills the process:
// SIGPIPE only sets the request (pipe_closed), every later write to stdout fails with EPIPE, which printf
// ignores, and the run goes on to its checkpoint. Before step 1 it does not end the process either: the run
// trains step 1, saves its checkpoint and exits 0. A SIGPIPE from another descriptor (stderr closed, a socket:
// comm.h sends with MSG_NOSIGNAL) is ignored, and the write that raised it fails with EPIPE for its caller.
static volatile sig_atomic_t stop_requested = 0, training = 0;
static void pipe_closed(int sig) {
    struct pollfd p = {1, 0, 0};  // stdout: POLLERR when a pipe's reader has gone, POLLHUP a socket's
    if (poll(&p, 1, 0) != 1 || !(p.revents & (POLLERR | POLLHUP))) return;
    if (!stop_requested) {
        static const char m[] = "trainer: stdout was closed (SIGPIPE): stopping after this step with a checkpoint\n";
        ssize_t w = write(2, m, sizeof m - 1);
        (void)w;
        stop_requested = sig;
    }
}
static void request_stop(int sig) {
    if (!training) {
        static const char* const msg[] = {
            "trainer: SIGTERM before step 1: stopping; no checkpoint or export was written (exit code 143)\n",
            "trainer: SIGINT before step 1: stopping; no checkpoint or export was written (exit code 130)\n",
            "trainer: SIGHUP before step 1: stopping; no checkpoint or export was written (exit code 129)\n",
            "trainer: SIGUSR1 before step 1: stopping; no checkpoint or export was written (exit code 138)\n"};
        const char* m = msg[sig == SIGTERM ? 0 : sig == SIGINT ? 1 : sig == SIGHUP ? 2 : 3];
        ssize_t w = write(2, m, strlen(m));
        (void)w;
        _exit(128 + sig);
    }
    stop_requested = sig;
}
static void install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = request_stop;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a stop must not fail a read or write in progress
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = pipe_closed;
    sigaction(SIGPIPE, &sa, NULL);
    signal(SIGXFSZ, SIG_IGN);
}

#include "run_dir.h"  // the run directory: --out, its lock, its files, run.json

static float lr_at(const Options* o, int step) {  // step counts from 1
    if (step <= o->warmup) return o->lr * step / (o->warmup > 0 ? o->warmup : 1);
    float left = (float)(o->steps - step) / (float)(o->steps - o->warmup > 0 ? o->steps - o->warmup : 1);
    return o->lr * (left > 0.f ? left : 0.f);
}

// mfu_text: "MFU 18.2% (of 989 TFLOP/s)" for a GPU sustaining flops_per_s model FLOP/s, or a note that the
// device's peak is unknown.
static void mfu_text(char* buf, size_t n, double flops_per_s, double peak_tflops) {
    if (peak_tflops > 0)
        snprintf(buf, n, "MFU %.1f%% (of %.0f TFLOP/s)", 100.0 * flops_per_s / (peak_tflops * 1e12), peak_tflops);
    else
        snprintf(buf, n, "MFU n/a (unknown device peak)");
}

// One optimizer step, as training and --bench run it: o->grad_accum micro-batches forward and backward,
// the last one's gradients reduced over ranks in buckets while its backward runs (comm.h), their norm,
// AdamW (under ZeRO-1 on this rank's shard, then the new weights all-gathered); then the step's one host
// sync. Under --bench (bench_timer set), the step's phases are marked on the stream.
typedef struct {
    float loss, norm;      // the mean loss per masked token over all ranks; the gradient norm
    long long tokens;      // real tokens this rank trained on
    long long all_tokens;  // real tokens all ranks trained on
    double wait_ms;        // host time spent waiting for the loader threads
    int stop;              // some rank was asked to stop (a signal): every rank stops after this step
    int ckpt;              // rank 0 asked for a checkpoint after this step (--ckpt-minutes): every rank knows
    int skipped;           // the loss or the gradient norm was not finite: no update was made
    int dropped;           // a stop between micro-batches: the step was abandoned (no update, gradients cleared)
    uint64_t comm_bytes;   // bytes this rank sent through NCCL in the step (comm_count's model)
} StepResult;

// model_set_params: a host fp32 slab (numel floats) as the weights; under ZeRO-1 this rank keeps its shard of
// the master weights (through the gradient buffer, which is zero again afterwards) and every floatX weight.
static void model_set_params(BertModel* m, const GradReduce* gr, const float* host) {
    if (!gr->zero) {
        bert_set_params(m, host);
        return;
    }
    size_t n = m->p.numel;
    CUDA_CHECK(cudaMemcpyAsync(m->grad, host, n * sizeof(float), cudaMemcpyHostToDevice, m->stream));
    launch(copy_to_floatX, dim3(launch_grid_cap()), dim3(256), 0, m->stream, m->w, (const float*)m->grad, n);
    zero_scatter(gr, m->grad, m->master, m->stream);
    bert_zero_grad(m);
}
// model_get_params: the fp32 master weights (numel floats) into host (NULL: nowhere). Under ZeRO-1 every rank
// calls it: the shards are gathered through the gradient buffer (between steps; zero again afterwards).
static void model_get_params(BertModel* m, const GradReduce* gr, float* host) {
    if (!gr->zero) {
        if (host) bert_get_params(m, host);
        return;
    }
    zero_gather(gr, m->master, m->grad, m->stream);
    if (host) CUDA_CHECK(cudaMemcpy(host, m->grad, m->p.numel * sizeof(float), cudaMemcpyDeviceToHost));
    bert_zero_grad(m);
}

// scratch (device floats, summed over ranks once per step): [0] loss sum, [1] masked count, [2] stop
// requests, [3] ZeRO-1: the gradients' sum of squares, [4] checkpoint requests, [5..6] real tokens / 4096
// and % 4096 (validation has its own sums: Validation).
enum { S_LOSS, S_COUNT, S_STOP, S_SUMSQ, S_CKPT, S_TOK_HI, S_TOK_LO, S_STEP_N };
// scratch[S_STEP_N]: the stop agreement between micro-batches (stop_agreed), the last of the 8 floats; its host
// side is bm->host[S_STEP_N + 1] (the sum) and [S_STEP_N + 2] (this rank's flag, the copy's pinned source)
static_assert(S_STEP_N < 8, "batch_maker_alloc gives 8 floats of step sums; stop_agreed uses scratch[S_STEP_N]");

// stop_agreed: between two micro-batches of a step: whether any rank was asked to stop, decided the same on
// every rank, one micro-batch late so that neither the host nor the GPU waits for it. After micro-batch k is
// queued, this rank's flag is summed over the ranks on the communication stream (one float; the compute stream
// never waits for the network) into pinned memory; after micro-batch k+1 is queued, the host reads that sum
// (comm_wait: the GPU is busy with k+1 by then, and the watchdog guards the wait). `pending` carries the sum in
// flight from one call to the next; launch_next 0 (after the last micro-batch) only collects it. With one rank,
// the flag itself. The all-reduce waits for the compute stream's work queued before it (stop_ev), and every
// later collective is queued after the host has seen it end: the ranks' collectives on this communicator run
// in one order on every rank, whatever stream they are on (NCCL does not promise that two of them in flight
// on two streams can progress together: NVIDIA/nccl issues #195, #217).
static int stop_agreed(GradReduce* gr, BatchMaker* bm, cudaStream_t compute, float* slot, int* pending,
                       int launch_next) {
    Comm* comm = gr->comm;
    if (comm->world == 1) return launch_next && stop_requested != 0;
    float *sum = bm->host + S_STEP_N + 1, *flag = bm->host + S_STEP_N + 2;
    int stop = 0;
    if (*pending) {
        comm_wait(comm, gr->stream, "stop AllReduce (between micro-batches)");
        stop = *sum > 0.f, *pending = 0;
    }
    if (stop || !launch_next) return stop;
    *flag = stop_requested ? 1.f : 0.f;  // pinned: the copy returns at once, and reads it before the next call
    CUDA_CHECK(cudaEventRecord(bm->stop_ev, compute));
    CUDA_CHECK(cudaStreamWaitEvent(gr->stream, bm->stop_ev, 0));
    CUDA_CHECK(cudaMemcpyAsync(slot, flag, sizeof *flag, cudaMemcpyHostToDevice, gr->stream));
    comm_sum(comm, slot, 1, gr->stream, "stop AllReduce (between micro-batches)");
    CUDA_CHECK(cudaMemcpyAsync(sum, slot, sizeof *sum, cudaMemcpyDeviceToHost, gr->stream));
    *pending = 1;
    return 0;
}

// train_step: one optimizer step: --grad-accum micro-batches forward and backward, then the optimizer's exchange,
// norm and update (optim.h) around the step's one host sync.
static StepResult train_step(BertModel* m, DataLoader* train, BatchMaker* bm, Optimizer* op, float* scratch,
                             const Options* o, float lr, int want_ckpt) {
    StepResult r;
    memset(&r, 0, sizeof r);
    GradReduce* gr = op->gr;
    Comm* comm = gr->comm;
    uint64_t sent0 = comm->sent;
    optimizer_begin(op, m);
    int stop_pending = 0;      // a stop agreement in flight (stop_agreed)
    comm->step = m->step + 1;  // for the watchdog's messages
    for (int micro = 0; micro < o->grad_accum; micro++) {
        bench_phase(PHASE_DATA, m->stream);
        Batch b;
        if (dataloader_next(train, m->stream, &b)) {
            fprintf(stderr, "trainer: %s\n", train->error);
            exit(1);
        }
        r.wait_ms += b.wait_ms;
        r.tokens += b.num_real_tokens;
        int n_masked;
        bench_phase(PHASE_OTHER, m->stream);
        BertBatch bt = make_batch(bm, &b, m->B, m->T, m->stream, &n_masked);
        // The gradient of each micro-batch's mean loss, weighted 1/grad_accum. A micro-batch with no
        // masked token (possible at an epoch's end) still needs a non-zero scale, so that its
        // dlogits are written (as zeros: all its head rows are padding).
        bert_forward(m, &bt, 1.f / ((float)(n_masked > 0 ? n_masked : 1) * o->grad_accum));
        // the last micro-step's backward makes the final gradients: it marks them as they become final
        m->grad_ready = micro == o->grad_accum - 1 ? gr->ready : NULL;
        bert_backward(m, &bt);
        m->grad_ready = NULL;
        add_loss(scratch, m, n_masked);
        // A stop is honoured between micro-batches, so a long accumulation answers a signal within one of them:
        // the partial step is abandoned (its gradients and loss sums cleared; the caller saves the last complete
        // step, with the data position from before this one).
        if (stop_agreed(gr, bm, m->stream, scratch + S_STEP_N, &stop_pending, micro < o->grad_accum - 1)) {
            bert_zero_grad(m);
            CUDA_CHECK(cudaMemsetAsync(scratch, 0, S_STEP_N * sizeof(float), m->stream));
            comm_wait(comm, m->stream, "dropping the step cut short");
            r.stop = r.dropped = 1;
            return r;
        }
    }
    // The buckets' reductions wait on the communication stream for the events of that backward, which the GPU
    // is still running: they overlap it. The phase is what is left of them when it ends (on the CPU build too,
    // whose streams run as the GPU's do).
    bench_phase(PHASE_ALLREDUCE, m->stream);
    op->exchange(op, m);
    test_hooks(o, comm, m, scratch + S_LOSS);
    bench_phase(PHASE_OPTIM, m->stream);
    op->norm(op, m, scratch + S_SUMSQ);
    // The one host sync of the step, before the update: over all ranks the loss sum, masked count, stop and
    // checkpoint requests, and the gradients' sum of squares where the norm is made of the ranks' pieces; else the
    // norm on the device, the same on every rank. A loss or norm that is not finite skips the update: the weights and
    // AdamW moments stay as they were (the step still counts: its batches are consumed and the schedule moves on).
    // This rank's real tokens go in two parts (/ 4096, % 4096), so that each float sum stays an exact integer.
    float stop = stop_requested ? 1.f : 0.f, ckpt = want_ckpt ? 1.f : 0.f, *h = bm->host, *norm = bm->host + S_STEP_N;
    float tok[2] = {(float)(r.tokens / 4096), (float)(r.tokens % 4096)};
    if (!op->sumsq_div) CUDA_CHECK(cudaMemcpyAsync(norm, m->norm, sizeof *norm, cudaMemcpyDeviceToHost, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_STOP, &stop, sizeof stop, cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_CKPT, &ckpt, sizeof ckpt, cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_TOK_HI, tok, sizeof tok, cudaMemcpyHostToDevice, m->stream));
    all_ranks_sum(comm, scratch, S_STEP_N, h, m->stream, "step loss AllReduce (the step's host sync)");
    r.norm = op->sumsq_div ? sqrtf(h[S_SUMSQ] / (float)op->sumsq_div) : *norm;  // (pinned: complete after the sync)
    if (gr->zero)  // (AdamW clips by the norm on the device)
        CUDA_CHECK(cudaMemcpyAsync(m->norm, &r.norm, sizeof r.norm, cudaMemcpyHostToDevice, m->stream));
    r.loss = h[S_COUNT] > 0.f ? h[S_LOSS] / h[S_COUNT] : 0.f;
    r.stop = h[S_STOP] > 0.f;
    r.ckpt = h[S_CKPT] > 0.f;
    r.all_tokens = 4096 * (long long)h[S_TOK_HI] + (long long)h[S_TOK_LO];
    r.skipped = !isfinite(r.loss) || !isfinite(r.norm);
    if (r.skipped)
        m->step++;
    else
        op->update(op, m, lr, r.norm);
    optimizer_end(op, m, r.skipped);
    bench_phase(PHASE_END, m->stream);
    r.comm_bytes = comm->sent - sent0;
    return r;
}

#include "bench.h"  // --bench: the training step, timed

// ----------------------------------------------------------------------------

#include "progress.h"  // progress: the log lines and DIR/metrics.jsonl

// no_gpu_reason: why cudaGetDeviceCount found no GPU, in words. Without an NVIDIA driver loaded (no
// /proc/driver/nvidia/version) the CUDA runtime reports cudaErrorInsufficientDriver, "CUDA driver version is
// insufficient for CUDA runtime version", which reads as if an older driver were there: say which it is.
static const char* no_gpu_reason(cudaError_t e, char* buf, size_t size) {
    if (e == cudaSuccess)
        snprintf(buf, size, "no CUDA device");
    else if (e == cudaErrorInsufficientDriver && access("/proc/driver/nvidia/version", F_OK) != 0)
        snprintf(buf, size, "no NVIDIA driver is loaded: no /proc/driver/nvidia/version");
    else if (e == cudaErrorInsufficientDriver)
        snprintf(buf, size, "the NVIDIA driver is older than this CUDA runtime needs: %s", cudaGetErrorString(e));
    else
        snprintf(buf, size, "%s", cudaGetErrorString(e));
    return buf;
}

// use_device: the GPU this rank runs on (comm_device's rule), its properties and free memory. Exits on error.
static void use_device(Comm* comm, cudaDeviceProp* prop, size_t* free_bytes, size_t* total_bytes) {
    int ndev = 0;
    char err[512];
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr,
                "trainer: no usable GPU here (%s); ./trainer_cpu is the same trainer on the CPU: run it with "
                "the same flags\n",
                no_gpu_reason(e, err, sizeof err));
        exit(1);
    }
    if ((comm->device = comm_device(comm->local_rank, ndev, err, sizeof err)) < 0) {
        fprintf(stderr, "trainer: rank %d: %s\n", comm->rank, err);
        exit(1);
    }
    CUDA_CHECK(cudaSetDevice(comm->device));
    CUDA_CHECK(cudaGetDeviceProperties(prop, comm->device));
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

static uint64_t fingerprint(uint64_t h, const void* p, size_t n) {  // FNV-1a over n bytes
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t*)p)[i]) * 0x100000001b3ull;
    return h;
}

// data_fingerprint: the shards_fingerprint of a glob's shards (headers only); the first shard's header (the
// vocabulary and its special ids: all shards agree, data.h checks) and the real tokens in all of them.
static uint64_t data_fingerprint(const char* flag, const char* pattern, ShardHeader* h, double* tokens) {
    Shard* shards;
    int n;
    char err[DATA_ERR_LEN];
    if (shards_open_all(pattern, &shards, &n, 1, err)) {
        fprintf(stderr, "trainer: %s: %s\n", flag, err);
        exit(1);
    }
    uint64_t f = shards_fingerprint(shards, n);
    if (h) *h = shards[0].h;
    for (int i = 0; tokens && i < n; i++) *tokens += (double)shards[i].h.num_tokens;
    for (int i = 0; i < n; i++) shard_close(&shards[i]);
    free(shards);
    return f;
}

// agree: every rank runs the same model, flags and data, with the same micro-batch: one AllReduce
// compares them (comm_agree). A value that differs stops every rank, each naming it with its value and
// the others' (comm_agree_flags). The automatic micro-batch is the smallest any rank can hold. Gives B.
// The table holds every flag that changes the model, the data a rank reads, the arithmetic, or which
// collectives run when (a rank that checkpoints, validates or stops at another step would desynchronise
// them). Adding a flag is one line: comm_flag_int / comm_flag_real / comm_flag_fingerprint (name, value).
static int agree(Comm* comm, const Options* o, const BertConfig* cfg, int B, uint64_t data_fp, uint64_t val_fp) {
    const uint64_t h0 = 0xcbf29ce484222325ull;
    CommFlag f[] = {
        comm_flag_int("--seq", o->T),
        comm_flag_int("--batch (0: the largest that fits)", o->B),
        comm_flag_int("--grad-accum", o->grad_accum),
        comm_flag_int("--steps", o->steps),
        comm_flag_int("--warmup", o->warmup),
        comm_flag_real("--lr", o->lr),
        comm_flag_real("--wd", o->wd),
        comm_flag_real("--beta1", o->beta1),
        comm_flag_real("--beta2", o->beta2),
        comm_flag_real("--eps", o->eps),
        comm_flag_real("--clip", o->clip),
        comm_flag_int("--seed", o->seed),
        comm_flag_int("--resume (1: given)", o->resume),
        comm_flag_int("--run-steps", o->run_steps),
        comm_flag_int("--val-every", o->val_every),
        comm_flag_int("--val-batches", o->val_batches),
        comm_flag_int("--ckpt-every", o->ckpt_every),
        comm_flag_int("--max-bad-steps", o->max_bad_steps),
        comm_flag_int("--zero", o->zero),
        comm_flag_real("--bucket-mb", o->bucket_mb),
        comm_flag_int("--grad-reduce (1: bf16)", o->grad_reduce_bf16),
        comm_flag_int("--tokens", o->tokens),
        comm_flag_real("--epochs", o->epochs),
        comm_flag_int("--stage-dir (1: given)", o->stage_dir != NULL),
        comm_flag_int("--global-batch", o->global_batch),
        comm_flag_int("--max-global-batch", o->max_global_batch),
        comm_flag_int("--comm onebit (1: given)", o->onebit),
        comm_flag_int("--comm-warmup", o->comm_warmup),
        comm_flag_int("--comm-refresh", o->comm_refresh),
        comm_flag_int("--comm-var-steps", o->comm_var_steps),
        comm_flag_int("the floating-point type of the weights (bytes; the build)", (int64_t)sizeof(floatX)),
        comm_flag_int("the model's layers (--preset, --init-from)", cfg->layers),
        comm_flag_int("the model's hidden size (--preset, --init-from)", cfg->hidden),
        comm_flag_int("the model's heads (--preset, --init-from)", cfg->heads),
        comm_flag_int("the model's FFN size (--preset, --init-from)", cfg->intermediate),
        comm_flag_int("the model's positions (--preset, --init-from)", cfg->max_position),
        comm_flag_int("the model's vocabulary (--init-from, the shards' vocabulary)", cfg->vocab_size),
        comm_flag_fingerprint("the model configuration (--preset or --init-from)", fingerprint(h0, cfg, sizeof *cfg)),
        comm_flag_fingerprint("the training data (the --data shards: names in order, sizes, checksums)", data_fp),
        comm_flag_fingerprint("the validation data (the --val shards)", val_fp),
        comm_flag_smallest("micro-batch", B),  // last: every rank takes the smallest
    };
    enum { n = sizeof f / sizeof f[0] };
    CommValue v[n];
    if (comm_agree_flags(comm, f, n, v)) exit(1);  // every rank sees the same min and max: all stop here
    if (comm->rank == 0 && v[n - 1].min != v[n - 1].max)
        printf("micro-batch: B=%lld, the smallest any rank can hold (the ranks' largest: %lld to %lld)\n",
               (long long)v[n - 1].min, (long long)v[n - 1].min, (long long)v[n - 1].max);
    return (int)v[n - 1].min;
}

// agree_on_position: after loading, every rank starts from the same step and data position (a rank that
// resumed from another checkpoint, or found none, stops them all).
static void agree_on_position(Comm* comm, const BertModel* m, const DataLoader* train) {
    DataLoaderState d = dataloader_state(train);
    CommValue v[] = {{"step to start from (--resume: the checkpoint each rank loaded)", m->step, 0, 0},
                     {"data position (epoch, row)", (int64_t)fingerprint(0xcbf29ce484222325ull, &d, sizeof d), 0, 0}};
    comm_agree(comm, v, 2);
    for (int i = 0; i < 2; i++)
        if (v[i].min != v[i].max) {
            fprintf(stderr,
                    "trainer: rank %d of %d: the ranks disagree on the %s: %lld here, from %lld to %lld over the "
                    "ranks (is --out on a file system every rank sees?)\n",
                    comm->rank, comm->world, v[i].name, (long long)v[i].value, (long long)v[i].min,
                    (long long)v[i].max);
            exit(1);
        }
}

// scaling_lists: n elements and n events (a bucket or part list of ScalingWork), or a message and exit.
static void scaling_lists(int n, double** elems, int** events) {
    *elems = (double*)malloc(n * sizeof(double));
    *events = (int*)malloc(n * sizeof(int));
    if (!*elems || !*events) {
        fprintf(stderr, "trainer: out of host memory for the scaling prediction\n");
        exit(1);
    }
}

// scaling_work: what scaling.h needs of the model, the micro-batch and the flags: FLOPs, the gradient buckets
// that comm.h's grad_reduce_layout makes for `world` ranks (their collectives' sizes and the backward events
// they wait for) and where in the backward each event falls (its share of the backward's FLOPs: the head,
// then one layer after another). Free with scaling_work_free.
static ScalingWork scaling_work(const Options* o, const BertConfig* cfg, const Plan* plan, int world,
                                const char* device) {
    ScalingWork w;
    memset(&w, 0, sizeof w);
    BertFlops f = bert_flops_per_token(cfg, plan->T, 0.15);
    w.flops_per_token = f.model;
    w.peak_tflops = device_peak_tflops(device);
    w.mfu = o->mfu > 0 ? o->mfu : scaling_default_mfu(cfg->hidden), w.mfu_given = o->mfu > 0;
    w.micro_s_at_B = o->micro_ms * 1e-3;
    if (w.micro_s_at_B > 0 && w.peak_tflops <= 0) w.peak_tflops = 1;  // no peak needed
    w.B = plan->B, w.T = plan->T;
    w.zero = o->zero && world > 1;
    w.weight_bytes = sizeof(floatX);
    w.sync_bytes = 8 * sizeof(float);  // the step's host sync: a handful of floats (S_STEP_N)
    // the onebit table: this run's schedule when it is known (--steps, --comm-warmup, --comm-refresh), else the
    // defaults' over SCALING_RUN_STEPS steps; its share of AdamW steps (compress.h's onebit_schedule)
    w.run_steps = o->steps > 0 ? o->steps : SCALING_RUN_STEPS;
    w.refresh = o->onebit ? o->comm_refresh : ONEBIT_REFRESH_DEFAULT;
    int adamw_steps,
        warmup = o->onebit && o->comm_warmup ? o->comm_warmup : onebit_default_warmup(w.run_steps, o->warmup);
    onebit_schedule(warmup, o->onebit ? o->comm_var_steps : ONEBIT_VAR_SCALER, w.refresh, w.run_steps, &adamw_steps);
    w.adamw_share = (double)adamw_steps / w.run_steps;
    BertParams params;
    bert_params_build(&params, cfg);
    w.params = (double)params.numel;
    w.n_events = bert_grad_ready_count(&params);
    double head = f.head / f.model;
    for (int k = 0; k < w.n_events && k < SCALING_MAX_EVENTS; k++)
        w.event_frac[k] = k == 0 ? head : k > cfg->layers ? 1 : head + (1 - head) * k / cfg->layers;
    Comm fake;  // only its world size matters to the layout
    memset(&fake, 0, sizeof fake);
    fake.world = world;
    GradReduce g;
    grad_reduce_setup(&g, cfg, &fake, o);
    w.n_buckets = g.n;
    scaling_lists(g.n, &w.bucket_elems, &w.bucket_event);
    for (int i = 0; i < g.n; i++)
        w.bucket_elems[i] = (double)(g.zero ? (size_t)world * g.b[i].piece : g.b[i].n),
        w.bucket_event[i] = g.b[i].event;
    OneBit ob;  // the onebit modes' parts (compress.h), and which part holds each layer's weights
    onebit_layout(&ob, &g, 0, 1, onebit_part_elems(o));
    w.n_parts = ob.n_parts;
    scaling_lists(ob.n_parts, &w.part_elems, &w.part_event);
    for (int i = 0; i < ob.n_parts; i++) w.part_elems[i] = (double)ob.part[i].n, w.part_event[i] = ob.part[i].event;
    w.n_layers = cfg->layers;
    for (int l = 0; l <= cfg->layers && l < SCALING_MAX_EVENTS; l++)
        w.layer_part[l] = onebit_layer_part(&ob, &params, l);
    free(ob.part);
    free(g.b);
    bert_params_free(&params);
    return w;
}
static void scaling_work_free(ScalingWork* w) {
    free(w->bucket_elems);
    free(w->bucket_event);
    free(w->part_elems);
    free(w->part_event);
}

// scaling_mode_of: the scaling.h mode this run communicates in (--comm).
static const ScalingModeDesc* scaling_mode_of(const Options* o) {
    return &scaling_modes[o->onebit ? SCALING_ONEBIT : o->grad_reduce_bf16 ? SCALING_BF16 : SCALING_FP32];
}

// job_nodes: the nodes this job runs on: --nodes, else Slurm's SLURM_NNODES, else 1.
static int job_nodes(const Options* o) {
    return o->nodes ? o->nodes : (int)env_int("SLURM_NNODES", 1, 1, 1 << 16);  // (--nodes' range)
}

// predict_scaling: --plan-only prints the scaling tables (scaling.h) for --nodes x --gpus-per-node, one per
// communication mode; in a run, --grad-accum auto and --global-batch become the accumulation they imply for
// this job's layout (SLURM_NNODES nodes, the ranks spread over them) on `device`. 0 (with the reason) when
// that cannot be resolved.
static int predict_scaling(Options* o, const BertConfig* cfg, const Plan* plan, const Comm* comm, const char* device) {
    int nodes = o->nodes || !o->plan_only ? job_nodes(o) : 1;
    int world = o->plan_only ? nodes * (o->gpus_per_node ? o->gpus_per_node : 1) : comm->world;
    if (o->global_batch && !o->plan_only) {  // the accumulation a global batch implies: world x accum x B
        long long per_step = (long long)world * plan->B;
        if (o->global_batch % per_step) {
            int b = plan->B;  // the largest micro-batch that divides it, to suggest
            while (b > 1 && o->global_batch % ((long long)world * b)) b--;
            if (comm->rank == 0) {
                if (o->global_batch % world)
                    fprintf(stderr, "trainer: --global-batch %lld: not a multiple of the %d GPU(s)\n", o->global_batch,
                            world);
                else
                    fprintf(stderr,
                            "trainer: --global-batch %lld: not a multiple of %d GPU(s) x B=%d = %lld sequences; "
                            "--batch %d divides it\n",
                            o->global_batch, world, plan->B, per_step, b);
            }
            return 0;
        }
        long long accum = o->global_batch / per_step;  // (64 bits: an int held 2^31 as -2^31, 2^32 as 0)
        if (accum > SCALING_MAX_ACCUM) {
            if (comm->rank == 0)
                fprintf(stderr,
                        "trainer: --global-batch %lld: %lld micro-batches of B=%d on each of %d GPU(s), more than "
                        "--grad-accum's limit of %d: a smaller --global-batch (at most %lld) or a larger --batch\n",
                        o->global_batch, accum, plan->B, world, SCALING_MAX_ACCUM,
                        (long long)SCALING_MAX_ACCUM * per_step);
            return 0;
        }
        o->grad_accum = (int)accum;
        if (comm->rank == 0)
            printf("--global-batch %lld: %d micro-batch(es) of B=%d on each of %d GPU(s)\n", o->global_batch,
                   o->grad_accum, plan->B, world);
    }
    ScalingCluster c =
        scaling_cluster_default(nodes, o->gpus_per_node ? o->gpus_per_node : (world + nodes - 1) / nodes);
    if (o->global_batch && o->plan_only &&
        plan->B > 0) {  // the tables' first row, one node, needs the most micro-batches
        long long per_gpu = o->global_batch / c.gpus_per_node, accum = (per_gpu + plan->B - 1) / plan->B;
        if (accum > SCALING_MAX_ACCUM) {
            if (comm->rank == 0)
                fprintf(stderr,
                        "trainer: --global-batch %lld: %lld micro-batches of B=%d on each of %d GPU(s) of one node, "
                        "more than --grad-accum's limit of %d: a smaller --global-batch (at most %lld) or a larger "
                        "--batch\n",
                        o->global_batch, accum, plan->B, c.gpus_per_node, SCALING_MAX_ACCUM,
                        (long long)SCALING_MAX_ACCUM * c.gpus_per_node * plan->B);
            return 0;
        }
    }
    if (o->net_gbps > 0) c.net_gbps = o->net_gbps;
    if (o->nvlink_gbps > 0) c.nvlink_gbps = o->nvlink_gbps;
    if (o->link_efficiency > 0) c.link_efficiency = o->link_efficiency;
    if (o->alpha_us >= 0) c.alpha_net_s = o->alpha_us * 1e-6;
    ScalingWork w = scaling_work(o, cfg, plan, world, device);
    int ok = 1;
    if (w.peak_tflops <= 0) {
        if (o->grad_accum == 0) {
            fprintf(stderr,
                    "trainer: --grad-accum auto: the bf16 peak of device \"%s\" is unknown; name a known one with "
                    "--device or give a number\n",
                    device);
            ok = 0;
        } else if (o->plan_only && comm->rank == 0) {
            printf(
                "scaling prediction: the bf16 peak of device \"%s\" is unknown; --device NAME predicts for "
                "a known one\n",
                device);
        }
    } else if (o->plan_only) {
        if (comm->rank == 0)
            scaling_print(&c, &w, o->grad_accum, o->global_batch, o->max_global_batch,
                          o->init_from ? o->init_from : o->preset);
    } else if (o->grad_accum == 0 && (long long)comm->world * plan->B > o->max_global_batch) {
        if (comm->rank == 0)  // (an automatic B was made to fit: global_batch_rows)
            fprintf(stderr,
                    "trainer: --grad-accum auto: one micro-batch of --batch %d on %d GPU(s) is %lld sequences, above "
                    "--max-global-batch %lld: a --batch of at most %lld, or a larger --max-global-batch\n",
                    plan->B, comm->world, (long long)comm->world * plan->B, o->max_global_batch,
                    o->max_global_batch / comm->world > 0 ? o->max_global_batch / comm->world : 1);
        ok = 0;
    } else if (o->grad_accum == 0) {
        ScalingPrediction p = scaling_predict(&c, &w, scaling_mode_of(o), 0, plan->B, o->max_global_batch);
        o->grad_accum = p.accum;
        if (comm->rank == 0) {
            printf(
                "--grad-accum auto: %d (%d node(s) x %d GPU(s) of %s, --comm %s: %d collectives, %.1f ms, %.1f ms "
                "exposed of a %.1f ms step, predicted efficiency %.1f%%); global batch %lld sequences, %.4g tokens\n",
                p.accum, c.nodes, c.gpus_per_node, device, scaling_mode_of(o)->name, p.collectives, p.comm_s * 1e3,
                p.exposed_s * 1e3, p.step_s * 1e3, 100 * p.efficiency, (long long)comm->world * p.accum * plan->B,
                (double)comm->world * p.accum * plan->B * plan->T);
            if (p.capped)
                printf(
                    "--grad-accum auto: --max-global-batch %lld keeps it at %d micro-batch(es), short of its target "
                    "(exposed communication at most %.0f%% of the step)\n",
                    o->max_global_batch, p.accum, 100 * SCALING_EXPOSED_MAX);
        }
    }
    scaling_work_free(&w);
    return ok;
}

// ----------------------------------------------------------------------------
// The phases of a run, in main's order.

// plan_for_run: the memory plan (--batch, or the largest micro-batch that fits, plus validation's sums when
// there is --val), printed by rank 0. Gives 1, or 0 after saying why it cannot fit.
static int plan_for_run(const BertConfig* cfg, const Options* o, int loaders, const GradReduce* gr, size_t free_bytes,
                        size_t total_bytes, const cudaDeviceProp* prop, const Comm* comm, long long max_rows,
                        Plan* plan) {
    char why[256];
    *plan = auto_batch(cfg, o, loaders, gr, free_bytes, total_bytes, prop->name, max_rows, why, sizeof why);
    if (o->val) plan_add_validation(plan, o->val_batches, o->val);
    if (comm->rank == 0) {
        printf("device: %s, %.1f GB free of %.1f GB; %d process(es)\n", prop->name, free_bytes / 1e9, total_bytes / 1e9,
               comm->world);
        bert_print_plan(cfg, plan->B, plan->T, plan->M, (int)sizeof(floatX));
        printf("  batch buffers %.3f GiB; total %.3f GiB for B=%d (%s)\n",
               (plan->batch_bytes + plan->maker_bytes + plan->val_bytes) / (double)(1 << 30),
               plan->total / (double)(1 << 30), plan->B, why);
    }
    if (plan->total > free_bytes) {
        fprintf(stderr,
                "trainer: the model needs %.3f GiB at B=%d but %.3f GiB are free: use a smaller --seq, "
                "--preset or --batch\n",
                plan->total / (double)(1 << 30), plan->B, free_bytes / (double)(1 << 30));
        return 0;
    }
    return 1;
}
// reserve_plan: the plan's bytes, allocated once and freed, to prove they can be had (the free figure may
// promise more). Gives 1, or 0 after saying so.
static int reserve_plan(const Plan* plan, const Options* o) {
    void* probe;
    if (cudaMalloc(&probe, plan->total) != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "trainer: cannot allocate the %.3f GiB of device memory planned for B=%d: %s\n",
                plan->total / (double)(1 << 30), plan->B, o->B ? "use a smaller --batch" : "set a smaller --batch");
        return 0;
    }
    CUDA_CHECK(cudaFree(probe));
    return 1;
}

// resolve_run_length: --tokens or --epochs as optimizer steps of the global batch (world x --grad-accum x B
// rows of T), and the default warmup; prints the global batch and the steps per epoch (rank 0). An epoch
// is counted in tokens: the tokens in the training shards / the tokens per step (packing leaves a few
// percent of positions empty, so the real tokens of a step are a little fewer: the log's epoch column
// gives the fraction actually consumed).
static void resolve_run_length(Options* o, const Comm* comm, int B, double epoch_tokens, int verbose) {
    // (in 64 bits and double: world x --grad-accum (at most 2^20) x B (2^20) x T (2^16) is past an int's range)
    long long rows = (long long)comm->world * o->grad_accum * B;
    double per_step = (double)rows * o->T;
    double steps = o->tokens       ? ceil(o->tokens / per_step)
                   : o->epochs > 0 ? ceil(o->epochs * epoch_tokens / per_step)
                                   : o->steps;
    if (steps > (1 << 30)) {
        fprintf(stderr, "trainer: %s is %.3g steps of %.0f tokens: more than 2^30 steps\n",
                o->tokens ? "--tokens" : "--epochs", steps, per_step);
        exit(1);
    }
    o->steps = steps < 1 ? 1 : (int)steps;
    if (o->steps * per_step >= (double)CKPT_TOKENS_MAX) {  // (2^30 steps x 2^20 x B x T can pass it)
        fprintf(stderr,
                "trainer: %s: %d steps of %.0f tokens (%lld sequences of %d) = %.3g tokens, more than 2^62 (the "
                "most a checkpoint counts): fewer steps or a smaller %s\n",
                o->tokens       ? "--tokens"
                : o->epochs > 0 ? "--epochs"
                                : "--steps",
                o->steps, per_step, rows, o->T, o->steps * per_step,
                o->global_batch ? "--global-batch" : "--grad-accum or --batch");
        exit(1);
    }
    if (o->warmup < 0) o->warmup = o->steps / 100;
    if (!verbose) return;
    printf(
        "global batch: %lld sequences of %d tokens (%d process(es) x %d micro-batch(es) x B=%d) = %.0f tokens "
        "per step; an epoch (%.0f tokens in the training shards) is %.1f steps\n",
        rows, o->T, comm->world, o->grad_accum, B, per_step, epoch_tokens, epoch_tokens / per_step);
    if (o->tokens) printf("--tokens %lld: %d steps\n", o->tokens, o->steps);
    if (o->epochs > 0) printf("--epochs %g: %d steps\n", o->epochs, o->steps);
    if (o->warmup >= o->steps)
        printf(
            "note: --warmup %d is not below --steps %d: the learning rate only rises (linear warm-up to --lr at step "
            "%d) and never decays\n",
            o->warmup, o->steps, o->warmup);
}

// byte_token_char: the character that stands for byte b in a byte tokenizer.json, as in GPT-2's byte-level
// alphabet (tokenizers' ByteLevel pre-tokenizer and decoder use the same): the printable bytes '!'..'~',
// 0xA1..0xAC and 0xAE..0xFF are themselves; the other 68, in order, are U+0100, U+0101, ... .
static int byte_token_char(int b) {
    int n = 0;
    for (int c = 0; c < b; c++) n += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255));
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    return printable ? b : 256 + n;
}

// export_byte_tokenizer: for byte shards, DIR/tokenizer.json that Hugging Face's tokenizers library (and
// transformers' AutoTokenizer, PreTrainedTokenizerFast) reads with the model's ids: the text's UTF-8 bytes,
// one token per byte (a ByteLevel pre-tokenizer maps each byte to its character, byte_token_char, and a Split
// isolates each character), a WordLevel vocabulary giving character(b) the id b, the header's [PAD] [CLS]
// [SEP] [MASK] as special added tokens, [CLS] text [SEP] added as the shards' samples have them, and a
// ByteLevel decoder back to bytes. With tokenizer_config.json (model_max_length: T, the length trained at)
// and special_tokens_map.json. Gives 1, or 0 after a message.
static int export_byte_tokenizer(const char* out, const ShardHeader* h, int T) {
    const char* names[4] = {"[PAD]", "[CLS]", "[SEP]", "[MASK]"};
    int ids[4] = {h->pad_id, h->cls_id, h->sep_id, h->mask_id};
    static char buf[32768];  // about 9 KB
    size_t n = 0, cap = sizeof buf;
#define OUT(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__))
    OUT("{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n \"added_tokens\": [");
    for (int i = 0; i < 4; i++)
        OUT("%s\n  {\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
            "\"normalized\": false, \"special\": true}",
            i ? "," : "", ids[i], names[i]);
    const char* bytelevel =
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}";
    OUT("],\n \"normalizer\": null,\n \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [%s,\n"
        "  {\"type\": \"Split\", \"pattern\": {\"Regex\": \".\"}, \"behavior\": \"Isolated\", \"invert\": false}]},\n",
        bytelevel);
    const char* cls = "{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}}";
    OUT(" \"post_processor\": {\"type\": \"TemplateProcessing\",\n  \"single\": [%s, {\"Sequence\": {\"id\": \"A\", "
        "\"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 0}}],\n",
        cls);
    OUT("  \"pair\": [%s, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"[SEP]\", "
        "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}, {\"SpecialToken\": {\"id\": \"[SEP]\", "
        "\"type_id\": 1}}],\n",
        cls);
    OUT("  \"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", \"ids\": [%d], \"tokens\": [\"[CLS]\"]}, "
        "\"[SEP]\": {\"id\": \"[SEP]\", \"ids\": [%d], \"tokens\": [\"[SEP]\"]}}},\n",
        h->cls_id, h->sep_id);
    OUT(" \"decoder\": %s,\n \"model\": {\"type\": \"WordLevel\", \"unk_token\": \"[UNK]\", \"vocab\": {", bytelevel);
    for (int b = 0; b < 256; b++)
        OUT("%s\"\\u%04x\": %d", b % 16 ? ", " : (b ? ",\n  " : "\n  "), byte_token_char(b), b);
    for (int i = 0; i < 4; i++) OUT(", \"%s\": %d", names[i], ids[i]);
    OUT("}}}\n");
#undef OUT
    if (n >= cap) {
        fprintf(stderr, "trainer: the byte tokenizer.json is longer than its %zu-byte buffer\n", cap);
        return 0;
    }
    char path[4200], cfg[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    if (!bert_write_file(path, buf, n, NULL, 0)) return 0;
    static const char specials[] =
        "\"pad_token\": \"[PAD]\", \"cls_token\": \"[CLS]\", \"sep_token\": \"[SEP]\", \"mask_token\": \"[MASK]\"";
    int k = snprintf(cfg, sizeof cfg,
                     "{\"tokenizer_class\": \"PreTrainedTokenizerFast\", \"model_max_length\": %d, "
                     "\"clean_up_tokenization_spaces\": false, %s}\n",
                     T, specials);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
    if (!bert_write_file(path, cfg, (size_t)k, NULL, 0)) return 0;
    k = snprintf(cfg, sizeof cfg, "{%s}\n", specials);
    snprintf(path, sizeof path, "%s/special_tokens_map.json", out);
    return bert_write_file(path, cfg, (size_t)k, NULL, 0);
}

// export_tokenizer: the tokenizer beside the Hugging Face export, so that it is usable as it is. Text
// shards (tools/prepare.py leaves their tokenizer.json beside them): a copy of that tokenizer.json (tok: read and
// checked at start-up, bert_tokenizer_load), and
// tokenizer_config.json + special_tokens_map.json, which transformers' AutoTokenizer.from_pretrained(DIR)
// needs to load it as a fast tokenizer with BERT's special tokens. Byte shards (ids 0..255 are the
// bytes; no [UNK]): byte_tokenizer.json, the mapping and the special ids of the shard header, which
// tools/fill_mask.py reads, and the same as Hugging Face files (export_byte_tokenizer). model_max_length is
// T, the length the run trained at (positions past it were never trained). Each file is written atomically.
// Gives 1, or 0 after a message.
static int export_tokenizer(const char* out, const BertTokenizer* tok, const ShardHeader* h, int T) {
    char path[4200], buf[2048];
    if (tok->json) {
        snprintf(path, sizeof path, "%s/tokenizer.json", out);
        int ok = bert_write_file(path, tok->json, tok->n, NULL, 0);
        static const char specials[] =
            "\"pad_token\": \"[PAD]\", \"unk_token\": \"[UNK]\", \"cls_token\": \"[CLS]\", \"sep_token\": \"[SEP]\", "
            "\"mask_token\": \"[MASK]\"";
        int k =
            snprintf(buf, sizeof buf,
                     "{\"tokenizer_class\": \"PreTrainedTokenizerFast\", \"model_max_length\": %d, %s}\n", T, specials);
        snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
        ok = ok && bert_write_file(path, buf, (size_t)k, NULL, 0);
        k = snprintf(buf, sizeof buf, "{%s}\n", specials);
        snprintf(path, sizeof path, "%s/special_tokens_map.json", out);
        ok = ok && bert_write_file(path, buf, (size_t)k, NULL, 0);
        if (!ok) fprintf(stderr, "trainer: cannot export the tokenizer %s to %s\n", tok->path, out);
        return ok;
    }
    if (h->unk_id < 0 && h->vocab_size == 260 && h->pad_id >= 256 && h->cls_id >= 256 && h->sep_id >= 256 &&
        h->mask_id >= 256) {
        int k = snprintf(buf, sizeof buf,
                         "{\"type\": \"bytes\", \"vocab_size\": %u, \"bytes\": \"token id b (0..255) is the byte b\",\n"
                         " \"special_tokens\": {\"[PAD]\": %d, \"[CLS]\": %d, \"[SEP]\": %d, \"[MASK]\": %d}}\n",
                         h->vocab_size, h->pad_id, h->cls_id, h->sep_id, h->mask_id);
        snprintf(path, sizeof path, "%s/byte_tokenizer.json", out);
        if (!bert_write_file(path, buf, (size_t)k, NULL, 0)) return 0;
        return export_byte_tokenizer(out, h, T);
    }
    printf("note: no tokenizer.json beside the shards (%s) and not a byte vocabulary: the export has no tokenizer\n",
           tok->path);
    return 1;
}

// export_run: the Hugging Face export as one set: model.safetensors, config.json and the tokenizer files are
// written whole (each flushed) into DIR/.export.tmp/, then every file there renamed into DIR, the weights last. A
// failure (a full disk) leaves the earlier export as it was, never a config.json without its weights. 1, or 0 after a
// message.
static int export_run(const char* out, const BertParams* p, const float* w, int pad_id, const BertTokenizer* tok,
                      const ShardHeader* h, int T) {
    char stage[4064], from[4400], to[4400];  // (stage: room for bert_save_hf's names within PATH_MAX)
    snprintf(stage, sizeof stage, "%s/%s", out, EXPORT_STAGING);
    remove_staging(stage);  // what a crash in an earlier export left
    if (mkdir(stage, 0755) != 0) {
        fprintf(stderr, "trainer: cannot create %s: %s\n", stage, strerror(errno));
        return 0;
    }
    int ok = bert_save_hf(stage, p, w, pad_id) && export_tokenizer(stage, tok, h, T);
    for (int last = 0; ok && last < 2; last++) {  // every file staged, model.safetensors in the second pass
        DIR* d = opendir(stage);
        struct dirent* e;
        while (ok && d && (e = readdir(d)) != NULL) {
            int weights = strcmp(e->d_name, "model.safetensors") == 0;
            if (e->d_name[0] == '.' || weights != last) continue;
            snprintf(from, sizeof from, "%s/%s", stage, e->d_name);
            snprintf(to, sizeof to, "%s/%s", out, e->d_name);
            if (rename(from, to) != 0) {
                fprintf(stderr, "trainer: cannot rename %s to %s: %s\n", from, to, strerror(errno));
                ok = 0;
            }
        }
        if (d) closedir(d);
    }
    remove_staging(stage);
    fsync_dir(out);
    return ok;
}

// export_now: rank 0 writes the final weights w (host, fp32) as a Hugging Face BertForMaskedLM with its
// tokenizer; every rank calls it and waits for that (write_begin, write_end). 1, or 0 on every rank when the
// export failed (rank 0 said why), or -1 when the weights are not finite (bert_params_all_finite named the first
// value that is not): no export is written of them.
static int export_now(const Options* o, Comm* comm, Ckpts* ck, BertModel* model, const float* w,
                      const ShardHeader* data_h, const BertTokenizer* tok) {
    char what[4600];
    WriteWatch ww = write_begin(comm, ck, (double)model->p.numel * sizeof(float));
    int ok = 1;
    if (comm->rank == 0) {
        if (!w) {
            fprintf(stderr, "trainer: out of host memory for the export; %s\n",
                    ckpt_whats_on_disk(ck, what, sizeof what));
            ok = 0;
        } else if (!bert_params_all_finite(o->out, &model->p, w)) {
            ok = -1;
        } else if (!export_run(o->out, &model->p, w, data_h->pad_id, tok, data_h, o->T)) {
            fprintf(stderr,
                    "trainer: cannot write the Hugging Face export to %s (see above; none of its files was replaced, "
                    "any earlier export is untouched); %s\n",
                    o->out, ckpt_whats_on_disk(ck, what, sizeof what));
            ok = 0;
        } else {
            printf("saved %s and the Hugging Face export %s/model.safetensors + config.json + the tokenizer\n",
                   ck->path, o->out);
        }
    }
    return write_end(comm, ck, ww, ok);
}

// eval_source: --eval SRC's model: a checkpoint file (its config, T and step in *h) or a Hugging Face export
// directory (its weights in *w, their table in *hp); --seq defaults to the checkpoint's (an export: the
// shards' --seq-len, vh). 1, or 0 after saying why.
static int eval_source(Options* o, const ShardHeader* vh, BertConfig* cfg, CkptHeader* h, BertParams* hp, float** w,
                       int* is_dir) {
    char why[512];
    struct stat st;
    memset(h, 0, sizeof *h);
    memset(hp, 0, sizeof *hp);
    *is_dir = stat(o->eval, &st) == 0 && S_ISDIR(st.st_mode);
    if (stat(o->eval, &st) != 0) {
        fprintf(stderr, "trainer: --eval %s: %s (expected a checkpoint file or a Hugging Face export directory)\n",
                o->eval, strerror(errno));
        return 0;
    }
    if (*is_dir && !bert_load_hf(o->eval, cfg, hp, w)) {
        fprintf(stderr, "trainer: --eval %s: cannot load config.json + model.safetensors from this directory\n",
                o->eval);
        return 0;
    }
    int fd = *is_dir ? -1 : ckpt_open(o->eval, h, why, sizeof why);  // (the header; the body: eval_run's ckpt_read)
    if (!*is_dir && fd < 0) {
        fprintf(stderr, "trainer: --eval %s: %s\n", o->eval, why);
        return 0;
    }
    if (fd >= 0) close(fd);
    if (!*is_dir && !ckpt_layout_ok(h, why, sizeof why)) {
        fprintf(stderr, "trainer: --eval %s: %s\n", o->eval, why);
        return 0;
    }
    if (!*is_dir && h->x_bytes != (int32_t)sizeof(floatX)) {
        fprintf(stderr, "trainer: --eval %s: saved by a trainer with %d-byte weights; this one is %s\n", o->eval,
                h->x_bytes, FLOATX_NAME);
        return 0;
    }
    if (!*is_dir) *cfg = h->cfg;
    if (!o->seq_given) o->T = *is_dir ? (int)vh->max_len : h->T;
    if (o->T > cfg->max_position) {
        fprintf(stderr, "trainer: --eval %s: --seq %d is longer than the model's %d positions\n", o->eval, o->T,
                cfg->max_position);
        return 0;
    }
    return !o->B || micro_batch_ok(o->B, o->T);  // (check_options checked a --seq given)
}

// eval_report: --eval's line on stdout and, with --out, its "eval" record in DIR/metrics.jsonl (rank 0).
// 0 when the record could not be written.
static int eval_report(const Options* o, const EvalResult* e, int step) {
    int ok = 1;
    char cov[160];
    printf("eval: loss %.4f | accuracy %.4f | %lld masked tokens in %lld sequences (%s)\n", e->loss, e->accuracy,
           e->masked, e->samples, validation_coverage(e, cov, sizeof cov));
    fflush(stdout);
    double unused;
    MetricsFile mf;
    char* buf;
    size_t len;
    if (o->out && metrics_open(&mf, o->out, 0, 0, &unused)) {
        FILE* f = metrics_record(&buf, &len);
        if (f) {
            fprintf(f, "{\"kind\":\"eval\",\"step\":%d", step);
            json_str(f, "source", o->eval);
            json_num(f, "val_loss", e->loss);
            json_num(f, "val_accuracy", e->accuracy);
            fprintf(f, ",\"val_masked\":%lld,\"val_sequences\":%lld,\"val_split\":%lld", e->masked, e->samples,
                    e->split);
            json_end(f);
        }
        if (!metrics_append(&mf, f, &buf, &len, step)) ok = 0;
        close(mf.fd);
    } else if (o->out) {
        ok = 0;
    }
    return ok;
}

// run_eval: ./trainer --eval SRC: a checkpoint's or an export's weights on the validation shards, exactly as
// training validates (evaluate), without training. One line on stdout; with --out, a metrics.jsonl record.
static int run_eval(Options* o, Comm* comm, const cudaDeviceProp* prop, size_t free_bytes, size_t total_bytes,
                    double started) {
    int main_rank = comm->rank == 0;
    if (comm->world > 1 && !o->out) {
        fprintf(stderr,
                "trainer: --eval with %d processes needs --out DIR on a shared file system (the NCCL "
                "rendezvous)\n",
                comm->world);
        return 1;
    }
    if (o->out && !make_out_dir(o->out)) return 1;
    Shard* shards;
    int nshards;
    char err[DATA_ERR_LEN];
    if (shards_open_all(o->val, &shards, &nshards, 1, err)) {
        fprintf(stderr, "trainer: --val: %s\n", err);
        return 1;
    }
    ShardHeader vh = shards[0].h;  // vocabulary, padding id, the --seq-len the shards were made for
    long long samples = 0;         // a row holds at least one: the split needs at most this many rows a process
    for (int i = 0; i < nshards; i++) samples += (long long)shards[i].h.num_samples, shard_close(&shards[i]);
    free(shards);

    BertConfig cfg;
    CkptHeader h;
    BertParams hp;
    float* w = NULL;
    int is_dir;
    if (!eval_source(o, &vh, &cfg, &h, &hp, &w, &is_dir)) return 1;
    GradReduce gr;  // (no gradients are reduced: make_plan and ckpt_read take the layout)
    grad_reduce_setup(&gr, &cfg, comm, o);
    Plan plan;
    if (!plan_for_run(&cfg, o, 1, &gr, free_bytes, total_bytes, prop, comm, (samples + comm->world - 1) / comm->world,
                      &plan) ||
        !reserve_plan(&plan, o))
        return 1;

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    BertModel model;
    if (!bert_alloc(&model, &cfg, plan.B, plan.T, plan.M, stream)) return 1;
    choose_attention(&model, prop, main_rank);
    BatchMaker bm;
    batch_maker_alloc(&bm, &plan, vh.pad_id);
    Validation v;
    validation_init(&v, o->val, &plan, comm, cfg.vocab_size, o->val_batches, main_rank);
    if (is_dir) {
        bert_set_params(&model, w);
        free(w);
        bert_params_free(&hp);
    } else {
        char why[256];  // every state region, so the bf16 weights are the run's own
        if (!ckpt_read(o->eval, &model, &gr, &h, -1, why, sizeof why)) {
            fprintf(stderr, "trainer: --eval %s: %s\n", o->eval, why);
            return 1;
        }
    }
    CommBootstrap boot = {o->bootstrap, o->out, o->out, started};
    comm_init(comm, &boot);
    EvalResult e = evaluate(&model, &v, &bm, comm);
    int step = is_dir ? 0 : h.step, rc = 0;
    if (main_rank && !eval_report(o, &e, step)) rc = 1;
    // finite weights can still overflow (huge values): a loss that is not finite is not a result (the same on
    // every rank: an all-reduced sum)
    if (!isfinite(e.loss)) {
        if (main_rank)
            fprintf(stderr, "trainer: --eval %s: the loss is %s, not a finite number: these weights do not evaluate\n",
                    o->eval, isnan(e.loss) ? "NaN" : "Inf");
        rc = 1;
    }
    validation_free(&v);
    grad_reduce_free(&gr);
    comm_free(comm);
    cudaFree(bm.seg_lo);
    cudaFreeHost(bm.host);
    cudaEventDestroy(bm.stop_ev);
    bert_free(&model);
    return rc;
}

// ----------------------------------------------------------------------------
// The run: main() tells its story, one phase per function. Run holds what the phases hand on to each other.

typedef struct {
    Options o;
    Comm comm;                       // this rank's place in the job; its communicator after open_run
    cudaDeviceProp prop;             // the device
    size_t free_bytes, total_bytes;  // its memory at start-up (--device-mem with --plan-only)
    double started, t_start;         // wall clock at start-up (comm_realtime_s), and now_s() then
    int main_rank;                   // rank 0: prints, logs, writes checkpoints and the export
    BertConfig cfg;                  // the model (choose_model)
    float* init_w;                   // --init-from: its weights on the host until load_weights
    BertParams init_p;               // --init-from: their table
    ShardHeader data_h;              // the training shards' vocabulary and special ids
    BertTokenizer tok;               // the tokenizer.json beside them, read at start-up for the export (hf.h)
    double epoch_tokens;             // real tokens in the training shards: one epoch
    uint64_t data_fp, val_fp;        // fingerprints of --data and --val, compared over the ranks
    GradReduce gr;                   // the gradient buckets (comm.h)
    OneBit ob;                       // --comm onebit: 1-bit Adam's errors and message buffers (compress.h)
    Optimizer opt;                   // the step's exchange, norm and update (optim.h)
    Plan plan;                       // every device byte (plan_run)
    char train_pattern[4096];        // the training shards (node-local copies with --stage-dir)
    char val_pattern[4096];          // the validation shards, likewise
    cudaStream_t stream;             // the compute stream
    BertModel model;                 // weights, gradients, AdamW state, activations (model.h)
    BatchMaker bm;                   // the device side of a micro-batch
    float* scratch;                  // the step's sums over the ranks (S_LOSS ...)
    DataLoader train;                // the ring of loader threads (data.h)
    Validation val;                  // --val
    Ckpts ck;                        // DIR/checkpoint*.bin
    RunLog lg;                       // the log lines and DIR/metrics.jsonl
    MetricsFile metrics;
} Run;

// print_info: --info: the device and this process's place in the job.
static int print_info(const Run* r) {
    printf("rank %d of %d (local %d): device %d, %s, sm_%d%d, %d SMs, %.1f GB free of %.1f GB\n", r->comm.rank,
           r->comm.world, r->comm.local_rank, r->comm.device, r->prop.name, r->prop.major, r->prop.minor,
           r->prop.multiProcessorCount, r->free_bytes / 1e9, r->total_bytes / 1e9);
    return 0;
}

// open_run: the output directory; one run per --out (see "The run directory": the lock comes before the
// bootstrap, so a second launch never joins); then the communicator of all ranks, before anything is
// planned: the ranks agree on the plan. --plan-only plans for the world size alone: no other rank.
static int open_run(Run* r) {
    Options* o = &r->o;
    const DeviceSpec* d = o->device ? device_spec(o->device) : NULL;
    if (o->device_mem > 0)  // another device: --plan-only plans its memory
        r->free_bytes = r->total_bytes = (size_t)(o->device_mem * 1e9);
    else if (d && o->plan_only)
        r->free_bytes = r->total_bytes = (size_t)(d->mem_gb * 1e9);
    if (o->out && !make_out_dir(o->out)) return 0;  // (--plan-only may have none)
    if (!o->plan_only && (run_lock(o->out, &r->comm) < 0 || !run_dir_check(o->out, o))) return 0;
    CommBootstrap boot = {o->bootstrap, o->out, o->out, r->started};
    if (!o->plan_only) comm_init(&r->comm, &boot);
    lock_watch_stop();  // the communicator is formed: byte 0 is this launch's
    return 1;
}

// choose_model: a preset with the shards' vocabulary, or a Hugging Face checkpoint (--init-from).
static int choose_model(Run* r) {
    Options* o = &r->o;
    if (o->data) r->data_fp = data_fingerprint("--data", o->data, &r->data_h, &r->epoch_tokens);
    if (o->val) r->val_fp = data_fingerprint("--val", o->val, NULL, NULL);
    int data_vocab = (int)r->data_h.vocab_size;  // no --data (--plan-only): 0, the preset's
    if (o->data && !o->plan_only && !bert_tokenizer_load(o->data, data_vocab, &r->tok)) return 0;
    if (o->init_from) {
        if (!bert_load_hf(o->init_from, &r->cfg, &r->init_p, &r->init_w)) {
            fprintf(stderr, "trainer: --init-from %s: cannot load config.json + model.safetensors\n", o->init_from);
            return 0;
        }
        if (!init_matches_preset(o, &r->cfg)) return 0;
    } else {
        if (!bert_preset(o->preset, &r->cfg)) {
            fprintf(stderr, "trainer: --preset %s: unknown; one of:", o->preset);
            for (int i = 0; i < BERT_NUM_PRESETS; i++) fprintf(stderr, " %s", bert_presets[i].name);
            fprintf(stderr, "\n");
            return 0;
        }
        if (data_vocab) r->cfg.vocab_size = data_vocab;
    }
    if (o->T > r->cfg.max_position) {
        fprintf(stderr, "trainer: --seq %d is longer than the model's %d positions\n", o->T, r->cfg.max_position);
        return 0;
    }
    return 1;
}

// global_batch_rows: the automatic micro-batch B (rows a GPU) for a run on `world` GPUs whose global batch is fixed
// (--global-batch G) or capped (--grad-accum auto, --max-global-batch S): at most G / world, the largest that divides
// it (predict_scaling checks what still does not); at most S / world (and 1). Else B.
static int global_batch_rows(const Options* o, int world, int B) {
    long long g = o->global_batch ? o->global_batch : o->grad_accum == 0 ? o->max_global_batch : 0;
    if (g <= 0 || (long long)world * B <= g) return B;
    int b = g / world > 0 ? (int)(g / world) : 1;
    while (o->global_batch && b > 1 && o->global_batch % ((long long)world * b)) b--;
    return b;
}

// plan_run: the gradient buckets, the memory plan and the micro-batch it allows (the seed paper's
// recommendation 5): the same on every rank, the smallest any rank can hold; then the scaling prediction.
static int plan_run(Run* r) {
    Options* o = &r->o;
    GradReduce* gr = &r->gr;
    grad_reduce_setup(gr, &r->cfg, &r->comm, o);
    int loaders = o->val ? 2 : 1;
    Plan* plan = &r->plan;
    char why[256] = "the largest that fits";  // (--plan-only plans the memory of the device it predicts for)
    *plan = o->plan_only && !o->B
                ? choose_batch(&r->cfg, o->T, loaders, gr, r->free_bytes, r->total_bytes)
                : auto_batch(&r->cfg, o, loaders, gr, r->free_bytes, r->total_bytes, r->prop.name, 0, why, sizeof why);
    if (!o->plan_only && !o->B) {  // a global batch below one micro-batch on every GPU: a smaller micro-batch
        int b = global_batch_rows(o, r->comm.world, plan->B);
        if (b < plan->B) {
            *plan = make_plan(&r->cfg, b, o->T, loaders, gr);
            snprintf(why, sizeof why, "%s %lld sequences on %d GPU(s)",
                     o->global_batch ? "--global-batch" : "--max-global-batch",
                     o->global_batch ? o->global_batch : o->max_global_batch, r->comm.world);
        }
    }
    if (!o->plan_only)
        *plan = make_plan(&r->cfg, agree(&r->comm, o, &r->cfg, plan->B, r->data_fp, r->val_fp), o->T, loaders, gr);
    if (o->val) plan_add_validation(plan, o->val_batches, o->val);
    if (r->main_rank) {
        printf("device: %s, %.1f GB free of %.1f GB; %d process(es)\n", r->prop.name, r->free_bytes / 1e9,
               r->total_bytes / 1e9, r->comm.world);
        bert_print_mem_plan(&plan->model, plan->B, plan->T, plan->M, (int)sizeof(floatX));
        if (r->comm.world > 1)
            printf("  gradients reduced in %d buckets of up to %g MB, %s%s; bf16 staging %.3f GiB\n", gr->n,
                   o->bucket_mb, o->grad_reduce_bf16 ? "bf16" : "fp32",
                   gr->zero ? ", ZeRO-1 (reduce-scatter, all-gather)" : "",
                   (plan->reduce_bytes - gr->onebit_bytes) / (double)(1 << 30));
        if (o->onebit)
            printf("  1-bit Adam (--comm onebit): errors and messages %.3f GiB\n",
                   gr->onebit_bytes / (double)(1 << 30));
        printf("  batch buffers %.3f GiB; total %.3f GiB for B=%d (%s)\n",
               (plan->batch_bytes + plan->maker_bytes + plan->val_bytes) / (double)(1 << 30),
               plan->total / (double)(1 << 30), plan->B, why);
    }
    if (plan->total > r->free_bytes) {
        fprintf(stderr,
                "trainer: the model needs %.3f GiB at B=%d but %.3f GiB are free: use a smaller --seq, "
                "--preset or --batch\n",
                plan->total / (double)(1 << 30), plan->B, r->free_bytes / (double)(1 << 30));
        return 0;
    }
    return predict_scaling(o, &r->cfg, plan, &r->comm, o->device ? o->device : r->prop.name);
}

// stage_shards: node-local copies of the shards (the seed paper's recommendation 2); the ranks wait for the
// slowest node (up to an hour more than --nccl-timeout). Without --stage-dir, the shards where they are.
static int stage_shards(Run* r) {
    Options* o = &r->o;
    char err[DATA_ERR_LEN];
    snprintf(r->train_pattern, sizeof r->train_pattern, "%s", o->data);
    snprintf(r->val_pattern, sizeof r->val_pattern, "%s", o->val ? o->val : "");
    if (!o->stage_dir) return 1;
    if (dataloader_stage(o->data, o->stage_dir, r->comm.local_rank, 3600, r->train_pattern, sizeof r->train_pattern,
                         err) ||
        (o->val && dataloader_stage(o->val, o->stage_dir, r->comm.local_rank, 3600, r->val_pattern,
                                    sizeof r->val_pattern, err))) {
        fprintf(stderr, "trainer: --stage-dir: %s\n", err);
        return 0;
    }
    CommValue staged = {"staged", 1, 0, 0};
    double timeout = r->comm.timeout_s;
    r->comm.timeout_s += 3600;
    comm_agree(&r->comm, &staged, 1);
    r->comm.timeout_s = timeout;
    return 1;
}

// onebit_setup: --comm onebit's errors and message buffers (compress.h), and what it will send.
static void onebit_setup(Run* r) {
    OneBit* ob = &r->ob;
    onebit_layout(ob, &r->gr, r->comm.rank, r->o.comm_warmup, onebit_part_elems(&r->o));
    ob->refresh = r->o.comm_refresh, ob->var_steps = r->o.comm_var_steps;
    onebit_alloc(ob);
    r->gr.onebit = ob;
    // NCCL connects two ranks on their first point-to-point exchange: the first compressed step's all-to-all would
    // open P - 1 connections per rank inside a collective watched by --nccl-timeout, minutes at 240 GPUs (nccl-tests
    // issue 78). One all-to-all of the first part's messages now, at start-up, opens them all, under a deadline of
    // its own (ONEBIT_CONNECT_S, or --nccl-timeout where that is longer).
    if (r->comm.world > 1) {
        double t0 = now_s();
        onebit_exchange(ob, &ob->part[0], &r->comm, r->gr.stream);
        comm_poll(&r->comm, r->gr.stream, "1-bit Adam's first all-to-all (its connections to every rank, at start-up)",
                  r->comm.timeout_s > ONEBIT_CONNECT_S ? r->comm.timeout_s : ONEBIT_CONNECT_S);
        if (r->main_rank)
            printf("comm: 1-bit Adam's all-to-all connections to %d ranks in %.1f s\n", r->comm.world - 1,
                   now_s() - t0);
    }
    // the next forward waits for each layer's part only (onebit_step_forward)
    int L = r->cfg.layers;
    ob->weights_ready = (cudaEvent_t*)malloc((L + 1) * sizeof(cudaEvent_t));
    for (int l = 0; l < L; l++) ob->weights_ready[l] = ob->updated[onebit_layer_part(ob, &r->model.p, l)];
    ob->weights_ready[L] = r->gr.done;  // the head: every part, and the gradients zeroed
    r->model.weights_ready = ob->weights_ready;
    uint64_t fp32 =
        r->comm.world > 1 ? 2 * (uint64_t)(r->comm.world - 1) * (r->model.p.numel * 4) / (uint64_t)r->comm.world : 0;
    if (r->main_rank) {
        int adamw;
        onebit_schedule(ob->warmup, ob->var_steps, ob->refresh, r->o.steps, &adamw);
        printf(
            "comm: %s (1-bit Adam): AdamW (bf16 all-reduce) for %d steps, then the momentum's signs and scales in %d "
            "parts after the backward, under the next forward: %llu bytes sent per rank per step (fp32 all-reduce: "
            "%llu); the variance steps (AdamW) at spacings 1, 2, 4, ... up to %d: %d of the %d steps are AdamW's\n",
            r->o.comm, ob->warmup, ob->n_parts, (unsigned long long)onebit_step_bytes(ob), (unsigned long long)fp32,
            ob->refresh, adamw, r->o.steps);
    }
}

// loader_thread_cap: the most loader threads --loader-threads auto may start: this rank's share of the CPUs it
// may run on (all of them, when Slurm binds it to its own; else the node's split over its ranks), less one
// for the thread that drives the GPU when there are more than 2; at least 1.
static int loader_thread_cap(const Options* o, const Comm* comm) {
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int nodes = job_nodes(o), per_node = (comm->world + nodes - 1) / nodes;
    if (cpus >= sysconf(_SC_NPROCESSORS_ONLN) && per_node > 1) cpus /= per_node;  // not bound: share the node
    int cap = cpus > 2 ? cpus - 1 : cpus;
    return cap < 1 ? 1 : cap > 256 ? 256 : cap;
}

// tune_loader: --loader-threads auto, the seed paper's third recommendation ("parallelize data loading, but
// only just as much as necessary"): one loader thread fills the ring's first batches, timed (fill ms per
// batch); the GPU takes a micro-batch every micro ms (scaling.h's: B T FLOPs per token / (peak x MFU), or
// --micro-ms);
// threads = ceil(1.5 fill / micro): enough to keep up with half again as much work, at least 1, at most
// loader_thread_cap. Where the device's peak is unknown (the CPU runtime) the demand is not predicted: 2
// threads, as before auto. Printed with the reason.
static void tune_loader(Run* r) {
    Options* o = &r->o;
    const char* device = o->device ? o->device : r->prop.name;
    int cap = r->train.num_workers, B = r->plan.B;
    double fill_ms = dataloader_fill_ms(&r->train, 3);
    if (fill_ms < 0) return;  // a loader thread failed: the first dataloader_next says why
    ScalingWork w = scaling_work(o, &r->cfg, &r->plan, r->comm.world, device);
    double micro_ms = w.peak_tflops > 0 ? 1e3 * scaling_micro_s(&w, B) : 0;  // (--micro-ms needs no peak)
    scaling_work_free(&w);
    int n = micro_ms > 0 ? (int)ceil(1.5 * fill_ms / micro_ms) : 2;
    n = n < 1 ? 1 : n > cap ? cap : n;
    dataloader_set_threads(&r->train, n);
    if (!r->main_rank) return;
    if (micro_ms > 0)
        printf(
            "loader: %d thread(s) (--loader-threads auto: one fills a micro-batch of %d x %d in %.3g ms; %s takes one "
            "every %.3g ms%s: ceil(1.5 x %.3g / %.3g) = %d, at most %d here)\n",
            n, B, o->T, fill_ms, device, micro_ms, o->micro_ms > 0 ? " (--micro-ms)" : " (predicted at its peak x MFU)",
            fill_ms, micro_ms, (int)ceil(1.5 * fill_ms / micro_ms), cap);
    else
        printf(
            "loader: %d thread(s) (--loader-threads auto: one fills a micro-batch of %d x %d in %.3g ms; the bf16 peak "
            "of %s is unknown, so its demand is not predicted: 2, at most %d here; --device NAME or --micro-ms "
            "predicts it)\n",
            n, B, o->T, fill_ms, device, cap);
}

// allocate_run: everything on the device, allocated once (the plan's bytes), and the loader threads.
static int allocate_run(Run* r) {
    Options* o = &r->o;
    int B = r->plan.B, T = o->T;
    CUDA_CHECK(cudaStreamCreate(&r->stream));
    if (!bert_alloc_sharded(&r->model, &r->cfg, B, T, r->plan.M, r->stream, r->gr.zero ? r->gr.state_numel : 0,
                            r->gr.slack))
        return 0;
    choose_attention(&r->model, &r->prop, r->main_rank);
    grad_reduce_start(&r->gr);
    if (o->onebit) onebit_setup(r);
    r->opt = optimizer_setup(&r->gr, o->onebit ? &r->ob : NULL, o->grad_reduce_bf16, o->beta1, o->beta2, o->eps, o->wd,
                             o->clip);
    r->scratch = batch_maker_alloc(&r->bm, &r->plan, r->data_h.pad_id);  // the step's sums: see S_LOSS

    DataLoaderConfig dcfg = dataloader_default_config(r->train_pattern, B, T);
    dcfg.rank = r->comm.rank, dcfg.world = r->comm.world, dcfg.num_threads = o->loader_threads;
    dcfg.ring_slots = o->ring_slots, dcfg.seed = (uint64_t)o->seed, dcfg.vocab_size = r->cfg.vocab_size;
    dcfg.verbose = r->main_rank;
    if (!o->loader_threads) dcfg.num_threads = 1, dcfg.max_threads = loader_thread_cap(o, &r->comm);  // auto
    if (dataloader_init(&r->train, &dcfg)) {
        fprintf(stderr, "trainer: %s\n", r->train.error);
        return 0;
    }
    if (!o->loader_threads) tune_loader(r);
    if (o->val)
        validation_init(&r->val, r->val_pattern, &r->plan, &r->comm, r->cfg.vocab_size, o->val_batches, r->main_rank);
    return 1;
}

// load_weights: from the checkpoint (--resume), from Hugging Face (--init-from), or BERT's random
// initialisation; then every rank at the same data position, and the device memory in use from here on.
static int load_weights(Run* r) {
    Options* o = &r->o;
    BertModel* m = &r->model;
    r->ck.dir = o->out, r->ck.keep = o->keep, r->ck.step = -1;
    if (o->resume) {
        resume_checkpoint(&r->ck, m, &r->gr, &r->train, o->steps, r->main_rank);
        if (o->seed_given && r->train.cfg.seed != (uint64_t)o->seed) {  // the data order and masking are its own
            if (r->main_rank)
                fprintf(stderr,
                        "trainer: --seed %lld: the run in %s was started with --seed %llu; drop --seed to resume\n",
                        o->seed, o->out, (unsigned long long)r->train.cfg.seed);
            return 0;
        }
    } else {
        if (!r->init_w && !(r->init_w = (float*)malloc(m->p.numel * sizeof(float)))) {
            fprintf(stderr, "trainer: out of host memory for the %zu initial weights\n", m->p.numel);
            return 0;
        }
        if (!o->init_from) bert_init_host(&m->p, r->init_w, (uint64_t)o->seed);
        model_set_params(m, &r->gr, r->init_w);
    }
    free(r->init_w);
    if (o->init_from) bert_params_free(&r->init_p);
    agree_on_position(&r->comm, m, &r->train);
    bert_zero_grad(m);
    size_t free_before_step1;  // from here on nothing is allocated: the log shows it
    CUDA_CHECK(cudaMemGetInfo(&free_before_step1, &r->total_bytes));
    if (r->main_rank)
        printf("device memory allocated before step 1: %zu bytes (the plan: %zu bytes)\n",
               r->free_bytes - free_before_step1, r->plan.total);
    return 1;
}

// start_log: the progress log and DIR/metrics.jsonl (rank 0), for steps up to last_step; a new run in --out
// with --overwrite clears the earlier run's files first.
static int start_log(Run* r, int last_step) {
    Options* o = &r->o;
    RunLog* lg = &r->lg;
    if (r->main_rank) printf("training: %d steps, %s\n", o->steps, FLOATX_NAME);
    lg->t_start = r->t_start, lg->first_step = r->model.step + 1, lg->last_step = last_step;
    lg->tokens = (long long)r->ck.tokens, lg->epoch_tokens = r->epoch_tokens;
    if (!r->main_rank) return 1;
    if (o->overwrite) run_dir_clear(o->out);  // the new run is ready: the earlier one's files go
    if (!o->resume && !o->overwrite) run_dir_keep_metrics(o->out);
    run_schedule(o->out, o, r->comm.world, r->plan.B, r->cfg.vocab_size, r->model.step);
    if (!metrics_open(&r->metrics, o->out, 1, o->resume ? r->model.step : -1, &lg->elapsed0)) return 0;
    lg->f = &r->metrics;
    return 1;
}

// train: the training loop, from the step after the checkpoint's to --steps (or --run-steps of them, or to a
// stop on a signal). 0 when it ends so, else the exit code (1: a checkpoint failed; 2: the run diverged, or its
// state is not finite: checkpoint_at).
static int train(Run* r) {
    Options* o = &r->o;
    BertModel* m = &r->model;
    int main_rank = r->main_rank;
    int last_step = o->run_steps && (long long)m->step + o->run_steps < o->steps ? m->step + o->run_steps : o->steps;
    if (!start_log(r, last_step)) return 1;
    double flops_token = bert_flops_per_token(&r->cfg, o->T, 0.15).model,
           peak_tflops = device_peak_tflops(r->prop.name);
    int bad_steps = 0;  // consecutive steps skipped for a loss or gradient norm that was not finite
    double last_ckpt = now_s();
    training = 1;  // from here a signal finishes the step and saves a checkpoint
    r->lg.t_loop = now_s();
    while (m->step < last_step) {
        int step = m->step + 1;
        double t0 = now_s();
        // rank 0's clock decides --ckpt-minutes, and the step's all-reduce tells every rank
        int want_ckpt = main_rank && o->ckpt_minutes > 0 && now_s() - last_ckpt >= 60.0 * o->ckpt_minutes;
        DataLoaderState step_start = dataloader_state(&r->train);  // where a dropped step's checkpoint resumes
        StepResult s = train_step(m, &r->train, &r->bm, &r->opt, r->scratch, o, lr_at(o, step), want_ckpt);
        if (s.dropped) {  // a signal between micro-batches (every rank agreed): save the last complete step
            if (main_rank)
                printf(
                    "stopped on a signal between micro-batches of step %d: that step is dropped; the checkpoint "
                    "is of step %d\n",
                    step, m->step);
            return checkpoint_at(&r->ck, m, &r->gr, &step_start, m->step);
        }
        if (s.stop) last_step = step;  // some rank got a signal: every rank stops after this step
        bad_steps = s.skipped ? bad_steps + 1 : 0;
        r->ck.tokens = r->lg.tokens += s.all_tokens;
        if (main_rank)
            log_step(o, &s, step, bad_steps, now_s() - t0, r->comm.world, flops_token, peak_tflops, &r->bm, &r->lg);
        if (bad_steps >= o->max_bad_steps) return diverged(o, &r->ck, step, bad_steps, main_rank);
        if (o->val && o->val_every && (step % o->val_every == 0 || step == o->steps)) {
            EvalResult e = evaluate(m, &r->val, &r->bm, &r->comm);
            if (main_rank) log_validation(&r->lg, step, &e);
        }
        // A checkpoint every --ckpt-every steps, every --ckpt-minutes, and at the end; never of a skipped step
        // but the last (the weights are the last good ones either way).
        // Every rank decides the same (under ZeRO-1 all of them gather the shards for rank 0 to write).
        int due = (o->ckpt_every && step % o->ckpt_every == 0) || s.ckpt;
        if ((due && !bad_steps) || step == last_step) {
            int rc = checkpoint_now(&r->ck, m, &r->gr, &r->train, step);
            if (rc) return rc;
            last_ckpt = now_s();
        }
    }
    return 0;
}

// finish_run: the final weights as a Hugging Face BertForMaskedLM (model.safetensors + config.json) when the
// run reached --steps; then everything freed. The exit code.
static int finish_run(Run* r) {
    Options* o = &r->o;
    BertModel* m = &r->model;
    size_t free_after;
    onebit_settle(&r->gr);
    CUDA_CHECK(cudaMemGetInfo(&free_after, &r->total_bytes));
    if (r->main_rank) printf("device memory allocated after the last step: %zu bytes\n", r->free_bytes - free_after);
    if (r->main_rank && m->step < o->steps)
        printf("stopped after step %d (%s); --resume continues from its checkpoint, %s/checkpoint.bin\n", m->step,
               stop_requested ? "on a signal" : "--run-steps", o->out);
    // test hook (tests/test_data_parallel.sh): MLM_TEST_WEIGHTS_CRC=1 makes every rank print checksums of the
    // weights it holds, which must be the same on all ranks
    int crc = (int)env_int("MLM_TEST_WEIGHTS_CRC", 0, 0, 1);
    float* w = m->step == o->steps || crc ? (float*)malloc(m->p.numel * sizeof(float)) : NULL;
    if (m->step == o->steps || crc) model_get_params(m, &r->gr, w);  // every rank: under ZeRO-1 they gather
    if (w && crc) print_weights_crc(m, w, r->comm.rank);
    int exported = m->step == o->steps ? export_now(o, &r->comm, &r->ck, m, w, &r->data_h, &r->tok) : 1;
    if (exported == 0) return 1;
    if (exported == -1) return diverged_state(&r->ck, m->step, "its final weights, named above", r->main_rank);
    free(w);
    free(r->tok.json);
    dataloader_free(&r->train);
    if (o->val) validation_free(&r->val);
    if (r->lg.f && r->lg.f->lost)
        fprintf(stderr, "trainer: warning: %s lacks %lld record(s) that could not be written (see above)\n",
                r->lg.f->path, r->lg.f->lost);
    if (r->lg.f) close(r->lg.f->fd);
    grad_reduce_free(&r->gr);
    onebit_free(&r->ob);
    // every rank: what it sent (tests/test_onebit.sh compares it with the CPU NCCL's own count)
    printf("comm: rank %d sent %llu bytes in %llu NCCL calls\n", r->comm.rank, (unsigned long long)r->comm.sent,
           (unsigned long long)r->comm.calls);
    comm_free(&r->comm);
    cudaFree(r->bm.seg_lo);
    cudaFreeHost(r->bm.host);
    cudaEventDestroy(r->bm.stop_ev);
    bert_free(m);
    return 0;
}

int main(int argc, char** argv) {
    install_stop_handlers();  // first: a stop during start-up exits cleanly (see request_stop)
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    static Run run;  // (zeroed; static: it holds the whole model's state)
    Run* r = &run;
    r->started = comm_realtime_s(), r->t_start = now_s();
    setvbuf(stdout, NULL, _IOLBF, 0);  // every line as it is printed: start-up lines show at once under srun
    r->comm = comm_from_env();         // rank, world, local rank: srun, torchrun-style variables, or one process
    use_device(&r->comm, &r->prop, &r->free_bytes, &r->total_bytes);
    if (!strcmp(argv[1], "--info")) return print_info(r);
    r->o = parse_options(argc, argv);
    // one process waits only on its own device: a step as slow as the CPU runtime's is no dead rank (a deadline
    // only when --nccl-timeout is given, as the tests of the watchdog give it)
    r->comm.timeout_s = r->comm.world > 1 || r->o.timeout_given ? r->o.nccl_timeout : 1e30;
    stall_hook_init(&r->comm, &r->o);
    if (r->o.bench) return run_bench(&r->o, &r->comm, &r->prop, r->started);
    if (r->o.eval) return run_eval(&r->o, &r->comm, &r->prop, r->free_bytes, r->total_bytes, r->started);
    r->main_rank = r->comm.rank == 0;

    if (!open_run(r)) return 1;      // --out, its lock, and the communicator of all ranks
    if (!choose_model(r)) return 1;  // a preset with the shards' vocabulary, or a Hugging Face checkpoint
    if (!plan_run(r)) return 1;      // the buckets, the memory plan (the micro-batch), the scaling prediction
    if (r->o.plan_only) return 0;
    if (!reserve_plan(&r->plan, &r->o)) return 1;
    resolve_run_length(&r->o, &r->comm, r->plan.B, r->epoch_tokens, r->main_rank);  // --tokens, --epochs: steps
    resolve_comm_warmup(&r->o);
    if (!stage_shards(r)) return 1;  // --stage-dir: node-local copies of the shards
    if (!allocate_run(r)) return 1;  // every device buffer, once; the loader threads
    if (!load_weights(r)) return 1;  // the checkpoint, --init-from, or a random initialisation
    int rc = train(r);               // the training loop
    if (rc) return rc;
    return finish_run(r);  // the export; everything freed
}
