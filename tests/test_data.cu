// tests/test_data.cu: the shard format and the loader (data.h) on small shards made here.
// Covers: the format round trip (2- and 4-byte tokens), every sample exactly once per epoch across
// ranks and thread counts, identical batches whatever the threads and ranks, the batch layout,
// MLM masking statistics and determinism, resume equivalence, node-local staging, and every
// bad-input case (one clear error naming the file).
#include <dirent.h>

#include "../data.h"
#include "testing.h"

// ----------------------------------------------------------------------------
// Test data. Vocabulary: 0 [PAD], 1 [UNK], 2 [CLS], 3 [SEP], 4 [MASK], ordinary ids 5..V-1.
// Sample g is [CLS] id0 id1 filler... [SEP], where id0/id1 encode g, so that a sample can be
// recognized in a batch. Some samples hold an [UNK] (a special token inside the text).
enum { PAD = 0, UNK = 1, CLS = 2, SEP = 3, MASKID = 4, FIRST = 5 };
static const uint32_t VOCAB = 1200;
static const uint32_t M = VOCAB - FIRST;

typedef struct {
    uint64_t n;     // samples, in global order (shard after shard)
    uint64_t* off;  // (n+1)
    uint32_t* tok;  // all samples back to back
} Corpus;

static int sample_length(uint64_t g, int max_len) {
    uint64_t h = mix64(g ^ 0xABCDEF);
    if (h % 10 < 2) return max_len;                        // some fill a row alone
    return 4 + (int)((h >> 8) % (uint64_t)(max_len / 2));  // the rest are short: packing matters
}
static void sample_tokens(uint64_t g, int len, uint32_t* out) {
    out[0] = CLS;
    out[1] = FIRST + (uint32_t)(g % M);
    out[2] = FIRST + (uint32_t)(g / M % M);
    for (int j = 3; j < len - 1; j++) out[j] = FIRST + (uint32_t)(mix64(g * 1000 + j) % M);
    if (len > 6 && g % 7 == 0) out[4] = UNK;
    out[len - 1] = SEP;
}
static ShardHeader test_header(uint32_t token_bytes, uint32_t max_len) {
    ShardHeader h = {};
    memset(&h, 0, sizeof(h));
    h.vocab_size = VOCAB;
    h.token_bytes = token_bytes;
    h.max_len = max_len;
    h.pad_id = PAD;
    h.cls_id = CLS;
    h.sep_id = SEP;
    h.mask_id = MASKID;
    h.unk_id = UNK;
    return h;
}

// Writes `shards` shards of `per_shard` samples each as DIR/PREFIX_00000.bin..., the last one with
// 4-byte tokens (the loader reads both widths), and returns the corpus in global order.
static Corpus make_dataset(const char* dir, const char* prefix, int shards, int per_shard, int max_len) {
    Corpus c;
    c.n = (uint64_t)shards * per_shard;
    c.off = (uint64_t*)malloc(sizeof(uint64_t) * (c.n + 1));
    c.off[0] = 0;
    for (uint64_t g = 0; g < c.n; g++) c.off[g + 1] = c.off[g] + sample_length(g, max_len);
    c.tok = (uint32_t*)malloc(sizeof(uint32_t) * c.off[c.n]);
    for (uint64_t g = 0; g < c.n; g++) sample_tokens(g, (int)(c.off[g + 1] - c.off[g]), c.tok + c.off[g]);
    char path[512], err[DATA_ERR_LEN];
    uint64_t* local = (uint64_t*)malloc(sizeof(uint64_t) * (per_shard + 1));
    for (int s = 0; s < shards; s++) {
        uint64_t g0 = (uint64_t)s * per_shard;
        for (int i = 0; i <= per_shard; i++) local[i] = c.off[g0 + i] - c.off[g0];
        ShardHeader h = test_header(s == shards - 1 && shards > 1 ? 4 : 2, max_len);
        h.num_samples = per_shard;
        h.num_tokens = local[per_shard];
        snprintf(path, sizeof(path), "%s/%s_%05d.bin", dir, prefix, s);
        if (shard_write(path, &h, c.tok + c.off[g0], local, err)) {
            printf("%s\n", err);
            exit(1);
        }
    }
    free(local);
    return c;
}
static void corpus_free(Corpus* c) {
    free(c->off);
    free(c->tok);
}

static char tmp_root[256];
static void rm_tree(const char* path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR* d = opendir(path);
        struct dirent* e;
        char sub[1024];
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
            rm_tree(sub);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}
static void subdir(char* out, const char* name) {
    snprintf(out, 512, "%s/%s", tmp_root, name);
    mkdir(out, 0755);
}

// ----------------------------------------------------------------------------
// Reading batches back. check_batch validates the layout and the contents of one batch against
// the corpus: every segment is a whole sample (once its masked tokens are put back) or padding.
typedef struct {
    int B, T;
    BatchLayout L;
    int32_t* host;  // one batch, copied back from the device
} Reader;

static Reader reader_make(int B, int T) {
    Reader r;
    r.B = B;
    r.T = T;
    r.L = batch_layout(B, T);
    r.host = (int32_t*)malloc(dataloader_batch_bytes(B, T));
    return r;
}

// Two batches hold the same data: the counts, the per-position arrays, and the first num_segments+1
// / num_masked entries of the others (past those, slots keep stale values from earlier batches).
static int batch_equal(const Reader* r, const int32_t* a, const int32_t* b) {
    const BatchLayout* L = &r->L;
    size_t BT = (size_t)r->B * r->T;
    if (memcmp(a, b, 4 * sizeof(int32_t))) return 0;
    return !memcmp(a + L->input_ids, b + L->input_ids, BT * 4) &&
           !memcmp(a + L->segment_ids, b + L->segment_ids, BT * 4) &&
           !memcmp(a + L->position_ids, b + L->position_ids, BT * 4) &&
           !memcmp(a + L->cu_seqlens, b + L->cu_seqlens, (a[0] + 1) * 4) &&
           !memcmp(a + L->mask_pos, b + L->mask_pos, a[1] * 4) &&
           !memcmp(a + L->mask_target, b + L->mask_target, a[1] * 4);
}

static int next_host(DataLoader* dl, cudaStream_t stream, Reader* r, Batch* b) {
    if (dataloader_next(dl, stream, b)) return -1;
    cudaStreamSynchronize(stream);
    cudaMemcpy(r->host, b->device_base, dataloader_batch_bytes(r->B, r->T), cudaMemcpyDeviceToHost);
    return 0;
}

