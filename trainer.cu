// trainer.cu: mlm.c's one program, BERT-style masked-language-model pretraining.
// This is the only translation unit: nvcc compiles it for the GPU (./trainer) and g++ compiles the
// very same file against cpu/ for the CPU (./trainer_cpu). Each header has one role:
#include <cuda_runtime.h>  // the CUDA runtime (cpu/include/cuda_runtime.h on the CPU build)
#include "kernels.cuh"     // every GPU kernel, and launch()
#include "model.h"         // the BERT configuration, parameter table, memory plan, forward/backward/AdamW
#include "data.h"          // token shards, the ring of loader threads, MLM masking
#include "comm.h"          // rank and world size; NCCL gradient averaging
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Flags

typedef struct {
    const char* data;       // glob of the training shards
    const char* val;        // glob of the validation shards (optional)
    const char* preset;     // model size when starting from scratch
    const char* init_from;  // a Hugging Face BertForMaskedLM directory to start from (optional)
    const char* out;        // checkpoints, the final export, the NCCL rendezvous
    const char* stage_dir;  // node-local directory to copy the shards to first (optional)
    int T, B, grad_accum, steps, warmup;
    float lr, wd, beta1, beta2, eps, clip;
    long long seed;
    int loader_threads, ring_slots;
    int log_every, val_every, val_batches, ckpt_every, run_steps;
    int resume, plan_only;
} Options;

static void usage(void) {
    printf(
        "usage: trainer --data 'DIR/train_*.bin' --out DIR [options]    (srun ./trainer ... for several GPUs)\n"
        "  --data GLOB         training shards (tools/prepare.py makes them)\n"
        "  --val GLOB          validation shards; evaluated every --val-every steps\n"
        "  --out DIR           checkpoint.bin, the final Hugging Face export (model.safetensors, config.json)\n"
        "  --preset NAME       tiny | bert-base | bert-large | paper-120m | paper-350m (default bert-base);\n"
        "                      the vocabulary size comes from the shards\n"
        "  --init-from DIR     start from a Hugging Face BertForMaskedLM checkpoint instead\n"
        "  --resume            continue from DIR/checkpoint.bin (weights, optimizer, data position)\n"
        "  --seq T             tokens per row (default 512)\n"
        "  --batch B           rows per micro-batch per GPU (default 0: the largest that fits in GPU memory)\n"
        "  --grad-accum N      micro-batches per optimizer step (default 1)\n"
        "  --steps N           optimizer steps (required)\n"
        "  --lr X              peak learning rate (default 5e-4), linear warmup then linear decay to 0\n"
        "  --warmup N          warmup steps (default 1%% of --steps)\n"
        "  --wd X --beta1 X --beta2 X --eps X --clip X   AdamW (0.01, 0.9, 0.98, 1e-6) and clipping (1.0)\n"
        "  --seed N            data order, masking and initialisation (default 1337)\n"
        "  --loader-threads N  threads preparing batches (default 2); --ring N slots (default 4)\n"
        "  --stage-dir DIR     copy the shards to this node-local directory first, once per node\n"
        "  --log-every N --val-every N --val-batches N --ckpt-every N   (1, 0, 20, 0: only at the end)\n"
        "  --run-steps N       stop after N steps of this run, with a checkpoint (to fit a job's time limit;\n"
        "                      --resume continues)\n"
        "  --plan-only         print the memory plan and exit\n"
        "  --info              print the device and this process's place in the job, then exit\n");
}

// parse_int / parse_float: the value of flag `name`, or exit with a message naming flag and value.
static long long parse_int(const char* name, const char* v, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "trainer: %s %s: expected an integer in [%lld, %lld]\n", name, v, lo, hi);
        exit(1);
    }
    return x;
}
static float parse_float(const char* name, const char* v, double lo, double hi) {
    char* end;
    double x = strtod(v, &end);
    if (*end || end == v || !(x >= lo && x <= hi)) {
        fprintf(stderr, "trainer: %s %s: expected a number in [%g, %g]\n", name, v, lo, hi);
        exit(1);
    }
    return (float)x;
}

