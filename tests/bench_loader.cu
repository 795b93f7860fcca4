// tests/bench_loader.cu: how fast data.h delivers masked, packed micro-batches. A benchmark
// (prints figures), not a test.
//
//   g++ -std=c++17 -O2 -Icpu/include -I/usr/local/cuda/include -pthread -x c++ tests/bench_loader.cu
//       -x none cpu/runtime.cpp -o build/bench_loader -lrt          (one line)
//   build/bench_loader                      # makes ~1.2 GB of synthetic shards in /tmp/mlmc_bench first
//   build/bench_loader --shards 'data/usrlib/train_*.bin' --seconds 10
//
// Figures:
//   1. one loader thread's work alone (claim + copy + pack + MLM masking into a pinned slot):
//      tokens/s with masking, and without, for the cost of masking;
//   2. the whole pipeline: N loader threads -> ring -> dataloader_next() (copy to the device, which
//      is a memcpy on the CPU runtime) -> consumer, for N = 1, 2;
//   3. the epoch plan (shuffle + best-fit packing) build time and row fill; the verification (CRC)
//      speed at init;
//   4. the same samples through Hugging Face DataCollatorForLanguageModeling + a PyTorch DataLoader
//      with one worker (tools/bench_hf_collator.py, run from here with --hf-python), and the ratio.
// Tokens are real (non-padding) tokens delivered; "positions" also count padding.
#include "../data.h"

static double now_s(void) { return data_now(); }

// Synthetic text-like data: documents of log-normal length (median ~245 tokens), split into samples
// of at most T as tools/prepare.py does ([CLS] piece [SEP]), BERT's vocabulary layout (30522 ids;
// [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103).
static void make_shards(const char* dir, double gb, int T) {
    mkdir(dir, 0755);
    const uint64_t shard_tokens = 64ull << 20;
    uint64_t total = (uint64_t)(gb * 1e9 / 2);  // 2-byte tokens
    uint32_t* tok = (uint32_t*)malloc(sizeof(uint32_t) * (shard_tokens + T));
    uint64_t* off = (uint64_t*)malloc(sizeof(uint64_t) * (shard_tokens + 1));
    uint64_t rng = 2024, made = 0;
    char path[600], err[DATA_ERR_LEN];
    double t0 = now_s();
    for (int s = 0; made < total; s++) {
        uint64_t n = 0, ns = 0;
        off[0] = 0;
        while (n < shard_tokens) {
            // log-normal document length via Box-Muller
            double u1 = ((rng_next(&rng) >> 11) + 1) * 0x1.0p-53, u2 = (rng_next(&rng) >> 11) * 0x1.0p-53;
            double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
            int64_t doc = (int64_t)exp(5.5 + 1.0 * z) + 1;
            for (int64_t at = 0; at < doc; at += T - 2) {
                int64_t piece = doc - at < T - 2 ? doc - at : T - 2;
                tok[n++] = 101;
                for (int64_t j = 0; j < piece; j++) {
                    uint64_t r = rng_next(&rng);
                    tok[n++] = (r & 1023) == 0 ? 100 : 1000 + (uint32_t)rng_below(r >> 16, 30522 - 1000);
                }
                tok[n++] = 102;
                off[++ns] = n;
                if (n >= shard_tokens) break;
            }
        }
        ShardHeader h;
        memset(&h, 0, sizeof(h));
        h.vocab_size = 30522;
        h.token_bytes = 2;
        h.max_len = (uint32_t)T;
        h.pad_id = 0;
        h.unk_id = 100;
        h.cls_id = 101;
        h.sep_id = 102;
        h.mask_id = 103;
        h.num_samples = ns;
        h.num_tokens = n;
        snprintf(path, sizeof(path), "%s/train_%05d.bin", dir, s);
        if (shard_write(path, &h, tok, off, err)) {
            fprintf(stderr, "%s\n", err);
            exit(1);
        }
        made += n;
    }
    printf("made %.2f GB of shards (%llu tokens) in %s in %.1f s\n", made * 2 / 1e9, (unsigned long long)made, dir,
           now_s() - t0);
    free(tok);
    free(off);
}

