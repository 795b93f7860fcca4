// trainer.cu: mlm.c's one program, BERT-style masked-language-model pretraining.
// This is the only translation unit: nvcc compiles it for the GPU (./trainer) and g++ compiles the
// very same file against cpu/ for the CPU (./trainer_cpu). Each header has one role:
#include <cuda_runtime.h>  // the CUDA runtime (cpu/include/cuda_runtime.h on the CPU build)
#include "kernels.cuh"     // every GPU kernel, and launch()
#include "model.h"         // the BERT configuration, parameter table, memory plan, forward/backward/AdamW
#include "data.h"          // token shards, the ring of loader threads, MLM masking
#include "comm.h"          // rank and world size; NCCL gradient averaging
#include "scaling.h"       // the scaling predictor: compute, all-reduce and overlap on N nodes
#include <ctype.h>
#include <dirent.h>
#include <glob.h>
#include <libgen.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
    const char* out;        // checkpoints, the final export (and the NCCL id with --bootstrap file)
    const char* stage_dir;  // node-local directory to copy the shards to first (optional)
    int T, B, grad_accum, steps, warmup;
    float lr, wd, beta1, beta2, eps, clip;
    long long seed;
    int loader_threads, ring_slots;
    int log_every, val_every, val_batches, ckpt_every, run_steps;
    int resume, plan_only;
    int keep, max_bad_steps;               // checkpoints kept; consecutive non-finite steps before the run stops
    float ckpt_minutes;                    // a checkpoint at least this often (wall clock; 0: only --ckpt-every)
    int inf_grad[2], inf_loss[2];          // test hooks (MLM_TEST_INF_GRAD / MLM_TEST_INF_LOSS): see test_hook_env
    int bench, bench_steps, bench_warmup;  // --bench: time the training step on synthetic data
    const char* bootstrap;                 // --bootstrap tcp | file: how the ranks get rank 0's NCCL id
    float nccl_timeout;                    // --nccl-timeout S: the deadline of every wait on the other ranks
    // The scaling predictor (scaling.h) for --plan-only and --grad-accum auto (grad_accum 0)
    int nodes, gpus_per_node;          // 0: from Slurm (SLURM_NNODES) and the world size
    float net_gbps, nvlink_gbps, mfu;  // Gbit/s one way; the share of the device's peak
    const char* device;                // the device the prediction is for (default: this one)
    float device_mem;                  // GB of device memory for --plan-only's planner (0: this device's)
    float bucket_mb;                   // gradient bucket size (MB of fp32 gradients)
    int grad_reduce_bf16, zero;        // --grad-reduce bf16; --zero 1 (ZeRO-1)
    int lamb;                          // --optimizer lamb (else AdamW)
    long long tokens;                  // --tokens N: about N real tokens, as steps (resolve_run_length)
    double epochs;                     // --epochs E: E passes over the training shards, as steps
    const char* eval;                  // --eval SRC: evaluate a checkpoint or an export on --val; no training
    int seq_given;                     // --seq was given (--eval otherwise takes the source's)
} Options;

