// trainer.cu: mlm.c's one program, BERT-style masked-language-model pretraining.
// This is the only translation unit: nvcc compiles it for the GPU (./trainer) and g++ compiles the
// very same file against cpu/ for the CPU (./trainer_cpu). Each header has one role:
#include <cuda_runtime.h>  // the CUDA runtime (cpu/include/cuda_runtime.h on the CPU build)
#include "kernels.cuh"     // every GPU kernel, and launch()
#include "model.h"         // the BERT configuration, parameter table, memory plan, forward/backward/AdamW
#include "data.h"          // token shards, the ring of loader threads, MLM masking
#include "comm.h"          // rank and world size; NCCL gradient averaging
#include "scaling.h"       // the scaling predictor: compute, all-reduce and overlap on N nodes
#include "compress.h"      // --comm onebit: 1-bit Adam's compressed momentum all-reduce
#include <ctype.h>
#include <dirent.h>
#include <glob.h>
#include <libgen.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Flags: one table (flags[]) says, for every flag, where its value goes, how it is read, its default and its
// --help text; parse_options reads argv by it and usage() prints it, so a flag cannot be parsed without being
// documented.

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
    int resume, plan_only, info;
    int keep, max_bad_steps;               // checkpoints kept; consecutive non-finite steps before the run stops
    float ckpt_minutes;                    // a checkpoint at least this often (wall clock; 0: only --ckpt-every)
    int inf_grad[2], inf_loss[2];          // test hooks (MLM_TEST_INF_GRAD / MLM_TEST_INF_LOSS): see test_hook_env
    int stall[2];                          // test hook MLM_TEST_STALL=STEP: see stall_hook_init
    int bench, bench_steps, bench_warmup;  // --bench: time the training step on synthetic data
    const char* bootstrap;                 // --bootstrap tcp | file: how the ranks get rank 0's NCCL id
    float nccl_timeout;                    // --nccl-timeout S: the deadline of every wait on the other ranks
    // The scaling predictor (scaling.h) for --plan-only and --grad-accum auto (grad_accum 0)
    int nodes, gpus_per_node;          // 0: from Slurm (SLURM_NNODES) and the world size
    float net_gbps, nvlink_gbps, mfu;  // Gbit/s one way; the share of the device's peak
    const char* device;                // the device the prediction is for (default: this one)
    float device_mem;                  // GB of device memory for --plan-only's planner (0: this device's)
    float bucket_mb;                   // gradient bucket size (MB of fp32 gradients)
    float link_efficiency, alpha_us;   // the share of --net-gbps NCCL reaches; microseconds per network step
    float micro_ms;                    // --micro-ms: a measured micro-batch (ms) instead of FLOPs / (peak x MFU)
    long long global_batch;            // --global-batch S: sequences per step (0: from --grad-accum)
    long long max_global_batch;        // --max-global-batch S: --grad-accum auto's cap
    const char* comm;                  // --comm fp32 | bf16 | onebit (--grad-reduce: its old name)
    int grad_reduce_bf16, zero;        // --comm bf16; --zero 1 (ZeRO-1)
    int onebit, comm_warmup;           // --comm onebit (1-bit Adam, compress.h); --comm-warmup (0: default)
    int onebit_overlap;                // --comm onebit-overlap: the parts exchanged during the backward
    int comm_refresh;                  // --comm-refresh K: an fp32 step updates v every K steps (0: never)
    const char* optimizer_name;        // --optimizer adamw | lamb
    int optimizer;                     // OPT_ADAMW or OPT_LAMB (from optimizer_name)
    long long tokens;                  // --tokens N: about N real tokens, as steps (resolve_run_length)
    double epochs;                     // --epochs E: E passes over the training shards, as steps
    const char* eval;                  // --eval SRC: evaluate a checkpoint or an export on --val; no training
    int seq_given;                     // --seq was given (--eval otherwise takes the source's)
    int overwrite;                     // --overwrite: a new run may replace the run already in --out
    int seed_given, preset_given;      // --seed, --preset were given (checked against --resume, --init-from)
    int accum_given;                   // --grad-accum was given (--global-batch is its alternative)
} Options;
enum { OPT_ADAMW, OPT_LAMB };

// How a flag's value is read (read_flag): a switch takes none; a string is kept as given; a choice is one of
// the words of Flag.value ("tcp|file"); numbers must lie in [lo, hi]; INT_AUTO also takes "auto" (as 0); COUNT
// is a number of tokens with a K/M/B/T suffix; DOUBLE is read as a float and kept in a double.
enum { F_SWITCH, F_STR, F_CHOICE, F_INT, F_INT_AUTO, F_LL, F_FLOAT, F_DOUBLE, F_COUNT, F_HELP };
typedef struct {
    const char* name;   // "--seq"; NULL: a heading in --help (help is its text)
    const char* value;  // the value's name in --help ("T"); an F_CHOICE's words; NULL for a switch
    int kind;           // F_*
    size_t at;          // where the value goes: offsetof(Options, field)
    double lo, hi;      // a number's range
    const char* def;    // the default, read as a given value is (NULL: 0, or what the help says)
    const char* help;   // --help's text; '\n' starts a new, indented line
} Flag;
#define AT(field) offsetof(Options, field)
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static const Flag flags[] = {
    {"--data", "GLOB", F_STR, AT(data), 0, 0, NULL, "training shards (tools/prepare.py makes them)"},
    {"--val", "GLOB", F_STR, AT(val), 0, 0, NULL,
     "validation shards: MLM loss and masked-token accuracy every --val-every steps, on\n"
     "every validation sequence once (a fixed masking) whatever the number of GPUs"},
    {"--out", "DIR", F_STR, AT(out), 0, 0, NULL,
     "(created with its parents) checkpoint.bin, metrics.jsonl (a JSON object per logged\n"
     "step and per validation), the final Hugging Face export (model.safetensors,\n"
     "config.json) and the tokenizer files (tokenizer.json + tokenizer_config.json +\n"
     "special_tokens_map.json for text shards, byte_tokenizer.json for byte shards)"},
    {"--preset", "NAME", F_STR, AT(preset), 0, 0, NULL,
     "default bert-base; the vocabulary size comes from the shards:"},  // usage() lists the presets here
    {"--init-from", "DIR", F_STR, AT(init_from), 0, 0, NULL,
     "start from a Hugging Face BertForMaskedLM checkpoint instead"},
    {"--resume", NULL, F_SWITCH, AT(resume), 0, 0, NULL,
     "continue from DIR/checkpoint.bin (weights, optimizer, data position)"},
    {"--overwrite", NULL, F_SWITCH, AT(overwrite), 0, 0, NULL,
     "start a new run in an --out that holds another run's checkpoints or export,\n"
     "deleting them and its metrics first (without it, or --resume, it is refused)"},
    {"--seq", "T", F_INT, AT(T), 2, 1 << 16, "512", "tokens per row"},
    {"--batch", "B", F_INT, AT(B), 0, 1 << 20, NULL,
     "rows per micro-batch per GPU (default 0: the largest that fits in GPU memory)"},
    {"--grad-accum", "N", F_INT_AUTO, AT(grad_accum), 1, SCALING_MAX_ACCUM, "1",
     "micro-batches per optimizer step; auto: the fewest that hide the gradient\n"
     "all-reduce behind compute (predicted, see --plan-only)"},
    {"--steps", "N", F_INT, AT(steps), 1, 1 << 30, NULL, "optimizer steps; or instead:"},
    {"--tokens", "N", F_COUNT, AT(tokens), 1, 1e15, NULL,
     "about N real tokens (1e9, 500M, 2B: K M B T suffixes), as steps of the global batch"},
    {"--epochs", "E", F_DOUBLE, AT(epochs), 1e-6, 1e6, NULL,
     "E passes over the training shards (E x their tokens / tokens per step, rounded up)"},
    {"--lr", "X", F_FLOAT, AT(lr), 0, 1, "5e-4", "peak learning rate, linear warmup then linear decay to 0"},
    {"--warmup", "N", F_INT, AT(warmup), 0, 1 << 30, NULL, "warmup steps (default 1% of --steps)"},
    {"--wd", "X", F_FLOAT, AT(wd), 0, 1, "0.01", "AdamW's weight decay (not on biases and LayerNorm)"},
    {"--beta1", "X", F_FLOAT, AT(beta1), 0, 0.999999, "0.9", "AdamW's momentum decay"},
    {"--beta2", "X", F_FLOAT, AT(beta2), 0, 0.999999, "0.98", "AdamW's variance decay"},
    {"--eps", "X", F_FLOAT, AT(eps), 1e-30, 1, "1e-6", "AdamW's epsilon"},
    {"--clip", "X", F_FLOAT, AT(clip), 0, 1e30, "1.0", "the gradient norm is clipped to X (0: no clipping)"},
    {"--optimizer", "adamw|lamb", F_CHOICE, AT(optimizer_name), 0, 0, "adamw",
     "adamw, or lamb: AdamW's moments and decay, each tensor's step scaled by its trust\n"
     "ratio |w| / |update| (for large global batches; not with --zero 1)"},
    {"--seed", "N", F_LL, AT(seed), 0, (double)(1LL << 62), "1337", "data order, masking and initialisation"},
    {"--loader-threads", "N", F_INT_AUTO, AT(loader_threads), 1, 256, "auto",
     "threads preparing batches; auto: as many as the step needs, from one thread's measured\n"
     "rate and the predicted micro-batch time (printed with the reason)"},
    {"--ring", "N", F_INT, AT(ring_slots), 2, 1024, "4", "slots of prepared batches in the loaders' ring"},
    {"--stage-dir", "DIR", F_STR, AT(stage_dir), 0, 0, NULL,
     "copy the shards to this node-local directory first, once per node"},
    {"--log-every", "N", F_INT, AT(log_every), 1, 1 << 30, "1", "a log line (and metrics record) every N steps"},
    {"--val-every", "N", F_INT, AT(val_every), 0, 1 << 30, NULL,
     "validation every N steps and at the last (default 0: none while training)"},
    {"--val-batches", "N", F_INT, AT(val_batches), 0, 1 << 20, NULL,
     "only the first N micro-batches of B rows (over all GPUs together) of the\n"
     "validation split; 0, the default: the whole split, each sequence once"},
    {"--ckpt-every", "N", F_INT, AT(ckpt_every), 0, 1 << 30, NULL,
     "a checkpoint every N steps (default 0: only at the end)"},
    {"--ckpt-minutes", "X", F_FLOAT, AT(ckpt_minutes), 0, 1e6, "30",
     "also a checkpoint when X minutes passed since the last one (0: off)"},
    {"--keep", "K", F_INT, AT(keep), 1, 1000, "2",
     "checkpoints kept: DIR/checkpoint.bin and the K-1 before it as checkpoint-STEP.bin;\n"
     "--resume takes the newest intact one (each has a CRC-32)"},
    {"--max-bad-steps", "N", F_INT, AT(max_bad_steps), 1, 1 << 30, "3",
     "a step whose loss or gradient norm is not finite is skipped (weights and AdamW\n"
     "state untouched); N in a row stop the run with exit code 2"},
    {"--run-steps", "N", F_INT, AT(run_steps), 1, 1 << 30, NULL,
     "stop after N steps of this run, with a checkpoint (to fit a job's time limit;\n"
     "--resume continues)"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL, "how gradients cross the network:"},
    {"--comm", "fp32|bf16|onebit|onebit-overlap", F_CHOICE, AT(comm), 0, 0, "fp32",
     "fp32: buckets all-reduced in fp32; bf16: half the bytes; onebit: 1-bit Adam,\n"
     "after --comm-warmup steps of fp32 AdamW the variance is frozen and only the\n"
     "momentum's signs and one scale per 256 elements are sent, about 28x fewer bytes\n"
     "than fp32 (also on one GPU, to see its effect); onebit-overlap: the same sent\n"
     "during the backward, clipped after the exchange (faster on a slow network, a\n"
     "loss further from fp32's: README)"},
    {"--grad-reduce", "fp32|bf16", F_CHOICE, AT(comm), 0, 0, NULL, "the older name of --comm fp32 | bf16"},
    {"--comm-warmup", "N", F_INT, AT(comm_warmup), 1, INT_MAX, NULL,
     "--comm onebit: steps of fp32 AdamW before compression (default\n" STRINGIFY(
         ONEBIT_WARMUP_PERCENT) "% of --steps, at least 1; must be below --steps)"},
    {"--comm-refresh", "K", F_INT, AT(comm_refresh), 0, INT_MAX, NULL,
     "--comm onebit: every K steps after the warm-up one fp32 AdamW step updates the\n"
     "frozen variance as if the K steps since had seen its g^2 (v = b2^K v + (1 - b2^K) g^2;\n"
     "default " STRINGIFY(
         ONEBIT_REFRESH_DEFAULT) "; 0: never, as 1-bit Adam; K >= 18 keeps 16x fewer bytes than fp32)"},
    {"--bucket-mb", "X", F_FLOAT, AT(bucket_mb), 0.001, 1 << 20, "25",
     "gradients are reduced over GPUs in buckets of X MB (fp32), each as soon as the\n"
     "backward has made it, overlapping the rest of the backward"},
    {"--zero", "N", F_INT, AT(zero), 0, 1, NULL,
     "1: ZeRO-1, each GPU keeps 1/world of the fp32 master weights and AdamW state\n"
     "(gradients reduce-scattered, weights all-gathered); 0: off (default)"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL, "the memory plan and the scaling prediction:"},
    {"--plan-only", NULL, F_SWITCH, AT(plan_only), 0, 0, NULL,
     "print the memory plan and the scaling prediction, then exit (--data and --out\n"
     "optional: without --data the preset's vocabulary)"},
    {"--nodes", "N", F_INT, AT(nodes), 1, 1 << 16, NULL,
     "nodes predicted (--plan-only: default 1; a run: SLURM_NNODES)"},
    {"--gpus-per-node", "G", F_INT, AT(gpus_per_node), 1, 1024, NULL,
     "GPUs per node predicted (--plan-only: default 1; a run: its ranks over the nodes)"},
    {"--net-gbps", "X", F_FLOAT, AT(net_gbps), 1e-3, 1e6, NULL, "network between nodes, Gbit/s one way (default 25)"},
    {"--nvlink-gbps", "X", F_FLOAT, AT(nvlink_gbps), 1e-3, 1e6, NULL,
     "inside a node, Gbit/s one way (default 2400: H100 NVL's NVLink bridge)"},
    {"--mfu", "X", F_FLOAT, AT(mfu), 1e-4, 1, NULL,
     "share of the device's bf16 peak a step reaches (default 0.404: paper-120m on\n"
     "an H100; ./trainer --bench prints it as mfu=)"},
    {"--link-efficiency", "X", F_FLOAT, AT(link_efficiency), 1e-3, 1, NULL,
     "share of --net-gbps NCCL reaches on large messages (default 0.6: NCCL over TCP)"},
    {"--alpha-us", "X", F_FLOAT, AT(alpha_us), 0, 1e7, NULL,
     "latency of one network step of a collective, microseconds (default 40: TCP)"},
    {"--micro-ms", "X", F_FLOAT, AT(micro_ms), 1e-6, 1e9, NULL,
     "predict from a measured micro-batch (forward + backward of B, ms) instead of MFU"},
    {"--global-batch", "S", F_LL, AT(global_batch), 1, (double)(1LL << 40), NULL,
     "sequences per optimizer step over all GPUs: the accumulation S / (GPUs x B)\n"
     "(--plan-only: per node count, with a smaller B where one micro-batch exceeds S)"},
    {"--max-global-batch", "S", F_LL, AT(max_global_batch), 1, (double)(1LL << 40), STRINGIFY(SCALING_MAX_GLOBAL_BATCH),
     "the largest global batch --grad-accum auto may choose"},
    {"--device", "NAME", F_STR, AT(device), 0, 0, NULL,
     "predict for this device instead of this one: its memory (--plan-only) and bf16\n"
     "peak; one of these, or its full name (\"NVIDIA H100 NVL\"):"},
    {"--device-mem", "GB", F_FLOAT, AT(device_mem), 0.001, 1e6, NULL,
     "with --plan-only: plan for this much device memory instead of this one's"},
    {"--info", NULL, F_SWITCH, AT(info), 0, 0, NULL,
     "print the device and this process's place in the job, then exit (alone)"},
    {"--help", NULL, F_HELP, 0, 0, 0, NULL, "this text (also -h)"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL,
     "several processes (srun -K ./trainer ..., or RANK/WORLD_SIZE/LOCAL_RANK as torchrun sets them):"},
    {"--bootstrap", "tcp|file", F_CHOICE, AT(bootstrap), 0, 0, "tcp",
     "how the ranks get rank 0's NCCL id: tcp from MASTER_ADDR:MASTER_PORT, by default\n"
     "the first host of the Slurm node list and a port from the job and step id; file:\n"
     "through --out, which must be on a file system every rank sees"},
    {"--nccl-timeout", "S", F_FLOAT, AT(nccl_timeout), 0.1, 1e7, STRINGIFY(COMM_DEFAULT_TIMEOUT_S),
     "a rank that waits S seconds for the others (start-up, a collective) aborts the\n"
     "communicator and exits 1 naming the step and collective; while rank 0 writes a\n"
     "checkpoint or the export, 60 s + its size at 20 MB/s more"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL,
     "\nusage: trainer --bench [--preset A,B,..] [--seq T] [--batch B] [options]   (no shards needed)\n"
     "  times the training step on synthetic packed batches and prints, for each preset (default\n"
     "  bert-base,bert-large with the preset's vocabulary), the time per phase, tokens/s, MFU and the\n"
     "  planner's largest micro-batch; --batch picks the micro-batch run (default: that largest one);\n"
     "  --out DIR is needed only with several processes and --bootstrap file"},
    {"--bench", NULL, F_SWITCH, AT(bench), 0, 0, NULL, "time the training step (no --data, --out or --steps)"},
    {"--bench-steps", "N", F_INT, AT(bench_steps), 1, 1 << 20, "10", "timed steps"},
    {"--bench-warmup", "N", F_INT, AT(bench_warmup), 0, 1 << 20, "3", "untimed steps before them"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL,
     "\nusage: trainer --eval SRC --val GLOB [--batch B] [--seq T] [--val-batches N] [--out DIR]"},
    {"--eval", "SRC", F_STR, AT(eval), 0, 0, NULL,
     "evaluate SRC, a checkpoint file (DIR/checkpoint.bin) or a Hugging Face export\n"
     "directory (config.json + model.safetensors), on the validation shards as training\n"
     "validates, without training; prints \"eval: loss X | accuracy Y | N masked tokens\n"
     "in K sequences (...)\"; with --out it appends an \"eval\" record to\n"
     "DIR/metrics.jsonl. --seq defaults to the checkpoint's (an export: the shards'\n"
     "--seq-len). By default every validation sequence once, with the same masking as\n"
     "the run's validation at that --seq: the same sequences and masked tokens as the\n"
     "run's last validation, whatever --batch"},
};
enum { N_FLAGS = (int)(sizeof flags / sizeof flags[0]) };