static Options parse_options(int argc, char** argv) {
    Options o;
    memset(&o, 0, sizeof o);
    o.preset = "bert-base";
    o.T = 512, o.grad_accum = 1, o.warmup = -1;
    o.lr = 5e-4f, o.wd = 0.01f, o.beta1 = 0.9f, o.beta2 = 0.98f, o.eps = 1e-6f, o.clip = 1.0f;
    o.seed = 1337, o.loader_threads = 2, o.ring_slots = 4;
    o.log_every = 1, o.val_batches = 20;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--resume")) {
            o.resume = 1;
            continue;
        }
        if (!strcmp(a, "--plan-only")) {
            o.plan_only = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "trainer: %s: unknown flag, or missing its value (see --help)\n", a);
            exit(1);
        }
        const char* v = argv[++i];
        if (!strcmp(a, "--data"))
            o.data = v;
        else if (!strcmp(a, "--val"))
            o.val = v;
        else if (!strcmp(a, "--out"))
            o.out = v;
        else if (!strcmp(a, "--preset"))
            o.preset = v;
        else if (!strcmp(a, "--init-from"))
            o.init_from = v;
        else if (!strcmp(a, "--stage-dir"))
            o.stage_dir = v;
        else if (!strcmp(a, "--seq"))
            o.T = (int)parse_int(a, v, 2, 1 << 16);
        else if (!strcmp(a, "--batch"))
            o.B = (int)parse_int(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--grad-accum"))
            o.grad_accum = (int)parse_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--steps"))
            o.steps = (int)parse_int(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--warmup"))
            o.warmup = (int)parse_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--lr"))
            o.lr = parse_float(a, v, 0, 1);
        else if (!strcmp(a, "--wd"))
            o.wd = parse_float(a, v, 0, 1);
        else if (!strcmp(a, "--beta1"))
            o.beta1 = parse_float(a, v, 0, 0.999999);
        else if (!strcmp(a, "--beta2"))
            o.beta2 = parse_float(a, v, 0, 0.999999);
        else if (!strcmp(a, "--eps"))
            o.eps = parse_float(a, v, 1e-30, 1);
        else if (!strcmp(a, "--clip"))
            o.clip = parse_float(a, v, 0, 1e30);
        else if (!strcmp(a, "--seed"))
            o.seed = parse_int(a, v, 0, (1LL << 62));
        else if (!strcmp(a, "--loader-threads"))
            o.loader_threads = (int)parse_int(a, v, 1, 256);
        else if (!strcmp(a, "--ring"))
            o.ring_slots = (int)parse_int(a, v, 2, 1024);
        else if (!strcmp(a, "--log-every"))
            o.log_every = (int)parse_int(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--val-every"))
            o.val_every = (int)parse_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--val-batches"))
            o.val_batches = (int)parse_int(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--ckpt-every"))
            o.ckpt_every = (int)parse_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--run-steps"))
            o.run_steps = (int)parse_int(a, v, 1, 1 << 30);
        else {
            fprintf(stderr, "trainer: %s: unknown flag (see --help)\n", a);
            exit(1);
        }
    }
    if (!o.data || !o.out || (!o.steps && !o.plan_only)) {
        fprintf(stderr, "trainer: --data, --out and --steps are required (see --help)\n");
        exit(1);
    }
    if (o.warmup < 0) o.warmup = o.steps / 100;
    return o;
}

// ----------------------------------------------------------------------------
// Memory plan: everything on the device is allocated once, before step 1, from one plan. The MLM
// head always runs on M = 1.1 * 0.15 * B * T + 64 rows, the masked positions of the micro-batch
// followed by padding rows (the loader masks 15% of ordinary tokens exactly on average, so a batch
// above the cap is vanishingly rare: its excess positions are left out of the loss, and the log
// says so).
typedef struct {
    int B, T, M;
    BertMemPlan model;
    size_t batch_bytes;  // each loader's (training, validation) two device batch buffers
    size_t maker_bytes;  // seg_lo, seg_hi (B, T), the head's positions and labels (M), 8 floats of loss sums
    size_t total;
} Plan;

static int mlm_cap(int B, int T) { return (int)(1.1 * 0.15 * B * T) + 64; }

static Plan make_plan(const BertConfig* c, int B, int T, int loaders) {
    Plan p;
    p.B = B, p.T = T, p.M = mlm_cap(B, T);
    p.model = bert_mem_plan(c, B, T, p.M, (int)sizeof(floatX));
    p.batch_bytes = loaders * dataloader_device_bytes(B, T);
    p.maker_bytes = (2 * (size_t)B * T + 2 * (size_t)p.M) * sizeof(int) + 8 * sizeof(float);  // + the loss sums
    p.total = p.model.total + p.batch_bytes + p.maker_bytes;
    return p;
}

// choose_batch: the largest B whose plan fits in the free device memory, less a reserve for the
// CUDA context, cuBLASLt and NCCL (5% of the device, at least 1 GiB).
static Plan choose_batch(const BertConfig* c, int T, int loaders, size_t free_bytes, size_t total_bytes) {
    size_t reserve = total_bytes / 20 > ((size_t)1 << 30) ? total_bytes / 20 : ((size_t)1 << 30);
    size_t budget = free_bytes > reserve ? free_bytes - reserve : 0;
    int lo = 0, hi = 1;
    while (make_plan(c, hi, T, loaders).total <= budget && hi < (1 << 20)) lo = hi, hi *= 2;
    while (hi - lo > 1) {  // largest B with plan <= budget is in [lo, hi)
        int mid = lo + (hi - lo) / 2;
        if (make_plan(c, mid, T, loaders).total <= budget)
            lo = mid;
        else
            hi = mid;
    }
    return make_plan(c, lo > 0 ? lo : 1, T, loaders);  // B = 1 when nothing fits: the caller reports it
}

// ----------------------------------------------------------------------------
// Checkpoints: one file, DIR/checkpoint.bin, written to DIR/checkpoint.bin.tmp, flushed to disk and
// renamed over the old one, so a crash at any moment leaves either the old or the new checkpoint.
//   header (CkptHeader) | master weights fp32 (numel) | AdamW m fp32 (numel) | AdamW v fp32 (numel)
//   | the floatX weights (numel; bf16 mode only: stochastic rounding made them, so they are state too)
#define CKPT_MAGIC "MLMCKPT1"
typedef struct {
    char magic[8];
    uint32_t version, header_bytes;
    BertConfig cfg;
    int32_t T, step;
    uint64_t numel;
    DataLoaderState data;
} CkptHeader;

static size_t ckpt_x_bytes(const BertModel* m) {  // the floatX copy, when it is not the master itself
    return (void*)m->w == (void*)m->master ? 0 : m->p.numel * sizeof(floatX);
}

static int write_all(int fd, const void* p, size_t n) {
    const char* c = (const char*)p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return 0;
        c += w, n -= (size_t)w;
    }
    return 1;
}

static void save_checkpoint(const char* dir, BertModel* m, const DataLoaderState* data) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    size_t n = m->p.numel, xbytes = ckpt_x_bytes(m), bytes = 3 * n * sizeof(float) + xbytes;
    float* host = (float*)malloc(bytes);
    CUDA_CHECK(cudaMemcpy(host, m->master, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(host + n, m->adam_m, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(host + 2 * n, m->adam_v, n * sizeof(float), cudaMemcpyDeviceToHost));
    if (xbytes) CUDA_CHECK(cudaMemcpy(host + 3 * n, m->w, xbytes, cudaMemcpyDeviceToHost));
    CkptHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = 1, h.header_bytes = sizeof h;
    h.cfg = m->cfg, h.T = m->T, h.step = m->step, h.numel = n, h.data = *data;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write_all(fd, &h, sizeof h) && write_all(fd, host, bytes) && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "trainer: cannot write checkpoint %s: %s (the previous checkpoint is untouched)\n", tmp,
                strerror(errno));
        unlink(tmp);
        exit(1);
    }
    int dfd = open(dir, O_RDONLY);  // make the rename itself durable
    if (dfd >= 0) fsync(dfd), close(dfd);
    free(host);
}