static void usage(void) {
    printf(
        "usage: trainer --data 'DIR/train_*.bin' --out DIR --steps N [options]\n"
        "  (srun -K ./trainer ... for several GPUs; ./trainer_cpu: the same program on the CPU, without a GPU)\n"
        "  --data GLOB         training shards (tools/prepare.py makes them)\n"
        "  --val GLOB          validation shards: MLM loss and masked-token accuracy every --val-every steps, on\n"
        "                      the same --val-batches micro-batches (a fixed masking) whatever the number of GPUs\n"
        "  --out DIR           (created with its parents) checkpoint.bin, metrics.jsonl (a JSON object per logged\n"
        "                      step and per validation), the final Hugging Face export (model.safetensors,\n"
        "                      config.json) and the tokenizer files (tokenizer.json + tokenizer_config.json +\n"
        "                      special_tokens_map.json for text shards, byte_tokenizer.json for byte shards)\n"
        "  --preset NAME       default bert-base; the vocabulary size comes from the shards:\n");
    for (int i = 0; i < BERT_NUM_PRESETS; i++) {
        BertConfig c;
        bert_preset(bert_presets[i].name, &c);
        BertParams p;
        bert_params_build(&p, &c);
        printf("      %-11s %2d x %4d, %2d heads of %d, FFN %4d, %d positions: %.3gM parameters at V=%d\n",
               bert_presets[i].name, c.layers, c.hidden, c.heads, c.hidden / c.heads, c.intermediate, c.max_position,
               bert_param_count(&p) / 1e6, c.vocab_size);
        bert_params_free(&p);
    }
    printf(
        "  --init-from DIR     start from a Hugging Face BertForMaskedLM checkpoint instead\n"
        "  --resume            continue from DIR/checkpoint.bin (weights, optimizer, data position)\n"
        "  --seq T             tokens per row (default 512)\n"
        "  --batch B           rows per micro-batch per GPU (default 0: the largest that fits in GPU memory)\n"
        "  --grad-accum N      micro-batches per optimizer step (default 1); auto: the fewest that hide the\n"
        "                      gradient all-reduce behind compute (predicted, see --plan-only)\n"
        "  --steps N           optimizer steps; or instead:\n"
        "  --tokens N          about N real tokens (1e9, 500M, 2B: K M B T suffixes), as steps of the global batch\n"
        "  --epochs E          E passes over the training shards (E x their tokens / tokens per step, rounded up)\n"
        "  --lr X              peak learning rate (default 5e-4), linear warmup then linear decay to 0\n"
        "  --warmup N          warmup steps (default 1%% of --steps)\n"
        "  --wd X --beta1 X --beta2 X --eps X --clip X   AdamW (0.01, 0.9, 0.98, 1e-6) and clipping (1.0)\n"
        "  --optimizer NAME    adamw (default) or lamb: AdamW's moments and decay, each tensor's step scaled by its\n"
        "                      trust ratio |w| / |update| (for large global batches; not with --zero 1)\n"
        "  --seed N            data order, masking and initialisation (default 1337)\n"
        "  --loader-threads N  threads preparing batches (default 2); --ring N slots (default 4)\n"
        "  --stage-dir DIR     copy the shards to this node-local directory first, once per node\n"
        "  --log-every N --val-every N --val-batches N --ckpt-every N   (1, 0, 20, 0: only at the end);\n"
        "                      --val-batches counts micro-batches of B rows over all GPUs together\n"
        "  --ckpt-minutes X    also a checkpoint when X minutes passed since the last one (default 30; 0: off)\n"
        "  --keep K            checkpoints kept: DIR/checkpoint.bin and the K-1 before it as checkpoint-STEP.bin\n"
        "                      (default 2); --resume takes the newest intact one (each has a CRC-32)\n"
        "  --max-bad-steps N   a step whose loss or gradient norm is not finite is skipped (weights and AdamW\n"
        "                      state untouched); N in a row stop the run with exit code 2 (default 3)\n"
        "  --run-steps N       stop after N steps of this run, with a checkpoint (to fit a job's time limit;\n"
        "                      --resume continues)\n"
        "  --plan-only         print the memory plan and the scaling prediction, then exit (--data and --out\n"
        "                      optional: without --data the preset's vocabulary)\n"
        "  --nodes N --gpus-per-node G   the layout predicted (--plan-only: default 1 x 1; a run: SLURM_NNODES\n"
        "                      and its ranks spread over them)\n"
        "  --net-gbps X        network between nodes, Gbit/s one way (default 25); --nvlink-gbps X inside a\n"
        "                      node (default 2400: H100 NVL's NVLink bridge, 300 GB/s each way)\n"
        "  --mfu X             share of the device's bf16 peak a step reaches (default 0.404: paper-120m on\n"
        "                      an H100; ./trainer --bench prints it as mfu=)\n"
        "  --device NAME       predict for this device (e.g. \"NVIDIA H100 NVL\") instead of this one\n"
        "  --device-mem GB     with --plan-only: plan for this much device memory instead of this one's\n"
        "  --bucket-mb X       gradients are reduced over GPUs in buckets of X MB (fp32; default 25), each as\n"
        "                      soon as the backward has made it, overlapping the rest of the backward\n"
        "  --grad-reduce T     fp32 (default) or bf16: the type the buckets are reduced in (bf16: half the traffic)\n"
        "  --zero N            1: ZeRO-1, each GPU keeps 1/world of the fp32 master weights and AdamW state\n"
        "                      (gradients reduce-scattered, weights all-gathered); 0: off (default)\n"
        "  --info              print the device and this process's place in the job, then exit\n"
        "several processes (srun -K ./trainer ..., or RANK/WORLD_SIZE/LOCAL_RANK as torchrun sets them):\n"
        "  --bootstrap tcp|file  how the ranks get rank 0's NCCL id: tcp (default) from MASTER_ADDR:MASTER_PORT,\n"
        "                      by default the first host of the Slurm node list and a port from the job and step\n"
        "                      id; file: through --out, which must be on a file system every rank sees\n"
        "  --nccl-timeout S    a rank that waits S seconds for the others (start-up, a collective) aborts the\n"
        "                      communicator and exits 1 naming the step and collective (default 120)\n"
        "exit codes: 0 done or stopped by a signal with a checkpoint; 1 bad input or an error; 2 diverged;\n"
        "  128+N a signal N (SIGTERM, SIGUSR1) before step 1: no checkpoint or export was written\n"
        "\n"
        "usage: trainer --bench [--preset A,B,..] [--seq T] [--batch B] [options]   (no shards needed)\n"
        "  times the training step on synthetic packed batches and prints, for each preset (default\n"
        "  bert-base,bert-large with the preset's vocabulary), the time per phase, tokens/s, MFU and the\n"
        "  planner's largest micro-batch; --batch picks the micro-batch run (default: that largest one)\n"
        "  --bench-steps N     timed steps (default 10), after --bench-warmup N untimed ones (default 3)\n"
        "  --out DIR           needed only with several processes and --bootstrap file\n"
        "\n"
        "usage: trainer --eval SRC --val GLOB [--batch B] [--seq T] [--val-batches N] [--out DIR]\n"
        "  evaluates SRC, a checkpoint file (DIR/checkpoint.bin) or a Hugging Face export directory (config.json +\n"
        "  model.safetensors), on the validation shards as training validates, without training; prints\n"
        "  \"eval: loss X | accuracy Y | N masked tokens in K sequences\"; with --out it appends an \"eval\"\n"
        "  record to DIR/metrics.jsonl. --seq defaults to the checkpoint's (an export: the shards' --seq-len); with "
        "the\n"
        "  run's --batch and --val-batches it sees the very batches of the run's validation\n");
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
// parse_count: --tokens: a count such as 1000000, 1e9, 500M or 2B (suffixes K, M, B or G, T: powers of 1000).
static long long parse_count(const char* name, const char* v) {
    char* end;
    double x = strtod(v, &end);
    const char* suffixes = "KMBGT";
    const double scale[] = {1e3, 1e6, 1e9, 1e9, 1e12};
    const char* at = *end ? strchr(suffixes, toupper((unsigned char)*end)) : NULL;
    if (at && end[1] == 0) x *= scale[at - suffixes], end++;
    if (*end || end == v || !(x >= 1 && x <= 1e15)) {
        fprintf(stderr, "trainer: %s %s: expected a count of tokens in [1, 1e15], such as 5000000, 1e9, 500M or 2B\n",
                name, v);
        exit(1);
    }
    return (long long)ceil(x);
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

// Test hooks, for tests/test_checkpoints.sh: MLM_TEST_INF_GRAD=FIRST[:COUNT] makes the gradient of steps
// FIRST .. FIRST+COUNT-1 infinite (COUNT 0: every step from FIRST on; default 1), MLM_TEST_INF_LOSS the loss,
// as a diverging run would. Unset: nothing happens.
static void test_hook_env(const char* name, int h[2]) {
    const char* v = getenv(name);
    h[0] = h[1] = 0;
    if (!v) return;
    char* end;
    long first = strtol(v, &end, 10), count = 1;
    if (*end == ':') count = strtol(end + 1, &end, 10);
    if (*end || first < 1 || count < 0 || first > INT_MAX || count > INT_MAX) {
        fprintf(stderr, "trainer: %s=%s: expected FIRST[:COUNT] (steps, FIRST >= 1)\n", name, v);
        exit(1);
    }
    h[0] = (int)first, h[1] = (int)count;
}
static int test_hook_on(const int h[2], int step) {
    return h[0] > 0 && step >= h[0] && (h[1] == 0 || step < h[0] + h[1]);
}

static Options parse_options(int argc, char** argv) {
    Options o;
    memset(&o, 0, sizeof o);
    o.bench_steps = 10, o.bench_warmup = 3;
    o.T = 512, o.grad_accum = 1, o.warmup = -1;
    o.lr = 5e-4f, o.wd = 0.01f, o.beta1 = 0.9f, o.beta2 = 0.98f, o.eps = 1e-6f, o.clip = 1.0f;
    o.seed = 1337, o.loader_threads = 2, o.ring_slots = 4;
    o.log_every = 1, o.val_batches = 20;
    o.keep = 2, o.max_bad_steps = 3, o.ckpt_minutes = 30;
    o.bootstrap = "tcp", o.nccl_timeout = (float)COMM_DEFAULT_TIMEOUT_S;
    o.bucket_mb = 25;
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
        if (!strcmp(a, "--bench")) {
            o.bench = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "trainer: %s: unknown flag, or missing its value (see --help)\n", a);
            exit(1);
        }
        const char* v = argv[++i];
        if (!strcmp(a, "--data"))
            o.data = v;
        else if (!strcmp(a, "--eval"))
            o.eval = v;
        else if (!strcmp(a, "--tokens"))
            o.tokens = parse_count(a, v);
        else if (!strcmp(a, "--epochs"))
            o.epochs = parse_float(a, v, 1e-6, 1e6);
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
            o.T = (int)parse_int(a, v, 2, 1 << 16), o.seq_given = 1;
        else if (!strcmp(a, "--batch"))
            o.B = (int)parse_int(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--grad-accum"))
            o.grad_accum = !strcmp(v, "auto") ? 0 : (int)parse_int(a, v, 1, SCALING_MAX_ACCUM);
        else if (!strcmp(a, "--nodes"))
            o.nodes = (int)parse_int(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--gpus-per-node"))
            o.gpus_per_node = (int)parse_int(a, v, 1, 1024);
        else if (!strcmp(a, "--net-gbps"))
            o.net_gbps = parse_float(a, v, 1e-3, 1e6);
        else if (!strcmp(a, "--nvlink-gbps"))
            o.nvlink_gbps = parse_float(a, v, 1e-3, 1e6);
        else if (!strcmp(a, "--mfu"))
            o.mfu = parse_float(a, v, 1e-4, 1);
        else if (!strcmp(a, "--device"))
            o.device = v;
        else if (!strcmp(a, "--device-mem"))
            o.device_mem = parse_float(a, v, 0.001, 1e6);
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
            o.val_batches = (int)parse_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--ckpt-every"))
            o.ckpt_every = (int)parse_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--run-steps"))
            o.run_steps = (int)parse_int(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--ckpt-minutes"))
            o.ckpt_minutes = parse_float(a, v, 0, 1e6);
        else if (!strcmp(a, "--keep"))
            o.keep = (int)parse_int(a, v, 1, 1000);
        else if (!strcmp(a, "--max-bad-steps"))
            o.max_bad_steps = (int)parse_int(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--bench-steps"))
            o.bench_steps = (int)parse_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--bench-warmup"))
            o.bench_warmup = (int)parse_int(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--nccl-timeout"))
            o.nccl_timeout = parse_float(a, v, 0.1, 1e7);
        else if (!strcmp(a, "--bootstrap")) {
            if (strcmp(v, "tcp") && strcmp(v, "file")) {
                fprintf(stderr, "trainer: --bootstrap %s: expected tcp or file\n", v);
                exit(1);
            }
            o.bootstrap = v;
        } else if (!strcmp(a, "--bucket-mb"))
            o.bucket_mb = parse_float(a, v, 0.001, 1 << 20);
        else if (!strcmp(a, "--zero"))
            o.zero = (int)parse_int(a, v, 0, 1);
        else if (!strcmp(a, "--optimizer")) {
            if (strcmp(v, "adamw") && strcmp(v, "lamb")) {
                fprintf(stderr, "trainer: --optimizer %s: expected adamw or lamb\n", v);
                exit(1);
            }
            o.lamb = !strcmp(v, "lamb");
        } else if (!strcmp(a, "--grad-reduce")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16")) {
                fprintf(stderr, "trainer: --grad-reduce %s: expected fp32 or bf16\n", v);
                exit(1);
            }
            o.grad_reduce_bf16 = !strcmp(v, "bf16");
        } else {
            fprintf(stderr, "trainer: %s: unknown flag (see --help)\n", a);
            exit(1);
        }
    }
    if (!o.preset) o.preset = o.bench ? "bert-base,bert-large" : "bert-base";
    if (o.device_mem > 0 && !o.plan_only) {
        fprintf(stderr, "trainer: --device-mem: only with --plan-only (a real run plans for its device)\n");
        exit(1);
    }
    if (o.lamb && o.zero) {  // LAMB's trust ratios need each tensor's whole norms; ZeRO-1 shards the state
        fprintf(stderr,
                "trainer: --optimizer lamb: not with --zero 1 (its per-tensor trust ratios need whole tensors; "
                "ZeRO-1 splits them over the ranks)\n");
        exit(1);
    }
    if (o.bench && o.grad_accum == 0) {
        fprintf(stderr, "trainer: --grad-accum auto: not with --bench; give a number\n");
        exit(1);
    }
    if (o.bench) return o;  // --bench needs no shards, output directory or step count
    if (o.eval) {           // --eval: only the evaluation's flags
        if (!o.val || o.data || o.steps || o.tokens || o.epochs || o.resume || o.init_from) {
            fprintf(stderr,
                    "trainer: --eval %s: needs --val GLOB and takes no --data, --steps, --tokens, --epochs, "
                    "--resume or --init-from (see --help)\n",
                    o.eval);
            exit(1);
        }
        return o;
    }
    int lengths = (o.steps > 0) + (o.tokens > 0) + (o.epochs > 0);
    if (lengths > 1) {
        fprintf(stderr, "trainer: --steps, --tokens and --epochs are alternatives: give one of them\n");
        exit(1);
    }
    if (!o.plan_only && (!o.data || !o.out || !lengths)) {
        fprintf(stderr, "trainer: --data, --out and --steps (or --tokens, or --epochs) are required (see --help)\n");
        exit(1);
    }
    test_hook_env("MLM_TEST_INF_GRAD", o.inf_grad);
    test_hook_env("MLM_TEST_INF_LOSS", o.inf_loss);
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
    size_t reduce_bytes;  // the bf16 staging buffer of --grad-reduce bf16 (comm.h)
    size_t batch_bytes;   // each loader's (training, validation) two device batch buffers
    size_t maker_bytes;   // seg_lo, seg_hi (B, T), the head's positions and labels (M), 8 floats of loss sums,
                          // the head rows' hits (M floats: accuracy)
    size_t val_bytes;     // validation's per-micro-batch sums (4 floats x --val-batches; plan_add_validation)
    size_t total;
} Plan;

static int mlm_cap(int B, int T) { return (int)(1.1 * 0.15 * B * T) + 64; }

// make_plan: the plan for micro-batch B; gr: the gradient buckets (ZeRO-1 shards the optimizer state).
static Plan make_plan(const BertConfig* c, int B, int T, int loaders, const GradReduce* gr) {
    Plan p;
    p.B = B, p.T = T, p.M = mlm_cap(B, T);
    p.model = bert_mem_plan_sharded(c, B, T, p.M, (int)sizeof(floatX), gr->zero ? gr->state_numel : 0, gr->slack);
    p.reduce_bytes = gr->stage_elems * sizeof(__nv_bfloat16);
    p.batch_bytes = loaders * dataloader_device_bytes(B, T);
    p.maker_bytes = (2 * (size_t)B * T + 2 * (size_t)p.M) * sizeof(int) + 8 * sizeof(float)  // + the loss sums
                    + (size_t)p.M * sizeof(float);                                           // + the hits
    p.val_bytes = 0;
    p.total = p.model.total + p.reduce_bytes + p.batch_bytes + p.maker_bytes;
    return p;
}
// plan_add_validation: validation's sums, one slot of 4 floats per micro-batch (see Validation).
static void plan_add_validation(Plan* p, int val_batches) {
    p->val_bytes = 4 * (size_t)val_batches * sizeof(float);
    p->total += p->val_bytes;
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
                       o->grad_reduce_bf16);
    free(ready_lo);
    bert_params_free(&p);
}

// choose_batch: the largest B whose plan fits in the free device memory, less a reserve for the
// CUDA context, cuBLASLt and NCCL (5% of the device, at least 1 GiB).
static Plan choose_batch(const BertConfig* c, int T, int loaders, const GradReduce* gr, size_t free_bytes,
                         size_t total_bytes) {
    size_t reserve = total_bytes / 20 > ((size_t)1 << 30) ? total_bytes / 20 : ((size_t)1 << 30);
    size_t budget = free_bytes > reserve ? free_bytes - reserve : 0;
    int lo = 0, hi = 1;
    while (make_plan(c, hi, T, loaders, gr).total <= budget && hi < (1 << 20)) lo = hi, hi *= 2;
    while (hi - lo > 1) {  // largest B with plan <= budget is in [lo, hi)
        int mid = lo + (hi - lo) / 2;
        if (make_plan(c, mid, T, loaders, gr).total <= budget)
            lo = mid;
        else
            hi = mid;
    }
    return make_plan(c, lo > 0 ? lo : 1, T, loaders, gr);  // B = 1 when nothing fits: the caller reports it
}

// ----------------------------------------------------------------------------
// Checkpoints. DIR/checkpoint.bin is the newest; with --keep K the K-1 before it stay beside it as
// DIR/checkpoint-STEP.bin. A checkpoint is written to DIR/checkpoint.bin.tmp, flushed to disk, and
// renamed over checkpoint.bin (which first gets its checkpoint-STEP.bin name as a hard link), so a
// crash at any moment leaves every earlier checkpoint intact. The file, little-endian:
//   header (CkptHeader) | master weights fp32 (numel) | AdamW m fp32 (numel) | AdamW v fp32 (numel)
//   | the floatX weights (numel; bf16 mode only: stochastic rounding made them, so they are state too)
//   | CRC-32 (zlib's) of every byte before it (u32) | 4 zero bytes
// The CRC is computed while writing and checked before anything is loaded; then the header is checked
// against the run (model, T, step within --steps; data.h checks the data position).
#define CKPT_MAGIC "MLMCKPT3"
#define CKPT_VERSION 3  // 3: the tokens trained on (for metrics.jsonl and the epoch fraction across resumes)
#define CKPT_CHUNK ((size_t)16 << 20)  // bytes copied, checksummed and written at a time
typedef struct {
    char magic[8];
    uint32_t version, header_bytes;
    BertConfig cfg;
    int32_t T, step;
    int32_t x_bytes;  // sizeof(floatX) of the run that wrote it
    int32_t reserved;
    uint64_t numel, body_bytes;  // body: everything between the header and the CRC
    uint64_t tokens;             // real tokens trained on by all ranks up to this step
    DataLoaderState data;        // (last: tests/test_checkpoints.sh finds it 64 bytes before the body)
} CkptHeader;

// What this run knows about DIR's checkpoints, for --keep and for the truth of its messages.
typedef struct {
    const char* dir;
    int keep;         // --keep: checkpoints kept, the newest included
    int step;         // the step of the newest good checkpoint this process wrote or loaded; -1: none
    char path[4400];  // its file
    uint64_t tokens;  // real tokens trained on up to the model's step: the trainer keeps it current, saves, loads
} Ckpts;

// ckpt_regions: the device buffers a checkpoint holds, in file order, each whole in the file. Gives their
// number. Under ZeRO-1 the first three (master weights, AdamW m, v) are this rank's shards: ckpt_sharded.
static int ckpt_regions(const BertModel* m, void* dev[4], size_t bytes[4]) {
    int k = 0;
    dev[k] = m->master, bytes[k++] = m->p.numel * sizeof(float);
    dev[k] = m->adam_m, bytes[k++] = m->p.numel * sizeof(float);
    dev[k] = m->adam_v, bytes[k++] = m->p.numel * sizeof(float);
    if (sizeof(floatX) != sizeof(float)) dev[k] = m->w, bytes[k++] = m->p.numel * sizeof(floatX);
    return k;
}
static int ckpt_sharded(const GradReduce* gr, int region) { return gr->zero && region < 3; }
static uint64_t ckpt_body_bytes(const BertModel* m) {
    void* dev[4];
    size_t bytes[4];
    uint64_t total = 0;
    for (int i = 0, k = ckpt_regions(m, dev, bytes); i < k; i++) total += bytes[i];
    return total;
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
static int read_all(int fd, void* p, size_t n) {  // 1 when all n bytes were read
    char* c = (char*)p;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        c += r, n -= (size_t)r;
    }
    return 1;
}
static void fsync_dir(const char* dir) {  // makes renames and unlinks in dir durable
    int dfd = open(dir, O_RDONLY);
    if (dfd >= 0) fsync(dfd), close(dfd);
}

// ckpt_prune: removes checkpoint-STEP.bin files of steps >= newest (left by a run that resumed from an
// older checkpoint) and all but the keep-1 newest of the others.
static void ckpt_prune(const Ckpts* ck, int newest) {
    DIR* d = opendir(ck->dir);
    if (!d) return;
    int steps[1024], n = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int s, len;
        if (sscanf(e->d_name, "checkpoint-%d.bin%n", &s, &len) == 1 && e->d_name[len] == 0 && n < 1024) steps[n++] = s;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        int newer = 0;  // kept checkpoint-*.bin files newer than this one
        for (int j = 0; j < n; j++) newer += steps[j] > steps[i] && steps[j] < newest;
        if (steps[i] >= newest || newer >= ck->keep - 1) {
            char p[4200];
            snprintf(p, sizeof p, "%s/checkpoint-%d.bin", ck->dir, steps[i]);
            unlink(p);
        }
    }
    fsync_dir(ck->dir);
}

// save_checkpoint: writes DIR/checkpoint.bin as described above. Gives 1, or 0 with the reason in err
// (the temporary file removed; every earlier checkpoint untouched). Rank 0 writes; under ZeRO-1 every rank
// calls it, to gather the shards (through the gradient buffer: call it between steps).
static int save_checkpoint(Ckpts* ck, BertModel* m, const GradReduce* gr, const DataLoaderState* data, char* err,
                           size_t errlen) {
    int writer = gr->comm->rank == 0;
    char path[4400], tmp[4400], old[4400];
    snprintf(path, sizeof path, "%s/checkpoint.bin", ck->dir);
    snprintf(tmp, sizeof tmp, "%s/checkpoint.bin.tmp", ck->dir);
    CkptHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION, h.header_bytes = sizeof h;
    h.cfg = m->cfg, h.T = m->T, h.step = m->step, h.x_bytes = (int32_t)sizeof(floatX);
    h.numel = m->p.numel, h.body_bytes = ckpt_body_bytes(m), h.tokens = ck->tokens, h.data = *data;
    unsigned char* buf = writer ? (unsigned char*)malloc(CKPT_CHUNK) : NULL;
    int fd = buf ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
    int ok = fd >= 0 && write_all(fd, &h, sizeof h), why = buf ? errno : ENOMEM;  // why: errno of the failure
    uint32_t crc = crc32_update(0, &h, sizeof h);
    void* dev[4];
    size_t bytes[4];
    for (int r = 0, k = ckpt_regions(m, dev, bytes); r < k; r++) {
        const void* src = dev[r];
        if (ckpt_sharded(gr, r)) {  // every rank, whatever happened to the file
            zero_gather(gr, (const float*)dev[r], m->grad, m->stream);
            src = m->grad;
        }
        for (size_t off = 0; ok && off < bytes[r]; off += CKPT_CHUNK) {
            size_t n = bytes[r] - off < CKPT_CHUNK ? bytes[r] - off : CKPT_CHUNK;
            CUDA_CHECK(cudaMemcpy(buf, (const char*)src + off, n, cudaMemcpyDeviceToHost));
            crc = crc32_update(crc, buf, n);
            if (!(ok = write_all(fd, buf, n))) why = errno;
        }
        // test hook (tests/test_checkpoints.sh): MLM_TEST_CKPT_DELAY_MS=N pauses N ms inside the write, so a
        // kill lands while the checkpoint is half written
        if (ok && r == 0 && getenv("MLM_TEST_CKPT_DELAY_MS")) usleep(1000 * atoi(getenv("MLM_TEST_CKPT_DELAY_MS")));
    }
    if (gr->zero) bert_zero_grad(m);  // the gradient buffer was the staging area
    if (!writer) return 1;
    uint32_t trailer[2] = {crc, 0};
    if (ok && !(ok = write_all(fd, trailer, sizeof trailer) && fsync(fd) == 0)) why = errno;
    if (fd >= 0 && close(fd) != 0 && ok) ok = 0, why = errno;
    free(buf);
    if (ok && ck->keep > 1 && ck->step >= 0 && !strcmp(ck->path, path)) {
        // the previous checkpoint.bin keeps a name of its own; a file system without hard links renames it
        // (for a moment there is then no checkpoint.bin: --resume takes checkpoint-STEP.bin)
        snprintf(old, sizeof old, "%s/checkpoint-%d.bin", ck->dir, ck->step);
        unlink(old);
        if (link(path, old) != 0) {
            if (rename(path, old) != 0) ok = 0, why = errno;
            snprintf(ck->path, sizeof ck->path, "%s", old);
        }
    }
    if (ok && rename(tmp, path) != 0) ok = 0, why = errno;
    if (!ok) {
        snprintf(err, errlen, "cannot write the checkpoint %s: %s", tmp, strerror(why));
        unlink(tmp);
        return 0;
    }
    fsync_dir(ck->dir);
    ck->step = m->step;
    snprintf(ck->path, sizeof ck->path, "%s", path);
    ckpt_prune(ck, m->step);
    return 1;
}

// ckpt_whats_on_disk: the truth about the last good checkpoint, for messages when a run stops.
static const char* ckpt_whats_on_disk(const Ckpts* ck, char* buf, size_t n) {
    if (ck->step < 0)
        snprintf(buf, n, "this run has written no checkpoint");
    else
        snprintf(buf, n, "the last checkpoint, %s (step %d), is intact", ck->path, ck->step);
    return buf;
}

// ckpt_verify: 1 when path is a whole checkpoint whose CRC matches (header in *h); else 0 and why.
static int ckpt_verify(const char* path, CkptHeader* h, char* why, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(why, n, "cannot open: %s", strerror(errno));
        return 0;
    }
    struct stat st;
    int ok = 0;
    unsigned char* buf = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        snprintf(why, n, "not a regular file");
    else if ((size_t)st.st_size < sizeof *h + 8 || !read_all(fd, h, sizeof *h))
        snprintf(why, n, "truncated: %lld bytes, shorter than a header", (long long)st.st_size);
    else if (!memcmp(h->magic, "MLMCKPT2", 8))
        snprintf(why, n, "an mlm.c checkpoint of version 2 (no token count); this trainer reads version %d",
                 CKPT_VERSION);
    else if (memcmp(h->magic, CKPT_MAGIC, 8) || h->version != CKPT_VERSION || h->header_bytes != sizeof *h)
        snprintf(why, n, "not an mlm.c checkpoint of version %d (magic %.8s)", CKPT_VERSION, CKPT_MAGIC);
    else if (h->body_bytes != (uint64_t)st.st_size - sizeof *h - 8)
        snprintf(why, n, "truncated or trailing bytes: %lld bytes, the header says %llu", (long long)st.st_size,
                 (unsigned long long)(sizeof *h + h->body_bytes + 8));
    else if (!(buf = (unsigned char*)malloc(CKPT_CHUNK)))
        snprintf(why, n, "out of host memory");
    else {
        uint32_t crc = crc32_update(0, h, sizeof *h), trailer[2];
        uint64_t left = h->body_bytes;
        ok = 1;
        while (ok && left) {
            size_t k = left < CKPT_CHUNK ? (size_t)left : CKPT_CHUNK;
            ok = read_all(fd, buf, k);
            crc = crc32_update(crc, buf, k);
            left -= k;
        }
        if (!ok || !read_all(fd, trailer, sizeof trailer))
            ok = 0, snprintf(why, n, "read error: %s", strerror(errno));
        else if (trailer[0] != crc || trailer[1] != 0)
            ok = 0, snprintf(why, n, "checksum mismatch (stored %08x, computed %08x): corrupted", trailer[0], crc);
    }
    free(buf);
    close(fd);
    return ok;
}

// ckpt_check_run: an intact checkpoint that does not belong to this run (other model, --seq, precision,
// or a step beyond --steps) is an error: the flags are wrong, and an older checkpoint would lose work.
static void ckpt_check_run(const char* path, const CkptHeader* h, const BertModel* m, int steps) {
    const char* why = NULL;
    char buf[256];
    if (memcmp(&h->cfg, &m->cfg, sizeof h->cfg) || h->numel != m->p.numel || h->T != m->T) {
        snprintf(buf, sizeof buf,
                 "saved for another model or --seq (%d layers, hidden %d, vocab %d, T %d; this run: %d, %d, %d, %d)",
                 h->cfg.layers, h->cfg.hidden, h->cfg.vocab_size, h->T, m->cfg.layers, m->cfg.hidden, m->cfg.vocab_size,
                 m->T);
        why = buf;
    } else if (h->x_bytes != (int32_t)sizeof(floatX) || h->body_bytes != ckpt_body_bytes(m)) {
        snprintf(buf, sizeof buf, "saved by a trainer with %d-byte weights; this one is %s", h->x_bytes, FLOATX_NAME);
        why = buf;
    } else if (h->step < 0 || h->step > steps) {
        snprintf(buf, sizeof buf, "its step %d is beyond --steps %d (raise --steps to train on)", h->step, steps);
        why = buf;
    }
    if (why) {
        fprintf(stderr, "trainer: --resume: %s: %s\n", path, why);
        exit(1);
    }
}

// ckpt_load: streams a verified checkpoint's body to the device (checking its CRC again on the way). Under
// ZeRO-1 a full array goes through the gradient buffer, and this rank keeps its shard of it.
static void ckpt_load(const char* path, BertModel* m, const GradReduce* gr, CkptHeader* h) {
    int fd = open(path, O_RDONLY);
    unsigned char* buf = (unsigned char*)malloc(CKPT_CHUNK);
    int ok = fd >= 0 && buf && read_all(fd, h, sizeof *h);
    uint32_t crc = crc32_update(0, h, sizeof *h), trailer[2] = {0, 1};
    void* dev[4];
    size_t bytes[4];
    for (int r = 0, k = ckpt_regions(m, dev, bytes); ok && r < k; r++) {
        char* dst = ckpt_sharded(gr, r) ? (char*)m->grad : (char*)dev[r];
        for (size_t off = 0; ok && off < bytes[r]; off += CKPT_CHUNK) {
            size_t n = bytes[r] - off < CKPT_CHUNK ? bytes[r] - off : CKPT_CHUNK;
            ok = read_all(fd, buf, n);
            crc = crc32_update(crc, buf, n);
            if (ok) CUDA_CHECK(cudaMemcpy(dst + off, buf, n, cudaMemcpyHostToDevice));
        }
        if (ok && ckpt_sharded(gr, r)) zero_scatter(gr, m->grad, (float*)dev[r], m->stream);
    }
    if (gr->zero) bert_zero_grad(m);
    ok = ok && read_all(fd, trailer, sizeof trailer) && trailer[0] == crc;
    free(buf);
    if (fd >= 0) close(fd);
    if (!ok) {
        fprintf(stderr, "trainer: %s changed while it was being read\n", path);
        exit(1);
    }
    m->step = h->step;
}

// resume_checkpoint: loads the newest intact checkpoint in ck->dir (checkpoint.bin, then checkpoint-STEP.bin
// from the highest STEP), saying which ones it skipped and why; restores the data position into train.
static void resume_checkpoint(Ckpts* ck, BertModel* m, const GradReduce* gr, DataLoader* train, int steps,
                              int verbose) {
    int cand[1024], n = 0;  // INT_MAX: checkpoint.bin; else the STEP of checkpoint-STEP.bin
    cand[n++] = INT_MAX;
    DIR* d = opendir(ck->dir);
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
        int s, len;
        if (sscanf(e->d_name, "checkpoint-%d.bin%n", &s, &len) == 1 && e->d_name[len] == 0 && s >= 0 && n < 1024)
            cand[n++] = s;
    }
    if (d) closedir(d);
    char skipped[4096] = "", path[4400];
    for (int tried = 0; tried < n; tried++) {
        int best = -1;  // the newest candidate not yet tried
        for (int i = 0; i < n; i++)
            if (cand[i] != INT_MIN && (best < 0 || cand[i] > cand[best])) best = i;
        if (cand[best] == INT_MAX)
            snprintf(path, sizeof path, "%s/checkpoint.bin", ck->dir);
        else
            snprintf(path, sizeof path, "%s/checkpoint-%d.bin", ck->dir, cand[best]);
        cand[best] = INT_MIN;
        CkptHeader h;
        char why[256];
        if (!ckpt_verify(path, &h, why, sizeof why)) {
            if (verbose) fprintf(stderr, "trainer: --resume: skipped %s: %s\n", path, why);
            size_t len = strlen(skipped);  // the list in the final error (paths shortened to their file names)
            const char* name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
            if (len < 3000)
                snprintf(skipped + len, sizeof skipped - len, "%s%.64s: %.200s", len ? "; " : "", name, why);
            continue;
        }
        ckpt_check_run(path, &h, m, steps);
        ckpt_load(path, m, gr, &h);
        if (dataloader_restore(train, &h.data)) {
            fprintf(stderr, "trainer: --resume: %s: %s\n", path, train->error);
            exit(1);
        }
        ck->step = h.step, ck->tokens = h.tokens;
        snprintf(ck->path, sizeof ck->path, "%s", path);
        if (verbose) {
            printf("resumed from %s at step %d\n", path, h.step);
            if (h.step == steps) printf("the checkpoint is at --steps %d: no step left, only the export\n", steps);
        }
        return;
    }
    fprintf(stderr, "trainer: --resume: no intact checkpoint in %s (%s)\n", ck->dir, skipped);
    exit(1);
}

