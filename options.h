// options.h: the trainer's flags: one table (flags[]) that parses, checks and documents them (--help), and the
// checks of their combinations. Part of trainer.cu (one translation unit): included where its Options are first needed.

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
    int comm_refresh;                  // --comm-refresh K: the variance steps' longest spacing (0: none)
    int comm_var_steps;                // --comm-var-steps S: variance steps at each spacing below K
    long long tokens;                  // --tokens N: about N real tokens, as steps (resolve_run_length)
    double epochs;                     // --epochs E: E passes over the training shards, as steps
    const char* eval;                  // --eval SRC: evaluate a checkpoint or an export on --val; no training
    int seq_given;                     // --seq was given (--eval otherwise takes the source's)
    int timeout_given;                 // --nccl-timeout was given (one process waits on no other without it)
    int overwrite;                     // --overwrite: a new run may replace the run already in --out
    int seed_given, preset_given;      // --seed, --preset were given (checked against --resume, --init-from)
    int accum_given;                   // --grad-accum was given (--global-batch is its alternative)
    int max_global_given;              // --max-global-batch was given (only with --grad-accum auto)
} Options;

// How a flag's value is read (read_flag): a switch takes none; a string is kept as given; a choice is one of
// the words of Flag.value ("tcp|file"); a number (parse.h) must lie in [lo, hi] on its field's type: INT into
// an int, LL into a long long, FLOAT and DOUBLE read as a double, then kept in a float or a double; INT_AUTO also
// takes "auto" (as 0); COUNT is a number of tokens with a K/M/B/T suffix.
enum { F_SWITCH, F_STR, F_CHOICE, F_INT, F_INT_AUTO, F_LL, F_FLOAT, F_DOUBLE, F_COUNT, F_HELP };
// The modes that read a flag (Flag.modes): a training run; --plan-only, the plan of that run (it takes the run's
// flags, but --resume: it reads no checkpoint); --bench; --eval. A flag given to a mode that does not read it is
// an error naming both (check_modes), not a flag quietly ignored.
enum { M_TRAIN = 1, M_PLAN = 2, M_BENCH = 4, M_EVAL = 8 };
#define M_RUN (M_TRAIN | M_PLAN)
#define M_ALL (M_RUN | M_BENCH | M_EVAL)
typedef struct {
    const char* name;   // "--seq"; NULL: a heading in --help (help is its text)
    const char* value;  // the value's name in --help ("T"); an F_CHOICE's words; NULL for a switch
    int kind;           // F_*
    size_t at;          // where the value goes: offsetof(Options, field)
    double lo, hi;      // a number's range
    const char* def;    // the default, read as a given value is (NULL: 0, or what the help says)
    int modes;          // M_*: the modes that read it
    const char* help;   // --help's text; '\n' starts a new, indented line
} Flag;
#define AT(field) offsetof(Options, field)
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static const Flag flags[] = {
    {"--data", "GLOB", F_STR, AT(data), 0, 0, NULL, M_RUN, "training shards (tools/prepare.py makes them)"},
    {"--val", "GLOB", F_STR, AT(val), 0, 0, NULL, M_RUN | M_EVAL,
     "validation shards: MLM loss and masked-token accuracy every --val-every steps, on\n"
     "every validation sequence once (a fixed masking) whatever the number of GPUs"},
    {"--out", "DIR", F_STR, AT(out), 0, 0, NULL, M_ALL,
     "(created with its parents) checkpoint.bin, metrics.jsonl (a JSON object per logged\n"
     "step and per validation), the final Hugging Face export (model.safetensors,\n"
     "config.json) and the tokenizer files (tokenizer.json + tokenizer_config.json +\n"
     "special_tokens_map.json for text shards, byte_tokenizer.json for byte shards)"},
    {"--preset", "NAME", F_STR, AT(preset), 0, 0, NULL, M_RUN | M_BENCH,
     "default bert-base; the vocabulary size comes from the shards:"},  // usage() lists the presets here
    {"--init-from", "DIR", F_STR, AT(init_from), 0, 0, NULL, M_RUN,
     "start from a Hugging Face BertForMaskedLM checkpoint instead"},
    {"--resume", NULL, F_SWITCH, AT(resume), 0, 0, NULL, M_TRAIN,
     "continue from DIR/checkpoint.bin (weights, optimizer, data position)"},
    {"--overwrite", NULL, F_SWITCH, AT(overwrite), 0, 0, NULL, M_RUN,
     "start a new run in an --out that holds another run's checkpoints or export,\n"
     "deleting them and its metrics first (without it, or --resume, it is refused)"},
    {"--seq", "T", F_INT, AT(T), 2, 1 << 16, "512", M_ALL, "tokens per row"},
    {"--batch", "B", F_INT, AT(B), 0, 1 << 20, NULL, M_ALL,
     "rows per micro-batch per GPU (default 0: the largest that fits in GPU memory; at\n"
     "most 4096 tokens on a device of unknown speed, such as the CPU build's)"},
    {"--grad-accum", "N", F_INT_AUTO, AT(grad_accum), 1, SCALING_MAX_ACCUM, "1", M_RUN | M_BENCH,
     "micro-batches per optimizer step; auto: the fewest that hide the gradient\n"
     "all-reduce behind compute (predicted, see --plan-only)"},
    {"--steps", "N", F_INT, AT(steps), 1, 1 << 30, NULL, M_RUN, "optimizer steps; or instead:"},
    {"--tokens", "N", F_COUNT, AT(tokens), 1, 1e15, NULL, M_RUN,
     "about N real tokens (1e9, 500M, 2B: K M B T suffixes), as steps of the global batch"},
    {"--epochs", "E", F_DOUBLE, AT(epochs), 1e-6, 1e6, NULL, M_RUN,
     "E passes over the training shards (E x their tokens / tokens per step, rounded up)"},
    {"--lr", "X", F_FLOAT, AT(lr), 0, 1, "5e-4", M_RUN | M_BENCH,
     "peak learning rate, linear warmup then linear decay to 0"},
    {"--warmup", "N", F_INT, AT(warmup), 0, 1 << 30, NULL, M_RUN, "warmup steps (default 1% of --steps)"},
    {"--wd", "X", F_FLOAT, AT(wd), 0, 1, "0.01", M_RUN | M_BENCH, "AdamW's weight decay (not on biases and LayerNorm)"},
    {"--beta1", "X", F_FLOAT, AT(beta1), 0, 0.999999, "0.9", M_RUN | M_BENCH, "AdamW's momentum decay"},
    {"--beta2", "X", F_FLOAT, AT(beta2), 0, 0.999999, "0.98", M_RUN | M_BENCH, "AdamW's variance decay"},
    {"--eps", "X", F_FLOAT, AT(eps), 1e-30, 1, "1e-6", M_RUN | M_BENCH, "AdamW's epsilon"},
    {"--clip", "X", F_FLOAT, AT(clip), 0, 1e30, "1.0", M_RUN | M_BENCH,
     "the gradient norm is clipped to X (0: no clipping)"},
    {"--seed", "N", F_LL, AT(seed), 0, (double)(1LL << 62), "1337", M_RUN | M_BENCH,
     "data order, masking and initialisation"},
    {"--log-every", "N", F_INT, AT(log_every), 1, 1 << 30, "1", M_RUN, "a log line (and metrics record) every N steps"},
    {"--val-every", "N", F_INT, AT(val_every), 0, 1 << 30, NULL, M_RUN,
     "validation every N steps and at the last (default 0: none while training)"},
    {"--val-batches", "N", F_INT, AT(val_batches), 0, 1 << 20, NULL, M_RUN | M_EVAL,
     "a sample of N micro-batches of B rows (over all GPUs together), spread evenly over\n"
     "the validation split, the same at every validation; 0, the default: the whole split"},
    {"--ckpt-every", "N", F_INT, AT(ckpt_every), 0, 1 << 30, NULL, M_RUN,
     "a checkpoint every N steps (default 0: only at the end)"},
    {"--ckpt-minutes", "X", F_FLOAT, AT(ckpt_minutes), 0, 1e6, "30", M_RUN,
     "also a checkpoint when X minutes passed since the last one (0: off)"},
    {"--keep", "K", F_INT, AT(keep), 1, 1000, "2", M_RUN,
     "checkpoints kept: DIR/checkpoint.bin and the K-1 before it as checkpoint-STEP.bin;\n"
     "--resume takes the newest intact one (each has a CRC-32)"},
    {"--max-bad-steps", "N", F_INT, AT(max_bad_steps), 1, 1 << 30, "3", M_RUN,
     "a step whose loss or gradient norm is not finite is skipped (weights and AdamW\n"
     "state untouched); N in a row stop the run with exit code 2"},
    {"--run-steps", "N", F_INT, AT(run_steps), 1, 1 << 30, NULL, M_RUN,
     "stop after N steps of this run, with a checkpoint (to fit a job's time limit;\n"
     "--resume continues)"},
    {"--help", NULL, F_HELP, 0, 0, 0, NULL, M_ALL, "this text (also -h)"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL, 0, "the data loader:"},
    {"--loader-threads", "N", F_INT_AUTO, AT(loader_threads), 1, 256, "auto", M_RUN | M_BENCH,
     "threads preparing batches; auto: as many as the step needs, from one thread's measured\n"
     "rate and the predicted micro-batch time (printed with the reason)"},
    {"--ring", "N", F_INT, AT(ring_slots), 2, 1024, "4", M_RUN | M_BENCH,
     "slots of prepared batches in the loaders' ring"},
    {"--stage-dir", "DIR", F_STR, AT(stage_dir), 0, 0, NULL, M_RUN,
     "copy the shards to this node-local directory first, once per node"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL, 0, "communication and the optimizer at scale (docs/scaling.md):"},
    {"--comm", "fp32|bf16|onebit", F_CHOICE, AT(comm), 0, 0, "fp32", M_RUN | M_BENCH,
     "fp32: buckets all-reduced in fp32; bf16: half the bytes; onebit: 1-bit Adam,\n"
     "after --comm-warmup steps of AdamW (bf16 all-reduce) only the momentum's signs and\n"
     "one scale per 256 elements are sent, but on the variance steps (AdamW, ever rarer):\n"
     "about 25x fewer bytes than fp32 (also on one GPU, to see its effect)"},
    {"--grad-reduce", "fp32|bf16", F_CHOICE, AT(comm), 0, 0, NULL, M_RUN | M_BENCH,
     "the older name of --comm fp32 | bf16"},
    {"--comm-warmup", "N", F_INT, AT(comm_warmup), 1, INT_MAX, NULL, M_RUN,
     "--comm onebit: steps of AdamW (bf16 all-reduce) before compression (default\n"
     "--warmup's, at least 1; must be below --steps)"},
    {"--comm-refresh", "K", F_INT, AT(comm_refresh), 0, INT_MAX, NULL, M_RUN,
     "--comm onebit: after the warm-up, AdamW steps (bf16) update the variance, " STRINGIFY(
         ONEBIT_VAR_SCALER) " at\n"
                            "each spacing 1, 2, 4, ... below K, then every K steps (0/1 Adam's schedule; "
                            "default\n" STRINGIFY(ONEBIT_REFRESH_DEFAULT) "; 0: none, v frozen as in 1-bit Adam)"},
    {"--comm-var-steps", "S", F_INT, AT(comm_var_steps), 0, 1 << 20, NULL, M_RUN,
     "--comm onebit: the variance steps at each spacing before it doubles (0/1 Adam's\n"
     "kappa; default " STRINGIFY(ONEBIT_VAR_SCALER) "; 0: none, only every K steps)"},
    {"--bucket-mb", "X", F_FLOAT, AT(bucket_mb), 0.001, 1 << 20, "25", M_RUN | M_BENCH,
     "gradients are reduced over GPUs in buckets of X MB (fp32), each as soon as the\n"
     "backward has made it, overlapping the rest of the backward"},
    {"--zero", "N", F_INT, AT(zero), 0, 1, NULL, M_RUN | M_BENCH,
     "1: ZeRO-1, each GPU keeps 1/world of the fp32 master weights and AdamW state\n"
     "(gradients reduce-scattered, weights all-gathered); 0: off (default)"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL, 0,
     "several processes (srun -K ./trainer ..., or RANK/WORLD_SIZE/LOCAL_RANK as torchrun sets them):"},
    {"--bootstrap", "tcp|file", F_CHOICE, AT(bootstrap), 0, 0, "tcp", M_ALL,
     "how the ranks get rank 0's NCCL id: tcp from MASTER_ADDR:MASTER_PORT, by default\n"
     "the first host of the Slurm node list and a port from the job and step id; file:\n"
     "through --out, which must be on a file system every rank sees"},
    {"--nccl-timeout", "S", F_FLOAT, AT(nccl_timeout), 0.1, 1e7, STRINGIFY(COMM_DEFAULT_TIMEOUT_S), M_ALL,
     "a rank that waits S seconds for the others (start-up, a collective) aborts the\n"
     "communicator and exits 1 naming the step and collective; while rank 0 writes a\n"
     "checkpoint or the export, 60 s + its size at 20 MB/s more; one process (no other rank\n"
     "to wait for) waits on its own device without a deadline unless it is given"},
    {"--info", NULL, F_SWITCH, AT(info), 0, 0, NULL, 0,
     "print the device and this process's place in the job, then exit (alone)"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL, 0, "the memory plan and the scaling prediction:"},
    {"--plan-only", NULL, F_SWITCH, AT(plan_only), 0, 0, NULL, M_PLAN,
     "print the memory plan and the scaling prediction of the run's flags, then exit\n"
     "(--data and --out optional: without --data the preset's vocabulary; no --resume)"},
    {"--nodes", "N", F_INT, AT(nodes), 1, 1 << 16, NULL, M_RUN,
     "nodes predicted (--plan-only: default 1; a run: SLURM_NNODES)"},
    {"--gpus-per-node", "G", F_INT, AT(gpus_per_node), 1, 1024, NULL, M_RUN,
     "GPUs per node predicted (--plan-only: default 1; a run: its ranks over the nodes)"},
    {"--net-gbps", "X", F_FLOAT, AT(net_gbps), 1e-3, 1e6, NULL, M_RUN,
     "network between nodes, Gbit/s one way (default 25)"},
    {"--nvlink-gbps", "X", F_FLOAT, AT(nvlink_gbps), 1e-3, 1e6, NULL, M_RUN,
     "inside a node, Gbit/s one way (default 2400: H100 NVL's NVLink bridge)"},
    {"--mfu", "X", F_FLOAT, AT(mfu), 1e-4, 1, NULL, M_RUN,
     "share of the device's bf16 peak a step reaches (default: measured on an H200,\n"
     "0.478 up to hidden 768, 0.535 above; ./trainer --bench prints it as mfu=)"},
    {"--link-efficiency", "X", F_FLOAT, AT(link_efficiency), 1e-3, 1, NULL, M_RUN,
     "share of --net-gbps NCCL reaches on large messages (default 0.6: NCCL over TCP)"},
    {"--alpha-us", "X", F_FLOAT, AT(alpha_us), 0, 1e7, NULL, M_RUN,
     "latency of one network step of a collective, microseconds (default 40: TCP)"},
    {"--micro-ms", "X", F_FLOAT, AT(micro_ms), 1e-6, 1e9, NULL, M_RUN,
     "predict from a measured micro-batch (forward + backward of B, ms) instead of MFU"},
    {"--global-batch", "S", F_LL, AT(global_batch), 1, (double)(1LL << 40), NULL, M_RUN,
     "sequences per optimizer step over all GPUs: the accumulation S / (GPUs x B)\n"
     "(--plan-only: per node count, with a smaller B where one micro-batch exceeds S)"},
    {"--max-global-batch", "S", F_LL, AT(max_global_batch), 1, (double)(1LL << 40), STRINGIFY(SCALING_MAX_GLOBAL_BATCH),
     M_RUN, "the largest global batch --grad-accum auto may choose"},
    {"--device", "NAME", F_STR, AT(device), 0, 0, NULL, M_RUN,
     "predict for this device instead of this one: its memory (--plan-only) and bf16\n"
     "peak; one of these, or its full name (\"NVIDIA H100 NVL\"):"},
    {"--device-mem", "GB", F_FLOAT, AT(device_mem), 0.001, 1e6, NULL, M_PLAN,
     "with --plan-only: plan for this much device memory instead of this one's"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL, 0,
     "\nusage: trainer --bench [--preset A,B,..] [--seq T] [--batch B] [options]   (no shards needed)\n"
     "  times the training step on synthetic packed batches and prints, for each preset (default\n"
     "  bert-base,bert-large with the preset's vocabulary), the time per phase, tokens/s, MFU and the\n"
     "  planner's largest micro-batch; --batch picks the micro-batch run (default: that largest one);\n"
     "  --out DIR is needed only with several processes and --bootstrap file"},
    {"--bench", NULL, F_SWITCH, AT(bench), 0, 0, NULL, M_BENCH, "time the training step (no --data, --out or --steps)"},
    {"--bench-steps", "N", F_INT, AT(bench_steps), 1, 1 << 20, "10", M_BENCH, "timed steps"},
    {"--bench-warmup", "N", F_INT, AT(bench_warmup), 0, 1 << 20, "3", M_BENCH, "untimed steps before them"},

    {NULL, NULL, F_HELP, 0, 0, 0, NULL, 0,
     "\nusage: trainer --eval SRC --val GLOB [--batch B] [--seq T] [--val-batches N] [--out DIR]\n"
     "  (and --bootstrap, --nccl-timeout with several processes; a training flag is refused)"},
    {"--eval", "SRC", F_STR, AT(eval), 0, 0, NULL, M_EVAL,
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

// parse_count: --tokens: a count such as 1000000, 1e9, 500M or 2B (suffixes K, M, B or G, T: powers of 1000) in
// [1, 1e15], rounded up to a whole token. 1 with *x set, else 0.
static int parse_count(const char* v, long long* x) {
    const char* suffixes = "KMBGT";
    const double scale[] = {1e3, 1e6, 1e9, 1e9, 1e12};
    size_t n = strlen(v);
    const char* at = n ? strchr(suffixes, toupper((unsigned char)v[n - 1])) : NULL;
    char num[64];
    double y;
    if (at) n--;
    if (n >= sizeof num) return 0;
    memcpy(num, v, n), num[n] = 0;
    if (!parse_double(num, 0, 1e15, &y)) return 0;
    y *= at ? scale[at - suffixes] : 1;
    if (!(y >= 1 && y <= 1e15)) return 0;
    *x = (long long)ceil(y);
    return 1;
}

// env_int / env_real: the number in environment variable `name` (dflt when it is unset or empty), read by
// parse.h in [lo, hi]; else exit 1 naming the variable, its value and the range.
static long long env_int(const char* name, long long dflt, long long lo, long long hi) {
    const char* v = getenv(name);
    long long x = dflt;
    if (v && *v && !parse_int64(v, lo, hi, &x)) {
        fprintf(stderr, "trainer: %s=%s: expected an integer in [%lld, %lld]\n", name, v, lo, hi);
        exit(1);
    }
    return x;
}
static double env_real(const char* name, double dflt, double lo, double hi) {
    const char* v = getenv(name);
    double x = dflt;
    if (v && *v && !parse_double(v, lo, hi, &x)) {
        fprintf(stderr, "trainer: %s=%s: expected a number in [%g, %g]\n", name, v, lo, hi);
        exit(1);
    }
    return x;
}

// Test hooks, for tests/test_checkpoints.sh: MLM_TEST_INF_GRAD=FIRST[:COUNT] makes the gradient of steps
// FIRST .. FIRST+COUNT-1 infinite (COUNT 0: every step from FIRST on; default 1), MLM_TEST_INF_LOSS the loss,
// as a diverging run would. Unset: nothing happens.
static void test_hook_env(const char* name, int h[2]) {
    const char* v = getenv(name);
    h[0] = h[1] = 0;
    if (!v) return;
    char first[32] = "";
    const char* colon = strchr(v, ':');
    size_t n = colon ? (size_t)(colon - v) : strlen(v);
    if (n < sizeof first) memcpy(first, v, n), first[n] = 0;
    h[1] = 1;
    if (!parse_int(first, 1, INT_MAX, &h[0]) || (colon && !parse_int(colon + 1, 0, INT_MAX, &h[1]))) {
        fprintf(stderr, "trainer: %s=%s: expected FIRST[:COUNT] (steps, FIRST >= 1)\n", name, v);
        exit(1);
    }
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
    else if (o->max_global_given && o->grad_accum != 0)  // (--global-batch or --grad-accum N fix the global batch)
        why = "--max-global-batch: only with --grad-accum auto (it caps the global batch auto chooses)";
    if (why) {
        fprintf(stderr, "trainer: %s\n", why);
        exit(1);
    }
}

// check_comm_options: --comm onebit and its --comm-* flags against the other flags (one line and exit 1).
static void check_comm_options(const Options* o) {
    const char* why = NULL;
    if (o->comm_warmup && !o->onebit)
        why = "--comm-warmup: only with --comm onebit";
    else if (o->comm_refresh >= 0 && !o->onebit)  // (-1: not given)
        why = "--comm-refresh: only with --comm onebit";
    else if (o->comm_var_steps >= 0 && !o->onebit)
        why = "--comm-var-steps: only with --comm onebit";
    else if (o->onebit && o->zero)
        why =
            "--comm onebit with --zero 1: 1-bit Adam keeps the whole momentum and its error on every rank (no "
            "ZeRO-1 shards); use one of them";
    else if (o->onebit && o->bench)
        why = "--comm onebit: not with --bench (its steps are the warm-up's; time a short training run instead)";
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
// test_hooks: the tests' faults (MLM_TEST_*, read by check_options), at one point of a step, after the gradients'
// exchange: MLM_TEST_STALL stalls this rank's device work, so that the step's sync never completes (the watchdog's
// test); MLM_TEST_INF_GRAD and MLM_TEST_INF_LOSS poison the gradient and the loss sum (the step is skipped).
static void test_hooks(const Options* o, Comm* comm, BertModel* m, float* loss_sum) {
    static const float inf = INFINITY;
    if (test_hook_on(o->stall, m->step + 1)) stall_launch(comm, o, m->stream);
    if (test_hook_on(o->inf_grad, m->step + 1))
        CUDA_CHECK(cudaMemcpyAsync(m->grad, &inf, sizeof inf, cudaMemcpyHostToDevice, m->stream));
    if (test_hook_on(o->inf_loss, m->step + 1))
        CUDA_CHECK(cudaMemcpyAsync(loss_sum, &inf, sizeof inf, cudaMemcpyHostToDevice, m->stream));
}

// resolve_comm_warmup: --comm onebit's warm-up once --steps is known: the default (onebit_default_warmup: the
// learning rate's warm-up), and an error line when it is not below --steps.
static void resolve_comm_warmup(Options* o) {
    if (!o->onebit) return;
    if (!o->comm_warmup) o->comm_warmup = onebit_default_warmup(o->steps, o->warmup);
    if (o->comm_warmup >= o->steps) {
        fprintf(stderr,
                "trainer: --comm-warmup %d: the warm-up must end before the run's last step (--steps %d); give a "
                "smaller --comm-warmup or more steps\n",
                o->comm_warmup, o->steps);
        exit(1);
    }
}

// check_modes: every flag given is one the mode reads (Flag.modes): --eval takes no --lr, --plan-only no --resume,
// a training run no --bench-steps. Else one line naming the flag and the mode, and exit 1.
static void check_modes(const Options* o, const unsigned char* given) {
    const char* names[] = {"a training run", "--plan-only", "--bench", "--eval"};  // M_TRAIN, M_PLAN, ... by bit
    int m = o->eval ? 3 : o->bench ? 2 : o->plan_only ? 1 : 0;
    for (int i = 0; i < N_FLAGS; i++) {
        const Flag* f = &flags[i];
        if (!given[i] || (f->modes & (1 << m))) continue;
        if (m) {
            fprintf(stderr, "trainer: %s: not with %s, which ignores it (see --help)\n", f->name, names[m]);
        } else {
            fprintf(stderr, "trainer: %s: only with", f->name);
            for (int b = 1, n = 0; b < 4; b++)
                if (f->modes & (1 << b)) fprintf(stderr, "%s %s", n++ ? " or" : "", names[b]);
            fprintf(stderr, "\n");
        }
        exit(1);
    }
}

// micro_batch_ok: a micro-batch of B rows of T tokens holds at most MAX_MICRO_TOKENS positions, the data loader's
// limit (data.h), which also keeps every count of its positions (B x T, the MLM head's rows) within an int.
#define MAX_MICRO_TOKENS (1 << 26)
static int micro_batch_ok(int B, int T) {
    if ((long long)B * T <= MAX_MICRO_TOKENS) return 1;
    fprintf(stderr,
            "trainer: --batch %d: %d rows of %d tokens = %lld tokens a micro-batch, more than 2^26 = %d (the data "
            "loader's limit): a smaller --batch or --seq\n",
            B, B, T, (long long)B * T, MAX_MICRO_TOKENS);
    return 0;
}

// check_options: what the flags mean together: one line and exit 1 for a flag the mode ignores or a combination
// that cannot run (or would silently ignore a flag); then the mode's required flags; --comm onebit's warm-up;
// the test hooks and the test variables checkpoint.h reads.
static void check_options(Options* o, const unsigned char* given) {
    const char* why = NULL;
    if (o->info) {
        fprintf(stderr, "trainer: --info: give it alone (trainer --info)\n");
        exit(1);
    }
    check_modes(o, given);
    if (o->global_batch && o->accum_given)
        why = "--global-batch and --grad-accum are alternatives: give one of them";
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
    if (o->B && (!o->eval || o->seq_given) && !micro_batch_ok(o->B, o->T)) exit(1);  // (--eval: T may be the source's)
    check_comm_options(o);
    if (o->bench) return;  // --bench needs no shards, output directory or step count
    if (o->eval) {
        if (!o->val) {
            fprintf(stderr, "trainer: --eval %s: needs --val GLOB, the shards to evaluate on (see --help)\n", o->eval);
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
    // the other test variables, checked before step 1: checkpoint.h reads these two with atoi / atof, which
    // then read a number; finish_run reads MLM_TEST_WEIGHTS_CRC after the last step
    env_int("MLM_TEST_CKPT_DELAY_MS", 0, 0, 60000);
    env_real("MLM_TEST_SLOW_WRITE_S", 0, 0, 3600);
    env_int("MLM_TEST_WEIGHTS_CRC", 0, 0, 1);
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
// the value and what was expected. A number's range is cut to its field's type (a range wider than an int's
// could not be checked on the int the value is kept in).
static void read_flag(Options* o, const Flag* f, const char* v) {
    char* at = (char*)o + f->at;
    double lo = f->lo, hi = f->hi, d = 0;
    int ok = 1, integer = f->kind == F_INT || f->kind == F_INT_AUTO || f->kind == F_LL;
    if (f->kind == F_INT || f->kind == F_INT_AUTO) lo = fmax(lo, INT_MIN), hi = fmin(hi, INT_MAX);
    if (f->kind == F_LL) lo = fmax(lo, -0x1p62), hi = fmin(hi, 0x1p62);
    if (f->kind == F_FLOAT) lo = fmax(lo, -FLT_MAX), hi = fmin(hi, FLT_MAX);
    if (f->kind == F_SWITCH)
        *(int*)at = 1;
    else if (f->kind == F_STR)
        *(const char**)at = v;
    else if (f->kind == F_CHOICE)
        *(const char**)at = choice(f, v);
    else if (f->kind == F_INT_AUTO && !strcmp(v, "auto"))
        *(int*)at = 0;
    else if (f->kind == F_INT || f->kind == F_INT_AUTO)
        ok = parse_int(v, (int)lo, (int)hi, (int*)at);
    else if (f->kind == F_LL)
        ok = parse_int64(v, (long long)lo, (long long)hi, (long long*)at);
    else if (f->kind == F_FLOAT && (ok = parse_double(v, lo, hi, &d)))
        *(float*)at = (float)d;
    else if (f->kind == F_DOUBLE)
        ok = parse_double(v, lo, hi, (double*)at);
    else if (f->kind == F_COUNT)
        ok = parse_count(v, (long long*)at);
    if (ok) return;
    const char* q = !*v || strpbrk(v, " \t\n") ? "'" : "";  // "", " 3": quoted, to be seen
    if (f->kind == F_COUNT)
        fprintf(stderr,
                "trainer: %s %s%s%s: expected a count of tokens in [1, 1e15], such as 5000000, 1e9, 500M or 2B\n",
                f->name, q, v, q);
    else if (integer)
        fprintf(stderr, "trainer: %s %s%s%s: expected an integer in [%.0f, %.0f]%s\n", f->name, q, v, q, lo, hi,
                f->kind == F_INT_AUTO ? " or auto" : "");
    else
        fprintf(stderr, "trainer: %s %s%s%s: expected a number in [%g, %g]\n", f->name, q, v, q, lo, hi);
    exit(1);
}

// parse_options: the defaults of flags[], then argv read by flags[], then the checks of what they mean together.
static Options parse_options(int argc, char** argv) {
    Options o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < N_FLAGS; i++)
        if (flags[i].def) read_flag(&o, &flags[i], flags[i].def);
    o.warmup = -1, o.alpha_us = -1, o.comm_refresh = -1,
    o.comm_var_steps = -1;  // defaults resolved later (--steps; scaling.h; below)
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
    o.timeout_given = given[find_flag("--nccl-timeout") - flags];
    o.preset_given = given[find_flag("--preset") - flags], o.accum_given = given[find_flag("--grad-accum") - flags];
    o.max_global_given = given[find_flag("--max-global-batch") - flags];
    o.grad_reduce_bf16 = !strcmp(o.comm, "bf16"), o.onebit = !strcmp(o.comm, "onebit");
    if (!o.preset) o.preset = o.bench ? "bert-base,bert-large" : "bert-base";
    check_options(&o, given);
    if (o.comm_refresh < 0) o.comm_refresh = o.onebit ? ONEBIT_REFRESH_DEFAULT : 0;
    if (o.comm_var_steps < 0) o.comm_var_steps = o.onebit ? ONEBIT_VAR_SCALER : 0;
    return o;
}
