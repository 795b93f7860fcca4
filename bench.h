// bench.h: ./trainer --bench, the training step timed on synthetic data (tokens/s, MFU, the time of each phase).
// Part of trainer.cu (one translation unit): it runs the trainer's own plan, batch and train_step.

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
    Optimizer opt = optimizer_setup(gr, NULL, o->grad_reduce_bf16, o->beta1, o->beta2, o->eps, o->wd,
                                    o->clip);  // (--bench refuses --comm onebit)
    BatchMaker bm;
    float* scratch = batch_maker_alloc(&bm, &plan, 0);
    float* w = (float*)malloc(model.p.numel * sizeof(float));
    bert_init_host(&model.p, w, (uint64_t)o->seed);
    model_set_params(&model, gr, w);
    free(w);
    bert_zero_grad(&model);

    for (int i = 0; i < o->bench_warmup; i++) train_step(&model, &train, &bm, &opt, scratch, o, o->lr, 0);
    long long tokens_done = 0;
    comm_wait(comm, stream, "benchmark sync");  // the ZeRO-1 AllGather may be in flight
    double t0 = now_s();
    for (int i = 0; i < o->bench_steps; i++)
        tokens_done += train_step(&model, &train, &bm, &opt, scratch, o, o->lr, 0).tokens;
    comm_wait(comm, stream, "benchmark sync");
    double dt = now_s() - t0;
    res->step_ms = 1e3 * dt / o->bench_steps;
    res->tokens_per_s = comm->world * tokens_done / dt;
    res->real_fraction = (double)tokens_done / ((double)o->bench_steps * o->grad_accum * B * T);
    double flops_token = bert_flops_per_token(&cfg, T, 0.15).model;
    res->mfu = peak_tflops > 0 ? res->tokens_per_s / comm->world * flops_token / (peak_tflops * 1e12) : -1;

    // The same steps again, each phase between two events.
    PhaseTimer timer;
    phase_timer_init(&timer, 64 * cfg.layers + 64);  // (grows in the first step as needed)
    bench_timer = &timer;
    t0 = now_s();
    for (int i = 0; i < o->bench_steps; i++) {
        train_step(&model, &train, &bm, &opt, scratch, o, o->lr, 0);
        phase_timer_collect(&timer);  // waits for the step's last mark
    }
    res->phased_step_ms = 1e3 * (now_s() - t0) / o->bench_steps;
    for (int p = 0; p < PHASE_COUNT; p++) res->phase_ms[p] = timer.ms[p] / o->bench_steps;
    bench_timer = NULL;
    phase_timer_free(&timer);

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