// ----------------------------------------------------------------------------
// One micro-batch from the loader, as the model takes it.
typedef struct {
    int *seg_lo, *seg_hi;  // (B, T) device: the key range of each token
    int *pos, *labels;     // (M) device: the head's rows
    float* hits;           // (M) device: 1 where the head's top prediction is the label (validation)
    int pad_id, M;
    long long dropped;  // masked positions left out of the loss because a batch had more than M
} BatchMaker;

// batch_maker_alloc: the plan's maker_bytes, in one allocation; gives the 8 floats of loss sums in it.
static float* batch_maker_alloc(BatchMaker* bm, const Plan* plan, int pad_id) {
    memset(bm, 0, sizeof *bm);
    bm->pad_id = pad_id, bm->M = plan->M;
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

// all_ranks_sum: x (n floats, device) summed over all ranks into host (n floats), then x zeroed.
// Synchronizes the stream, with the watchdog (comm_wait); `what` names the collective.
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
// same batch. --val-batches N means micro-batches 0 .. N-1: rank r evaluates j = r, r + W, r + 2W, ...
// and writes micro-batch j's sums (loss x masked count, masked count, hits, samples) into slot j of a
// device array that is zero elsewhere; one all-reduce (a sum of one value and zeros: exact) gives every
// rank all N slots, added on the host in the order j = 0 .. N-1. So 1 or 64 GPUs give the same bits.
#define VAL_SEED 1337  // the validation masking seed, whatever --seed is: results comparable across runs

typedef struct {
    DataLoader loader;
    DataLoaderState start;  // the loader's position right after init: every evaluation restarts there
    int batches;            // --val-batches
    float* slots;           // device, 4 x batches: (loss sum, masked, hits) per micro-batch, then samples
    float* host;            // host, 4 x batches
} Validation;

typedef struct {
    double loss, accuracy;  // per masked token
    long long masked, samples;
} EvalResult;

// validation_init: the loader over pattern (B rows of T per micro-batch per rank) and the plan's val_bytes.
static void validation_init(Validation* v, const char* pattern, const Plan* plan, const Comm* comm, int vocab,
                            int batches, int verbose) {
    DataLoaderConfig c = dataloader_default_config(pattern, plan->B, plan->T);
    c.rank = comm->rank, c.world = comm->world, c.num_threads = 1, c.shuffle = 0, c.seed = VAL_SEED;
    c.vocab_size = vocab, c.verbose = verbose;
    if (dataloader_init(&v->loader, &c)) {
        fprintf(stderr, "trainer: %s\n", v->loader.error);  // names the --val shards
        exit(1);
    }
    v->start = dataloader_state(&v->loader);
    v->batches = batches;
    CUDA_CHECK(cudaMalloc((void**)&v->slots, plan->val_bytes));
    CUDA_CHECK(cudaMemset(v->slots, 0, plan->val_bytes));
    v->host = (float*)calloc(4 * (size_t)batches, sizeof(float));
    if (!v->host) {
        fprintf(stderr, "trainer: out of host memory for --val-batches %d\n", batches);
        exit(1);
    }
}
static void validation_free(Validation* v) {
    dataloader_free(&v->loader);
    cudaFree(v->slots);
    free(v->host);
}

// evaluate: the model on micro-batches 0 .. batches-1 of the validation stream (forward only), all ranks.
static EvalResult evaluate(BertModel* m, Validation* v, BatchMaker* bm, Comm* comm) {
    if (dataloader_restore(&v->loader, &v->start)) {  // the same batches every time
        fprintf(stderr, "trainer: validation: %s\n", v->loader.error);
        exit(1);
    }
    int n = v->batches;
    float* samples = v->host + 3 * (size_t)n;  // this rank's sample counts, zero in the other ranks' slots
    memset(samples, 0, n * sizeof(float));
    for (int j = comm->rank; j < n; j += comm->world) {
        Batch b;
        if (dataloader_next(&v->loader, m->stream, &b)) {
            fprintf(stderr, "trainer: validation: %s\n", v->loader.error);
            exit(1);
        }
        int n_masked;
        BertBatch bt = make_batch(bm, &b, m->B, m->T, m->stream, &n_masked);
        bert_forward(m, &bt, 0.f);  // the masked rows' logits stay in ACT_X(m, logits)
        float* slot = v->slots + 3 * (size_t)j;
        add_loss(slot, m, n_masked);  // slot[0] += mean loss x n_masked, slot[1] += n_masked
        launch(argmax_hits, dim3(bm->M), dim3(256), 0, m->stream, bm->hits, (const floatX*)ACT_X(m, logits),
               (const int*)bm->labels, bm->M, m->cfg.vocab_size, m->act.Vp);
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
    return r;
}

// A signal asks the run to stop cleanly: Slurm sends SIGTERM before it kills a job (scancel,
// preemption), and `sbatch --signal=USR1@300` sends SIGUSR1 300 s before the time limit. The step
// in progress finishes, all ranks agree on it through the step's AllReduce, and the run saves a
// checkpoint and exits 0; --resume continues. The handlers are installed first thing in main: a signal
// before step 1 (during shard checks, loading, the NCCL rendezvous: minutes on a big job) has nothing to
// save, and ends the process at once with exit code 128 + the signal's number, saying so.
static volatile sig_atomic_t stop_requested = 0, training = 0;
static void request_stop(int sig) {
    if (!training) {
        static const char term[] =
            "trainer: SIGTERM before step 1: stopping; no checkpoint or export was written (exit code 143)\n";
        static const char usr1[] =
            "trainer: SIGUSR1 before step 1: stopping; no checkpoint or export was written (exit code 138)\n";
        ssize_t w = sig == SIGTERM ? write(2, term, sizeof term - 1) : write(2, usr1, sizeof usr1 - 1);
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
    sigaction(SIGUSR1, &sa, NULL);
}

// make_out_dir: --out and its missing parents created, and a file written and removed there, so a
// directory the run could not write fails now, not at the first checkpoint. Gives 1, or 0 after an error.
static int make_out_dir(const char* dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p || !*p) {
        fprintf(stderr, "trainer: --out '%s': expected a directory path (at most 4095 characters)\n", dir);
        return 0;
    }
    for (char* s = p + 1;; s++) {  // mkdir -p
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "trainer: --out %s: cannot create the directory %s: %s\n", dir, p, strerror(errno));
            return 0;
        }
        *s = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "trainer: --out %s: exists and is not a directory\n", dir);
        return 0;
    }
    snprintf(p, sizeof p, "%s/.write_test.%d", dir, (int)getpid());
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write_all(fd, "ok\n", 3) && fsync(fd) == 0, why = errno;
    if (fd >= 0) close(fd), unlink(p);
    if (!ok) fprintf(stderr, "trainer: --out %s: cannot write there: %s\n", dir, strerror(why));
    return ok;
}

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