// Checks one batch; appends the global ids of its samples to ids (if not NULL). Returns the number
// of failed checks (each failure is also reported).
static int check_batch(const Reader* r, const Batch* b, const Corpus* c, uint64_t* ids, int* nids) {
    const int32_t* h = r->host;
    const BatchLayout* L = &r->L;
    int BT = r->B * r->T, fails = 0, T = r->T;
    const int32_t *in = h + L->input_ids, *seg = h + L->segment_ids, *pos = h + L->position_ids,
                  *cu = h + L->cu_seqlens;
    const int32_t *mpos = h + L->mask_pos, *mtgt = h + L->mask_target;
#define BCHECK(cond, ...)                           \
    do {                                            \
        if (!(cond)) {                              \
            if (fails++ < 5) CHECK(0, __VA_ARGS__); \
        }                                           \
    } while (0)
    BCHECK(h[0] == b->num_segments && h[1] == b->num_masked && h[2] == b->num_real_tokens && h[3] == b->num_samples,
           "the device header matches the host counts");
    int nseg = h[0], nm = h[1];
    BCHECK(nseg >= r->B && nseg <= BT && nm >= 0 && nm <= BT, "counts in range: %d segments, %d masked", nseg, nm);
    if (fails) return fails;
    BCHECK(cu[0] == 0 && cu[nseg] == BT, "cu_seqlens spans the batch: %d..%d", cu[0], cu[nseg]);
    // The original tokens: put the masked ones back.
    int32_t* orig = (int32_t*)malloc(sizeof(int32_t) * BT);
    memcpy(orig, in, sizeof(int32_t) * BT);
    for (int i = 0; i < nm; i++) {
        BCHECK(mpos[i] >= 0 && mpos[i] < BT && (i == 0 || mpos[i] > mpos[i - 1]), "mask_pos ascending, in range");
        if (mpos[i] >= 0 && mpos[i] < BT) orig[mpos[i]] = mtgt[i];
    }
    int real = 0, samples = 0;
    for (int s = 0; s < nseg && !fails; s++) {
        int a = cu[s], e = cu[s + 1];
        BCHECK(e > a && a / T == (e - 1) / T, "segment %d [%d,%d) is non-empty within one row", s, a, e);
        for (int p = a; p < e; p++) BCHECK(seg[p] == s && pos[p] == p - a, "segment and position ids at %d", p);
        if (in[a] == PAD) {  // padding: to the end of the row, all pad, never masked
            BCHECK(e % T == 0, "padding segment %d ends its row", s);
            for (int p = a; p < e; p++) BCHECK(in[p] == PAD && orig[p] == PAD, "padding is pad_id");
            continue;
        }
        int len = e - a;
        BCHECK(orig[a] == CLS && orig[e - 1] == SEP && len >= 4, "segment %d is a whole sample", s);
        uint64_t g = (uint64_t)(orig[a + 1] - FIRST) + (uint64_t)(orig[a + 2] - FIRST) * M;
        BCHECK(g < c->n && (int)(c->off[g + 1] - c->off[g]) == len, "segment %d is sample %llu of its length", s,
               (unsigned long long)g);
        if (g < c->n && (int)(c->off[g + 1] - c->off[g]) == len) {
            for (int j = 0; j < len; j++)
                BCHECK((uint32_t)orig[a + j] == c->tok[c->off[g] + j], "sample %llu token %d", (unsigned long long)g,
                       j);
        }
        if (ids) ids[(*nids)++] = g;
        real += len;
        samples++;
    }
    BCHECK(real == b->num_real_tokens && samples == b->num_samples, "real tokens %d, samples %d as counted", real,
           samples);
    // Masked positions: never special in the original; replacements never special.
    for (int i = 0; i < nm; i++) {
        int32_t o = mtgt[i], x = in[mpos[i]];
        BCHECK(o >= FIRST, "masked position %d holds ordinary token (got %d)", mpos[i], o);
        BCHECK(x == MASKID || x >= FIRST, "replacement %d is [MASK] or ordinary", x);
    }
    free(orig);
#undef BCHECK
    return fails;
}