// print_presets: every preset's shape and size (--help, after --preset).
static void print_presets(void) {
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
}

// usage: --help, from flags[]: each flag with its value's name, its text and its default; the presets' shapes
// after --preset.
static void print_devices(void) {
    printf("%22s", "");
    for (int i = 0; i < DEVICE_SPECS; i++)
        printf("%s%s (%g GB, %g TFLOP/s)", i ? (i % 3 ? ", " : ",\n                      ") : "", device_specs[i].name,
               device_specs[i].mem_gb, device_specs[i].tflops);
    printf("\n");
}
static void usage(void) {
    printf(
        "usage: trainer --data 'DIR/train_*.bin' --out DIR --steps N [options]\n"
        "  (srun -K ./trainer ... for several GPUs; ./trainer_cpu: the same program on the CPU, without a GPU)\n");
    for (int i = 0; i < N_FLAGS; i++) {
        const Flag* f = &flags[i];
        if (!f->name) {
            printf("%s\n", f->help);
            continue;
        }
        char head[64];
        snprintf(head, sizeof head, "%s%s%s", f->name, f->value ? " " : "", f->value ? f->value : "");
        if (strlen(head) > 19)
            printf("  %s\n%22s", head, "");  // a long name: its text on the next line
        else
            printf("  %-19s ", head);
        for (const char* s = f->help; *s; s++) {
            if (*s == '\n')
                printf("\n%22s", "");
            else
                putchar(*s);
        }
        if (f->def) printf(" (default %s)", f->def);
        printf("\n");
        if (!strcmp(f->name, "--preset")) print_presets();
        if (!strcmp(f->name, "--device")) print_devices();
    }
    printf(
        "signals: SIGTERM, SIGINT (Ctrl-C), SIGHUP, SIGUSR1 stop the run after the current micro-batch with a\n"
        "  checkpoint of the last complete step; one run per --out at a time (DIR/lock names the holder)\n"
        "exit codes: 0 done or stopped by a signal with a checkpoint; 1 bad input or an error; 2 diverged;\n"
        "  128+N a signal N (SIGTERM, SIGINT, SIGHUP, SIGUSR1) before step 1: no checkpoint or export was written\n");
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

// check_flag_combinations: flags that would be silently ignored (or undo each other) are an error instead.
static void check_flag_combinations(const Options* o) {
    const char* why = NULL;
    if (o->val_every && !o->val)
        why = "--val-every: needs --val GLOB (the validation shards)";
    else if (o->init_from && o->resume)
        why = "--init-from: not with --resume (the checkpoint holds the weights; drop --init-from)";
    else if (o->overwrite && o->resume)
        why = "--overwrite: not with --resume (--resume continues the run in --out, --overwrite replaces it)";
    if (why) {
        fprintf(stderr, "trainer: %s\n", why);
        exit(1);
    }
}

// check_comm_options: --comm onebit, --comm-warmup and --optimizer against the other flags (one line and exit 1).
static void check_comm_options(const Options* o) {
    const char* why = NULL;
    if (o->optimizer == OPT_LAMB && o->onebit)
        why =
            "--optimizer lamb with --comm onebit: 1-bit Adam freezes Adam's variance and compresses its momentum; "
            "1-bit LAMB is not implemented: use --comm fp32 or bf16 with lamb, or adamw with onebit";
    else if (o->comm_warmup && !o->onebit)
        why = "--comm-warmup: only with --comm onebit";
    else if (o->comm_refresh >= 0 && !o->onebit)  // (-1: not given)
        why = "--comm-refresh: only with --comm onebit";
    else if (o->onebit && o->zero)
        why =
            "--comm onebit with --zero 1: 1-bit Adam keeps the whole momentum and its error on every rank (no "
            "ZeRO-1 shards); use one of them";
    else if (o->onebit && o->bench)
        why = "--comm onebit: not with --bench (its steps are the fp32 warm-up's; time a short training run instead)";
    if (why) {
        fprintf(stderr, "trainer: %s\n", why);
        exit(1);
    }
}

// init_matches_preset: --preset beside --init-from must name the shape the checkpoint has (the weights decide
// it); a different one is an error instead of being ignored. 1 when it matches or was not given.
static int init_matches_preset(const Options* o, const BertConfig* c) {
    BertConfig p;
    if (!o->preset_given) return 1;
    if (bert_preset(o->preset, &p) && p.layers == c->layers && p.hidden == c->hidden && p.heads == c->heads &&
        p.intermediate == c->intermediate)
        return 1;
    fprintf(stderr,
            "trainer: --preset %s: --init-from %s holds another model (%d layers x %d, %d heads, FFN %d), whose shape "
            "is used; drop --preset\n",
            o->preset, o->init_from, c->layers, c->hidden, c->heads, c->intermediate);
    return 0;
}

// Test hook, for tests/test_stall.sh: MLM_TEST_STALL=STEP makes this rank's step-STEP collectives never
// complete, as a GPU that hangs or a peer that stops would: a kernel (stall_spin) spins on the stream of the
// step's first collective, ahead of it, until comm_die releases it through a flag in pinned host memory (or
// for --nccl-timeout + 60 s at most). Only the watchdog can end the run: every rank must exit 1 within
// --nccl-timeout plus a few seconds, naming the step. The flag is allocated before step 1 (stall_hook_init).
static void stall_hook_init(Comm* comm, const Options* o) {
    if (o->stall[0] <= 0) return;
    int* flag = NULL;
    CUDA_CHECK(cudaHostAlloc((void**)&flag, sizeof(int), cudaHostAllocMapped));
    *flag = 0;
    comm->release = flag;
}
static void stall_launch(Comm* comm, const Options* o, cudaStream_t s) {
    int* release = NULL;  // the kernel's view of the flag (the same address with unified addressing)
    CUDA_CHECK(cudaHostGetDevicePointer((void**)&release, (void*)comm->release, 0));
    fprintf(stderr, "trainer: rank %d: MLM_TEST_STALL: step %d's collectives stall\n", comm->rank, comm->step);
    long long max_cycles = (long long)((o->nccl_timeout + 60.0) * 2e9);  // clock64 ticks at most ~2 GHz
    launch(stall_spin, dim3(1), dim3(1), 0, s, (const volatile int*)release, max_cycles);
}

// resolve_comm_warmup: --comm onebit's warm-up once --steps is known: the default (ONEBIT_WARMUP_PERCENT of the
// steps, at least 1), and an error line when it is not below --steps.
static void resolve_comm_warmup(Options* o) {
    if (!o->onebit) return;
    int share = (int)((long long)o->steps * ONEBIT_WARMUP_PERCENT / 100);
    if (!o->comm_warmup) o->comm_warmup = share > 1 ? share : 1;
    if (o->comm_warmup >= o->steps) {
        fprintf(stderr,
                "trainer: --comm-warmup %d: the warm-up must end before the run's last step (--steps %d); give a "
                "smaller --comm-warmup or more steps\n",
                o->comm_warmup, o->steps);
        exit(1);
    }
}

// check_options: what the flags mean together: one line and exit 1 for a combination that cannot run (or
// would silently ignore a flag); then the mode's required flags; --comm onebit's warm-up; the test hooks.
static void check_options(Options* o) {
    const char* why = NULL;
    if (o->info)
        why = "--info: give it alone (trainer --info)";
    else if (o->device_mem > 0 && !o->plan_only)
        why = "--device-mem: only with --plan-only (a real run plans for its device)";
    else if (o->global_batch && o->accum_given)
        why = "--global-batch and --grad-accum are alternatives: give one of them";
    else if (o->global_batch && o->bench)
        why = "--global-batch: not with --bench; give --grad-accum";
    else if (o->optimizer == OPT_LAMB && o->zero)  // LAMB's trust ratios need each tensor's whole norms
        why =
            "--optimizer lamb: not with --zero 1 (its per-tensor trust ratios need whole tensors; ZeRO-1 splits them "
            "over the ranks)";
    else if (o->bench && o->grad_accum == 0)
        why = "--grad-accum auto: not with --bench; give a number";
    if (!why && o->device && !device_spec(o->device)) {
        fprintf(stderr, "trainer: --device %s: unknown; expected one of", o->device);
        for (int i = 0; i < DEVICE_SPECS; i++) fprintf(stderr, "%s %s", i ? "," : "", device_specs[i].name);
        fprintf(stderr, " (or its full name, as nvidia-smi -L prints it)\n");
        exit(1);
    }
    if (why) {
        fprintf(stderr, "trainer: %s\n", why);
        exit(1);
    }
    check_comm_options(o);
    if (o->bench) return;  // --bench needs no shards, output directory or step count
    if (o->eval) {         // --eval: only the evaluation's flags
        if (!o->val || o->data || o->steps || o->tokens || o->epochs || o->resume || o->init_from) {
            fprintf(stderr,
                    "trainer: --eval %s: needs --val GLOB and takes no --data, --steps, --tokens, --epochs, "
                    "--resume or --init-from (see --help)\n",
                    o->eval);
            exit(1);
        }
        return;
    }
    int lengths = (o->steps > 0) + (o->tokens > 0) + (o->epochs > 0);
    if (lengths > 1) {
        fprintf(stderr, "trainer: --steps, --tokens and --epochs are alternatives: give one of them\n");
        exit(1);
    }
    if (!o->plan_only && (!o->data || !o->out || !lengths)) {
        fprintf(stderr, "trainer: --data, --out and --steps (or --tokens, or --epochs) are required (see --help)\n");
        exit(1);
    }
    check_flag_combinations(o);
    if (o->steps > 0) resolve_comm_warmup(o);  // else after resolve_run_length
    test_hook_env("MLM_TEST_INF_GRAD", o->inf_grad);
    test_hook_env("MLM_TEST_INF_LOSS", o->inf_loss);
    test_hook_env("MLM_TEST_STALL", o->stall);
}

// find_flag: flags[]'s entry for the argument a (NULL: not a flag).
static const Flag* find_flag(const char* a) {
    for (int i = 0; i < N_FLAGS; i++)
        if (flags[i].name && !strcmp(flags[i].name, a)) return &flags[i];
    return NULL;
}

// choice: v if it is one of f->value's words ("tcp|file"), else exit 1 naming them ("expected tcp or file").
static const char* choice(const Flag* f, const char* v) {
    char words[128];
    snprintf(words, sizeof words, "%s", f->value);
    int n = 0;
    const char* w[8];
    for (char *save = NULL, *t = strtok_r(words, "|", &save); t && n < 8; t = strtok_r(NULL, "|", &save)) w[n++] = t;
    for (int i = 0; i < n; i++)
        if (!strcmp(w[i], v)) return v;
    fprintf(stderr, "trainer: %s %s: expected ", f->name, v);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", w[i], i + 2 < n ? ", " : i + 2 == n ? " or " : "\n");
    exit(1);
}

// read_flag: flag f's value v (NULL for a switch) into its field of o, or exit 1 with a line naming the flag,
// the value and what was expected.
static void read_flag(Options* o, const Flag* f, const char* v) {
    char* at = (char*)o + f->at;
    long long lo = (long long)f->lo, hi = (long long)f->hi;
    switch (f->kind) {
        case F_SWITCH:
            *(int*)at = 1;
            break;
        case F_STR:
            *(const char**)at = v;
            break;
        case F_CHOICE:
            *(const char**)at = choice(f, v);
            break;
        case F_INT:
            *(int*)at = (int)parse_int(f->name, v, lo, hi);
            break;
        case F_INT_AUTO:
            *(int*)at = !strcmp(v, "auto") ? 0 : (int)parse_int(f->name, v, lo, hi);
            break;
        case F_LL:
            *(long long*)at = parse_int(f->name, v, lo, hi);
            break;
        case F_FLOAT:
            *(float*)at = parse_float(f->name, v, f->lo, f->hi);
            break;
        case F_DOUBLE:
            *(double*)at = parse_float(f->name, v, f->lo, f->hi);
            break;
        case F_COUNT:
            *(long long*)at = parse_count(f->name, v);
            break;
    }
}

// parse_options: the defaults of flags[], then argv read by flags[], then the checks of what they mean together.
static Options parse_options(int argc, char** argv) {
    Options o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < N_FLAGS; i++)
        if (flags[i].def) read_flag(&o, &flags[i], flags[i].def);
    o.warmup = -1, o.alpha_us = -1, o.comm_refresh = -1;  // defaults resolved later (--steps; scaling.h; below)
    unsigned char given[N_FLAGS];
    memset(given, 0, sizeof given);
    for (int i = 1; i < argc; i++) {
        const Flag* f = find_flag(argv[i]);
        const char* v = NULL;
        if (!f) {
            fprintf(stderr, "trainer: %s: unknown flag (see --help)\n", argv[i]);
            exit(1);
        }
        if (f->kind == F_HELP) usage(), exit(0);
        if (f->kind != F_SWITCH) {
            if (i + 1 >= argc) {
                fprintf(stderr, "trainer: %s: missing its value (see --help)\n", argv[i]);
                exit(1);
            }
            v = argv[++i];
            if (v[0] == '-' && v[1] == '-') {  // `--out --resume`: a flag where the value should be
                fprintf(stderr, "trainer: %s: missing its value (got the flag %s; see --help)\n", argv[i - 1], v);
                exit(1);
            }
        }
        read_flag(&o, f, v);
        given[f - flags] = 1;
    }
    o.seq_given = given[find_flag("--seq") - flags], o.seed_given = given[find_flag("--seed") - flags];
    o.preset_given = given[find_flag("--preset") - flags], o.accum_given = given[find_flag("--grad-accum") - flags];
    o.grad_reduce_bf16 = !strcmp(o.comm, "bf16"), o.onebit_overlap = !strcmp(o.comm, "onebit-overlap");
    o.onebit = o.onebit_overlap || !strcmp(o.comm, "onebit");
    o.optimizer = !strcmp(o.optimizer_name, "lamb") ? OPT_LAMB : OPT_ADAMW;
    if (!o.preset) o.preset = o.bench ? "bert-base,bert-large" : "bert-base";
    check_options(&o);
    if (o.comm_refresh < 0) o.comm_refresh = o.onebit ? ONEBIT_REFRESH_DEFAULT : 0;
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
// or val_batches (--val-batches) when smaller (0 takes the whole split), rounded up to a multiple of the world's
// processes (a pass takes one micro-batch on each).
static long long validation_max_batches(const char* pattern, int val_batches, int B, int world) {
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
    if (val_batches > 0 && val_batches < batches) batches = val_batches;
    return (batches + world - 1) / world * world;
}
// plan_add_validation: validation's sums, one slot of 4 floats per micro-batch (see Validation) for at most
// validation_max_batches micro-batches.
static void plan_add_validation(Plan* p, int val_batches, const char* val_pattern, int world) {
    p->val_bytes = 4 * (size_t)validation_max_batches(val_pattern, val_batches, p->B, world) * sizeof(float);
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
    gr->bf16 = o->grad_reduce_bf16;  // onebit: only its refresh steps reduce in bf16 (train_step), with this staging
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
        snprintf(why, n, "%d tokens: %s's speed is unknown, and B=%d would fit; --batch N plans more", speed_rows * o->T,
                 device, p.B);
        p = make_plan(c, speed_rows, o->T, loaders, gr);
    }
    if (max_rows > 0 && p.B > max_rows) {
        snprintf(why, n, "the validation split's %lld rows a process", max_rows);
        p = make_plan(c, (int)max_rows, o->T, loaders, gr);
    }
    return p;
}