// One thread's work alone: claim the next batch and fill a slot, no ring, no other thread.
static void bench_fill(const char* pattern, int B, int T, float mask_prob, double seconds, double* tok_s,
                       double* pos_s) {
    DataLoader dl;
    DataLoaderConfig cfg = dataloader_default_config(pattern, B, T);
    cfg.num_threads = 1;
    cfg.verify = 0;
    cfg.mask_prob = mask_prob;
    if (dataloader_init(&dl, &cfg)) {
        fprintf(stderr, "%s\n", dl.error);
        exit(1);
    }
    loader_stop(&dl);  // measure the work of one loader thread, here, alone
    Job* job = &dl.workers[0].job;
    int32_t* slot = dl.slots[0].host;
    pthread_mutex_lock(&dl.lock);
    claim_job(&dl, job);  // builds epoch 0's plan outside the timed loop
    pthread_mutex_unlock(&dl.lock);
    uint64_t real = 0, batches = 0;
    double t0 = now_s(), t;
    do {
        pthread_mutex_lock(&dl.lock);
        claim_job(&dl, job);
        pthread_mutex_unlock(&dl.lock);
        if (fill_batch(&dl, job, slot)) {
            fprintf(stderr, "%s\n", dl.error);
            exit(1);
        }
        real += (uint64_t)slot[2];
        batches++;
    } while ((t = now_s() - t0) < seconds);
    *tok_s = real / t;
    *pos_s = (double)batches * B * T / t;
    dataloader_free(&dl);
}

// The pipeline: threads fill the ring, this thread takes batches as fast as it can.
static void bench_pipeline(const char* pattern, int B, int T, int threads, double seconds, double* tok_s,
                           double* wait_ms) {
    DataLoader dl;
    DataLoaderConfig cfg = dataloader_default_config(pattern, B, T);
    cfg.num_threads = threads;
    cfg.ring_slots = 2 * threads + 2;
    cfg.verify = 0;
    if (dataloader_init(&dl, &cfg)) {
        fprintf(stderr, "%s\n", dl.error);
        exit(1);
    }
    cudaStream_t s;
    cudaStreamCreate(&s);
    Batch b;
    for (int i = 0; i < 4; i++) dataloader_next(&dl, s, &b);  // warm up (the plan, the threads)
    uint64_t real = 0, n = 0;
    double waited = 0, t0 = now_s(), t;
    do {
        if (dataloader_next(&dl, s, &b)) {
            fprintf(stderr, "%s\n", dl.error);
            exit(1);
        }
        real += (uint64_t)b.num_real_tokens;
        waited += b.wait_ms;
        n++;
    } while ((t = now_s() - t0) < seconds);
    cudaStreamSynchronize(s);
    *tok_s = real / t;
    *wait_ms = waited / n;
    cudaStreamDestroy(s);
    dataloader_free(&dl);
}