// Two loaders, or none (a failed test must not leave loader threads behind).
static int init_two(DataLoader* a, const DataLoaderConfig* ca, DataLoader* b, const DataLoaderConfig* cb) {
    if (dataloader_init(a, ca)) {
        CHECK(0, "init: %s", a->error);
        return -1;
    }
    if (dataloader_init(b, cb)) {
        CHECK(0, "init: %s", b->error);
        dataloader_free(a);
        return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
static void test_crc_and_perm(void) {
    CHECK(crc32_update(0, "123456789", 9) == 0xCBF43926u, "CRC-32 check value (zlib's)");
    uint32_t c = crc32_update(0, "12345", 5);
    CHECK(crc32_update(c, "6789", 4) == 0xCBF43926u, "CRC-32 continues across calls");
    uint64_t sizes[] = {1, 2, 3, 17, 1000, 4097};
    for (int k = 0; k < 6; k++) {
        uint64_t n = sizes[k];
        char* seen = (char*)calloc(n, 1);
        int ok = 1, moved = 0, differs = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t p = perm_index(i, n, 42);
            if (p >= n || seen[p])
                ok = 0;
            else
                seen[p] = 1;
            moved += p != i;
            differs += p != perm_index(i, n, 43);
        }
        CHECK(ok, "perm_index is a permutation of [0,%llu)", (unsigned long long)n);
        if (n >= 1000)
            CHECK(moved > (int)n * 9 / 10 && differs > (int)n * 9 / 10, "perm_index shuffles (n=%llu: %d moved)",
                  (unsigned long long)n, moved);
        free(seen);
    }
}

// The format: write with the C writer, read back every field and sample, 2- and 4-byte tokens.
static void test_format_round_trip(void) {
    char dir[512], err[DATA_ERR_LEN];
    subdir(dir, "format");
    Corpus c = make_dataset(dir, "train", 2, 50, 32);  // shard 0: 2-byte tokens, shard 1: 4-byte
    Shard* s;
    int n;
    char pattern[600];
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", dir);
    CHECK(shards_open_all(pattern, &s, &n, 0, err) == 0 && n == 2, "open 2 shards: %s", err);
    if (n == 2) {
        for (int k = 0; k < 2; k++) {
            ShardHeader* h = &s[k].h;
            CHECK(h->vocab_size == VOCAB && h->token_bytes == (k ? 4u : 2u) && h->num_samples == 50 &&
                      h->max_len == 32 && h->pad_id == PAD && h->cls_id == CLS && h->sep_id == SEP &&
                      h->mask_id == MASKID && h->unk_id == UNK,
                  "header fields of shard %d", k);
            CHECK(shard_check_data(s[k].map, s[k].bytes, s[k].path, h, err) == 0, "checksum verifies: %s", err);
            int same = 1;
            for (uint64_t i = 0; i < 50; i++) {
                uint64_t g = k * 50 + i, len = s[k].offsets[i + 1] - s[k].offsets[i];
                if (len != c.off[g + 1] - c.off[g]) {
                    same = 0;
                    break;
                }
                for (uint64_t j = 0; j < len; j++) {
                    uint64_t at = s[k].offsets[i] + j;
                    uint32_t t =
                        h->token_bytes == 2 ? ((const uint16_t*)s[k].tokens)[at] : ((const uint32_t*)s[k].tokens)[at];
                    same &= t == c.tok[c.off[g] + j];
                }
            }
            CHECK(same, "every sample of shard %d reads back as written (O(1) through the offsets)", k);
            CHECK(s[k].bytes == shard_offsets_pos(h->num_tokens, h->token_bytes) + 8 * 51, "file size as documented");
        }
    }
    for (int k = 0; k < n; k++) shard_close(&s[k]);
    free(s);
    // A fixed tiny shard: its file CRC pins the exact bytes (tests/test_prepare.py checks that
    // tools/prepare.py writes the same file).
    uint32_t toks[7] = {2, 10, 11, 3, 2, 12, 3};
    uint64_t offs[3] = {0, 4, 7};
    ShardHeader h = test_header(2, 8);
    h.vocab_size = 30522;
    h.pad_id = 0;
    h.unk_id = 100;
    h.cls_id = 2;
    h.sep_id = 3;
    h.mask_id = 103;
    h.num_samples = 2;
    h.num_tokens = 7;
    char path[600];
    snprintf(path, sizeof(path), "%s/golden.bin", dir);
    CHECK(shard_write(path, &h, toks, offs, err) == 0, "write the golden shard");
    char tmp_path[700];  // written atomically: through golden.bin.tmp, renamed
    snprintf(tmp_path, sizeof(tmp_path), "%s.tmp", path);
    CHECK(access(tmp_path, F_OK) != 0, "shard_write left %s behind", tmp_path);
    snprintf(tmp_path, sizeof(tmp_path), "%s/no/such/dir/x.bin", dir);
    CHECK(shard_write(tmp_path, &h, toks, offs, err) != 0 && strstr(err, "x.bin.tmp: cannot create"),
          "shard_write into a missing directory: %s", err);
    FILE* f = fopen(path, "rb");
    uint8_t buf[256];
    size_t got = f ? fread(buf, 1, sizeof(buf), f) : 0;
    if (f) fclose(f);
    CHECK(got == 128 + 16 + 24, "golden shard is %zu bytes (expected 168)", got);
    CHECK(crc32_update(0, buf, got) == 0x7E341EE9u, "golden shard bytes: file CRC 0x%08x", crc32_update(0, buf, got));
    corpus_free(&c);
}

// All ranks of one configuration for `epochs` epochs; checks every batch; checks that each
// sample is seen exactly once per epoch across the ranks. Returns row hashes keyed by
// (epoch, global row) into rows[epoch][row] (0 for rows no rank filled).
static void run_config(const char* pattern, const Corpus* c, int B, int T, int world, int threads, int slots,
                       int epochs, uint64_t seed, uint64_t** rows, uint64_t rows_cap) {
    uint64_t* ids = (uint64_t*)malloc(sizeof(uint64_t) * (c->n + (uint64_t)B * T));
    int* count = (int*)calloc(c->n, sizeof(int));
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    Reader r = reader_make(B, T);
    for (int e = 0; e < epochs; e++) memset(rows[e], 0, sizeof(uint64_t) * rows_cap);
    int bad_epochs = 0, fails = 0;
    for (int rank = 0; rank < world; rank++) {
        DataLoader dl;
        DataLoaderConfig cfg = dataloader_default_config(pattern, B, T);
        cfg.rank = rank;
        cfg.world = world;
        cfg.num_threads = threads;
        cfg.ring_slots = slots;
        cfg.seed = seed;
        cfg.vocab_size = VOCAB;
        if (dataloader_init(&dl, &cfg)) {
            CHECK(0, "init: %s", dl.error);
            break;
        }
        int64_t epoch = 0;
        int nids = 0;
        for (;;) {
            Batch b = {};
            if (next_host(&dl, stream, &r, &b)) {
                CHECK(0, "next: %s", dl.error);
                break;
            }
            if (b.epoch != epoch) {  // the epoch ended: each of this rank's samples once...
                for (int i = 0; i < nids; i++) count[ids[i]] += 1 << (4 * epoch);  // a counter per epoch
                nids = 0;
                epoch = b.epoch;
                if (epoch == epochs) break;
            }
            fails += check_batch(&r, &b, c, ids, &nids);
            for (int bb = 0; bb < B; bb++) {
                uint64_t row = (uint64_t)b.row + (uint64_t)rank * B + bb, hsh = 0x1234;
                if (row >= rows_cap) continue;
                const int32_t* h = r.host;
                for (int t = 0; t < T; t++)
                    hsh = mix64(hsh ^ (uint32_t)h[r.L.input_ids + bb * T + t] ^
                                ((uint64_t)h[r.L.position_ids + bb * T + t] << 32));
                for (int i = 0; i < h[1]; i++)
                    if (h[r.L.mask_pos + i] / T == bb)
                        hsh =
                            mix64(hsh ^ ((uint64_t)(h[r.L.mask_pos + i] % T) << 32) ^ (uint32_t)h[r.L.mask_target + i]);
                if (rows[epoch][row]) bad_epochs++;  // two ranks filled the same row
                rows[epoch][row] = hsh;
            }
        }
        dataloader_free(&dl);
    }
    // count[g] holds one 4-bit counter per epoch: each must be exactly 1.
    uint64_t wrong = 0;
    int want = 0;
    for (int e = 0; e < epochs; e++) want |= 1 << (4 * e);
    for (uint64_t g = 0; g < c->n; g++) wrong += count[g] != want;
    CHECK(wrong == 0 && bad_epochs == 0,
          "world %d, %d threads: every sample exactly once per epoch (%llu wrong, %d rows twice)", world, threads,
          (unsigned long long)wrong, bad_epochs);
    CHECK(fails == 0, "world %d, %d threads: every batch well formed and holding whole samples", world, threads);
    free(r.host);
    free(ids);
    free(count);
    cudaStreamDestroy(stream);
}

// Every sample once per epoch across ranks and threads, and the same rows whatever the split.
static void test_epochs_ranks_threads(void) {
    char dir[512], pattern[600];
    subdir(dir, "epochs");
    Corpus c = make_dataset(dir, "train", 3, 233, 48);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", dir);
    const int T = 48, E = 3;
    const uint64_t CAP = 2000;
    uint64_t* ref[E];
    uint64_t* got[E];
    for (int e = 0; e < E; e++) {
        ref[e] = (uint64_t*)malloc(sizeof(uint64_t) * CAP);
        got[e] = (uint64_t*)malloc(sizeof(uint64_t) * CAP);
    }
    // The global micro-batch is 6 rows, split 1x6, 2x3, 3x2, 6x1, with various threads and slots.
    run_config(pattern, &c, 6, T, 1, 1, 2, E, 7, ref, CAP);
    int cfgs[][4] = {{3, 2, 2, 3}, {2, 3, 3, 2}, {1, 6, 1, 5}, {6, 1, 4, 8}};  // B, world, threads, slots
    for (int k = 0; k < 4; k++) {
        run_config(pattern, &c, cfgs[k][0], T, cfgs[k][1], cfgs[k][2], cfgs[k][3], E, 7, got, CAP);
        int same = 1, filled = 0;
        for (int e = 0; e < E; e++)
            for (uint64_t i = 0; i < CAP; i++) {
                same &= ref[e][i] == got[e][i];
                filled += ref[e][i] != 0;
            }
        CHECK(same && filled > 100, "B=%d world=%d threads=%d slots=%d: the same rows as B=6 world=1 (%d rows)",
              cfgs[k][0], cfgs[k][1], cfgs[k][2], cfgs[k][3], filled);
    }
    // A global batch of 5 rows: a different split of the row stream, still each sample once per epoch.
    run_config(pattern, &c, 5, T, 1, 2, 3, E, 7, got, CAP);
    // Epochs are shuffled differently, and the seed changes the order.
    int diff_epoch = 0, diff_seed = 0;
    for (uint64_t i = 0; i < CAP; i++) diff_epoch += ref[0][i] != ref[1][i];
    run_config(pattern, &c, 6, T, 1, 2, 4, 1, 8, got, CAP);
    for (uint64_t i = 0; i < CAP; i++) diff_seed += ref[0][i] != got[0][i];
    CHECK(diff_epoch > 100 && diff_seed > 100, "epochs and seeds reshuffle (%d, %d rows differ)", diff_epoch,
          diff_seed);
    for (int e = 0; e < E; e++) {
        free(ref[e]);
        free(got[e]);
    }
    corpus_free(&c);
}

// Packing: the plan fills rows well and keeps every sample whole. And the next epoch's plan, which a
// planner thread builds in the background while this one is consumed, is the plan a build on the
// spot gives.
static void test_packing(void) {
    char dir[512], pattern[600];
    subdir(dir, "packing");
    Corpus c = make_dataset(dir, "train", 2, 2000, 128);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", dir);
    DataLoader dl;
    DataLoaderConfig cfg = dataloader_default_config(pattern, 8, 128);
    if (dataloader_init(&dl, &cfg)) {
        CHECK(0, "init: %s", dl.error);
        corpus_free(&c);
        return;
    }
    Batch b = {};
    CHECK(dataloader_next(&dl, 0, &b) == 0, "first batch");
    pthread_mutex_lock(&dl.lock);
    planner_join(&dl);
    CHECK(dl.plan.epoch == 0 && dl.next_plan.epoch == 1, "epoch 1 planned in the background (plans: %lld, %lld)",
          (long long)dl.plan.epoch, (long long)dl.next_plan.epoch);
    EpochPlan fresh = {-1, 0, (uint32_t*)malloc(4 * dl.num_samples), (uint32_t*)malloc(4 * (dl.num_samples + 1)), 0};
    plan_build(&dl, &fresh, 1);
    CHECK(fresh.num_rows == dl.next_plan.num_rows &&
              !memcmp(fresh.row_start, dl.next_plan.row_start, 4 * (fresh.num_rows + 1)) &&
              !memcmp(fresh.order, dl.next_plan.order, 4 * dl.num_samples),
          "the background plan of epoch 1 equals one built on the spot");
    free(fresh.order);
    free(fresh.row_start);
    const EpochPlan* p = &dl.plan;
    uint64_t total = 0, bad = 0;
    for (uint64_t r = 0; r < p->num_rows; r++) {
        uint64_t len = 0;
        for (uint32_t k = p->row_start[r]; k < p->row_start[r + 1]; k++) len += sample_len(&dl, p->order[k]);
        bad += len > 128 || len == 0;
        total += len;
    }
    CHECK(bad == 0 && total == dl.num_tokens, "rows hold 1..T tokens and all tokens once (%llu bad rows)",
          (unsigned long long)bad);
    CHECK(p->fill > 0.97, "best-fit packing fills %.2f%% of row positions (expected > 97%%)", 100 * p->fill);
    pthread_mutex_unlock(&dl.lock);
    dataloader_free(&dl);
    corpus_free(&c);
}

// Masking statistics, exact per-sample counts, and determinism.
static void test_masking(void) {
    char dir[512], pattern[600];
    subdir(dir, "masking");
    Corpus c = make_dataset(dir, "train", 2, 3000, 128);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", dir);
    const int B = 16, T = 128;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    Reader r = reader_make(B, T), r2 = reader_make(B, T);
    DataLoader a, b2;
    DataLoaderConfig cfg = dataloader_default_config(pattern, B, T);
    cfg.num_threads = 2;
    DataLoaderConfig cfg2 = cfg;
    cfg2.num_threads = 3;
    cfg2.ring_slots = 7;
    if (init_two(&a, &cfg, &b2, &cfg2)) return;
    uint64_t cand = 0, masked = 0, as_mask = 0, as_same = 0, as_random = 0, per_sample_bad = 0, quarter[4] = {0};
    int identical = 1, batch_fails = 0;
    int32_t* first = (int32_t*)malloc(dataloader_batch_bytes(B, T));
    for (int it = 0; it < 80; it++) {
        Batch b, bb;
        if (next_host(&a, stream, &r, &b) || next_host(&b2, stream, &r2, &bb)) {
            CHECK(0, "next");
            break;
        }
        identical &= batch_equal(&r, r.host, r2.host);
        if (it == 0) memcpy(first, r.host, dataloader_batch_bytes(B, T));
        batch_fails += check_batch(&r, &b, &c, NULL, NULL);  // among others: replacements are never special
        const int32_t* h = r.host;
        const int32_t *in = h + r.L.input_ids, *cu = h + r.L.cu_seqlens, *mp = h + r.L.mask_pos,
                      *mt = h + r.L.mask_target;
        int mi = 0;
        for (int s = 0; s < h[0]; s++) {
            int s0 = cu[s], s1 = cu[s + 1], nc = 0, nmk = 0;
            if (in[s0] == PAD) continue;
            for (; mi < h[1] && mp[mi] < s1; mi++) {
                nmk++;
                int q = mp[mi] > s0 && mp[mi] < s1 - 1 ? 4 * (mp[mi] - s0 - 1) / (s1 - s0 - 2) : -1;
                if (q >= 0) quarter[q]++;  // where in the sample's content ([CLS] and [SEP] never are: checked below)
                if (in[mp[mi]] == MASKID)
                    as_mask++;
                else if (in[mp[mi]] == mt[mi])
                    as_same++;
                else
                    as_random++;
            }
            // Candidates: the sample's non-special tokens (in the original, i.e. after putting masks back).
            for (int p = s0; p < s1; p++) nc += in[p] >= FIRST || in[p] == MASKID;
            double want = (double)0.15f * nc;  // the loader draws floor(want + u), u uniform in [0,1)
            per_sample_bad += nmk < (int)floor(want) || nmk > (int)floor(want) + 1;
            cand += nc;
            masked += nmk;
        }
    }
    double rate = (double)masked / cand, fm = (double)as_mask / masked, fs = (double)as_same / masked,
           fr = (double)as_random / masked;
    CHECK(fabs(rate - 0.15) < 0.004, "15%% of ordinary tokens masked: %.4f of %llu", rate, (unsigned long long)cand);
    CHECK(per_sample_bad == 0, "each sample masks floor or ceil of 15%% of its ordinary tokens (%llu not)",
          (unsigned long long)per_sample_bad);
    CHECK(fabs(fm - 0.8) < 0.015 && fabs(fs - 0.1) < 0.012 && fabs(fr - 0.1) < 0.012,
          "80/10/10: [MASK] %.4f, unchanged %.4f, random %.4f of %llu", fm, fs, fr, (unsigned long long)masked);
    CHECK(identical, "2 and 3 loader threads, 4 and 7 slots: byte-identical batches");
    CHECK(batch_fails == 0, "80 batches well formed, whole samples, no special token masked or put in");
    int spread = 1;
    for (int q = 0; q < 4; q++) spread &= fabs((double)quarter[q] / masked - 0.25) < 0.02;
    CHECK(spread, "masked positions spread evenly over the samples: %llu %llu %llu %llu",
          (unsigned long long)quarter[0], (unsigned long long)quarter[1], (unsigned long long)quarter[2],
          (unsigned long long)quarter[3]);
    dataloader_free(&a);
    dataloader_free(&b2);
    // Another seed: other masks (and order); mask_prob 0: nothing masked.
    cfg.seed = 99;
    cfg2.mask_prob = 0;
    if (init_two(&a, &cfg, &b2, &cfg2)) return;
    Batch b, bb;
    next_host(&a, stream, &r2, &b);
    CHECK(!batch_equal(&r, first, r2.host), "another seed gives other batches");
    free(first);
    int fails = 0;
    for (int it = 0; it < 5; it++) {
        next_host(&b2, stream, &r2, &bb);
        fails += bb.num_masked != 0;
        fails += check_batch(&r2, &bb, &c, NULL, NULL);
    }
    CHECK(fails == 0, "mask_prob 0: no masked positions, inputs are the samples");
    dataloader_free(&a);
    dataloader_free(&b2);
    free(r.host);
    free(r2.host);
    cudaStreamDestroy(stream);
    corpus_free(&c);
}

// Resume: a run stopped after k batches and resumed (other threads, other world size with the same
// global batch, another seed given at init) sees exactly the batches of an uninterrupted run.
static void test_resume(void) {
    char dir[512], pattern[600];
    subdir(dir, "resume");
    Corpus c = make_dataset(dir, "train", 2, 150, 40);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", dir);
    const int T = 40, B = 4, N = 100;
    size_t bytes = dataloader_batch_bytes(B, T);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    Reader r = reader_make(B, T), r2 = reader_make(2, T), r3 = reader_make(2, T);
    int32_t* ref = (int32_t*)malloc(bytes * N);
    DataLoader dl, d0, d1;
    DataLoaderConfig cfg = dataloader_default_config(pattern, B, T);
    cfg.seed = 5;
    if (dataloader_init(&dl, &cfg)) {
        CHECK(0, "init: %s", dl.error);
        return;
    }
    Batch b = {};
    int64_t epochs_seen = 0;
    for (int i = 0; i < N; i++) {
        next_host(&dl, stream, &r, &b);
        memcpy((char*)ref + bytes * i, r.host, bytes);
        epochs_seen = b.epoch;
    }
    dataloader_free(&dl);
    CHECK(epochs_seen >= 2, "the reference run crosses epochs (reached epoch %lld)", (long long)epochs_seen);
    int ks[] = {1, 40, 77};
    for (int kk = 0; kk < 3; kk++) {
        int k = ks[kk];
        cfg.num_threads = 1 + kk;
        if (dataloader_init(&dl, &cfg)) break;
        for (int i = 0; i < k; i++) next_host(&dl, stream, &r, &b);
        DataLoaderState st = dataloader_state(&dl);
        dataloader_free(&dl);
        uint8_t saved[sizeof(st)];  // as a checkpoint file would hold it
        memcpy(saved, &st, sizeof(st));
        DataLoaderState st2;
        memcpy(&st2, saved, sizeof(st2));
        // Resume on 2 ranks of B=2 (the same global batch of 4), with another seed at init.
        DataLoaderConfig c0 = cfg, c1 = cfg;
        c0.B = c1.B = 2;
        c0.world = c1.world = 2;
        c1.rank = 1;
        c0.seed = c1.seed = 12345;
        c0.num_threads = 3;
        if (init_two(&d0, &c0, &d1, &c1)) break;
        CHECK(dataloader_restore(&d0, &st2) == 0 && dataloader_restore(&d1, &st2) == 0, "restore: %s", d0.error);
        int same = 1;
        for (int i = k; i < N; i++) {
            Batch b0, b1;
            next_host(&d0, stream, &r2, &b0);
            next_host(&d1, stream, &r3, &b1);
            const int32_t* want = (const int32_t*)((char*)ref + bytes * i);
            // rank 0 holds rows 0,1 and rank 1 rows 2,3 of the reference batch: compare ids, positions, masks.
            for (int q = 0; q < 2 * T; q++) {
                same &= r2.host[r2.L.input_ids + q] == want[r.L.input_ids + q];
                same &= r3.host[r3.L.input_ids + q] == want[r.L.input_ids + 2 * T + q];
                same &= r2.host[r2.L.position_ids + q] == want[r.L.position_ids + q];
                same &= r3.host[r3.L.position_ids + q] == want[r.L.position_ids + 2 * T + q];
            }
            same &= r2.host[1] + r3.host[1] == want[1];
            for (int m = 0; m < r2.host[1]; m++)
                same &= r2.host[r2.L.mask_pos + m] == want[r.L.mask_pos + m] &&
                        r2.host[r2.L.mask_target + m] == want[r.L.mask_target + m];
            for (int m = 0; m < r3.host[1]; m++)
                same &= r3.host[r3.L.mask_pos + m] + 2 * T == want[r.L.mask_pos + r2.host[1] + m] &&
                        r3.host[r3.L.mask_target + m] == want[r.L.mask_target + r2.host[1] + m];
        }
        CHECK(same, "resumed after %d batches on 2 ranks: the same batches as the uninterrupted run", k);
        dataloader_free(&d0);
        dataloader_free(&d1);
    }
    // Same world, restore onto a fresh loader: byte-identical batches.
    cfg.num_threads = 2;
    dataloader_init(&dl, &cfg);
    for (int i = 0; i < 45; i++) next_host(&dl, stream, &r, &b);
    DataLoaderState st = dataloader_state(&dl);
    CHECK(dataloader_restore(&dl, &st) == 0, "restore in place");
    int same = 1;
    for (int i = 45; i < N; i++) {
        next_host(&dl, stream, &r, &b);
        same &= batch_equal(&r, r.host, (const int32_t*)((char*)ref + bytes * i));
    }
    CHECK(same, "restore in place continues byte-identically");
    // Restores that must be refused.
    DataLoaderState bad = st;
    bad.fingerprint ^= 1;
    CHECK(dataloader_restore(&dl, &bad) != 0 && strstr(dl.error, "other data"), "other data refused: %s", dl.error);
    bad = st;
    bad.T = 64;
    CHECK(dataloader_restore(&dl, &bad) != 0 && strstr(dl.error, "T=64"), "other T refused: %s", dl.error);
    bad = st;
    bad.version = 9;
    CHECK(dataloader_restore(&dl, &bad) != 0 && strstr(dl.error, "version"), "other version refused: %s", dl.error);
    dataloader_free(&dl);
    free(ref);
    free(r.host);
    free(r2.host);
    free(r3.host);
    cudaStreamDestroy(stream);
    corpus_free(&c);
}

// ----------------------------------------------------------------------------
// Bad input: each case gives one error naming the file and saying what is wrong.
static void patch_file(const char* path, long at, const void* bytes, size_t n) {
    FILE* f = fopen(path, "r+b");
    fseek(f, at, SEEK_SET);
    fwrite(bytes, 1, n, f);
    fclose(f);
}
static void copy_file(const char* from, const char* to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), a)) > 0) fwrite(buf, 1, n, b);
    fclose(a);
    fclose(b);
}
static void expect_init_error(const char* what, const char* pattern, const char* name_in_msg, const char* phrase, int T,
                              int vocab, int verify) {
    DataLoader dl;
    DataLoaderConfig cfg = dataloader_default_config(pattern, 2, T);
    cfg.vocab_size = vocab;
    cfg.verify = verify;
    int rc = dataloader_init(&dl, &cfg);
    CHECK(rc != 0 && !strncmp(dl.error, "data: ", 6) && strstr(dl.error, name_in_msg) && strstr(dl.error, phrase) &&
              !strchr(dl.error, '\n'),
          "%s: one error naming %s and saying \"%s\"; got rc %d: %s", what, name_in_msg, phrase, rc, dl.error);
    if (rc == 0) dataloader_free(&dl);
    if (getenv("TEST_VERBOSE")) printf("ok   %s -> %s\n", what, dl.error);
}