// ----------------------------------------------------------------------------
// Checkpoints. DIR/checkpoint.bin is the newest; with --keep K the K-1 before it stay beside it as
// DIR/checkpoint-STEP.bin. A checkpoint is written to DIR/checkpoint.bin.tmp, flushed to disk, and
// renamed over checkpoint.bin (which first gets its checkpoint-STEP.bin name as a hard link), so a
// crash at any moment leaves every earlier checkpoint intact. The file, little-endian:
//   header (CkptHeader) | master weights fp32 (numel) | AdamW m fp32 (numel) | AdamW v fp32 (numel)
//   | the floatX weights (numel; bf16 mode only: stochastic rounding made them, so they are state too)
//   | --comm onebit only: every rank's 1-bit Adam errors (compress.h: onebit_ckpt_bytes; header.onebit_world)
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
    int32_t x_bytes;             // sizeof(floatX) of the run that wrote it
    int32_t onebit_world;        // --comm onebit: the ranks whose 1-bit Adam errors follow the AdamW state; else 0
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
    double slowest_write_s;  // the slowest of rank 0's writes so far (every rank knows it: write_end)
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
    h.onebit_world = gr->onebit ? gr->onebit->world : 0;
    h.body_bytes += onebit_ckpt_bytes(h.numel, h.onebit_world);
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
    if (gr->zero) bert_zero_grad(m);                              // the gradient buffer was the staging area
    for (int q = 0; gr->onebit && q <= gr->onebit->world; q++) {  // every rank: the workers' errors, the servers'
        if (q < gr->onebit->world)
            onebit_fetch_worker(gr->onebit, gr->comm, q, m->grad, m->stream);
        else
            onebit_fetch_servers(gr->onebit, gr->comm, m->grad, m->stream);
        size_t n = m->p.numel * sizeof(float);
        for (size_t off = 0; ok && off < n; off += CKPT_CHUNK) {
            size_t k = n - off < CKPT_CHUNK ? n - off : CKPT_CHUNK;
            CUDA_CHECK(cudaMemcpy(buf, (const char*)m->grad + off, k, cudaMemcpyDeviceToHost));
            crc = crc32_update(crc, buf, k);
            if (!(ok = write_all(fd, buf, k))) why = errno;
        }
    }
    if (gr->onebit) bert_zero_grad(m);
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

// ckpt_first_nonfinite: the body offset of the first value in buf (k bytes at body offset pos) that is not a
// finite number (NaN, +-Inf), or UINT64_MAX. The body is 3 fp32 arrays of numel (master weights, AdamW m, v),
// then, when x_bytes is 2, the bf16 weights; chunks start at multiples of 4 bytes, so no value straddles two.
// What follows the weights (--comm onebit's error buffers, compress.h) is not weights, and is not checked.
static uint64_t ckpt_first_nonfinite(const CkptHeader* h, const unsigned char* buf, size_t k, uint64_t pos) {
    uint64_t fp32_end = 12 * h->numel;  // where the fp32 arrays end
    uint64_t weights_end = fp32_end + (h->x_bytes == 2 ? 2 * h->numel : 0);
    if (pos >= weights_end) return UINT64_MAX;
    if (k > weights_end - pos) k = (size_t)(weights_end - pos);
    for (size_t i = 0; i < k;) {
        if (pos + i < fp32_end) {
            uint32_t u;
            memcpy(&u, buf + i, 4);
            if ((u & 0x7F800000u) == 0x7F800000u) return pos + i;  // exponent all ones: Inf or NaN
            i += 4;
        } else {
            uint16_t u;
            memcpy(&u, buf + i, 2);
            if ((u & 0x7F80u) == 0x7F80u) return pos + i;  // bf16: the same exponent field
            i += 2;
        }
    }
    return UINT64_MAX;
}
// ckpt_describe_nonfinite: why a checkpoint with a non-finite value at body offset `off` is not intact.
static void ckpt_describe_nonfinite(const CkptHeader* h, uint64_t off, char* why, size_t n) {
    static const char* region[] = {"fp32 master weights", "AdamW m", "AdamW v", "bf16 weights"};
    uint64_t fp32_end = 12 * h->numel;
    int r = off < fp32_end ? (int)(off / (4 * h->numel)) : 3;
    uint64_t i = off < fp32_end ? off / 4 - r * h->numel : (off - fp32_end) / 2;
    snprintf(why, n, "its %s hold a value that is not finite (NaN or Inf) at element %llu of %llu: not intact",
             region[r], (unsigned long long)i, (unsigned long long)h->numel);
}