// device_peak_tflops: the device's dense bf16 tensor-core peak in TFLOP/s, the denominator of MFU, found
// by the start of its name (NVIDIA's datasheets; dense is half the "with sparsity" figure). 0: unknown.
static double device_peak_tflops(const char* name) {
    static const struct {
        const char* prefix;
        double tflops;
    } peaks[] = {
        {"NVIDIA H100 NVL", 835}, {"NVIDIA H100 PCIe", 756}, {"NVIDIA H100", 989},  // H100 SXM: "NVIDIA H100 80GB HBM3"
        {"NVIDIA H200 NVL", 835}, {"NVIDIA H200", 989},      {"NVIDIA GH200", 989}, {"NVIDIA A100", 312},
    };
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
        if (!strncmp(name, peaks[i].prefix, strlen(peaks[i].prefix))) return peaks[i].tflops;
    return 0;
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
// sync. With model->timer set (--bench), each phase is marked on the stream.
typedef struct {
    float loss, norm;      // the mean loss per masked token over all ranks; the gradient norm
    long long tokens;      // real tokens this rank trained on
    long long all_tokens;  // real tokens all ranks trained on
    double wait_ms;        // host time spent waiting for the loader threads
    int stop;              // some rank was asked to stop (a signal): every rank stops after this step
    int ckpt;              // rank 0 asked for a checkpoint after this step (--ckpt-minutes): every rank knows
    int skipped;           // the loss or the gradient norm was not finite: no update was made
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

// zero_adamw_step: bert_adamw_step on this rank's pieces of every bucket (ZeRO-1).
static void zero_adamw_step(BertModel* m, const GradReduce* gr, const Options* o, float lr) {
    m->step++;
    for (int i = 0; i < gr->n; i++) {
        size_t off, n;
        grad_reduce_piece(gr, &gr->b[i], gr->comm->rank, &off, &n);
        if (n) bert_adamw_range(m, off, n, gr->b[i].state_off, lr, o->beta1, o->beta2, o->eps, o->wd, o->clip);
    }
}

// scratch (device floats, summed over ranks once per step): [0] loss sum, [1] masked count, [2] stop
// requests, [3] ZeRO-1: the gradients' sum of squares, [4] checkpoint requests, [5..6] real tokens / 4096
// and % 4096 (validation has its own sums: Validation).
enum { S_LOSS, S_COUNT, S_STOP, S_SUMSQ, S_CKPT, S_TOK_HI, S_TOK_LO, S_STEP_N };

static StepResult train_step(BertModel* m, DataLoader* train, BatchMaker* bm, GradReduce* gr, float* scratch,
                             const Options* o, float lr, int want_ckpt) {
    StepResult r;
    memset(&r, 0, sizeof r);
    Comm* comm = gr->comm;
    comm->step = m->step + 1;  // for the watchdog's messages
    for (int micro = 0; micro < o->grad_accum; micro++) {
        bert_phase(m, PHASE_DATA);
        Batch b;
        if (dataloader_next(train, m->stream, &b)) {
            fprintf(stderr, "trainer: %s\n", train->error);
            exit(1);
        }
        r.wait_ms += b.wait_ms;
        r.tokens += b.num_real_tokens;
        int n_masked;
        bert_phase(m, PHASE_OTHER);
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
    }
    // The buckets' reductions wait on the communication stream for the events of that backward, which the GPU
    // is still running: they overlap it. The phase is what is left of them when it ends (on the CPU build,
    // where collectives run when called, all of it).
    bert_phase(m, PHASE_ALLREDUCE);
    grad_reduce_launch(gr, m->grad);
    grad_reduce_wait(gr, m->stream);
    static const float inf = INFINITY;  // the test hooks' poison
    if (test_hook_on(o->inf_grad, m->step + 1))
        CUDA_CHECK(cudaMemcpyAsync(m->grad, &inf, sizeof inf, cudaMemcpyHostToDevice, m->stream));
    if (test_hook_on(o->inf_loss, m->step + 1))
        CUDA_CHECK(cudaMemcpyAsync(scratch, &inf, sizeof inf, cudaMemcpyHostToDevice, m->stream));
    bert_phase(m, PHASE_OPTIM);
    if (gr->zero)
        zero_grad_sumsq(gr, m->grad, m->norm_partial, scratch + S_SUMSQ, m->stream);
    else
        bert_grad_norm(m);
    // The one host sync of the step, before the update: over all ranks the loss sum, masked count, stop and
    // checkpoint requests, and under ZeRO-1 the gradients' sum of squares; else the norm of the averaged
    // gradient, the same on every rank. A loss or norm that is not finite skips the update: the weights and
    // AdamW moments stay as they were (the step still counts: its batches are consumed and the schedule moves on).
    // This rank's real tokens go in two parts (/ 4096, % 4096), so that each float sum stays an exact integer.
    float stop = stop_requested ? 1.f : 0.f, ckpt = want_ckpt ? 1.f : 0.f, h[S_STEP_N];
    float tok[2] = {(float)(r.tokens / 4096), (float)(r.tokens % 4096)};
    if (!gr->zero) CUDA_CHECK(cudaMemcpyAsync(&r.norm, m->norm, sizeof r.norm, cudaMemcpyDeviceToHost, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_STOP, &stop, sizeof stop, cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_CKPT, &ckpt, sizeof ckpt, cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_TOK_HI, tok, sizeof tok, cudaMemcpyHostToDevice, m->stream));
    all_ranks_sum(comm, scratch, S_STEP_N, h, m->stream, "step loss AllReduce (the step's host sync)");
    if (gr->zero) {
        r.norm = sqrtf(h[S_SUMSQ]);
        CUDA_CHECK(cudaMemcpyAsync(m->norm, &r.norm, sizeof r.norm, cudaMemcpyHostToDevice, m->stream));
    }
    r.loss = h[S_COUNT] > 0.f ? h[S_LOSS] / h[S_COUNT] : 0.f;
    r.stop = h[S_STOP] > 0.f;
    r.ckpt = h[S_CKPT] > 0.f;
    r.all_tokens = 4096 * (long long)h[S_TOK_HI] + (long long)h[S_TOK_LO];
    r.skipped = !isfinite(r.loss) || !isfinite(r.norm);
    if (r.skipped) {
        m->step++;
    } else if (gr->zero) {
        zero_adamw_step(m, gr, o, lr);
        zero_allgather(gr, m->w, m->stream);
    } else if (o->lamb) {
        bert_lamb_step(m, lr, o->beta1, o->beta2, o->eps, o->wd, o->clip);
    } else {
        bert_adamw_step(m, lr, o->beta1, o->beta2, o->eps, o->wd, o->clip);
    }
    bert_zero_grad(m);
    bert_phase(m, PHASE_END);
    return r;
}

// ----------------------------------------------------------------------------
// ./trainer --bench: the training step above, timed on synthetic data. For each preset: the planner's
// largest micro-batch; a synthetic shard (random ordinary tokens in [CLS] ... [SEP] samples of realistic
// lengths) read through the real loader, so batches are packed and masked exactly as in training;
// warmup steps; timed steps with nothing added (tokens/s, MFU); the same number of steps again with a
// CUDA event at each phase boundary (the time per phase). One table per preset, and one line
// "bench-result key=value ..." for tools/bench_vs_peer.sh.

// bench_write_shard: writes DIR/bench_00000.bin with at least `tokens` tokens. Documents are
// log-normal in length (median T/4 tokens, sigma 1: mostly short, a long tail), split into samples
// of at most T tokens, [CLS] piece [SEP], as tools/prepare.py does. Ids: pad 0, unk 1, cls 2, sep 3,
// mask 4, then ordinary tokens. Gives 0, or -1 with err set.
static int bench_write_shard(const char* dir, int vocab, int T, size_t tokens, uint64_t seed, char* err) {
    if (vocab <= SHARD_NUM_SPECIAL)
        return data_err(err, "--bench: vocabulary %d has no ordinary tokens (expected > %d)", vocab, SHARD_NUM_SPECIAL);
    uint32_t* tok = (uint32_t*)malloc((tokens + (size_t)T) * sizeof(uint32_t));
    size_t cap = tokens / 3 + 2, n = 0, nt = 0;  // every sample has at least 3 tokens
    uint64_t* off = (uint64_t*)malloc((cap + 1) * sizeof(uint64_t));
    uint64_t s = seed ^ 0xBE4C4ull;
    off[0] = 0;
    while (nt < tokens) {
        double len = (T / 4.0) * exp(bert_normal(&s));
        int doc = len < 1 ? 1 : len > 64.0 * T ? 64 * T : (int)len;
        for (int at = 0; at < doc && nt < tokens; at += T - 2) {
            int piece = doc - at < T - 2 ? doc - at : T - 2;
            tok[nt++] = 2;
            for (int j = 0; j < piece; j++)
                tok[nt++] = SHARD_NUM_SPECIAL + rng_below(rng_next(&s), (uint32_t)(vocab - SHARD_NUM_SPECIAL));
            tok[nt++] = 3;
            off[++n] = nt;
        }
    }
    ShardHeader h;
    memset(&h, 0, sizeof h);
    h.vocab_size = (uint32_t)vocab, h.token_bytes = vocab <= 65536 ? 2 : 4, h.max_len = (uint32_t)T;
    h.pad_id = 0, h.unk_id = 1, h.cls_id = 2, h.sep_id = 3, h.mask_id = 4;
    h.num_samples = n, h.num_tokens = nt;
    char path[4200];
    snprintf(path, sizeof path, "%s/bench_00000.bin", dir);
    int rc = shard_write(path, &h, tok, off, err);
    free(tok);
    free(off);
    return rc;
}

typedef struct {
    int B, max_B;
    double tokens_per_s, mfu;  // mfu < 0: unknown device peak
    double step_ms, phase_ms[PHASE_COUNT], phased_step_ms, real_fraction;
} BenchResult;

// bench_preset: runs the benchmark for one preset; gives 0, or 1 after printing why not.
static int bench_run(const Options* o, const char* preset, GradReduce* gr, const cudaDeviceProp* prop,
                     double peak_tflops, BenchResult* res);
static int bench_preset(const Options* o, const char* preset, Comm* comm, const cudaDeviceProp* prop,
                        double peak_tflops, BenchResult* res) {
    BertConfig cfg;
    bert_preset(preset, &cfg);  // run_bench checked the name
    GradReduce gr;
    grad_reduce_setup(&gr, &cfg, comm, o);
    int rc = bench_run(o, preset, &gr, prop, peak_tflops, res);
    grad_reduce_free(&gr);
    return rc;
}
// bench_run: bench_preset with the gradient buckets made.
static int bench_run(const Options* o, const char* preset, GradReduce* gr, const cudaDeviceProp* prop,
                     double peak_tflops, BenchResult* res) {
    Comm* comm = gr->comm;
    int main_rank = comm->rank == 0, T = o->T;
    BertConfig cfg;
    bert_preset(preset, &cfg);  // run_bench checked the name
    if (T > cfg.max_position) {
        fprintf(stderr, "trainer: --bench: --seq %d is longer than %s's %d positions\n", T, preset, cfg.max_position);
        return 1;
    }
    size_t free_bytes, total_bytes;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    Plan largest = choose_batch(&cfg, T, 1, gr, free_bytes, total_bytes);
    if (largest.total > free_bytes) largest.B = 0;  // not even B = 1 fits
    Plan plan = o->B ? make_plan(&cfg, o->B, T, 1, gr) : largest;
    if (plan.B < 1 || plan.total > free_bytes) {
        fprintf(stderr, "trainer: --bench %s: needs %.3f GiB at B=%d, T=%d but %.3f GiB are free\n", preset,
                plan.total / (double)(1 << 30), plan.B, T, free_bytes / (double)(1 << 30));
        return 1;
    }
    int B = plan.B;
    res->B = B, res->max_B = largest.B;

    // Synthetic data for every step, 10% more than the rows needed (packing leaves a few percent
    // empty), so that no epoch ends inside the benchmark.
    char dir[4096], err[DATA_ERR_LEN] = "";
    const char* tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/mlm_bench_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "trainer: --bench: cannot create a temporary directory %s: %s\n", dir, strerror(errno));
        return 1;
    }
    size_t rows = (size_t)(o->bench_warmup + 2 * o->bench_steps) * o->grad_accum * comm->world * B;
    size_t tokens = (size_t)(1.1 * rows * T) + 64 * (size_t)T;
    char pattern[4200], path[4200];
    snprintf(pattern, sizeof pattern, "%s/bench_*.bin", dir);
    snprintf(path, sizeof path, "%s/bench_00000.bin", dir);
    DataLoaderConfig dcfg = dataloader_default_config(pattern, B, T);
    dcfg.rank = comm->rank, dcfg.world = comm->world, dcfg.num_threads = o->loader_threads;
    dcfg.ring_slots = o->ring_slots, dcfg.seed = (uint64_t)o->seed, dcfg.vocab_size = cfg.vocab_size;
    dcfg.verbose = main_rank;
    DataLoader train;
    int rc =
        bench_write_shard(dir, cfg.vocab_size, T, tokens, (uint64_t)o->seed, err) ? -1 : dataloader_init(&train, &dcfg);
    if (rc) fprintf(stderr, "trainer: --bench: %s\n", err[0] ? err : train.error);
    unlink(path);  // the loader keeps its mapping: nothing is left on disk
    rmdir(dir);
    if (rc) return 1;

    // The model and the batch buffers, as in training.
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    BertModel model;
    if (!bert_alloc_sharded(&model, &cfg, B, T, plan.M, stream, gr->zero ? gr->state_numel : 0, gr->slack)) return 1;
    grad_reduce_start(gr);
    BatchMaker bm;
    float* scratch = batch_maker_alloc(&bm, &plan, 0);
    float* w = (float*)malloc(model.p.numel * sizeof(float));
    bert_init_host(&model.p, w, (uint64_t)o->seed);
    model_set_params(&model, gr, w);
    free(w);
    bert_zero_grad(&model);

    for (int i = 0; i < o->bench_warmup; i++) train_step(&model, &train, &bm, gr, scratch, o, o->lr, 0);
    long long tokens_done = 0;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double t0 = now_s();
    for (int i = 0; i < o->bench_steps; i++)
        tokens_done += train_step(&model, &train, &bm, gr, scratch, o, o->lr, 0).tokens;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double dt = now_s() - t0;
    res->step_ms = 1e3 * dt / o->bench_steps;
    res->tokens_per_s = comm->world * tokens_done / dt;
    res->real_fraction = (double)tokens_done / ((double)o->bench_steps * o->grad_accum * B * T);
    double flops_token = bert_flops_per_token(&cfg, T, 0.15).model;
    res->mfu = peak_tflops > 0 ? res->tokens_per_s / comm->world * flops_token / (peak_tflops * 1e12) : -1;

    // The same steps again, each phase between two events.
    PhaseTimer timer;
    phase_timer_init(&timer, o->grad_accum * (32 + 32 * cfg.layers) + 16);
    model.timer = &timer;
    int lost = 0;
    t0 = now_s();
    for (int i = 0; i < o->bench_steps; i++) {
        train_step(&model, &train, &bm, gr, scratch, o, o->lr, 0);
        lost |= !phase_timer_collect(&timer);  // waits for the step's last mark
    }
    res->phased_step_ms = 1e3 * (now_s() - t0) / o->bench_steps;
    for (int p = 0; p < PHASE_COUNT; p++) res->phase_ms[p] = timer.ms[p] / o->bench_steps;
    model.timer = NULL;
    phase_timer_free(&timer);
    if (lost) {
        fprintf(stderr, "trainer: --bench: more phase marks per step than events (a bug in the event count)\n");
        return 1;
    }

    if (main_rank) {
        double sum = 0;
        for (int p = 0; p < PHASE_END; p++) sum += res->phase_ms[p];
        char mfu[64];
        mfu_text(mfu, sizeof mfu, res->tokens_per_s / comm->world * flops_token, peak_tflops);
        printf(
            "bench %s: T=%d, B=%d (the planner's largest: %d), %d process(es) x %d micro-batch(es) per step, %s, "
            "%d + %d steps\n",
            preset, T, B, largest.B, comm->world, o->grad_accum, FLOATX_NAME, o->bench_warmup, o->bench_steps);
        printf("  %-34s %10s %7s\n", "phase (CUDA events)", "ms/step", "share");
        for (int p = 0; p < PHASE_END; p++)
            printf("  %-34s %10.3f %6.1f%%\n", phase_name(p), res->phase_ms[p],
                   sum > 0 ? 100 * res->phase_ms[p] / sum : 0.0);
        printf("  %-34s %10.3f %6.1f%%\n", "sum of phases", sum, 100.0);
        printf("  %-34s %10.3f\n", "step with phase events (wall clock)", res->phased_step_ms);
        printf("  %-34s %10.3f\n", "step (wall clock)", res->step_ms);
        printf("  %-34s %10.0f  (real tokens: %.1f%% of positions)\n", "tokens/s", res->tokens_per_s,
               100 * res->real_fraction);
        printf("  %-34s %s\n", "MFU", peak_tflops > 0 ? mfu : "n/a: unknown dense bf16 peak for this device");
        printf("  %-34s %10d  (plan %.3f GiB of %.3f GiB free)\n", "largest micro-batch (planner)", largest.B,
               largest.total / (double)(1 << 30), free_bytes / (double)(1 << 30));
        printf("bench-result preset=%s T=%d batch=%d max_batch=%d world=%d tokens_per_s=%.0f step_ms=%.3f mfu=", preset,
               T, B, largest.B, comm->world, res->tokens_per_s, res->step_ms);
        if (res->mfu >= 0)
            printf("%.4f", res->mfu);
        else
            printf("na");
        printf(" device=\"%s\"\n", prop->name);
        fflush(stdout);
    }
    dataloader_free(&train);
    cudaFree(bm.seg_lo);
    bert_free(&model);
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

// run_bench: --bench over the comma-separated presets of --preset.
static int run_bench(const Options* o, Comm* comm, const cudaDeviceProp* prop, double started) {
    int file = !strcmp(o->bootstrap, "file");
    if (comm->world > 1 && file && !o->out) {
        fprintf(stderr,
                "trainer: --bench with %d processes and --bootstrap file needs --out DIR on a shared file system "
                "(for the NCCL id)\n",
                comm->world);
        return 1;
    }
    if (comm->world > 1 && file && mkdir(o->out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "trainer: --out %s: cannot create the directory: %s\n", o->out, strerror(errno));
        return 1;
    }
    char list[1024];
    snprintf(list, sizeof list, "%s", o->preset);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        BertConfig cfg;
        if (!bert_preset(name, &cfg)) {  // every name is checked before the first one runs
            fprintf(stderr, "trainer: --bench --preset %s: unknown preset %s; one of:", o->preset, name);
            for (int i = 0; i < BERT_NUM_PRESETS; i++) fprintf(stderr, " %s", bert_presets[i].name);
            fprintf(stderr, "\n");
            return 1;
        }
    }
    double peak = device_peak_tflops(prop->name);
    if (comm->rank == 0) {
        if (peak > 0)
            printf("bench: %s, dense bf16 peak %.0f TFLOP/s\n", prop->name, peak);
        else
            printf("bench: %s: unknown dense bf16 peak, so no MFU\n", prop->name);
    }
    CommBootstrap boot = {o->bootstrap, o->out, o->out, started};
    comm_init(comm, &boot);
    snprintf(list, sizeof list, "%s", o->preset);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        BenchResult r;
        memset(&r, 0, sizeof r);
        if (bench_preset(o, name, comm, prop, peak, &r)) return 1;
    }
    comm_free(comm);
    return 0;
}