static void test_bad_input(void) {
    char dir[512], good[600], path[600], pat[600];
    subdir(dir, "bad");
    Corpus c = make_dataset(dir, "good", 1, 40, 32);
    snprintf(good, sizeof(good), "%s/good_00000.bin", dir);
    struct stat st;
    stat(good, &st);
#define CASE(name)                                                                                                     \
    (snprintf(path, sizeof(path), "%s/%s_00000.bin", dir, name), snprintf(pat, sizeof(pat), "%s/%s_*.bin", dir, name), \
     copy_file(good, path))
    CASE("trunc");
    CHECK(truncate(path, st.st_size - 5) == 0, "truncate");
    expect_init_error("truncated file", pat, path, "truncated", 32, 0, 1);
    CASE("trailing");
    FILE* tf = fopen(path, "ab");
    fputs("extra!!!", tf);
    fclose(tf);
    expect_init_error("trailing bytes", pat, path, "trailing bytes", 32, 0, 1);
    CASE("tiny");
    CHECK(truncate(path, 100) == 0, "truncate");
    expect_init_error("file shorter than a header", pat, path, "truncated", 32, 0, 1);
    CASE("magic");
    patch_file(path, 0, "NOTASHRD", 8);
    expect_init_error("wrong magic", pat, path, "wrong magic \"NOTASHRD\"", 32, 0, 1);
    CASE("version");
    uint32_t v = 2;
    patch_file(path, 8, &v, 4);
    expect_init_error("wrong version", pat, path, "version 2", 32, 0, 1);
    CASE("hdrcrc");
    uint32_t vocab = 999;
    patch_file(path, 16, &vocab, 4);
    expect_init_error("corrupt header", pat, path, "header checksum", 32, 0, 1);
    CASE("offsets");  // sample 3 reaching past the end of the tokens
    uint64_t big = 1ull << 40;
    patch_file(path, (long)(st.st_size - 8 * 38), &big, 8);
    expect_init_error("offsets out of range", pat, path, "offsets[2..3]", 32, 0, 1);
    CASE("offdown");  // a decreasing offset
    uint64_t zero = 0;
    patch_file(path, (long)(st.st_size - 8 * 30), &zero, 8);
    expect_init_error("offsets not increasing", pat, path, "out of range", 32, 0, 1);
    CASE("datacrc");  // a flipped token byte
    uint8_t x = 0x77;
    patch_file(path, 128 + 9, &x, 1);
    expect_init_error("corrupt tokens", pat, path, "data checksum", 32, 0, 1);
    // A token id >= vocab with a matching checksum (a buggy writer): caught at init...
    snprintf(path, sizeof(path), "%s/tokid_00000.bin", dir);
    snprintf(pat, sizeof(pat), "%s/tokid_*.bin", dir);
    {
        uint32_t toks[8] = {CLS, 7, 8, SEP, CLS, 9, VOCAB + 5, SEP};
        uint64_t offs[3] = {0, 4, 8};
        ShardHeader h = test_header(2, 8);
        h.num_samples = 2;
        h.num_tokens = 8;
        char err[DATA_ERR_LEN];
        shard_write(path, &h, toks, offs, err);
    }
    expect_init_error("token id >= vocab", pat, path, "token 6 has id 1205", 32, 0, 1);
    {  // ...and, with verify off, by the loader thread, as an error from dataloader_next
        DataLoader dl;
        DataLoaderConfig cfg = dataloader_default_config(pat, 2, 8);
        cfg.verify = 0;
        cudaStream_t s;
        cudaStreamCreate(&s);
        Batch b = {};
        int rc = dataloader_init(&dl, &cfg);
        CHECK(rc == 0, "verify off: init passes: %s", dl.error);
        if (rc == 0) {
            rc = dataloader_next(&dl, s, &b);
            CHECK(rc != 0 && strstr(dl.error, path) && strstr(dl.error, "vocab size"), "verify off: next() fails: %s",
                  dl.error);
            dataloader_free(&dl);
        }
        cudaStreamDestroy(s);
    }
    snprintf(pat, sizeof(pat), "%s/good_*.bin", dir);
    expect_init_error("vocab disagrees with the model", pat, good, "but the model has 30522", 32, 30522, 1);
    expect_init_error("samples longer than T", pat, good, "do not fit rows of T=16", 16, 0, 1);
    snprintf(pat, sizeof(pat), "%s/val_*.bin", dir);
    expect_init_error("empty split", pat, pat, "no shard files match", 32, 0, 1);
    snprintf(pat, sizeof(pat), "%s/nowhere/train_*.bin", dir);
    expect_init_error("missing directory", pat, pat, "no shard files match", 32, 0, 1);
    expect_init_error("a directory given", dir, dir, "is a directory", 32, 0, 1);
    snprintf(path, sizeof(path), "%s/dangling_00000.bin", dir);
    CHECK(symlink("/nonexistent/shard.bin", path) == 0, "symlink");
    snprintf(pat, sizeof(pat), "%s/dangling_*.bin", dir);
    expect_init_error("unreadable path", pat, path, "cannot open", 32, 0, 1);
    snprintf(path, sizeof(path), "%s/isdir_00000.bin", dir);
    mkdir(path, 0755);
    snprintf(pat, sizeof(pat), "%s/isdir_*.bin", dir);
    expect_init_error("a directory named like a shard", pat, path, "not a regular file", 32, 0, 1);
    {  // shards that disagree on the vocabulary; a shard with no samples
        char err[DATA_ERR_LEN];
        uint32_t toks[4] = {CLS, 7, 8, SEP};
        uint64_t offs[2] = {0, 4};
        ShardHeader h = test_header(2, 8);
        h.num_samples = 1;
        h.num_tokens = 4;
        snprintf(path, sizeof(path), "%s/mix_00000.bin", dir);
        shard_write(path, &h, toks, offs, err);
        h.vocab_size = VOCAB + 1;
        snprintf(path, sizeof(path), "%s/mix_00001.bin", dir);
        shard_write(path, &h, toks, offs, err);
        snprintf(pat, sizeof(pat), "%s/mix_*.bin", dir);
        expect_init_error("shards disagree on the vocabulary", pat, path, "differs from", 32, 0, 1);
        h = test_header(2, 8);
        h.num_samples = 0;
        h.num_tokens = 0;
        snprintf(path, sizeof(path), "%s/empty_00000.bin", dir);
        shard_write(path, &h, toks, offs, err);
        snprintf(pat, sizeof(pat), "%s/empty_*.bin", dir);
        expect_init_error("a shard with no samples", pat, path, "no samples", 32, 0, 1);
        h = test_header(2, 8);
        h.num_samples = 1;
        h.num_tokens = 4;
        h.mask_id = h.pad_id;
        snprintf(path, sizeof(path), "%s/special_00000.bin", dir);
        shard_write(path, &h, toks, offs, err);
        snprintf(pat, sizeof(pat), "%s/special_*.bin", dir);
        expect_init_error("special ids collide", pat, path, "are both 0", 32, 0, 1);
        h = test_header(2, 8);
        h.num_samples = 1;
        h.num_tokens = 4;
        h.vocab_size = 70000;
        snprintf(path, sizeof(path), "%s/wide_00000.bin", dir);
        shard_write(path, &h, toks, offs, err);
        snprintf(pat, sizeof(pat), "%s/wide_*.bin", dir);
        expect_init_error("vocab too big for 2-byte tokens", pat, path, "does not fit", 32, 0, 1);
    }
    snprintf(pat, sizeof(pat), "%s/good_*.bin", dir);
    {
        DataLoader dl;
        DataLoaderConfig cfg = dataloader_default_config(pat, 2, 32);
        cfg.rank = 2;
        cfg.world = 2;
        CHECK(dataloader_init(&dl, &cfg) != 0 && strstr(dl.error, "bad loader settings"), "bad settings: %s", dl.error);
    }
    // Random header and offset corruption never crashes the parser (the fuzz target goes further).
    {
        FILE* f = fopen(good, "rb");
        uint8_t* buf = (uint8_t*)malloc(st.st_size);
        uint8_t* mut = (uint8_t*)malloc(st.st_size);
        CHECK(fread(buf, 1, st.st_size, f) == (size_t)st.st_size, "read");
        fclose(f);
        uint64_t rng = 3;
        int rejected = 0;
        char err[DATA_ERR_LEN];
        for (int it = 0; it < 2000; it++) {
            memcpy(mut, buf, st.st_size);
            int n = 1 + (int)(rng_next(&rng) % 4);
            for (int k = 0; k < n; k++) {
                uint64_t r = rng_next(&rng);
                size_t at = (r & 1) ? (r >> 8) % 128 : st.st_size - 1 - (r >> 8) % (8 * 41);
                mut[at] ^= (uint8_t)(1 + (r >> 40) % 255);
            }
            ShardHeader h = {};
            size_t size = (rng_next(&rng) % 8 == 0) ? (size_t)(rng_next(&rng) % st.st_size) : (size_t)st.st_size;
            int rc = shard_check_layout(mut, size, "mut", &h, err);
            if (rc == 0) rc = shard_check_data(mut, size, "mut", &h, err);
            rejected += rc != 0;
        }
        CHECK(rejected == 2000, "2000 corrupted shards: all rejected (%d)", rejected);
        free(buf);
        free(mut);
    }
#undef CASE
    corpus_free(&c);
}