// ckpt_verify: 1 when path is an intact checkpoint: a regular file, whole, whose CRC matches and whose
// weights and AdamW state are all finite numbers (header in *h); else 0 and why.
static int ckpt_verify(const char* path, CkptHeader* h, char* why, size_t n) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);  // (a FIFO named like a checkpoint must not block: refused below)
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
    else if ((h->x_bytes != 2 && h->x_bytes != 4) ||
             h->body_bytes != h->numel * (12 + (h->x_bytes == 4 ? 0 : (uint64_t)h->x_bytes)) +
                                  onebit_ckpt_bytes(h->numel, h->onebit_world))
        snprintf(why, n, "its header is inconsistent: %llu body bytes for %llu parameters of %d-byte weights",
                 (unsigned long long)h->body_bytes, (unsigned long long)h->numel, h->x_bytes);
    else if (!(buf = (unsigned char*)malloc(CKPT_CHUNK)))
        snprintf(why, n, "out of host memory");
    else {
        uint32_t crc = crc32_update(0, h, sizeof *h), trailer[2];
        uint64_t left = h->body_bytes, bad = UINT64_MAX;  // bad: the body offset of the first non-finite value
        ok = 1;
        while (ok && left) {
            size_t k = left < CKPT_CHUNK ? (size_t)left : CKPT_CHUNK;
            ok = read_all(fd, buf, k);
            crc = crc32_update(crc, buf, k);
            if (ok && bad == UINT64_MAX) bad = ckpt_first_nonfinite(h, buf, k, h->body_bytes - left);
            left -= k;
        }
        if (!ok || !read_all(fd, trailer, sizeof trailer))
            ok = 0, snprintf(why, n, "read error: %s", strerror(errno));
        else if (trailer[0] != crc)
            ok = 0, snprintf(why, n, "checksum mismatch (stored %08x, computed %08x): corrupted", trailer[0], crc);
        else if (trailer[1] != 0)
            ok = 0, snprintf(why, n, "the 4 bytes after the CRC are %08x, not zero: corrupted", trailer[1]);
        else if (bad != UINT64_MAX)
            ok = 0, ckpt_describe_nonfinite(h, bad, why, n);
    }
    free(buf);
    close(fd);
    return ok;
}

// ckpt_layout_ok: whether the checkpoint's slab is laid out as this trainer lays out its configuration. Since
// 2026-11-24 the word embeddings take bert_vocab_rows(V) rows (a multiple of 8; before, V rows), so a checkpoint
// of a model with V % 8 != 0 saved before that is refused, with what to do instead.
static int ckpt_layout_ok(const CkptHeader* h, char* why, size_t n) {
    if (!bert_config_check(&h->cfg)) {  // (it says why on stderr)
        snprintf(why, n, "its model configuration is not one this trainer can run");
        return 0;
    }
    BertParams p;
    bert_params_build(&p, &h->cfg);
    size_t want = p.numel;
    bert_params_free(&p);
    if (h->numel == want) return 1;
    snprintf(why, n,
             "its parameter slab holds %llu elements, this trainer lays the model out in %zu (the word embeddings "
             "in %d rows, a multiple of 8, since 2026-11-24): saved by an older trainer; start from that run's "
             "export instead (--init-from DIR, DIR holding its model.safetensors)",
             (unsigned long long)h->numel, want, bert_vocab_rows(h->cfg.vocab_size));
    return 0;
}

// ckpt_check_run: an intact checkpoint that does not belong to this run (other model, --seq, precision,
// or a step beyond --steps) is an error: the flags are wrong, and an older checkpoint would lose work.
static void ckpt_check_run(const char* path, const CkptHeader* h, const BertModel* m, int steps) {
    const char* why = NULL;
    char buf[512];
    if (memcmp(&h->cfg, &m->cfg, sizeof h->cfg) || h->T != m->T) {
        snprintf(buf, sizeof buf,
                 "saved for another model or --seq (%d layers, hidden %d, vocab %d, T %d; this run: %d, %d, %d, %d)",
                 h->cfg.layers, h->cfg.hidden, h->cfg.vocab_size, h->T, m->cfg.layers, m->cfg.hidden, m->cfg.vocab_size,
                 m->T);
        why = buf;
    } else if (!ckpt_layout_ok(h, buf, sizeof buf)) {
        why = buf;
    } else if (h->x_bytes != (int32_t)sizeof(floatX) ||
               h->body_bytes != ckpt_body_bytes(m) + onebit_ckpt_bytes(h->numel, h->onebit_world)) {
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

// ckpt_load_onebit: the checkpoint's 1-bit Adam errors (h->onebit_world ranks' worth; read through for the CRC
// in any case): this rank's into gr->onebit when it runs --comm onebit on that many ranks (the servers' through
// the gradient buffer, every rank's by slab index); else its errors stay zero (rank 0 says why, when the
// checkpoint had errors or the run is past its warm-up). Gives 0 on a read error.
static int ckpt_load_onebit(int fd, BertModel* m, const GradReduce* gr, const CkptHeader* h, unsigned char* buf,
                            uint32_t* crc) {
    OneBit* ob = gr->onebit;
    int W = h->onebit_world, use = ob && W == ob->world;
    if (gr->comm->rank == 0 && ob && !use && (W || h->step > ob->warmup))
        printf("--resume: %s; 1-bit Adam starts from zero errors\n",
               W ? "the checkpoint's 1-bit Adam errors are for another number of ranks"
                 : "the checkpoint has no 1-bit Adam errors (written without --comm onebit)");
    for (int q = 0; W > 0 && q <= W; q++) {  // the workers' errors, then the servers' (q = W)
        size_t n = h->numel * sizeof(float);
        char* dst = !use ? NULL : q == W ? (char*)m->grad : q == gr->comm->rank ? (char*)ob->worker_err[ob->cur] : NULL;
        for (size_t off = 0; off < n; off += CKPT_CHUNK) {
            size_t k = n - off < CKPT_CHUNK ? n - off : CKPT_CHUNK;
            if (!read_all(fd, buf, k)) return 0;
            *crc = crc32_update(*crc, buf, k);
            if (dst) CUDA_CHECK(cudaMemcpy(dst + off, buf, k, cudaMemcpyHostToDevice));
        }
    }
    if (use) {
        onebit_take_servers(ob, m->grad, m->stream);
        bert_zero_grad(m);
    }
    return 1;
}

// ckpt_load: streams a verified checkpoint's body to the device (checking its CRC again on the way). Under
// ZeRO-1 a full array goes through the gradient buffer, and this rank keeps its shard of it.
static void ckpt_load(const char* path, BertModel* m, const GradReduce* gr, CkptHeader* h) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
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
    ok = ok && ckpt_load_onebit(fd, m, gr, h, buf, &crc);
    ok = ok && read_all(fd, trailer, sizeof trailer) && trailer[0] == crc;
    free(buf);
    if (fd >= 0) close(fd);
    if (!ok) {
        fprintf(stderr, "trainer: %s changed while it was being read\n", path);
        exit(1);
    }
    m->step = h->step;
}

// ckpt_candidates: the checkpoint files in dir, newest first, as --resume tries them: INT_MAX for
// checkpoint.bin (always listed: it may be missing), then the STEP of each checkpoint-STEP.bin, highest first.
// Gives their number (at most 1024).
static int ckpt_candidates(const char* dir, int cand[1024]) {
    int n = 0;
    cand[n++] = INT_MAX;
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
        int s, len = 0;  // (len stays 0 when the name does not match to its end: d_name[0] is not 0)
        if (sscanf(e->d_name, "checkpoint-%d.bin%n", &s, &len) == 1 && len && e->d_name[len] == 0 && s >= 0 && n < 1024)
            cand[n++] = s;
    }
    if (d) closedir(d);
    for (int i = 1; i < n; i++)  // insertion sort, highest step first
        for (int k = i; k > 1 && cand[k] > cand[k - 1]; k--) {
            int t = cand[k];
            cand[k] = cand[k - 1], cand[k - 1] = t;
        }
    return n;
}

// ckpt_note_diverged: after a resume from step `from`, a note when DIR holds a checkpoint that a divergence set
// aside at a later step (ckpt_set_aside): the run is about to replay the steps that led there.
static void ckpt_note_diverged(const char* dir, int from) {
    DIR* d = opendir(dir);
    struct dirent* e;
    int newest = -1;
    while (d && (e = readdir(d)) != NULL) {
        int s, len = 0;
        if (sscanf(e->d_name, "checkpoint-%d.bin.diverged%n", &s, &len) == 1 && len && e->d_name[len] == 0 &&
            s >= from && s > newest)
            newest = s;
    }
    if (d) closedir(d);
    if (newest >= 0)
        printf(
            "note: %s/checkpoint-%d.bin.diverged holds weights that diverged at step %d; from step %d the same "
            "flags and data replay the same steps (lower --lr to get past it)\n",
            dir, newest, newest + 1, from);
}