// load_checkpoint: restores weights, optimizer state and step into m and the data position into *data.
static void load_checkpoint(const char* dir, BertModel* m, DataLoaderState* data) {
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    FILE* f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "trainer: --resume: cannot open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    CkptHeader h;
    size_t n = m->p.numel;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, CKPT_MAGIC, 8) || h.version != 1 ||
        h.header_bytes != sizeof h) {
        fprintf(stderr, "trainer: %s: not an mlm.c checkpoint of this version\n", path);
        exit(1);
    }
    if (memcmp(&h.cfg, &m->cfg, sizeof h.cfg) || h.numel != n || h.T != m->T) {
        fprintf(stderr, "trainer: %s: saved for another model or --seq (%d layers, hidden %d, vocab %d, T %d)\n", path,
                h.cfg.layers, h.cfg.hidden, h.cfg.vocab_size, h.T);
        exit(1);
    }
    size_t xbytes = ckpt_x_bytes(m), bytes = 3 * n * sizeof(float) + xbytes;
    float* host = (float*)malloc(bytes);
    if (fread(host, 1, bytes, f) != bytes || fgetc(f) != EOF) {
        fprintf(stderr, "trainer: %s: truncated or trailing bytes (expected %zu bytes of state)\n", path, bytes);
        exit(1);
    }
    fclose(f);
    bert_set_params(m, host);
    CUDA_CHECK(cudaMemcpy(m->adam_m, host + n, n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(m->adam_v, host + 2 * n, n * sizeof(float), cudaMemcpyHostToDevice));
    if (xbytes) CUDA_CHECK(cudaMemcpy(m->w, host + 3 * n, xbytes, cudaMemcpyHostToDevice));
    m->step = h.step;
    *data = h.data;
    free(host);
}