int main(int argc, char** argv) {
    const char* shards = NULL;
    const char* gen_dir = "/tmp/mlmc_bench";
    const char* hf_python = "/usr/bin/python3";
    double gen_gb = 1.1, seconds = 5;
    int B = 32, T = 512;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shards"))
            shards = argv[i + 1];
        else if (!strcmp(argv[i], "--gen-dir"))
            gen_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--gen-gb"))
            gen_gb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--B"))
            B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--T"))
            T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hf-python"))
            hf_python = argv[i + 1];
        else {
            fprintf(stderr, "unknown option %s (see the top of tests/bench_loader.cu)\n", argv[i]);
            return 1;
        }
    }
    char pattern[700];
    if (!shards) {
        snprintf(pattern, sizeof(pattern), "%s/train_*.bin", gen_dir);
        glob_t g;
        if (glob(pattern, 0, NULL, &g) != 0)
            make_shards(gen_dir, gen_gb, T);
        else
            globfree(&g);
        shards = pattern;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("bench_loader: shards %s, B=%d T=%d, %ld cores\n", shards, B, T, cores);

    // Init: open + full verification (CRC-32 and token ids of every byte), one thread and all cores.
    for (int th = 1; th <= 2; th++) {
        DataLoader dl;
        DataLoaderConfig cfg = dataloader_default_config(shards, B, T);
        cfg.num_threads = th;
        double t0 = now_s();
        if (dataloader_init(&dl, &cfg)) {
            fprintf(stderr, "%s\n", dl.error);
            return 1;
        }
        double t = now_s() - t0;
        uint64_t bytes = 0;
        for (int i = 0; i < dl.num_shards; i++) bytes += dl.shards[i].bytes;
        printf(
            "init with verification, %d thread(s): %d shards, %.2f GB, %llu samples, %llu tokens in %.2f s (%.2f "
            "GB/s)\n",
            th, dl.num_shards, bytes / 1e9, (unsigned long long)dl.num_samples, (unsigned long long)dl.num_tokens, t,
            bytes / 1e9 / t);
        if (th == 2) {
            pthread_mutex_lock(&dl.lock);
            planner_join(&dl);  // the spare plan is ours to time a build into
            t0 = now_s();
            plan_build(&dl, &dl.next_plan, 7);
            t = now_s() - t0;
            printf(
                "epoch plan (shuffle + best-fit packing of %d open rows): %.2f s for %llu samples (%.0f ns/sample); "
                "%llu rows, %.2f%% of positions hold real tokens\n",
                DATA_OPEN_ROWS, t, (unsigned long long)dl.num_samples, 1e9 * t / dl.num_samples,
                (unsigned long long)dl.next_plan.num_rows, 100 * dl.next_plan.fill);
            pthread_mutex_unlock(&dl.lock);
        }
        dataloader_free(&dl);
    }

    double tok, pos, tok0, pos0;
    bench_fill(shards, B, T, 0.15f, seconds, &tok, &pos);
    bench_fill(shards, B, T, 0.0f, seconds, &tok0, &pos0);
    printf("one loader thread alone, with MLM masking:    %7.1f M tokens/s (%.1f M positions/s)\n", tok / 1e6,
           pos / 1e6);
    printf("one loader thread alone, without masking:     %7.1f M tokens/s (masking costs %.0f%%)\n", tok0 / 1e6,
           100 * (1 - tok / tok0));
    double pipe_tok[3] = {0}, pipe_wait[3] = {0};
    for (int th = 1; th <= 2; th++) {
        bench_pipeline(shards, B, T, th, seconds, &pipe_tok[th], &pipe_wait[th]);
        printf(
            "pipeline, %d loader thread(s) + consumer:     %7.1f M tokens/s delivered (consumer waited %.3f "
            "ms/batch)\n",
            th, pipe_tok[th] / 1e6, pipe_wait[th]);
    }
    printf("target: one thread >= 70 M tokens/s (100x an H100 on BERT-base at 50%% MFU, ~0.71 M tokens/s): %s\n",
           tok >= 70e6 ? "met" : "NOT met");

    // Hugging Face, on the same shards.
    char cmd[2000];
    snprintf(cmd, sizeof(cmd), "%s tools/bench_hf_collator.py --shards '%s' --seq-len %d --seconds %g 2>&1", hf_python,
             shards, T, seconds);
    FILE* p = popen(cmd, "r");
    double hf = 0;
    char line[1000];
    while (p && fgets(line, sizeof(line), p)) {
        fputs(line, stdout);
        char* at = strstr(line, "HF_TOKENS_PER_S=");
        if (at) hf = atof(at + strlen("HF_TOKENS_PER_S="));
    }
    if (p) pclose(p);
    if (hf > 0)
        printf("ratio, one data.h loader thread / one Hugging Face DataLoader worker: %.0fx (target >= 20x)\n",
               tok / hf);
    else
        printf(
            "Hugging Face comparison skipped: `%s` failed (needs torch and transformers; see "
            "tools/bench_hf_collator.py)\n",
            cmd);
    return 0;
}