// ----------------------------------------------------------------------------
// Node-local staging: rank 0 copies and verifies, rank 1 waits, a second run copies nothing.
typedef struct {
    const char *pattern, *local;
    int rank;
    double timeout;
    char local_pattern[600], err[DATA_ERR_LEN];
    int rc;
} StageArgs;
static void* stage_thread(void* p) {
    StageArgs* a = (StageArgs*)p;
    a->rc =
        dataloader_stage(a->pattern, a->local, a->rank, a->timeout, a->local_pattern, sizeof(a->local_pattern), a->err);
    return NULL;
}
static int files_equal(const char* a, const char* b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        same = x == y;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}
static void test_staging(void) {
    char shared[512], local[600], pattern[600], a[700], b[700];
    subdir(shared, "shared");
    snprintf(local, sizeof(local), "%s/node/local/data", tmp_root);
    Corpus c = make_dataset(shared, "train", 3, 30, 32);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", shared);
    // A stale file from an earlier data set, which staging must remove.
    snprintf(a, sizeof(a), "%s/node", tmp_root);
    mkdir(a, 0755);
    snprintf(a, sizeof(a), "%s/node/local", tmp_root);
    mkdir(a, 0755);
    mkdir(local, 0755);
    snprintf(a, sizeof(a), "%s/train_00007.bin", local);
    FILE* f = fopen(a, "wb");
    fputs("stale", f);
    fclose(f);
    StageArgs r0 = {pattern, local, 0, 30, {0}, {0}, -1}, r1 = {pattern, local, 1, 30, {0}, {0}, -1};
    pthread_t t0, t1;
    pthread_create(&t1, NULL, stage_thread, &r1);  // the waiter starts first
    pthread_create(&t0, NULL, stage_thread, &r0);
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    CHECK(r0.rc == 0 && r1.rc == 0, "staging: rank 0 copies (%s), rank 1 waits (%s)", r0.err, r1.err);
    CHECK(!strcmp(r0.local_pattern, r1.local_pattern) && strstr(r0.local_pattern, "/node/local/data/train_*.bin"),
          "both ranks get the local pattern %s", r0.local_pattern);
    int same = 1;
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof(a), "%s/train_%05d.bin", shared, i);
        snprintf(b, sizeof(b), "%s/train_%05d.bin", local, i);
        same &= files_equal(a, b);
    }
    snprintf(a, sizeof(a), "%s/train_00007.bin", local);
    CHECK(same && access(a, F_OK) != 0, "the local copies equal the shared shards; the stale file is gone");
    DataLoader dl;
    DataLoaderConfig cfg = dataloader_default_config(r0.local_pattern, 2, 32);
    CHECK(dataloader_init(&dl, &cfg) == 0 && dl.num_samples == 90, "the loader opens the local copy: %s", dl.error);
    dataloader_free(&dl);
    // A second run: nothing copied (the local file keeps its inode and time).
    snprintf(b, sizeof(b), "%s/train_00001.bin", local);
    struct stat before, after;
    stat(b, &before);
    r0.rc = -1;
    stage_thread(&r0);
    stat(b, &after);
    CHECK(r0.rc == 0 && before.st_ino == after.st_ino && before.st_mtim.tv_nsec == after.st_mtim.tv_nsec,
          "staging again copies nothing: %s", r0.err);
    // A corrupt shared shard on a fresh node (no marker): staging fails naming it, and leaves no
    // marker, so no rank trains on it.
    snprintf(a, sizeof(a), "%s/.staged-train_*.bin", local);
    CHECK(unlink(a) == 0, "the marker %s exists", a);
    snprintf(a, sizeof(a), "%s/train_00002.bin", shared);
    uint8_t x = 0x55;
    patch_file(a, 128 + 3, &x, 1);
    r0.rc = 0;
    stage_thread(&r0);
    CHECK(r0.rc != 0 && strstr(r0.err, a) && strstr(r0.err, "corrupt"), "a corrupt shared shard fails staging: %s",
          r0.err);
    r1.timeout = 0.2;
    r1.rc = 0;
    stage_thread(&r1);
    CHECK(r1.rc != 0 && strstr(r1.err, "gave up"), "the waiting rank times out with a clear error: %s", r1.err);
    corpus_free(&c);
}