// resume_checkpoint: loads the newest intact checkpoint in ck->dir (checkpoint.bin, then checkpoint-STEP.bin
// from the highest STEP), saying which ones it skipped and why; restores the data position into train.
static void resume_checkpoint(Ckpts* ck, BertModel* m, const GradReduce* gr, DataLoader* train, int steps,
                              int verbose) {
    int cand[1024], n = ckpt_candidates(ck->dir, cand);
    char skipped[4096] = "", path[4400];
    for (int tried = 0; tried < n; tried++) {
        snprintf(path, sizeof path, "%s/checkpoint.bin", ck->dir);
        if (cand[tried] != INT_MAX) snprintf(path, sizeof path, "%s/checkpoint-%d.bin", ck->dir, cand[tried]);
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
            ckpt_note_diverged(ck->dir, h.step);
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
    int batches;            // micro-batches per pass (slots): the whole split's, or --val-batches' sample
    int steps;              // passes of one micro-batch per process
    long long all;          // micro-batches of B rows in the whole split (all ranks together)
    int sample;             // 1: the steps are a sample spread evenly over the split (--val-batches), 0: all of it
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
    long long all_steps = (all + comm->world - 1) / comm->world;
    v->all = all;
    v->sample = val_batches > 0 && val_batches < all;
    v->steps = (int)(v->sample ? (val_batches + comm->world - 1) / comm->world : all_steps);
    v->batches = v->steps * comm->world;
    if (v->sample && verbose)
        printf("validation: a sample of %d of the split's %lld micro-batches of B=%d rows, spread evenly over it (the "
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

// evaluate: the model on the validation micro-batches (forward only), all ranks: pass k of v->steps takes the
// world's micro-batches of global step k (the whole split), or of step k * all_steps / steps (a sample spread evenly
// over it); micro-batch pos * world + rank goes to this rank, its sums to slot k * world + rank.
static EvalResult evaluate(BertModel* m, Validation* v, BatchMaker* bm, Comm* comm) {
    int n = v->batches;
    float* samples = v->host + 3 * (size_t)n;  // this rank's sample counts, zero in the other ranks' slots
    memset(samples, 0, n * sizeof(float));
    long long all_steps = (v->all + comm->world - 1) / comm->world;
    for (int k = 0; k < v->steps; k++) {
        long long pos = v->sample ? k * all_steps / v->steps : k;
        int j = k * comm->world + comm->rank;
        if (pos * comm->world + comm->rank >= v->all) continue;  // past the split's last micro-batch
        if (k == 0 || v->sample) {  // the same batches every time: from the start, or from each sampled position
            DataLoaderState at = v->start;
            at.row = (uint64_t)(pos * comm->world * v->B);
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
        snprintf(buf + n, size - n, "%s%lld of the split's %lld sequences", e->sample ? "a sample spread over it, " : "",
                 e->samples, e->split);
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
static volatile sig_atomic_t stop_requested = 0, training = 0;
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
    signal(SIGXFSZ, SIG_IGN);
}

// make_out_dir: --out and its missing parents created, and a file written and removed there, so a
// directory the run could not write fails now, not at the first checkpoint. Gives 1, or 0 after an error.
#define OUT_MAX_LEN 4000  // --out's length: the run's file names (at most 64 characters) go under it, within PATH_MAX
static int make_out_dir(const char* dir) {
    char p[4096];
    if (strlen(dir) > OUT_MAX_LEN || !*dir) {
        fprintf(stderr,
                "trainer: --out '%.64s%s': expected a directory path of 1 to %d characters (this one has %zu)\n", dir,
                strlen(dir) > 64 ? "..." : "", OUT_MAX_LEN, strlen(dir));
        return 0;
    }
    snprintf(p, sizeof p, "%s", dir);
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
    // the test file's name is as long as the longest the run writes (64 characters), so a path too long fails now
    snprintf(p, sizeof p, "%s/.write_test.%010d.%.41s", dir, (int)getpid(),
             "0123456789012345678901234567890123456789x");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write_all(fd, "ok\n", 3) && fsync(fd) == 0, why = errno;
    if (fd >= 0) close(fd), unlink(p);
    if (!ok) fprintf(stderr, "trainer: --out %s: cannot write there: %s\n", dir, strerror(why));
    return ok;
}

// ----------------------------------------------------------------------------
// The run directory: one run per --out, and nothing of a finished run lost by a new one.
// - DIR/lock: every rank of a training run holds an fcntl write lock on one byte of it (rank r: byte r)
//   for the process's life, taken before the NCCL bootstrap; rank 0 writes "HOST PID JOB" into it. A second
//   launch into the same --out finds its bytes taken and stops with one line naming the holder, before it
//   could join the first launch's communicator (its ranks see the same launch tag). fcntl locks end with
//   their process, so a lock left by a dead run blocks nothing. (The one file written in place: replacing
//   it would lose the lock.) --eval, --bench and --plan-only take no lock: they do not write a run's files
//   (--eval --out appends one whole record to metrics.jsonl).
// - A new run (no --resume) into a directory that holds another run's checkpoints or export is refused unless
//   --overwrite, which deletes them once the new run is ready to write (run_dir_clear); the records of a run
//   that left no checkpoint are kept as metrics.jsonl.prev (run_dir_keep_metrics).
// - Every file the run will write must be a regular file or absent: a directory named checkpoint.bin fails at
//   the start, not after training.
// - DIR/run.json records the run's schedule; a resume that changes it says so in one line (run_schedule).
#define EXPORT_STAGING ".export.tmp"  // the export is written here whole, then renamed into --out (export_run)
static const char* const run_files[] = {
    "checkpoint.bin",        "checkpoint.bin.tmp",      "metrics.jsonl",        "metrics.jsonl.tmp",
    "metrics.jsonl.prev",    "model.safetensors",       "config.json",          "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "byte_tokenizer.json",  "run.json",
    "run.json.tmp",          "lock"};
#define RUN_NUM_FILES ((int)(sizeof run_files / sizeof run_files[0]))
// A run's results: a new run is refused where any is (or a checkpoint-STEP.bin). A metrics.jsonl alone (a run
// that never made a checkpoint: a requeued job starts again without --resume) is kept as metrics.jsonl.prev.
static const char* const run_results[] = {"checkpoint.bin", "model.safetensors", "config.json"};

// run_lock: this rank's byte of DIR/lock (see above). Gives the open descriptor (kept open: closing any
// descriptor of the file would drop the lock), or -1 after a message naming the holder.
static int run_lock(const char* dir, int rank) {
    char path[4200], line[512] = "";
    snprintf(path, sizeof path, "%s/lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "trainer: --out %s: cannot open %s: %s\n", dir, path, strerror(errno));
        return -1;
    }
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK, fl.l_whence = SEEK_SET, fl.l_start = rank, fl.l_len = 1;
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        if (errno == ENOLCK || errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS) {  // no locks there
            if (rank == 0)
                printf("note: cannot lock %s (%s): a second run into this --out would not be stopped\n", path,
                       strerror(errno));
            return fd;
        }
        struct flock who = fl;
        int pid = fcntl(fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK ? (int)who.l_pid : 0;
        ssize_t n = pread(fd, line, sizeof line - 1, 0);
        line[n > 0 ? n : 0] = 0;
        line[strcspn(line, "\n")] = 0;
        char host[256] = "?", job[128] = "?";
        int hpid = 0;
        if (sscanf(line, "%255s %d %127s", host, &hpid, job) != 3) snprintf(host, sizeof host, "?"), hpid = pid;
        fprintf(stderr,
                "trainer: --out %s: another run is using it: %s is held by pid %d on host %s (job %s); wait for it "
                "to end or stop it, or give another --out\n",
                dir, path, hpid, host, job);
        close(fd);
        return -1;
    }
    if (rank == 0) {
        char host[256] = "?", job[128] = "-";
        gethostname(host, sizeof host - 1);
        host[strcspn(host, " \n")] = 0;
        const char *id = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
        if (id && *id) snprintf(job, sizeof job, "%.60s%s%.60s", id, step && *step ? "." : "", step ? step : "");
        int k = snprintf(line, sizeof line, "%s %d %s\n", host, (int)getpid(), job);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)k, 0) != k)
            printf("note: cannot write the holder into %s: %s\n", path, strerror(errno));
    }
    return fd;
}

// run_dir_check: every file the run writes is a regular file or absent, and (without --resume or --overwrite)
// no other run's results are there. Every rank checks (they see the same directory). 1, or 0 after a message.
static int run_dir_check(const char* dir, const Options* o) {
    char path[4200], found[1024] = "";
    struct stat st;
    for (int i = 0; i < RUN_NUM_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, run_files[i]);
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            fprintf(stderr,
                    "trainer: --out %s: %s is %s, not a file: the run could not write it (remove or rename it)\n", dir,
                    path, S_ISDIR(st.st_mode) ? "a directory" : "a special file");
            return 0;
        }
    }
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, run_results[i]);
        if (stat(path, &st) == 0)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", *found ? ", " : "", run_results[i]);
    }
    int numbered = 0;
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
        int s, len;
        numbered += sscanf(e->d_name, "checkpoint-%d.bin%n", &s, &len) == 1 && e->d_name[len] == 0;
    }
    if (d) closedir(d);
    if (numbered && strlen(found) < 900)
        snprintf(found + strlen(found), sizeof found - strlen(found), "%s%d checkpoint-STEP.bin", *found ? ", " : "",
                 numbered);
    if (*found && !o->resume && !o->overwrite) {
        fprintf(stderr,
                "trainer: --out %s holds another run (%s): --resume continues it, --overwrite replaces it (deleting "
                "those files), or give another --out\n",
                dir, found);
        return 0;
    }
    return 1;
}