// ----------------------------------------------------------------------------

// ----------------------------------------------------------------------------
// Progress and DIR/metrics.jsonl. Rank 0 appends one JSON object per line, flushed after each line;
// a number that is not finite is written as null. Records:
//   {"kind":"train","step":S,"tokens":N,"epoch":E,"elapsed_s":X,"loss":X,"lr":X,"grad_norm":X,
//    "tokens_per_s":X,"mfu":X|null,"data_wait_ms":X}                            every logged step
//   {"kind":"val","step":S,"tokens":N,"elapsed_s":X,"val_loss":X,"val_accuracy":X,"val_masked":M}
//   {"kind":"eval","step":S,"source":"PATH","val_loss":X,"val_accuracy":X,"val_masked":M}   --eval --out
// tokens: real tokens trained on by all ranks so far (the checkpoint keeps the count); epoch: tokens /
// the tokens in the training shards; elapsed_s: wall clock since the run started, continued across
// resumes; mfu: a fraction, null when the device's peak is unknown (the CPU).
typedef struct {
    FILE* f;                    // DIR/metrics.jsonl (rank 0), or NULL
    double t_start, t_loop;     // this process's start, and its training loop's
    double elapsed0;            // elapsed_s of the runs this one resumes
    int first_step, last_step;  // this process's first step and last one
    long long tokens;           // real tokens trained on by all ranks
    double epoch_tokens;        // real tokens in the training shards: one epoch
} RunLog;