// ----------------------------------------------------------------------------
// One micro-batch from the loader, as the model takes it.
typedef struct {
    int *seg_lo, *seg_hi;  // (B, T) device: the key range of each token
    int *pos, *labels;     // (M) device: the head's rows
    int pad_id, M;
    long long dropped;  // masked positions left out of the loss because a batch had more than M
} BatchMaker;

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

// all_ranks_sum: x (n floats, device) summed over all ranks into host (n floats), then x zeroed.
// Synchronizes the stream.
static void all_ranks_sum(Comm* comm, float* x, int n, float* host, cudaStream_t s) {
    comm_sum(comm, x, n, s);
    CUDA_CHECK(cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), s));
    CUDA_CHECK(cudaStreamSynchronize(s));
}

// evaluate: the mean MLM loss per masked token over n validation batches (forward only), all ranks.
static float evaluate(BertModel* m, DataLoader* val, const DataLoaderState* start, BatchMaker* bm, Comm* comm, int n,
                      float* sum) {
    if (dataloader_restore(val, start)) {  // the same batches every time
        fprintf(stderr, "trainer: validation: %s\n", val->error);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        Batch b;
        if (dataloader_next(val, m->stream, &b)) {
            fprintf(stderr, "trainer: validation: %s\n", val->error);
            exit(1);
        }
        int n_masked;
        BertBatch bt = make_batch(bm, &b, m->B, m->T, m->stream, &n_masked);
        bert_forward(m, &bt, 0.f);
        add_loss(sum, m, n_masked);
    }
    float h[2];  // the losses weighted by their masked-token counts, and the counts: a mean per token
    all_ranks_sum(comm, sum, 2, h, m->stream);
    return h[1] > 0.f ? h[0] / h[1] : 0.f;
}

// A signal asks the run to stop cleanly: Slurm sends SIGTERM before it kills a job (scancel,
// preemption), and `sbatch --signal=USR1@300` sends SIGUSR1 300 s before the time limit. The step
// in progress finishes, all ranks agree on it through the step's AllReduce, and the run saves a
// checkpoint and exits 0; --resume continues.
static volatile sig_atomic_t stop_requested = 0;
static void request_stop(int sig) { stop_requested = sig; }