// remove_staging: the files in dir, then dir itself (the export's staging directory holds files only).
static void remove_staging(const char* dir) {
    DIR* d = opendir(dir);
    struct dirent* e;
    char p[4608];
    while (d && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

// run_dir_keep_metrics: a new run (no --resume, no --overwrite) in a directory whose metrics.jsonl holds records
// of a run that left no checkpoint keeps them as metrics.jsonl.prev (replacing an older one), and says so.
static void run_dir_keep_metrics(const char* dir) {
    char path[4200], prev[4300];
    struct stat st;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(prev, sizeof prev, "%s.prev", path);
    if (stat(path, &st) != 0 || st.st_size == 0) return;
    if (rename(path, prev) == 0)
        printf("note: %s held %lld bytes of records of an earlier run without a checkpoint: kept as %s\n", path,
               (long long)st.st_size, prev);
    else
        printf("note: cannot keep %s as %s (%s): a new log starts there\n", path, prev, strerror(errno));
}

// run_dir_clear: --overwrite: the earlier run's files deleted (rank 0, once the new run is ready to write).
static void run_dir_clear(const char* dir) {
    char path[4300];
    int n = 0;
    for (int i = 0; i < RUN_NUM_FILES; i++) {
        if (!strcmp(run_files[i], "lock")) continue;  // ours now
        snprintf(path, sizeof path, "%s/%s", dir, run_files[i]);
        n += unlink(path) == 0;
    }
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
        int s, len;
        if (sscanf(e->d_name, "checkpoint-%d.bin%n", &s, &len) == 1 && e->d_name[len] == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            n += unlink(path) == 0;
        }
    }
    if (d) closedir(d);
    snprintf(path, sizeof path, "%s/%s", dir, EXPORT_STAGING);
    remove_staging(path);
    fsync_dir(dir);
    if (n) printf("--overwrite: removed %d file(s) of the earlier run in %s\n", n, dir);
}

// run_schedule: writes DIR/run.json (atomically) with this run's schedule; on --resume first compares it with
// the one there and says in one line what this resume changes (the learning rate follows the new schedule).
// Rank 0.
static void json_str(FILE* f, const char* key, const char* v);
static void run_schedule(const char* dir, const Options* o, int world, int B, int vocab, int from_step) {
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    long long gb = (long long)world * o->grad_accum * B;
    if (o->resume) {
        size_t n = 0;
        char* old = bert_read_file(path, &n);
        const char* keys[] = {"steps", "warmup", "lr", "global_batch"};
        double now[] = {(double)o->steps, (double)o->warmup, (double)o->lr, (double)gb};
        const char* names[] = {"--steps", "--warmup", "--lr", "the global batch (sequences)"};
        char what[512] = "";
        for (int i = 0; old && i < 4; i++) {
            char key[64];
            snprintf(key, sizeof key, "\"%s\": ", keys[i]);
            const char* at = strstr(old, key);
            double was = at ? atof(at + strlen(key)) : now[i];
            if (fabs(was - now[i]) > 1e-6 * fabs(now[i]) && strlen(what) < 400)
                snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s %g -> %g", *what ? ", " : "", names[i],
                         was, now[i]);
        }
        if (*what) printf("note: this resume changes the schedule from step %d on: %s\n", from_step + 1, what);
        free(old);
    }
    // (and what the run trains, for tools/plot.py's title: the preset or --init-from, the shards, the vocabulary)
    char* buf = NULL;
    size_t k = 0;
    FILE* f = open_memstream(&buf, &k);
    if (!f) return;
    fprintf(f,
            "{\"steps\": %d, \"warmup\": %d, \"lr\": %.9g, \"global_batch\": %lld, \"world\": %d, "
            "\"grad_accum\": %d, \"batch\": %d, \"seq\": %d, \"vocab_size\": %d",
            o->steps, o->warmup, o->lr, gb, world, o->grad_accum, B, o->T, vocab);
    json_str(f, "preset", o->init_from ? o->init_from : o->preset);
    json_str(f, "data", o->data);
    fprintf(f, "}\n");
    fclose(f);
    if (!bert_write_file(path, buf, k, NULL, 0)) printf("note: %s not written (see above)\n", path);
    free(buf);
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

// zero_adamw_step: bert_adamw_step on this rank's pieces of every bucket (ZeRO-1).
static void zero_adamw_step(BertModel* m, const GradReduce* gr, const Options* o, float lr) {
    m->step++;
    for (int i = 0; i < gr->n; i++) {
        size_t off, n;
        grad_reduce_piece(gr, &gr->b[i], gr->comm->rank, &off, &n);
        if (n) bert_adamw_range(m, off, n, gr->b[i].state_off, lr, o->beta1, o->beta2, o->eps, o->wd, o->clip);
    }
}

// onebit_refresh_step: an AdamW step of the averaged gradient (m, v updated) whose v update is lazy: v decays by
// b2^K (the K steps since its last update) and bc2 = 1 - b2^t (compress.h: onebit_refresh_update).
static void onebit_refresh_step(BertModel* m, const OneBit* ob, const Options* o, float lr) {
    m->step++;
    onebit_refresh_update(ob, m->stream, m->step, m->master, m->w, m->grad, m->adam_m, m->adam_v, m->p.n_decay, m->norm,
                          lr, o->beta1, o->beta2, o->eps, o->wd, o->clip);
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

// onebit_local_sumsq: acc[0] += the sum of squares of this rank's own (not averaged) gradient (--comm onebit
// after its warm-up, where the averaged gradient is never formed).
static void onebit_local_sumsq(BertModel* m, float* acc) {
    launch(grad_norm_partial, dim3(launch_grid_cap()), dim3(256), 0, m->stream, m->norm_partial, (const float*)m->grad,
           m->p.numel);
    launch(accumulate_sum, dim3(1), dim3(256), 0, m->stream, acc, (const float*)m->norm_partial, launch_grid_cap());
}

// Under --comm onebit (gr->onebit), after its warm-up a step reduces no gradient: the norm (for the log, clipping
// and the non-finite check) is sqrt(mean over ranks of |g_r|^2), from the ranks' local sums of squares in the
// step's one all-reduce; then onebit_step_forward exchanges the clipped momentum part by part and updates the
// weights on the communication stream, under the next step's forward (compress.h). --comm onebit-overlap launches
// the parts while the last backward runs, as the fp32 buckets are reduced, and clips at the update.
static StepResult train_step(BertModel* m, DataLoader* train, BatchMaker* bm, GradReduce* gr, float* scratch,
                             const Options* o, float lr, int want_ckpt) {
    StepResult r;
    memset(&r, 0, sizeof r);
    Comm* comm = gr->comm;
    uint64_t sent0 = comm->sent;
    OneBit* ob = gr->onebit;
    int compressed = ob && m->step + 1 > ob->warmup && !onebit_is_refresh(ob, m->step + 1);
    int overlap = compressed && o->onebit_overlap;  // the parts leave during the backward, before the norm is known
    // a --comm-refresh step reduces the gradients in bf16 (half fp32's bytes, on the step that costs onebit most)
    gr->bf16 = o->grad_reduce_bf16 || (ob && m->step + 1 > ob->warmup && !compressed);
    int stop_pending = 0;      // a stop agreement in flight (stop_agreed)
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
    bert_phase(m, PHASE_ALLREDUCE);
    if (test_hook_on(o->stall, m->step + 1)) stall_launch(comm, o, comm->world > 1 ? gr->stream : m->stream);
    if (overlap) {
        onebit_launch(ob, gr, m->step + 1, m->grad, m->adam_m, m->adam_v, o->beta1, o->beta2, o->eps, 1.f);
        onebit_wait(gr, m->stream);
    } else if (!compressed) {
        grad_reduce_launch(gr, m->grad);
        grad_reduce_wait(gr, m->stream);
    }
    static const float inf = INFINITY;  // the test hooks' poison
    if (test_hook_on(o->inf_grad, m->step + 1))
        CUDA_CHECK(cudaMemcpyAsync(m->grad, &inf, sizeof inf, cudaMemcpyHostToDevice, m->stream));
    if (test_hook_on(o->inf_loss, m->step + 1))
        CUDA_CHECK(cudaMemcpyAsync(scratch, &inf, sizeof inf, cudaMemcpyHostToDevice, m->stream));
    bert_phase(m, PHASE_OPTIM);
    if (compressed)
        onebit_local_sumsq(m, scratch + S_SUMSQ);
    else if (gr->zero)
        zero_grad_sumsq(gr, m->grad, m->norm_partial, scratch + S_SUMSQ, m->stream);
    else
        bert_grad_norm(m);
    // The one host sync of the step, before the update: over all ranks the loss sum, masked count, stop and
    // checkpoint requests, and under ZeRO-1 the gradients' sum of squares; else the norm of the averaged
    // gradient, the same on every rank. A loss or norm that is not finite skips the update: the weights and
    // AdamW moments stay as they were (the step still counts: its batches are consumed and the schedule moves on).
    // This rank's real tokens go in two parts (/ 4096, % 4096), so that each float sum stays an exact integer.
    float stop = stop_requested ? 1.f : 0.f, ckpt = want_ckpt ? 1.f : 0.f, *h = bm->host, *norm = bm->host + S_STEP_N;
    float tok[2] = {(float)(r.tokens / 4096), (float)(r.tokens % 4096)};
    if (!gr->zero && !compressed)
        CUDA_CHECK(cudaMemcpyAsync(norm, m->norm, sizeof *norm, cudaMemcpyDeviceToHost, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_STOP, &stop, sizeof stop, cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_CKPT, &ckpt, sizeof ckpt, cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(scratch + S_TOK_HI, tok, sizeof tok, cudaMemcpyHostToDevice, m->stream));
    all_ranks_sum(comm, scratch, S_STEP_N, h, m->stream, "step loss AllReduce (the step's host sync)");
    if (!gr->zero && !compressed) r.norm = *norm;  // pinned: complete after the sync
    if (compressed) r.norm = sqrtf(h[S_SUMSQ] / (float)comm->world);
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
    } else if (compressed) {
        float clip = o->clip > 0.f && r.norm > o->clip ? o->clip / r.norm : 1.f;  // --clip's factor
        if (overlap)
            onebit_update(ob, m->stream, m->step + 1, m->master, m->w, m->adam_m, m->adam_v, m->p.n_decay, lr, o->beta1,
                          o->beta2, o->eps, o->wd, clip);
        else  // the parts leave now, clipped, and update the weights under the next step's forward
            onebit_step_forward(ob, gr, m->step + 1, m->grad, m->master, m->w, m->adam_m, m->adam_v, m->p.n_decay, lr,
                                o->beta1, o->beta2, o->eps, o->wd, clip);
        m->step++;
    } else if (gr->zero) {
        zero_adamw_step(m, gr, o, lr);
        zero_allgather(gr, m->w, m->stream);
    } else if (ob && m->step + 1 > ob->warmup) {  // --comm-refresh: an fp32 step updates the frozen v
        onebit_refresh_step(m, ob, o, lr);
    } else if (o->optimizer == OPT_LAMB) {
        bert_lamb_step(m, lr, o->beta1, o->beta2, o->eps, o->wd, o->clip);
    } else {
        bert_adamw_step(m, lr, o->beta1, o->beta2, o->eps, o->wd, o->clip);
    }
    if (!compressed || overlap || r.skipped) bert_zero_grad(m);  // else onebit_step_forward zeroes them
    bert_phase(m, PHASE_END);
    r.comm_bytes = comm->sent - sent0;
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
// bench_data: --bench's synthetic shard (random tokens, written to a temporary directory, mapped and deleted at
// once) and its loader, for every step: 10% more than the rows needed (packing leaves a few percent empty), so
// that no epoch ends inside the benchmark; --loader-threads auto: 2 threads (the benchmark times the GPU). 1, or 0
// after saying why.
static int bench_data(const Options* o, const Comm* comm, const BertConfig* cfg, int B, DataLoader* train) {
    int T = o->T;
    char dir[4096], err[DATA_ERR_LEN] = "";
    const char* tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/mlm_bench_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "trainer: --bench: cannot create a temporary directory %s: %s\n", dir, strerror(errno));
        return 0;
    }
    size_t rows = (size_t)(o->bench_warmup + 2 * o->bench_steps) * o->grad_accum * comm->world * B;
    size_t tokens = (size_t)(1.1 * rows * T) + 64 * (size_t)T;
    char pattern[4200], path[4200];
    snprintf(pattern, sizeof pattern, "%s/bench_*.bin", dir);
    snprintf(path, sizeof path, "%s/bench_00000.bin", dir);
    DataLoaderConfig dcfg = dataloader_default_config(pattern, B, T);
    dcfg.rank = comm->rank, dcfg.world = comm->world, dcfg.num_threads = o->loader_threads ? o->loader_threads : 2;
    dcfg.ring_slots = o->ring_slots, dcfg.seed = (uint64_t)o->seed, dcfg.vocab_size = cfg->vocab_size;
    dcfg.verbose = comm->rank == 0;
    int rc =
        bench_write_shard(dir, cfg->vocab_size, T, tokens, (uint64_t)o->seed, err) ? -1 : dataloader_init(train, &dcfg);
    if (rc) fprintf(stderr, "trainer: --bench: %s\n", err[0] ? err : train->error);
    unlink(path);  // the loader keeps its mapping: nothing is left on disk
    rmdir(dir);
    return rc == 0;
}

// bench_print: rank 0's table of one preset's --bench figures, and its machine-readable bench-result line.
static void bench_print(const Options* o, const char* preset, const BenchResult* res, const Plan* largest,
                        size_t free_bytes, int world, double flops_token, double peak_tflops, const char* device) {
    double sum = 0;
    for (int p = 0; p < PHASE_END; p++) sum += res->phase_ms[p];
    char mfu[64];
    mfu_text(mfu, sizeof mfu, res->tokens_per_s / world * flops_token, peak_tflops);
    printf(
        "bench %s: T=%d, B=%d (the planner's largest: %d), %d process(es) x %d micro-batch(es) per step, %s, "
        "%d + %d steps\n",
        preset, o->T, res->B, largest->B, world, o->grad_accum, FLOATX_NAME, o->bench_warmup, o->bench_steps);
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
    printf("  %-34s %10d  (plan %.3f GiB of %.3f GiB free)\n", "largest micro-batch (planner)", largest->B,
           largest->total / (double)(1 << 30), free_bytes / (double)(1 << 30));
    printf("bench-result preset=%s T=%d batch=%d max_batch=%d world=%d tokens_per_s=%.0f step_ms=%.3f mfu=", preset,
           o->T, res->B, largest->B, world, res->tokens_per_s, res->step_ms);
    if (res->mfu >= 0)
        printf("%.4f", res->mfu);
    else
        printf("na");
    printf(" device=\"%s\"\n", device);
    fflush(stdout);
}

// choose_attention: the attention kernels this device runs. The wgmma ones (attention.cuh: Hopper's warpgroup MMA,
// at cuDNN's speed on an H200, 1.46x the mma.sync ones forward + backward) where they can: bf16 storage, compute
// capability 9.0 and head size 64 (the forward alone also at 128); the mma.sync ones, which run on any GPU,
// elsewhere. (The CPU runtime reports compute capability 8.0 unless EMU_COMPUTE_CAPABILITY says 9.0: there the
// mma.sync kernels are the faster, emulated.)
static void choose_attention(BertModel* m, const cudaDeviceProp* prop, int main_rank) {
    int hd = m->cfg.hidden / m->cfg.heads, hopper = sizeof(floatX) == 2 && prop->major == 9 && prop->minor == 0;
    m->att_wgmma = !hopper ? 0 : hd == 64 ? ATT_WG_ALL : hd == 128 ? ATT_WG_FWD : 0;
    if (main_rank)
        printf("attention: %s, %s (%s, head size %d)\n",
               m->att_wgmma & ATT_WG_FWD ? "attention_forward_wgmma" : "attention_forward",
               m->att_wgmma & ATT_WG_DQ ? "attention_backward_dq_wgmma, attention_backward_dkdv_wgmma"
                                        : "attention_backward_dq, attention_backward_dkdv",
               prop->name, hd);
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

    DataLoader train;
    if (!bench_data(o, comm, &cfg, B, &train)) return 1;

    // The model and the batch buffers, as in training.
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    BertModel model;
    if (!bert_alloc_sharded(&model, &cfg, B, T, plan.M, stream, gr->zero ? gr->state_numel : 0, gr->slack)) return 1;
    choose_attention(&model, prop, main_rank);
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
    comm_wait(comm, stream, "benchmark sync");  // the ZeRO-1 AllGather may be in flight
    double t0 = now_s();
    for (int i = 0; i < o->bench_steps; i++)
        tokens_done += train_step(&model, &train, &bm, gr, scratch, o, o->lr, 0).tokens;
    comm_wait(comm, stream, "benchmark sync");
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

    if (main_rank) bench_print(o, preset, res, &largest, free_bytes, comm->world, flops_token, peak_tflops, prop->name);
    dataloader_free(&train);
    cudaFree(bm.seg_lo);
    cudaFreeHost(bm.host);
    cudaEventDestroy(bm.stop_ev);
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
//   {"kind":"val","step":S,"tokens":N,"elapsed_s":X,"val_loss":X,"val_accuracy":X,"val_masked":M,
//    "val_sequences":K,"val_split":Z}
//   {"kind":"eval","step":S,"source":"PATH","val_loss":X,"val_accuracy":X,"val_masked":M,"val_sequences":K,
//    "val_split":Z}                                                                 --eval --out
// val_sequences: the validation sequences evaluated; val_split: those in the split (equal: all of them, once).
// tokens: real tokens trained on by all ranks so far (the checkpoint keeps the count); epoch: tokens /
// the tokens in the training shards; elapsed_s: wall clock since the run started, continued across
// resumes; mfu: a fraction, null when the device's peak is unknown (the CPU).
// DIR/metrics.jsonl, appended one whole record at a time (metrics_append).
typedef struct {
    int fd;             // opened for appending; -1: none (not rank 0)
    int broken;         // a failed write could not be cut off: nothing more is appended
    int failing_since;  // the step of the first record lost since the last one written; 0: none
    long long lost;     // records lost to write errors in this process
    int fail_hook[2];   // test hook MLM_TEST_METRICS_FAIL=FIRST[:COUNT]: those steps' writes fail halfway (ENOSPC)
    char path[4200];
} MetricsFile;

typedef struct {
    MetricsFile* f;             // DIR/metrics.jsonl (rank 0), or NULL
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

// metrics_cut_partial: a last line without its newline (a writer killed in the middle of a record) is cut off,
// so that the next record does not continue it: the file holds whole lines only.
static void metrics_cut_partial(const MetricsFile* mf) {
    struct stat st;
    char buf[4096];
    if (fstat(mf->fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return;
    off_t at = st.st_size, keep = 0;  // keep: the length up to and with the last newline
    while (at > 0 && keep == 0) {
        size_t n = at < (off_t)sizeof buf ? (size_t)at : sizeof buf;
        at -= (off_t)n;
        if (pread(mf->fd, buf, n, at) != (ssize_t)n) return;
        for (size_t i = n; i-- > 0 && keep == 0;)
            if (buf[i] == '\n') keep = at + (off_t)i + 1;
    }
    if (keep == st.st_size) return;
    if (ftruncate(mf->fd, keep) == 0)
        printf("note: %s ended in a partial record (%lld bytes: its writer stopped in the middle): cut off\n", mf->path,
               (long long)(st.st_size - keep));
}

// metrics_open: opens DIR/metrics.jsonl for appending. With rewrite, first rewrites the file (a temporary
// file, flushed, renamed) without the records of steps after keep_step and without a partial last line:
// a resumed run (keep_step = its checkpoint's step) never repeats a step, and a new run (-1) starts a new
// log. elapsed0 gets the last kept training record's elapsed_s. Gives 1, or 0 with a message, on failure.
static int metrics_open(MetricsFile* mf, const char* dir, int rewrite, int keep_step, double* elapsed0) {
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
            return 0;
        }
    }
    memset(mf, 0, sizeof *mf);
    snprintf(mf->path, sizeof mf->path, "%s", path);
    test_hook_env("MLM_TEST_METRICS_FAIL", mf->fail_hook);
    mf->fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (mf->fd < 0) fprintf(stderr, "trainer: cannot append to %s: %s\n", path, strerror(errno));
    if (mf->fd >= 0) metrics_cut_partial(mf);
    return mf->fd >= 0;
}

// metrics_record: a memory stream to build one record in (NULL when out of memory); metrics_append writes it.
static FILE* metrics_record(char** buf, size_t* len) {
    *buf = NULL, *len = 0;
    return open_memstream(buf, len);
}

// metrics_append: the record built in rec appended with one write. A failed write (a full disk, a file size
// limit) is cut off again (the file back to its length before), so the file never holds a torn line in the
// middle; the first failure is reported in one line, the run goes on, later records are tried again, and when
// one can be written again the log says which steps are missing. Gives 1 when the record was written.
static int metrics_append(MetricsFile* mf, FILE* rec, char** buf, size_t* len, int step) {
    int ok = rec != NULL && fclose(rec) == 0, why = ENOMEM;
    if (mf->broken) {
        free(*buf);
        return 0;
    }
    off_t end = lseek(mf->fd, 0, SEEK_END);
    if (ok && test_hook_on(mf->fail_hook, step)) {  // the test hook: half the record, then a full disk
        ssize_t half = write(mf->fd, *buf, *len / 2);
        (void)half;
        ok = 0, why = ENOSPC;
    } else if (ok && !write_all(mf->fd, *buf, *len)) {
        ok = 0, why = errno;
    }
    free(*buf);
    *buf = NULL;
    if (ok) {
        if (mf->failing_since)
            fprintf(stderr,
                    "trainer: step %d: %s is written again; the records of steps %d to %d are missing from it\n", step,
                    mf->path, mf->failing_since, step - 1);
        mf->failing_since = 0;
        return 1;
    }
    mf->lost++;
    if (end < 0 || ftruncate(mf->fd, end) != 0) {
        mf->broken = 1;
        fprintf(stderr,
                "trainer: step %d: cannot append to %s (%s), nor cut the partial record off (%s): no more records are "
                "written there; the run goes on\n",
                step, mf->path, strerror(why), strerror(errno));
        return 0;
    }
    if (!mf->failing_since)
        fprintf(stderr,
                "trainer: step %d: cannot append to %s: %s; the record is left out whole and the run goes on "
                "(the next records are tried again)\n",
                step, mf->path, strerror(why));
    if (!mf->failing_since) mf->failing_since = step;
    return 0;
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
        char mfu[64] = "", comm[48] = "", el[32], et[32];  // (MFU where the device's peak is known; the bytes
        if (peak_tflops > 0) {                            // sent where there is another process)
            mfu[0] = ' ', mfu[1] = '|', mfu[2] = ' ';
            mfu_text(mfu + 3, sizeof mfu - 3, tps / world * flops_token, peak_tflops);
        }
        if (world > 1) snprintf(comm, sizeof comm, " | comm_bytes %llu", (unsigned long long)r->comm_bytes);
        printf(
            "step %6d/%d | loss %.4f | lr %.3e | norm %.3f | %.0f ms | %.0f tok/s%s | data wait %.1f ms%s | "
            "epoch %.3f | elapsed %s | ETA %s\n",
            step, o->steps, r->loss, lr_at(o, step), r->norm, dt * 1e3, tps, mfu, r->wait_ms, comm, epoch,
            fmt_duration(el, sizeof el, elapsed), fmt_duration(et, sizeof et, eta));
        fflush(stdout);
        char* buf;
        size_t len;
        FILE* f = lg->f ? metrics_record(&buf, &len) : NULL;
        if (f) {
            fprintf(f, "{\"kind\":\"train\",\"step\":%d,\"tokens\":%lld", step, lg->tokens);
            json_num(f, "epoch", epoch);
            json_num(f, "elapsed_s", elapsed);
            json_num(f, "loss", r->loss);
            json_num(f, "lr", lr_at(o, step));
            json_num(f, "grad_norm", r->norm);
            json_num(f, "tokens_per_s", tps);
            json_num(f, "mfu", peak_tflops > 0 ? tps / world * flops_token / (peak_tflops * 1e12) : NAN);
            json_num(f, "data_wait_ms", r->wait_ms);
            fprintf(f, ",\"comm_bytes\":%llu", (unsigned long long)r->comm_bytes);
            json_end(f);
        }
        if (lg->f) metrics_append(lg->f, f, &buf, &len, step);
    }
    if (bm->dropped) {
        printf("note: %lld masked positions above the cap M=%d were left out of the loss\n", bm->dropped, bm->M);
        bm->dropped = 0;
    }
}
// log_validation: the validation line and its metrics.jsonl record. Rank 0.
static void log_validation(const RunLog* lg, int step, const EvalResult* e) {
    char cov[160];
    printf("step %6d | val loss %.4f | accuracy %.4f | %lld masked tokens in %lld sequences (%s)\n", step, e->loss,
           e->accuracy, e->masked, e->samples, validation_coverage(e, cov, sizeof cov));
    fflush(stdout);
    if (!lg->f) return;
    char* buf;
    size_t len;
    FILE* f = metrics_record(&buf, &len);
    if (f) {
        fprintf(f, "{\"kind\":\"val\",\"step\":%d,\"tokens\":%lld", step, lg->tokens);
        json_num(f, "elapsed_s", lg->elapsed0 + now_s() - lg->t_start);
        json_num(f, "val_loss", e->loss);
        json_num(f, "val_accuracy", e->accuracy);
        fprintf(f, ",\"val_masked\":%lld,\"val_sequences\":%lld,\"val_split\":%lld", e->masked, e->samples, e->split);
        json_end(f);
    }
    metrics_append(lg->f, f, &buf, &len, step);
}
// ckpt_set_aside: after a divergence whose streak of non-finite steps ran from first_bad to last, the
// checkpoints of steps first_bad-1 .. last hold the weights that gave those steps (a skipped step changes
// nothing, so every step of the streak ran on the weights of step first_bad-1): each is renamed
// DIR/checkpoint-STEP.bin.diverged, out of --resume's way (kept to inspect). Writes into buf what was set aside
// and the checkpoint --resume takes now: the newest intact one left, or that there is none.
static const char* ckpt_set_aside(const Ckpts* ck, int first_bad, int last, char* buf, size_t n) {
    int cand[1024], k = ckpt_candidates(ck->dir, cand), aside = 0;
    char path[4400], to[4500], why[256];
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < k; i++) {
        snprintf(path, sizeof path, "%s/checkpoint.bin", ck->dir);
        if (cand[i] != INT_MAX) snprintf(path, sizeof path, "%s/checkpoint-%d.bin", ck->dir, cand[i]);
        CkptHeader h;
        int fd = open(path, O_RDONLY | O_NONBLOCK);
        struct stat st;
        int got = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && read_all(fd, &h, sizeof h) &&
                  !memcmp(h.magic, CKPT_MAGIC, 8);
        if (fd >= 0) close(fd);
        if (!got || h.step < first_bad - 1 || h.step > last) continue;
        snprintf(to, sizeof to, "%s/checkpoint-%d.bin.diverged", ck->dir, h.step);
        if (rename(path, to) != 0) {
            len += snprintf(buf + len, len < n ? n - len : 0,
                            "%scannot set aside %s (step %d): %s (move it away before --resume)", len ? "; " : "", path,
                            h.step, strerror(errno));
            continue;
        }
        aside++;
        len += snprintf(buf + len, len < n ? n - len : 0, "%s%s (step %d) set aside as %s", len ? "; " : "", path,
                        h.step, to);
    }
    if (aside) fsync_dir(ck->dir);
    if (len) len += snprintf(buf + len, len < n ? n - len : 0, ", its weights gave step %d; ", first_bad);
    k = ckpt_candidates(ck->dir, cand);
    for (int i = 0; i < k; i++) {
        snprintf(path, sizeof path, "%s/checkpoint.bin", ck->dir);
        if (cand[i] != INT_MAX) snprintf(path, sizeof path, "%s/checkpoint-%d.bin", ck->dir, cand[i]);
        CkptHeader h;  // (one that could not be renamed is not named here either)
        if (!ckpt_verify(path, &h, why, sizeof why) || (h.step >= first_bad - 1 && h.step <= last)) continue;
        snprintf(buf + len, len < n ? n - len : 0,
                 "the newest intact checkpoint is %s (step %d): --resume continues from it (the same flags replay "
                 "the same steps: lower --lr first)",
                 path, h.step);
        return buf;
    }
    if (!len && ck->step < 0)
        snprintf(buf, n, "this run has written no checkpoint");
    else
        snprintf(buf + len, len < n ? n - len : 0, "no intact checkpoint is left in %s", ck->dir);
    return buf;
}

// diverged: --max-bad-steps steps in a row, the last of them `step`, were skipped: sets aside the checkpoints
// holding the weights that gave them (ckpt_set_aside) and says what is left. Gives exit code 2.
static int diverged(const Options* o, const Ckpts* ck, int step, int bad_steps, int main_rank) {
    char what[9000];
    if (main_rank)
        fprintf(stderr, "trainer: diverged: %d steps in a row (--max-bad-steps %d); stopping, exit code 2: %s\n",
                bad_steps, o->max_bad_steps, ckpt_set_aside(ck, step - bad_steps + 1, step, what, sizeof what));
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

// Rank 0's writes and the others' deadline. Rank 0 alone writes the checkpoints and the export while the
// other ranks wait for it in a collective; their watchdog must not take a slow file system for a dead rank.
// So around a write every rank's deadline is --nccl-timeout plus the write's allowance (write_begin), and
// after it the ranks meet in an agreement under that deadline (write_end), which also tells every rank
// whether the write succeeded (if not, all stop together) and how long it took. The allowance: 60 s, plus
// the bytes at 20 MB/s (a slow shared file system), plus 4 times the slowest write so far.
typedef struct {
    double t0;         // when the write began
    double timeout_s;  // the deadline to restore (--nccl-timeout)
} WriteWatch;

static WriteWatch write_begin(Comm* comm, const Ckpts* ck, double bytes) {
    WriteWatch w = {now_s(), comm->timeout_s};
    comm->timeout_s += 60.0 + bytes / 20e6 + 4.0 * ck->slowest_write_s;
    return w;
}

// write_end: every rank, after rank 0's write (ok: its result there; any value elsewhere). Gives 1 when
// rank 0's write succeeded. Test hook (tests/test_launch.sh): MLM_TEST_SLOW_WRITE_S=S makes rank 0's
// writes take S seconds longer.
static int write_end(Comm* comm, Ckpts* ck, WriteWatch w, int ok) {
    const char* slow = getenv("MLM_TEST_SLOW_WRITE_S");
    if (comm->rank == 0 && slow) comm_sleep_s(atof(slow));
    CommValue v[2] = {
        {"the write failed", comm->rank == 0 && !ok, 0, 0},
        {"milliseconds rank 0's write took", comm->rank == 0 ? (int64_t)((now_s() - w.t0) * 1e3) : 0, 0, 0}};
    comm_agree(comm, v, 2);
    comm->timeout_s = w.timeout_s;
    if (v[1].max / 1e3 > ck->slowest_write_s) ck->slowest_write_s = v[1].max / 1e3;
    return v[0].max == 0;
}

// onebit_settle: the host waits until --comm onebit's last step has updated every part on the communication stream
// (onebit_step_forward), before anything but the next step's forward reads the weights, the moments, the errors or
// the gradients. Nothing without onebit.
static void onebit_settle(const GradReduce* gr) {
    if (gr->onebit) comm_wait(gr->comm, gr->stream, "the 1-bit exchange");
}

// checkpoint_at: saves the model and the data position `pos` after `step` (a dropped step's: from before
// it). 0 (with the reason) on failure, on every rank. Every rank calls it (under ZeRO-1 they gather the
// shards); rank 0 writes.
static int checkpoint_at(Ckpts* ck, BertModel* m, const GradReduce* gr, const DataLoaderState* pos, int step) {
    char why[4600], what[4600];
    onebit_settle(gr);
    WriteWatch w = write_begin(gr->comm, ck, (double)ckpt_body_bytes(m));
    int ok = save_checkpoint(ck, m, gr, pos, why, sizeof why);
    if (write_end(gr->comm, ck, w, ok)) return 1;
    if (gr->comm->rank != 0) snprintf(why, sizeof why, "rank 0 could not write the checkpoint (see its log)");
    fprintf(stderr, "trainer: step %d: %s; stopping: %s\n", step, why, ckpt_whats_on_disk(ck, what, sizeof what));
    return 0;
}
// checkpoint_now: checkpoint_at the loader's current position.
static int checkpoint_now(Ckpts* ck, BertModel* m, const GradReduce* gr, DataLoader* train, int step) {
    DataLoaderState pos = dataloader_state(train);
    return checkpoint_at(ck, m, gr, &pos, step);
}

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
        comm_flag_int("--optimizer (0: adamw, 1: lamb)", o->optimizer),
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
    w.mfu = o->mfu > 0 ? o->mfu : SCALING_MFU;
    w.micro_s_at_B = o->micro_ms * 1e-3;
    if (w.micro_s_at_B > 0 && w.peak_tflops <= 0) w.peak_tflops = 1;  // no peak needed
    w.B = plan->B, w.T = plan->T;
    w.zero = o->zero && world > 1;
    w.weight_bytes = sizeof(floatX);
    w.sync_bytes = 8 * sizeof(float);  // the step's host sync: a handful of floats (S_STEP_N)
    // onebit's share of steps at fp32: this run's warm-up when it is known, else the default's
    w.warmup_share =
        o->onebit && o->comm_warmup && o->steps > 0 ? (double)o->comm_warmup / o->steps : ONEBIT_WARMUP_PERCENT / 100.0;
    w.refresh = o->onebit ? o->comm_refresh : ONEBIT_REFRESH_DEFAULT;  // the onebit table: this run's, or the default
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
    return &scaling_modes[o->onebit_overlap     ? SCALING_ONEBIT_OVERLAP
                          : o->onebit           ? SCALING_ONEBIT
                          : o->grad_reduce_bf16 ? SCALING_BF16
                                                : SCALING_FP32];
}

// job_nodes: the nodes this job runs on: --nodes, else Slurm's SLURM_NNODES, else 1.
static int job_nodes(const Options* o) {
    const char* env = getenv("SLURM_NNODES");
    return o->nodes ? o->nodes : env && atoi(env) > 0 ? atoi(env) : 1;
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
        o->grad_accum = (int)(o->global_batch / per_step);
        if (comm->rank == 0)
            printf("--global-batch %lld: %d micro-batch(es) of B=%d on each of %d GPU(s)\n", o->global_batch,
                   o->grad_accum, plan->B, world);
    }
    ScalingCluster c =
        scaling_cluster_default(nodes, o->gpus_per_node ? o->gpus_per_node : (world + nodes - 1) / nodes);
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
            if ((long long)comm->world * plan->B > o->max_global_batch)
                printf(
                    "--grad-accum auto: one micro-batch of B=%d on %d GPU(s) is already above --max-global-batch "
                    "%lld; a smaller --batch or --global-batch keeps it\n",
                    plan->B, comm->world, o->max_global_batch);
            else if (p.capped)
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
    if (o->val) plan_add_validation(plan, o->val_batches, o->val, comm->world);
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
// shards (tools/prepare.py leaves their tokenizer.json beside them): a copy of that tokenizer.json, and
// tokenizer_config.json + special_tokens_map.json, which transformers' AutoTokenizer.from_pretrained(DIR)
// needs to load it as a fast tokenizer with BERT's special tokens. Byte shards (ids 0..255 are the
// bytes; no [UNK]): byte_tokenizer.json, the mapping and the special ids of the shard header, which
// tools/fill_mask.py reads, and the same as Hugging Face files (export_byte_tokenizer). model_max_length is
// T, the length the run trained at (positions past it were never trained). Each file is written atomically.
// Gives 1, or 0 after a message.
static int export_tokenizer(const char* out, const char* data_glob, const ShardHeader* h, int T) {
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
        int k =
            snprintf(buf, sizeof buf,
                     "{\"tokenizer_class\": \"PreTrainedTokenizerFast\", \"model_max_length\": %d, %s}\n", T, specials);
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
        return export_byte_tokenizer(out, h, T);
    }
    printf("note: no tokenizer.json beside the shards (%s) and not a byte vocabulary: the export has no tokenizer\n",
           src);
    return 1;
}