static void json_num(FILE* f, const char* key, double x) {
    if (isfinite(x))
        fprintf(f, ",\"%s\":%.9g", key, x);
    else
        fprintf(f, ",\"%s\":null", key);
}
static void json_str(FILE* f, const char* key, const char* v) {  // a JSON string, escaped
    fprintf(f, ",\"%s\":\"", key);
    for (const unsigned char* c = (const unsigned char*)v; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}
static void json_end(FILE* f) {
    fputs("}\n", f);
    fflush(f);
}

// metrics_open: opens DIR/metrics.jsonl for appending. With rewrite, first rewrites the file (a temporary
// file, flushed, renamed) without the records of steps after keep_step and without a partial last line:
// a resumed run (keep_step = its checkpoint's step) never repeats a step, and a new run (-1) starts a new
// log. elapsed0 gets the last kept training record's elapsed_s. Gives NULL, with a message, on failure.
static FILE* metrics_open(const char* dir, int rewrite, int keep_step, double* elapsed0) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    *elapsed0 = 0;
    FILE* old = rewrite ? fopen(path, "r") : NULL;
    if (old) {
        FILE* out = fopen(tmp, "w");
        int ok = out != NULL;
        char* line = NULL;
        size_t cap = 0;
        ssize_t len;
        while (ok && (len = getline(&line, &cap, old)) > 0) {
            const char *st = strstr(line, "\"step\":"), *el = strstr(line, "\"elapsed_s\":");
            if (line[len - 1] != '\n' || !st || atoll(st + 7) > keep_step) continue;
            if (el && strstr(line, "\"kind\":\"train\"")) *elapsed0 = atof(el + 12);
            ok = fwrite(line, 1, (size_t)len, out) == (size_t)len;
        }
        free(line);
        fclose(old);
        ok = ok && fflush(out) == 0 && fsync(fileno(out)) == 0;
        if (out && fclose(out) != 0) ok = 0;
        if (!ok || rename(tmp, path) != 0) {
            fprintf(stderr, "trainer: cannot rewrite %s (through %s): %s\n", path, tmp, strerror(errno));
            unlink(tmp);
            return NULL;
        }
    }
    FILE* f = fopen(path, "a");
    if (!f) fprintf(stderr, "trainer: cannot append to %s: %s\n", path, strerror(errno));
    return f;
}

// fmt_duration: "42s", "12m05s", "3h07m"
static const char* fmt_duration(char* buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e8)
        snprintf(buf, n, "?");
    else if (s < 60)
        snprintf(buf, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
    return buf;
}