// The ring keeps the compute stream fed; the per-step wait is measured.
static void test_wait_measure(void) {
    char dir[512], pattern[600];
    subdir(dir, "wait");
    Corpus c = make_dataset(dir, "train", 1, 100, 32);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", dir);
    DataLoader dl;
    DataLoaderConfig cfg = dataloader_default_config(pattern, 4, 32);
    cfg.num_threads = 1;
    cfg.ring_slots = 2;
    cudaStream_t s;
    cudaStreamCreate(&s);
    if (dataloader_init(&dl, &cfg) == 0) {
        double sum = 0;
        int ok = 1;
        for (int i = 0; i < 50; i++) {
            Batch b = {};
            ok &= dataloader_next(&dl, s, &b) == 0 && b.wait_ms >= 0 && b.wait_ms < 10000;
            sum += b.wait_ms;
        }
        CHECK(ok && fabs(sum - dl.wait_ms_total) < 1e-9, "wait_ms per step, summed in wait_ms_total (%.3f ms)", sum);
        dataloader_free(&dl);
    }
    cudaStreamDestroy(s);
    corpus_free(&c);
}

// --loader-threads auto's two calls: dataloader_fill_ms measures one thread's fill time once the ring holds
// its first batches; dataloader_set_threads then restarts the ring with more threads (up to max_threads), and
// the batches are the same as a loader that ran with that many threads from the start.
static void test_fill_rate_and_threads(void) {
    char dir[512], pattern[600];
    subdir(dir, "threads");
    Corpus c = make_dataset(dir, "train", 2, 400, 64);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", dir);
    const int B = 8, T = 64;
    cudaStream_t s;
    cudaStreamCreate(&s);
    Reader r = reader_make(B, T), r2 = reader_make(B, T);
    DataLoader a, b;
    DataLoaderConfig ca = dataloader_default_config(pattern, B, T), cb = ca;
    ca.num_threads = 1, ca.max_threads = 4;
    cb.num_threads = 3;
    if (init_two(&a, &ca, &b, &cb)) return;
    CHECK(a.num_workers == 4 && b.num_workers == 3, "workers made: %d (max_threads 4), %d", a.num_workers,
          b.num_workers);
    double ms = dataloader_fill_ms(&a, 3);
    CHECK(ms > 0 && ms < 10000 && a.filled >= 3, "fill time of one thread: %g ms after %lld batches", ms,
          (long long)a.filled);
    dataloader_set_threads(&a, 3);
    CHECK(a.cfg.num_threads == 3 && a.running, "dataloader_set_threads(3): %d threads running", a.cfg.num_threads);
    dataloader_set_threads(&a, 9);  // more than made at init: ignored
    CHECK(a.cfg.num_threads == 3, "dataloader_set_threads(9) past max_threads 4 is ignored: %d", a.cfg.num_threads);
    int same = 1;
    for (int i = 0; i < 40; i++) {
        Batch x, y;
        if (next_host(&a, s, &r, &x) || next_host(&b, s, &r2, &y)) {
            same = 0;
            break;
        }
        same &= batch_equal(&r, r.host, r2.host);
    }
    CHECK(same, "after set_threads the batches equal a 3-thread loader's, from the first one");
    dataloader_free(&a);
    dataloader_free(&b);
    cudaStreamDestroy(s);
    corpus_free(&c);
}

int main(void) {
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/test_data_XXXXXX");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc_and_perm();
    test_format_round_trip();
    test_epochs_ranks_threads();
    test_packing();
    test_masking();
    test_resume();
    test_bad_input();
    test_staging();
    test_wait_measure();
    test_fill_rate_and_threads();
    rm_tree(tmp_root);
    return test_summary();
}