static float lr_at(const Options* o, int step) {  // step counts from 1
    if (step <= o->warmup) return o->lr * step / (o->warmup > 0 ? o->warmup : 1);
    float left = (float)(o->steps - step) / (float)(o->steps - o->warmup > 0 ? o->steps - o->warmup : 1);
    return o->lr * (left > 0.f ? left : 0.f);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    Comm comm = comm_from_env();
    int ndev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ndev));
    if (comm.local_rank >= ndev) {
        fprintf(stderr, "trainer: SLURM_LOCALID=%d but this node has %d GPU(s): one process per GPU\n", comm.local_rank,
                ndev);
        return 1;
    }
    CUDA_CHECK(cudaSetDevice(comm.local_rank));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, comm.local_rank));
    size_t free_bytes, total_bytes;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (!strcmp(argv[1], "--info")) {
        printf("rank %d of %d (local %d): %s, sm_%d%d, %d SMs, %.1f GB free of %.1f GB\n", comm.rank, comm.world,
               comm.local_rank, prop.name, prop.major, prop.minor, prop.multiProcessorCount, free_bytes / 1e9,
               total_bytes / 1e9);
        return 0;
    }
    Options o = parse_options(argc, argv);
    int main_rank = comm.rank == 0;
    if (mkdir(o.out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "trainer: --out %s: cannot create the directory: %s\n", o.out, strerror(errno));
        return 1;
    }

    // Node-local copies of the shards (the seed paper's recommendation 2).
    char train_pattern[4096], val_pattern[4096], err[DATA_ERR_LEN];
    snprintf(train_pattern, sizeof train_pattern, "%s", o.data);
    snprintf(val_pattern, sizeof val_pattern, "%s", o.val ? o.val : "");
    if (o.stage_dir) {
        if (dataloader_stage(o.data, o.stage_dir, comm.local_rank, 3600, train_pattern, sizeof train_pattern, err) ||
            (o.val &&
             dataloader_stage(o.val, o.stage_dir, comm.local_rank, 3600, val_pattern, sizeof val_pattern, err))) {
            fprintf(stderr, "trainer: --stage-dir: %s\n", err);
            return 1;
        }
    }

    // The model: a preset with the shards' vocabulary, or a Hugging Face checkpoint.
    BertConfig cfg;
    float* init_w = NULL;
    BertParams init_p;
    Shard* shards;
    int nshards;
    if (shards_open_all(train_pattern, &shards, &nshards, 1, err)) {
        fprintf(stderr, "trainer: --data: %s\n", err);
        return 1;
    }
    int data_vocab = (int)shards[0].h.vocab_size, pad_id = shards[0].h.pad_id;
    for (int i = 0; i < nshards; i++) shard_close(&shards[i]);
    free(shards);
    if (o.init_from) {
        if (!bert_load_hf(o.init_from, &cfg, &init_p, &init_w)) {
            fprintf(stderr, "trainer: --init-from %s: cannot load config.json + model.safetensors\n", o.init_from);
            return 1;
        }
    } else {
        if (!bert_preset(o.preset, &cfg)) {
            fprintf(stderr, "trainer: --preset %s: unknown; one of:", o.preset);
            for (int i = 0; i < BERT_NUM_PRESETS; i++) fprintf(stderr, " %s", bert_presets[i].name);
            fprintf(stderr, "\n");
            return 1;
        }
        cfg.vocab_size = data_vocab;
    }
    if (o.T > cfg.max_position) {
        fprintf(stderr, "trainer: --seq %d is longer than the model's %d positions\n", o.T, cfg.max_position);
        return 1;
    }

    // The memory plan, and the micro-batch it allows (the seed paper's recommendation 5).
    int loaders = o.val ? 2 : 1;
    Plan plan = o.B ? make_plan(&cfg, o.B, o.T, loaders) : choose_batch(&cfg, o.T, loaders, free_bytes, total_bytes);
    if (main_rank) {
        printf("device: %s, %.1f GB free of %.1f GB; %d process(es)\n", prop.name, free_bytes / 1e9, total_bytes / 1e9,
               comm.world);
        bert_print_plan(&cfg, plan.B, plan.T, plan.M, (int)sizeof(floatX));
        printf("  batch buffers %.3f GiB; total %.3f GiB for B=%d (%s)\n",
               (plan.batch_bytes + plan.maker_bytes) / (double)(1 << 30), plan.total / (double)(1 << 30), plan.B,
               o.B ? "--batch" : "the largest that fits");
    }
    if (plan.total > free_bytes) {
        fprintf(stderr,
                "trainer: the model needs %.3f GiB at B=%d but %.3f GiB are free: use a smaller --seq, "
                "--preset or --batch\n",
                plan.total / (double)(1 << 30), plan.B, free_bytes / (double)(1 << 30));
        return 1;
    }
    if (o.plan_only) return 0;
    int B = plan.B, T = o.T;

    // Everything on the device, allocated once.
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    BertModel model;
    if (!bert_alloc(&model, &cfg, B, T, plan.M, stream)) return 1;
    BatchMaker bm;
    memset(&bm, 0, sizeof bm);
    bm.pad_id = pad_id, bm.M = plan.M;
    CUDA_CHECK(cudaMalloc((void**)&bm.seg_lo, plan.maker_bytes));
    bm.seg_hi = bm.seg_lo + (size_t)B * T;
    bm.pos = bm.seg_hi + (size_t)B * T;
    bm.labels = bm.pos + plan.M;
    float* scratch = (float*)(bm.labels + plan.M);  // step: loss sum, count, stops [0..2]; validation [3..4]
    CUDA_CHECK(cudaMemset(scratch, 0, 8 * sizeof(float)));

    DataLoaderConfig dcfg = dataloader_default_config(train_pattern, B, T);
    dcfg.rank = comm.rank, dcfg.world = comm.world, dcfg.num_threads = o.loader_threads;
    dcfg.ring_slots = o.ring_slots, dcfg.seed = (uint64_t)o.seed, dcfg.vocab_size = cfg.vocab_size;
    dcfg.verbose = main_rank;
    DataLoader train, val;
    if (dataloader_init(&train, &dcfg)) {
        fprintf(stderr, "trainer: %s\n", train.error);
        return 1;
    }
    DataLoaderState val_start;
    if (o.val) {
        DataLoaderConfig vcfg = dcfg;
        vcfg.pattern = val_pattern, vcfg.shuffle = 0, vcfg.num_threads = 1;
        if (dataloader_init(&val, &vcfg)) {
            fprintf(stderr, "trainer: %s\n", val.error);
            return 1;
        }
        val_start = dataloader_state(&val);
    }

    // Weights: from the checkpoint, from Hugging Face, or BERT's random initialisation.
    if (o.resume) {
        DataLoaderState pos;
        load_checkpoint(o.out, &model, &pos);
        if (dataloader_restore(&train, &pos)) {
            fprintf(stderr, "trainer: --resume: %s\n", train.error);
            return 1;
        }
        if (main_rank) printf("resumed from %s/checkpoint.bin at step %d\n", o.out, model.step);
    } else {
        if (!init_w) {
            init_w = (float*)malloc(model.p.numel * sizeof(float));
            bert_init_host(&model.p, init_w, (uint64_t)o.seed);
        }
        bert_set_params(&model, init_w);
    }
    free(init_w);
    if (o.init_from) bert_params_free(&init_p);
    comm_init(&comm, o.out, 600);
    bert_zero_grad(&model);
    size_t free_before_step1;  // from here on nothing is allocated: the log shows it
    CUDA_CHECK(cudaMemGetInfo(&free_before_step1, &total_bytes));
    if (main_rank)
        printf("device memory allocated before step 1: %zu bytes (the plan: %zu bytes)\n",
               free_bytes - free_before_step1, plan.total);

    double flops_token = bert_flops_per_token(&cfg, T, 0.15).model;
    if (main_rank)
        printf("training: %d steps of %d x %d micro-batch(es) of B=%d, T=%d (%.3g tokens per step), %s\n", o.steps,
               comm.world, o.grad_accum, B, T, (double)comm.world * o.grad_accum * B * T, FLOATX_NAME);
    int last_step = o.run_steps && model.step + o.run_steps < o.steps ? model.step + o.run_steps : o.steps;
    signal(SIGTERM, request_stop);
    signal(SIGUSR1, request_stop);
    while (model.step < last_step) {
        int step = model.step + 1;
        double t0 = now_s(), wait_ms = 0;
        float loss = 0.f;
        long long tokens = 0;
        for (int micro = 0; micro < o.grad_accum; micro++) {
            Batch b;
            if (dataloader_next(&train, stream, &b)) {
                fprintf(stderr, "trainer: %s\n", train.error);
                return 1;
            }
            wait_ms += b.wait_ms;
            tokens += b.num_real_tokens;
            int n_masked;
            BertBatch bt = make_batch(&bm, &b, B, T, stream, &n_masked);
            // The gradient of each micro-batch's mean loss, weighted 1/grad_accum. A micro-batch with no
            // masked token (possible at an epoch's end) still needs a non-zero scale, so that its
            // dlogits are written (as zeros: all its head rows are padding).
            bert_forward(&model, &bt, 1.f / ((float)(n_masked > 0 ? n_masked : 1) * o.grad_accum));
            bert_backward(&model, &bt);
            add_loss(scratch, &model, n_masked);
        }
        comm_average(&comm, model.grad, model.p.numel, stream);
        bert_grad_norm(&model);
        bert_adamw_step(&model, lr_at(&o, step), o.beta1, o.beta2, o.eps, o.wd, o.clip);
        bert_zero_grad(&model);
        // The one host sync of the step: the gradient norm, and over all ranks the (loss sum, masked count,
        // stop requests) that scratch[0..2] hold.
        float norm, stop = stop_requested ? 1.f : 0.f, h[3];
        CUDA_CHECK(cudaMemcpyAsync(&norm, model.norm, sizeof norm, cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaMemcpyAsync(scratch + 2, &stop, sizeof stop, cudaMemcpyHostToDevice, stream));
        all_ranks_sum(&comm, scratch, 3, h, stream);
        loss = h[1] > 0.f ? h[0] / h[1] : 0.f;
        if (h[2] > 0.f) last_step = step;  // some rank got a signal: every rank stops after this step
        double dt = now_s() - t0;
        if (!isfinite(loss)) {
            fprintf(stderr, "trainer: step %d: the loss is %f; stopping (the last checkpoint is intact)\n", step, loss);
            return 1;
        }
        if (main_rank && (step % o.log_every == 0 || step == 1 || step == o.steps)) {
            double tps = comm.world * tokens / dt;
            printf(
                "step %6d/%d | loss %.4f | lr %.3e | norm %.3f | %.0f ms | %.0f tok/s | MFU %.1f%% (of 989 TFLOP/s) "
                "| data wait %.1f ms\n",
                step, o.steps, loss, lr_at(&o, step), norm, dt * 1e3, tps,
                100.0 * tps * flops_token / comm.world / 989e12, wait_ms);
            fflush(stdout);
        }
        if (bm.dropped) {
            if (main_rank)
                printf("note: %lld masked positions above the cap M=%d were left out of the loss\n", bm.dropped, bm.M);
            bm.dropped = 0;
        }
        if (o.val && o.val_every && (step % o.val_every == 0 || step == o.steps)) {
            float vl = evaluate(&model, &val, &val_start, &bm, &comm, o.val_batches, scratch + 3);
            if (main_rank) printf("step %6d | val loss %.4f (%d batches)\n", step, vl, o.val_batches);
        }
        if (main_rank && ((o.ckpt_every && step % o.ckpt_every == 0) || step == last_step)) {
            DataLoaderState pos = dataloader_state(&train);
            save_checkpoint(o.out, &model, &pos);
        }
    }

    size_t free_after;
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total_bytes));
    if (main_rank) printf("device memory allocated after the last step: %zu bytes\n", free_bytes - free_after);

    // The final weights as a Hugging Face BertForMaskedLM (model.safetensors + config.json).
    if (main_rank && model.step < o.steps)
        printf("stopped after step %d (%s); --resume continues\n", model.step,
               stop_requested ? "on a signal" : "--run-steps");
    if (main_rank && model.step == o.steps) {
        float* w = (float*)malloc(model.p.numel * sizeof(float));
        bert_get_params(&model, w);
        if (!bert_save_hf(o.out, &model.p, w)) {
            fprintf(stderr, "trainer: cannot write the Hugging Face export to %s\n", o.out);
            return 1;
        }
        printf("saved %s/checkpoint.bin and the Hugging Face export %s/model.safetensors + config.json\n", o.out,
               o.out);
        free(w);
    }
    dataloader_free(&train);
    if (o.val) dataloader_free(&val);
    comm_free(&comm);
    cudaFree(bm.seg_lo);
    bert_free(&model);
    return 0;
}