// log_step: the step's line (every --log-every steps, the first and the last) and its metrics.jsonl record,
// a note when masked positions were left out, and the warning for a skipped step (bad_steps: skipped ones in
// a row). Rank 0. The ETA is to this run's last step, at this run's mean time per step so far.
static void log_step(const Options* o, const StepResult* r, int step, int bad_steps, double dt, int world,
                     double flops_token, double peak_tflops, BatchMaker* bm, const RunLog* lg) {
    if (r->skipped)
        fprintf(stderr, "trainer: step %d: loss %g, gradient norm %g: not finite; update skipped (%d in a row)\n", step,
                r->loss, r->norm, bad_steps);
    if (step % o->log_every == 0 || step == 1 || step == o->steps) {
        double tps = r->all_tokens / dt, now = now_s(), elapsed = lg->elapsed0 + now - lg->t_start;
        double eta = (now - lg->t_loop) / (step - lg->first_step + 1) * (lg->last_step - step);
        double epoch = lg->epoch_tokens > 0 ? lg->tokens / lg->epoch_tokens : 0;
        char mfu[64], el[32], et[32];
        mfu_text(mfu, sizeof mfu, tps / world * flops_token, peak_tflops);
        printf(
            "step %6d/%d | loss %.4f | lr %.3e | norm %.3f | %.0f ms | %.0f tok/s | %s | data wait %.1f ms | "
            "epoch %.3f | elapsed %s | ETA %s\n",
            step, o->steps, r->loss, lr_at(o, step), r->norm, dt * 1e3, tps, mfu, r->wait_ms, epoch,
            fmt_duration(el, sizeof el, elapsed), fmt_duration(et, sizeof et, eta));
        fflush(stdout);
        if (lg->f) {
            fprintf(lg->f, "{\"kind\":\"train\",\"step\":%d,\"tokens\":%lld", step, lg->tokens);
            json_num(lg->f, "epoch", epoch);
            json_num(lg->f, "elapsed_s", elapsed);
            json_num(lg->f, "loss", r->loss);
            json_num(lg->f, "lr", lr_at(o, step));
            json_num(lg->f, "grad_norm", r->norm);
            json_num(lg->f, "tokens_per_s", tps);
            json_num(lg->f, "mfu", peak_tflops > 0 ? tps / world * flops_token / (peak_tflops * 1e12) : NAN);
            json_num(lg->f, "data_wait_ms", r->wait_ms);
            json_end(lg->f);
        }
    }
    if (bm->dropped) {
        printf("note: %lld masked positions above the cap M=%d were left out of the loss\n", bm->dropped, bm->M);
        bm->dropped = 0;
    }
}
// log_validation: the validation line and its metrics.jsonl record. Rank 0.
static void log_validation(const RunLog* lg, int step, int batches, const EvalResult* e) {
    printf("step %6d | val loss %.4f | accuracy %.4f | %lld masked tokens in %lld sequences (%d micro-batches)\n", step,
           e->loss, e->accuracy, e->masked, e->samples, batches);
    fflush(stdout);
    if (!lg->f) return;
    fprintf(lg->f, "{\"kind\":\"val\",\"step\":%d,\"tokens\":%lld", step, lg->tokens);
    json_num(lg->f, "elapsed_s", lg->elapsed0 + now_s() - lg->t_start);
    json_num(lg->f, "val_loss", e->loss);
    json_num(lg->f, "val_accuracy", e->accuracy);
    fprintf(lg->f, ",\"val_masked\":%lld", e->masked);
    json_end(lg->f);
}
// diverged: --max-bad-steps steps in a row were skipped: says so, and what is on disk. Gives exit code 2.
static int diverged(const Options* o, const Ckpts* ck, int bad_steps, int main_rank) {
    char what[4600];
    if (main_rank)
        fprintf(stderr, "trainer: diverged: %d steps in a row (--max-bad-steps %d); stopping, exit code 2: %s\n",
                bad_steps, o->max_bad_steps, ckpt_whats_on_disk(ck, what, sizeof what));
    return 2;
}
// print_weights_crc: "rank R weights: floatX crc32 X, fp32 master crc32 Y" for the weights this rank holds
// (master: the host copy of the full fp32 master weights).
static void print_weights_crc(BertModel* m, const float* master, int rank) {
    size_t n = m->p.numel;
    void* x = malloc(n * sizeof(floatX));
    if (!x) return;
    CUDA_CHECK(cudaMemcpy(x, m->w, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    printf("rank %d weights: floatX crc32 %08x, fp32 master crc32 %08x\n", rank, crc32_update(0, x, n * sizeof(floatX)),
           crc32_update(0, master, n * sizeof(float)));
    fflush(stdout);
    free(x);
}

// checkpoint_now: saves the model and the loader's position after `step`. 0 (with the reason) on failure.
// Every rank calls it (under ZeRO-1 they gather the shards); rank 0 writes.
static int checkpoint_now(Ckpts* ck, BertModel* m, const GradReduce* gr, DataLoader* train, int step) {
    DataLoaderState pos = dataloader_state(train);
    char why[4600], what[4600];
    if (save_checkpoint(ck, m, gr, &pos, why, sizeof why)) return 1;
    fprintf(stderr, "trainer: step %d: %s; stopping: %s\n", step, why, ckpt_whats_on_disk(ck, what, sizeof what));
    return 0;
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
                e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
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
// compares them (comm_agree). A value that differs stops every rank, each saying what differs. The
// automatic micro-batch is the smallest any rank can hold. Gives B.
static int agree(Comm* comm, const Options* o, const BertConfig* cfg, int B, uint64_t data_fp, uint64_t val_fp) {
    double flags[] = {(double)o->warmup,
                      o->lr,
                      o->wd,
                      o->beta1,
                      o->beta2,
                      o->eps,
                      o->clip,
                      (double)o->seed,
                      (double)o->resume,
                      (double)o->run_steps,
                      (double)o->val_every,
                      (double)o->val_batches,
                      (double)o->max_bad_steps,
                      (double)sizeof(floatX),
                      (double)o->zero,
                      (double)o->bucket_mb,
                      (double)o->grad_reduce_bf16,
                      (double)o->tokens,
                      o->epochs,
                      (double)o->lamb};
    const uint64_t h0 = 0xcbf29ce484222325ull;
    // The first four are numbers (the message shows them); the next four fingerprints; the last the micro-batch.
    CommValue v[] = {
        {"--seq", o->T, 0, 0},
        {"--batch (0: the largest that fits)", o->B, 0, 0},
        {"--grad-accum", o->grad_accum, 0, 0},
        {"--steps", o->steps, 0, 0},
        {"model configuration (--preset or --init-from, the shards' vocabulary)",
         (int64_t)fingerprint(h0, cfg, sizeof *cfg), 0, 0},
        {"other training flags (--lr --warmup --wd --beta1 --beta2 --eps --clip --seed --resume --run-steps "
         "--val-every "
         "--val-batches --max-bad-steps --zero --bucket-mb --grad-reduce --tokens --epochs --optimizer)",
         (int64_t)fingerprint(h0, flags, sizeof flags), 0, 0},
        {"training data (the --data shards: names in order, sizes, checksums)", (int64_t)data_fp, 0, 0},
        {"validation data (the --val shards)", (int64_t)val_fp, 0, 0},
        {"micro-batch", B, 0, 0},
    };
    int n = (int)(sizeof v / sizeof v[0]), bad = 0;
    comm_agree(comm, v, n);
    for (int i = 0; i < n - 1; i++) {
        if (v[i].min == v[i].max) continue;
        if (i < 4)
            fprintf(stderr,
                    "trainer: rank %d of %d: the ranks disagree on %s: %lld here, from %lld to %lld over the ranks\n",
                    comm->rank, comm->world, v[i].name, (long long)v[i].value, (long long)v[i].min,
                    (long long)v[i].max);
        else
            fprintf(stderr,
                    "trainer: rank %d of %d: the ranks disagree on the %s: fingerprint %016llx here, from %016llx to "
                    "%016llx over the ranks: every rank must run the same command on the same files\n",
                    comm->rank, comm->world, v[i].name, (unsigned long long)v[i].value, (unsigned long long)v[i].min,
                    (unsigned long long)v[i].max);
        bad = 1;
    }
    if (bad) exit(1);  // every rank sees the same min and max, so every rank stops here
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

// predict_scaling: --plan-only prints the scaling table (scaling.h) for --nodes x --gpus-per-node;
// --grad-accum auto becomes the accumulation it predicts for this job's layout (SLURM_NNODES nodes, the ranks
// spread over them) on `device`. 0 (with the reason) when auto cannot be resolved.
static int predict_scaling(Options* o, const BertConfig* cfg, const Plan* plan, const Comm* comm, const char* device) {
    const char* env_nodes = getenv("SLURM_NNODES");
    int nodes = o->nodes ? o->nodes : o->plan_only ? 1 : env_nodes && atoi(env_nodes) > 0 ? atoi(env_nodes) : 1;
    int world = o->plan_only ? nodes * (o->gpus_per_node ? o->gpus_per_node : 1) : comm->world;
    ScalingCluster c =
        scaling_cluster_default(nodes, o->gpus_per_node ? o->gpus_per_node : (world + nodes - 1) / nodes);
    if (o->net_gbps > 0) c.net_gbps = o->net_gbps;
    if (o->nvlink_gbps > 0) c.nvlink_gbps = o->nvlink_gbps;
    BertParams params;
    bert_params_build(&params, cfg);
    ScalingWork w;
    w.flops_per_token = bert_flops_per_token(cfg, plan->T, 0.15).model;
    w.peak_tflops = device_peak_tflops(device);
    w.mfu = o->mfu > 0 ? o->mfu : SCALING_MFU;
    w.tokens_per_micro = (double)plan->B * plan->T;
    w.grad_bytes =
        (double)bert_param_count(&params) * (o->grad_reduce_bf16 ? 2 : 4);  // an all-reduce of every gradient
    // The tail, reduced after the backward ends: the embeddings (the word embeddings' gradient is final only
    // after the embedding backward, the backward's last kernel) and every vector (biases, LayerNorm).
    w.tail_bytes = 0;
    for (int i = 0; i < params.n; i++)
        if (params.t[i].rank == 1 || !strncmp(params.t[i].name, "bert.embeddings.", 16))
            w.tail_bytes += params.t[i].numel * (o->grad_reduce_bf16 ? 2 : 4);
    bert_params_free(&params);
    if (w.peak_tflops <= 0) {
        if (o->grad_accum == 0) {
            fprintf(stderr,
                    "trainer: --grad-accum auto: the bf16 peak of device \"%s\" is unknown; name a known one with "
                    "--device or give a number\n",
                    device);
            return 0;
        }
        if (o->plan_only && comm->rank == 0)
            printf(
                "scaling prediction: the bf16 peak of device \"%s\" is unknown; --device NAME predicts for "
                "a known one\n",
                device);
        return 1;
    }
    if (o->plan_only) {
        if (comm->rank == 0) scaling_print(&c, &w, o->grad_accum, plan->B, plan->T);
        return 1;
    }
    if (o->grad_accum == 0) {
        ScalingPrediction p = scaling_predict(&c, &w, 0);
        o->grad_accum = p.accum;
        if (comm->rank == 0)
            printf(
                "--grad-accum auto: %d (%d node(s) x %d GPU(s) of %s: all-reduce %.1f ms, %.1f ms exposed of a "
                "%.1f ms step, predicted efficiency %.1f%%); global batch %lld sequences, %.4g tokens\n",
                p.accum, c.nodes, c.gpus_per_node, device, p.comm_s * 1e3, p.exposed_s * 1e3, p.step_s * 1e3,
                100 * p.efficiency, (long long)comm->world * p.accum * plan->B,
                (double)comm->world * p.accum * plan->B * plan->T);
    }
    return 1;
}

// ----------------------------------------------------------------------------
// The phases of a run, in main's order.

// plan_for_run: the memory plan (--batch, or the largest micro-batch that fits, plus validation's sums when
// there is --val), printed by rank 0. Gives 1, or 0 after saying why it cannot fit.
static int plan_for_run(const BertConfig* cfg, const Options* o, int loaders, const GradReduce* gr, size_t free_bytes,
                        size_t total_bytes, const cudaDeviceProp* prop, const Comm* comm, Plan* plan) {
    *plan =
        o->B ? make_plan(cfg, o->B, o->T, loaders, gr) : choose_batch(cfg, o->T, loaders, gr, free_bytes, total_bytes);
    if (o->val) plan_add_validation(plan, o->val_batches);
    if (comm->rank == 0) {
        printf("device: %s, %.1f GB free of %.1f GB; %d process(es)\n", prop->name, free_bytes / 1e9, total_bytes / 1e9,
               comm->world);
        bert_print_plan(cfg, plan->B, plan->T, plan->M, (int)sizeof(floatX));
        printf("  batch buffers %.3f GiB; total %.3f GiB for B=%d (%s)\n",
               (plan->batch_bytes + plan->maker_bytes + plan->val_bytes) / (double)(1 << 30),
               plan->total / (double)(1 << 30), plan->B, o->B ? "--batch" : "the largest that fits");
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
    double rows = (double)comm->world * o->grad_accum * B, per_step = rows * o->T;
    double steps = o->tokens       ? ceil(o->tokens / per_step)
                   : o->epochs > 0 ? ceil(o->epochs * epoch_tokens / per_step)
                                   : o->steps;
    if (steps > (1 << 30)) {
        fprintf(stderr, "trainer: %s is %.3g steps of %.0f tokens: more than 2^30 steps\n",
                o->tokens ? "--tokens" : "--epochs", steps, per_step);
        exit(1);
    }
    o->steps = steps < 1 ? 1 : (int)steps;
    if (o->warmup < 0) o->warmup = o->steps / 100;
    if (!verbose) return;
    printf(
        "global batch: %.0f sequences of %d tokens (%d process(es) x %d micro-batch(es) x B=%d) = %.0f tokens "
        "per step; an epoch (%.0f tokens in the training shards) is %.1f steps\n",
        rows, o->T, comm->world, o->grad_accum, B, per_step, epoch_tokens, epoch_tokens / per_step);
    if (o->tokens) printf("--tokens %lld: %d steps\n", o->tokens, o->steps);
    if (o->epochs > 0) printf("--epochs %g: %d steps\n", o->epochs, o->steps);
}

// export_tokenizer: the tokenizer beside the Hugging Face export, so that it is usable as it is. Text
// shards (tools/prepare.py leaves their tokenizer.json beside them): a copy of that tokenizer.json, and
// tokenizer_config.json + special_tokens_map.json, which transformers' AutoTokenizer.from_pretrained(DIR)
// needs to load it as a fast tokenizer with BERT's special tokens. Byte shards (ids 0..255 are the
// bytes; no [UNK]): byte_tokenizer.json, the mapping and the special ids of the shard header. Each file
// is written atomically. Gives 1, or 0 after a message.
static int export_tokenizer(const char* out, const char* data_glob, const ShardHeader* h, int max_position) {
    char first[4096], src[4200], path[4200], buf[2048];
    glob_t g;
    if (glob(data_glob, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        globfree(&g);
        fprintf(stderr, "trainer: --data %s: the shards are gone: no tokenizer exported\n", data_glob);
        return 0;
    }
    snprintf(first, sizeof first, "%s", g.gl_pathv[0]);
    globfree(&g);
    snprintf(src, sizeof src, "%s/tokenizer.json", dirname(first));
    if (access(src, F_OK) == 0) {
        size_t n;
        char* tok = bert_read_file(src, &n);
        int ok = tok != NULL;
        snprintf(path, sizeof path, "%s/tokenizer.json", out);
        ok = ok && bert_write_file(path, tok, n, NULL, 0);
        free(tok);
        static const char specials[] =
            "\"pad_token\": \"[PAD]\", \"unk_token\": \"[UNK]\", \"cls_token\": \"[CLS]\", \"sep_token\": \"[SEP]\", "
            "\"mask_token\": \"[MASK]\"";
        int k = snprintf(buf, sizeof buf,
                         "{\"tokenizer_class\": \"PreTrainedTokenizerFast\", \"model_max_length\": %d, %s}\n",
                         max_position, specials);
        snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
        ok = ok && bert_write_file(path, buf, (size_t)k, NULL, 0);
        k = snprintf(buf, sizeof buf, "{%s}\n", specials);
        snprintf(path, sizeof path, "%s/special_tokens_map.json", out);
        ok = ok && bert_write_file(path, buf, (size_t)k, NULL, 0);
        if (!ok) fprintf(stderr, "trainer: cannot export the tokenizer %s to %s\n", src, out);
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
        return 1;
    }
    printf("note: no tokenizer.json beside the shards (%s) and not a byte vocabulary: the export has no tokenizer\n",
           src);
    return 1;
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
    char err[DATA_ERR_LEN], why[256];
    if (shards_open_all(o->val, &shards, &nshards, 1, err)) {
        fprintf(stderr, "trainer: --val: %s\n", err);
        return 1;
    }
    ShardHeader vh = shards[0].h;  // vocabulary, padding id, the --seq-len the shards were made for
    for (int i = 0; i < nshards; i++) shard_close(&shards[i]);
    free(shards);

    // The source: a checkpoint file (its config, T and step in its header) or an export directory.
    struct stat st;
    BertConfig cfg;
    CkptHeader h;
    BertParams hp;
    float* w = NULL;
    memset(&h, 0, sizeof h);
    memset(&hp, 0, sizeof hp);
    int is_dir = stat(o->eval, &st) == 0 && S_ISDIR(st.st_mode);
    if (stat(o->eval, &st) != 0) {
        fprintf(stderr, "trainer: --eval %s: %s (expected a checkpoint file or a Hugging Face export directory)\n",
                o->eval, strerror(errno));
        return 1;
    }
    if (is_dir && !bert_load_hf(o->eval, &cfg, &hp, &w)) {
        fprintf(stderr, "trainer: --eval %s: cannot load config.json + model.safetensors from this directory\n",
                o->eval);
        return 1;
    }
    if (!is_dir && !ckpt_verify(o->eval, &h, why, sizeof why)) {
        fprintf(stderr, "trainer: --eval %s: %s\n", o->eval, why);
        return 1;
    }
    if (!is_dir && h.x_bytes != (int32_t)sizeof(floatX)) {
        fprintf(stderr, "trainer: --eval %s: saved by a trainer with %d-byte weights; this one is %s\n", o->eval,
                h.x_bytes, FLOATX_NAME);
        return 1;
    }
    if (!is_dir) cfg = h.cfg;
    if (!o->seq_given) o->T = is_dir ? (int)vh.max_len : h.T;
    if (o->T > cfg.max_position) {
        fprintf(stderr, "trainer: --eval %s: --seq %d is longer than the model's %d positions\n", o->eval, o->T,
                cfg.max_position);
        return 1;
    }
    GradReduce gr;  // (no gradients are reduced: make_plan and ckpt_load take the layout)
    grad_reduce_setup(&gr, &cfg, comm, o);
    Plan plan;
    if (!plan_for_run(&cfg, o, 1, &gr, free_bytes, total_bytes, prop, comm, &plan) || !reserve_plan(&plan, o)) return 1;

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    BertModel model;
    if (!bert_alloc(&model, &cfg, plan.B, plan.T, plan.M, stream)) return 1;
    BatchMaker bm;
    batch_maker_alloc(&bm, &plan, vh.pad_id);
    Validation v;
    validation_init(&v, o->val, &plan, comm, cfg.vocab_size, o->val_batches, main_rank);
    if (is_dir) {
        bert_set_params(&model, w);
        free(w);
        bert_params_free(&hp);
    } else {
        ckpt_load(o->eval, &model, &gr, &h);  // every state region, so the bf16 weights are the run's own
    }
    CommBootstrap boot = {o->bootstrap, o->out, o->out, started};
    comm_init(comm, &boot);
    EvalResult e = evaluate(&model, &v, &bm, comm);
    int step = is_dir ? 0 : h.step, rc = 0;
    if (main_rank) {
        printf("eval: loss %.4f | accuracy %.4f | %lld masked tokens in %lld sequences\n", e.loss, e.accuracy, e.masked,
               e.samples);
        fflush(stdout);
        double unused;
        FILE* f = o->out ? metrics_open(o->out, 0, 0, &unused) : NULL;
        if (f) {
            fprintf(f, "{\"kind\":\"eval\",\"step\":%d", step);
            json_str(f, "source", o->eval);
            json_num(f, "val_loss", e.loss);
            json_num(f, "val_accuracy", e.accuracy);
            fprintf(f, ",\"val_masked\":%lld", e.masked);
            json_end(f);
            fclose(f);
        } else if (o->out) {
            rc = 1;
        }
    }
    validation_free(&v);
    grad_reduce_free(&gr);
    comm_free(comm);
    cudaFree(bm.seg_lo);
    bert_free(&model);
    return rc;
}

int main(int argc, char** argv) {
    install_stop_handlers();  // first: a stop during start-up exits cleanly (see request_stop)
    double started = comm_realtime_s();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    double t_start = now_s();
    Comm comm = comm_from_env();  // rank, world, local rank: srun, torchrun-style variables, or one process
    cudaDeviceProp prop;
    size_t free_bytes, total_bytes;
    use_device(&comm, &prop, &free_bytes, &total_bytes);
    if (!strcmp(argv[1], "--info")) {
        printf("rank %d of %d (local %d): device %d, %s, sm_%d%d, %d SMs, %.1f GB free of %.1f GB\n", comm.rank,
               comm.world, comm.local_rank, comm.device, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
               free_bytes / 1e9, total_bytes / 1e9);
        return 0;
    }
    Options o = parse_options(argc, argv);
    comm.timeout_s = o.nccl_timeout;
    if (o.bench) return run_bench(&o, &comm, &prop, started);
    if (o.eval) return run_eval(&o, &comm, &prop, free_bytes, total_bytes, started);
    int main_rank = comm.rank == 0;
    if (o.device_mem > 0) free_bytes = total_bytes = (size_t)(o.device_mem * 1e9);  // --plan-only for another device
    if (o.out && !make_out_dir(o.out)) return 1;                                    // (--plan-only may have none)

    // The communicator of all ranks, before anything is planned: the ranks agree on the plan.
    CommBootstrap boot = {o.bootstrap, o.out, o.out, started};
    if (!o.plan_only) comm_init(&comm, &boot);  // --plan-only plans for the world size alone: no other rank

    // The model: a preset with the shards' vocabulary, or a Hugging Face checkpoint.
    BertConfig cfg;
    float* init_w = NULL;
    BertParams init_p;
    ShardHeader data_h;  // the vocabulary and its special ids (all shards agree: data.h checks)
    memset(&data_h, 0, sizeof data_h);
    double epoch_tokens = 0;  // real tokens in the training shards
    uint64_t data_fp = o.data ? data_fingerprint("--data", o.data, &data_h, &epoch_tokens) : 0;
    uint64_t val_fp = o.val ? data_fingerprint("--val", o.val, NULL, NULL) : 0;
    int data_vocab = (int)data_h.vocab_size, pad_id = data_h.pad_id;  // no --data (--plan-only): 0, the preset's
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
        if (data_vocab) cfg.vocab_size = data_vocab;
    }
    if (o.T > cfg.max_position) {
        fprintf(stderr, "trainer: --seq %d is longer than the model's %d positions\n", o.T, cfg.max_position);
        return 1;
    }

    // The gradient buckets, the memory plan, and the micro-batch it allows (the seed paper's recommendation 5):
    // the same on every rank, the smallest any rank can hold.
    GradReduce gr;
    grad_reduce_setup(&gr, &cfg, &comm, &o);
    int loaders = o.val ? 2 : 1;
    Plan plan =
        o.B ? make_plan(&cfg, o.B, o.T, loaders, &gr) : choose_batch(&cfg, o.T, loaders, &gr, free_bytes, total_bytes);
    if (!o.plan_only) plan = make_plan(&cfg, agree(&comm, &o, &cfg, plan.B, data_fp, val_fp), o.T, loaders, &gr);
    if (o.val) plan_add_validation(&plan, o.val_batches);
    if (main_rank) {
        printf("device: %s, %.1f GB free of %.1f GB; %d process(es)\n", prop.name, free_bytes / 1e9, total_bytes / 1e9,
               comm.world);
        bert_print_mem_plan(&plan.model, plan.B, plan.T, plan.M, (int)sizeof(floatX));
        if (comm.world > 1)
            printf("  gradients reduced in %d buckets of up to %g MB, %s%s; bf16 staging %.3f GiB\n", gr.n, o.bucket_mb,
                   o.grad_reduce_bf16 ? "bf16" : "fp32", gr.zero ? ", ZeRO-1 (reduce-scatter, all-gather)" : "",
                   plan.reduce_bytes / (double)(1 << 30));
        printf("  batch buffers %.3f GiB; total %.3f GiB for B=%d (%s)\n",
               (plan.batch_bytes + plan.maker_bytes + plan.val_bytes) / (double)(1 << 30),
               plan.total / (double)(1 << 30), plan.B, o.B ? "--batch" : "the largest that fits");
    }
    if (plan.total > free_bytes) {
        fprintf(stderr,
                "trainer: the model needs %.3f GiB at B=%d but %.3f GiB are free: use a smaller --seq, "
                "--preset or --batch\n",
                plan.total / (double)(1 << 30), plan.B, free_bytes / (double)(1 << 30));
        return 1;
    }
    if (!predict_scaling(&o, &cfg, &plan, &comm, o.device ? o.device : prop.name)) return 1;
    if (o.plan_only) return 0;
    if (!reserve_plan(&plan, &o)) return 1;
    int B = plan.B, T = o.T;
    resolve_run_length(&o, &comm, B, epoch_tokens, main_rank);  // --tokens, --epochs: steps of the global batch

    // Node-local copies of the shards (the seed paper's recommendation 2); the ranks wait for the slowest
    // node (up to an hour more than --nccl-timeout).
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
        CommValue staged = {"staged", 1, 0, 0};
        comm.timeout_s += 3600;
        comm_agree(&comm, &staged, 1);
        comm.timeout_s = o.nccl_timeout;
    }

    // Everything on the device, allocated once.
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    BertModel model;
    if (!bert_alloc_sharded(&model, &cfg, B, T, plan.M, stream, gr.zero ? gr.state_numel : 0, gr.slack)) return 1;
    grad_reduce_start(&gr);
    BatchMaker bm;
    float* scratch = batch_maker_alloc(&bm, &plan, pad_id);  // the step's sums: see S_LOSS

    DataLoaderConfig dcfg = dataloader_default_config(train_pattern, B, T);
    dcfg.rank = comm.rank, dcfg.world = comm.world, dcfg.num_threads = o.loader_threads;
    dcfg.ring_slots = o.ring_slots, dcfg.seed = (uint64_t)o.seed, dcfg.vocab_size = cfg.vocab_size;
    dcfg.verbose = main_rank;
    DataLoader train;
    if (dataloader_init(&train, &dcfg)) {
        fprintf(stderr, "trainer: %s\n", train.error);
        return 1;
    }
    Validation val;
    if (o.val) validation_init(&val, val_pattern, &plan, &comm, cfg.vocab_size, o.val_batches, main_rank);

    // Weights: from the checkpoint, from Hugging Face, or BERT's random initialisation.
    Ckpts ck;
    memset(&ck, 0, sizeof ck);
    ck.dir = o.out, ck.keep = o.keep, ck.step = -1;
    if (o.resume) {
        resume_checkpoint(&ck, &model, &gr, &train, o.steps, main_rank);
    } else {
        if (!init_w && !(init_w = (float*)malloc(model.p.numel * sizeof(float)))) {
            fprintf(stderr, "trainer: out of host memory for the %zu initial weights\n", model.p.numel);
            return 1;
        }
        if (!o.init_from) bert_init_host(&model.p, init_w, (uint64_t)o.seed);
        model_set_params(&model, &gr, init_w);
    }
    free(init_w);
    if (o.init_from) bert_params_free(&init_p);
    agree_on_position(&comm, &model, &train);
    bert_zero_grad(&model);
    size_t free_before_step1;  // from here on nothing is allocated: the log shows it
    CUDA_CHECK(cudaMemGetInfo(&free_before_step1, &total_bytes));
    if (main_rank)
        printf("device memory allocated before step 1: %zu bytes (the plan: %zu bytes)\n",
               free_bytes - free_before_step1, plan.total);

    double flops_token = bert_flops_per_token(&cfg, T, 0.15).model, peak_tflops = device_peak_tflops(prop.name);
    if (main_rank) printf("training: %d steps, %s\n", o.steps, FLOATX_NAME);
    int last_step = o.run_steps && model.step + o.run_steps < o.steps ? model.step + o.run_steps : o.steps;
    RunLog lg;  // progress: the log lines' elapsed time, ETA and epoch, and DIR/metrics.jsonl
    memset(&lg, 0, sizeof lg);
    lg.t_start = t_start, lg.first_step = model.step + 1, lg.last_step = last_step;
    lg.tokens = (long long)ck.tokens, lg.epoch_tokens = epoch_tokens;
    if (main_rank && !(lg.f = metrics_open(o.out, 1, o.resume ? model.step : -1, &lg.elapsed0))) return 1;
    int bad_steps = 0;  // consecutive steps skipped for a loss or gradient norm that was not finite
    double last_ckpt = now_s();
    char what[4600];
    training = 1;  // from here a signal finishes the step and saves a checkpoint
    lg.t_loop = now_s();
    while (model.step < last_step) {
        int step = model.step + 1;
        double t0 = now_s();
        // rank 0's clock decides --ckpt-minutes, and the step's all-reduce tells every rank
        int want_ckpt = main_rank && o.ckpt_minutes > 0 && now_s() - last_ckpt >= 60.0 * o.ckpt_minutes;
        StepResult r = train_step(&model, &train, &bm, &gr, scratch, &o, lr_at(&o, step), want_ckpt);
        if (r.stop) last_step = step;  // some rank got a signal: every rank stops after this step
        bad_steps = r.skipped ? bad_steps + 1 : 0;
        ck.tokens = lg.tokens += r.all_tokens;
        if (main_rank) log_step(&o, &r, step, bad_steps, now_s() - t0, comm.world, flops_token, peak_tflops, &bm, &lg);
        if (bad_steps >= o.max_bad_steps) return diverged(&o, &ck, bad_steps, main_rank);
        if (o.val && o.val_every && (step % o.val_every == 0 || step == o.steps)) {
            EvalResult e = evaluate(&model, &val, &bm, &comm);
            if (main_rank) log_validation(&lg, step, o.val_batches, &e);
        }
        // A checkpoint every --ckpt-every steps, every --ckpt-minutes, and at the end; never of a skipped step
        // but the last (the weights are the last good ones either way).
        // Every rank decides the same (under ZeRO-1 all of them gather the shards for rank 0 to write).
        int due = (o.ckpt_every && step % o.ckpt_every == 0) || r.ckpt;
        if ((due && !bad_steps) || step == last_step) {
            if (!checkpoint_now(&ck, &model, &gr, &train, step)) return 1;
            last_ckpt = now_s();
        }
    }

    size_t free_after;
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total_bytes));
    if (main_rank) printf("device memory allocated after the last step: %zu bytes\n", free_bytes - free_after);

    // The final weights as a Hugging Face BertForMaskedLM (model.safetensors + config.json).
    if (main_rank && model.step < o.steps)
        printf("stopped after step %d (%s); --resume continues\n", model.step,
               stop_requested ? "on a signal" : "--run-steps");
    float* w =
        model.step == o.steps || getenv("MLM_TEST_WEIGHTS_CRC") ? (float*)malloc(model.p.numel * sizeof(float)) : NULL;
    if (model.step == o.steps || getenv("MLM_TEST_WEIGHTS_CRC"))
        model_get_params(&model, &gr, w);  // every rank: under ZeRO-1 they gather the shards (w NULL: no copy)
    // test hook (tests/test_data_parallel.sh): MLM_TEST_WEIGHTS_CRC=1 makes every rank print checksums of the
    // weights it holds, which must be the same on all ranks
    if (w && getenv("MLM_TEST_WEIGHTS_CRC")) print_weights_crc(&model, w, comm.rank);
    if (main_rank && model.step == o.steps) {
        if (!w) {
            fprintf(stderr, "trainer: out of host memory for the export; %s\n",
                    ckpt_whats_on_disk(&ck, what, sizeof what));
            return 1;
        }
        if (!bert_save_hf(o.out, &model.p, w, pad_id)) {
            fprintf(stderr,
                    "trainer: cannot write the Hugging Face export to %s (any earlier export is untouched); %s\n",
                    o.out, ckpt_whats_on_disk(&ck, what, sizeof what));
            return 1;
        }
        if (!export_tokenizer(o.out, o.data, &data_h, cfg.max_position)) {
            fprintf(stderr, "trainer: the export in %s lacks its tokenizer (see above); %s\n", o.out,
                    ckpt_whats_on_disk(&ck, what, sizeof what));
            return 1;
        }
        printf("saved %s and the Hugging Face export %s/model.safetensors + config.json + the tokenizer\n", ck.path,
               o.out);
    }
    free(w);
    dataloader_free(&train);
    if (o.val) validation_free(&val);
    if (lg.f) fclose(lg.f);
    grad_reduce_free(&gr);
    comm_free(&comm);
    cudaFree(bm.seg_lo);
    bert_free(&model);
    return 0;
}