// export_run: the Hugging Face export as one set: model.safetensors, config.json and the tokenizer files are
// written whole (each flushed) into DIR/.export.tmp/, then every file there renamed into DIR, the weights last. A
// failure (a full disk) leaves the earlier export as it was, never a config.json without its weights. 1, or 0 after a
// message.
static int export_run(const char* out, const BertParams* p, const float* w, int pad_id, const char* data_glob,
                      const ShardHeader* h, int T) {
    char stage[4064], from[4400], to[4400];  // (stage: room for bert_save_hf's names within PATH_MAX)
    snprintf(stage, sizeof stage, "%s/%s", out, EXPORT_STAGING);
    remove_staging(stage);  // what a crash in an earlier export left
    if (mkdir(stage, 0755) != 0) {
        fprintf(stderr, "trainer: cannot create %s: %s\n", stage, strerror(errno));
        return 0;
    }
    int ok = bert_save_hf(stage, p, w, pad_id) && export_tokenizer(stage, data_glob, h, T);
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
// export failed (rank 0 said why).
static int export_now(const Options* o, Comm* comm, Ckpts* ck, BertModel* model, const float* w,
                      const ShardHeader* data_h, const BertConfig* cfg) {
    char what[4600];
    WriteWatch ww = write_begin(comm, ck, (double)model->p.numel * sizeof(float));
    int ok = 1;
    if (comm->rank == 0) {
        if (!w) {
            fprintf(stderr, "trainer: out of host memory for the export; %s\n",
                    ckpt_whats_on_disk(ck, what, sizeof what));
            ok = 0;
        } else if (!export_run(o->out, &model->p, w, data_h->pad_id, o->data, data_h, o->T)) {
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
    if (!*is_dir && !ckpt_verify(o->eval, h, why, sizeof why)) {
        fprintf(stderr, "trainer: --eval %s: %s\n", o->eval, why);
        return 0;
    }
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
    return 1;
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
    GradReduce gr;  // (no gradients are reduced: make_plan and ckpt_load take the layout)
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
        ckpt_load(o->eval, &model, &gr, &h);  // every state region, so the bf16 weights are the run's own
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
    double epoch_tokens;             // real tokens in the training shards: one epoch
    uint64_t data_fp, val_fp;        // fingerprints of --data and --val, compared over the ranks
    GradReduce gr;                   // the gradient buckets (comm.h)
    OneBit ob;                       // --comm onebit: 1-bit Adam's errors and message buffers (compress.h)
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
    if (!o->plan_only && (run_lock(o->out, r->comm.rank) < 0 || !run_dir_check(o->out, o))) return 0;
    CommBootstrap boot = {o->bootstrap, o->out, o->out, r->started};
    if (!o->plan_only) comm_init(&r->comm, &boot);
    return 1;
}

// choose_model: a preset with the shards' vocabulary, or a Hugging Face checkpoint (--init-from).
static int choose_model(Run* r) {
    Options* o = &r->o;
    if (o->data) r->data_fp = data_fingerprint("--data", o->data, &r->data_h, &r->epoch_tokens);
    if (o->val) r->val_fp = data_fingerprint("--val", o->val, NULL, NULL);
    int data_vocab = (int)r->data_h.vocab_size;  // no --data (--plan-only): 0, the preset's
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

// plan_run: the gradient buckets, the memory plan and the micro-batch it allows (the seed paper's
// recommendation 5): the same on every rank, the smallest any rank can hold; then the scaling prediction.
static int plan_run(Run* r) {
    Options* o = &r->o;
    GradReduce* gr = &r->gr;
    grad_reduce_setup(gr, &r->cfg, &r->comm, o);
    int loaders = o->val ? 2 : 1;
    Plan* plan = &r->plan;
    char why[256] = "the largest that fits";  // (--plan-only plans the memory of the device it predicts for)
    *plan = o->plan_only && !o->B ? choose_batch(&r->cfg, o->T, loaders, gr, r->free_bytes, r->total_bytes)
                                  : auto_batch(&r->cfg, o, loaders, gr, r->free_bytes, r->total_bytes, r->prop.name, 0,
                                               why, sizeof why);
    if (!o->plan_only)
        *plan = make_plan(&r->cfg, agree(&r->comm, o, &r->cfg, plan->B, r->data_fp, r->val_fp), o->T, loaders, gr);
    if (o->val) plan_add_validation(plan, o->val_batches, o->val, r->comm.world);
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
    r->comm.timeout_s += 3600;
    comm_agree(&r->comm, &staged, 1);
    r->comm.timeout_s = o->nccl_timeout;
    return 1;
}

// onebit_setup: --comm onebit's errors and message buffers (compress.h), and what it will send.
static void onebit_setup(Run* r) {
    OneBit* ob = &r->ob;
    onebit_layout(ob, &r->gr, r->comm.rank, r->o.comm_warmup, onebit_part_elems(&r->o));
    ob->refresh = r->o.comm_refresh;
    onebit_alloc(ob);
    r->gr.onebit = ob;
    if (!r->o.onebit_overlap) {  // the next forward waits for each layer's part only (onebit_step_forward)
        int L = r->cfg.layers;
        ob->weights_ready = (cudaEvent_t*)malloc((L + 1) * sizeof(cudaEvent_t));
        for (int l = 0; l < L; l++) ob->weights_ready[l] = ob->updated[onebit_layer_part(ob, &r->model.p, l)];
        ob->weights_ready[L] = r->gr.done;  // the head: every part, and the gradients zeroed
        r->model.weights_ready = ob->weights_ready;
    }
    uint64_t fp32 =
        r->comm.world > 1 ? 2 * (uint64_t)(r->comm.world - 1) * (r->model.p.numel * 4) / (uint64_t)r->comm.world : 0;
    if (r->main_rank)
        printf(
            "comm: %s (1-bit Adam): fp32 AdamW for %d steps, then the momentum's signs and scales in %d parts "
            "%s: %llu bytes sent per rank per step (fp32 all-reduce: %llu)\n",
            r->o.comm, ob->warmup, ob->n_parts,
            r->o.onebit_overlap ? "during the backward" : "after the backward, under the next forward",
            (unsigned long long)onebit_step_bytes(ob), (unsigned long long)fp32);
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
// stop on a signal). 0 when it ends so, else the exit code (1: a checkpoint failed; 2: the run diverged).
static int train(Run* r) {
    Options* o = &r->o;
    BertModel* m = &r->model;
    int main_rank = r->main_rank;
    int last_step = o->run_steps && m->step + o->run_steps < o->steps ? m->step + o->run_steps : o->steps;
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
        StepResult s = train_step(m, &r->train, &r->bm, &r->gr, r->scratch, o, lr_at(o, step), want_ckpt);
        if (s.dropped) {  // a signal between micro-batches (every rank agreed): save the last complete step
            if (main_rank)
                printf(
                    "stopped on a signal between micro-batches of step %d: that step is dropped; the checkpoint "
                    "is of step %d\n",
                    step, m->step);
            return checkpoint_at(&r->ck, m, &r->gr, &step_start, m->step) ? 0 : 1;
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
            if (!checkpoint_now(&r->ck, m, &r->gr, &r->train, step)) return 1;
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
    int crc = getenv("MLM_TEST_WEIGHTS_CRC") != NULL;
    float* w = m->step == o->steps || crc ? (float*)malloc(m->p.numel * sizeof(float)) : NULL;
    if (m->step == o->steps || crc) model_get_params(m, &r->gr, w);  // every rank: under ZeRO-1 they gather
    if (w && crc) print_weights_crc(m, w, r->comm.rank);
    if (m->step == o->steps && !export_now(o, &r->comm, &r->ck, m, w, &r->data_h, &r->cfg)) return 1;
    free(w);
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
    r->comm.timeout_s = r->o.nccl_timeout;
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
