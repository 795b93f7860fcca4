// checkpoint.h: checkpoints: written atomically by rank 0 (DIR/checkpoint.bin, --keep K older ones beside it),
// verified and loaded at --resume, set aside after a divergence. Part of trainer.cu (one translation unit).

// ----------------------------------------------------------------------------
// Checkpoints. DIR/checkpoint.bin is the newest; with --keep K the K-1 before it stay beside it as
// DIR/checkpoint-STEP.bin. A checkpoint is written to DIR/checkpoint.bin.tmp, flushed to disk, and
// renamed over checkpoint.bin (which first gets its checkpoint-STEP.bin name as a hard link), so a
// crash at any moment leaves every earlier checkpoint intact. The file, little-endian:
//   header (CkptHeader) | master weights fp32 (numel) | AdamW m fp32 (numel) | AdamW v fp32 (numel)
//   | the floatX weights (numel; bf16 mode only: stochastic rounding made them, so they are state too)
//   | files written before 2026-11-28 with --comm onebit: every rank's 1-bit Adam errors, then the servers'
//     ((header.onebit_world + 1) x numel fp32: ckpt_onebit_bytes), read through for the CRC and not used
//   | CRC-32 (zlib's) of every byte before it (u32) | 4 zero bytes
// The CRC is computed while writing. --resume reads a checkpoint once: the header is checked against the run
// (model, T, step within --steps; data.h checks the data position), the body streamed to the device with its
// CRC and the gate below; a checkpoint whose CRC or values fail is skipped for the one before it.
// 1-bit Adam's errors are not saved: a resumed run starts them from zero (compress.h), so a checkpoint is
// 3 or 3.5 x 4 bytes per parameter whatever the number of ranks.
#define CKPT_MAGIC "MLMCKPT3"
#define CKPT_VERSION 3  // 3: the tokens trained on (for metrics.jsonl and the epoch fraction across resumes)
#define CKPT_CHUNK ((size_t)16 << 20)  // bytes copied, checksummed and written at a time
typedef struct {
    char magic[8];
    uint32_t version, header_bytes;
    BertConfig cfg;
    int32_t T, step;
    int32_t x_bytes;             // sizeof(floatX) of the run that wrote it
    int32_t onebit_world;        // written 0; older files: the ranks whose 1-bit Adam errors follow the AdamW state
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

// The gate for the numbers in a checkpoint's state (ckpt_read at --resume and --eval, ckpt_verify,
// save_checkpoint before it writes): the weights (fp32 master, bf16) and AdamW's m finite, AdamW's v finite and >= 0 (a
// mean of squares; -0 is zero), --comm onebit's 1-bit Adam errors finite and within
// +-CKPT_ONEBIT_ERR_MAX. The errors are in the units of Adam's update (compress.h: u = m / (sqrt(v) + eps), of
// order 1 per element, at most |m| / eps); compression sums |x| over groups of ONEBIT_GROUP of them in fp32 and the
// server averages the ranks', so an error above 2^64 (1.8e19) is no error a run makes, and below it those sums
// stay finite (256 x 2^64 is far below FLT_MAX).
#define CKPT_ONEBIT_ERR_MAX 18446744073709551616.0  // 2^64
// The header's token count is below 2^62: no run trains on that many, and the metrics' signed counts stay exact.
#define CKPT_TOKENS_MAX ((uint64_t)1 << 62)
// ckpt_onebit_bytes: the bytes of 1-bit Adam errors an older checkpoint holds after its state (onebit_world <=
// 65536: ckpt_open).
static uint64_t ckpt_onebit_bytes(const CkptHeader* h) {
    return h->onebit_world > 0 ? ((uint64_t)h->onebit_world + 1) * h->numel * sizeof(float) : 0;
}
// The body's regions in file order (CkptHeader's comment): fp32 master weights, AdamW m, AdamW v, the bf16 weights
// (x_bytes 2 only), then --comm onebit's errors: onebit_world workers' and the servers' (fp32, numel each).
enum { CKPT_MASTER, CKPT_M, CKPT_V, CKPT_BF16, CKPT_ONEBIT };

// ckpt_region_of: the region of body offset pos (CKPT_ONEBIT + q: rank q's worker errors, + onebit_world: the
// servers'), with where it starts in *start and its element size in *size.
static int ckpt_region_of(const CkptHeader* h, uint64_t pos, uint64_t* start, int* size) {
    uint64_t fp32_end = 12 * h->numel, bf16_end = fp32_end + (h->x_bytes == 2 ? 2 * h->numel : 0);
    *size = 4;
    if (pos < fp32_end) return *start = pos / (4 * h->numel) * 4 * h->numel, (int)(pos / (4 * h->numel));
    if (pos < bf16_end) return *start = fp32_end, *size = 2, CKPT_BF16;
    uint64_t q = (pos - bf16_end) / (4 * h->numel);
    *start = bf16_end + q * 4 * h->numel;
    return CKPT_ONEBIT + (int)q;
}
// ckpt_region_end: where the region of body offset pos ends (a value never straddles a chunk that ends there).
static uint64_t ckpt_region_end(const CkptHeader* h, uint64_t pos) {
    uint64_t start;
    int size, r = ckpt_region_of(h, pos, &start, &size);
    return start + (r == CKPT_BF16 ? 2 : 4) * h->numel;
}
// ckpt_value_ok: whether a value of region r is one the state may hold (the gate above).
static int ckpt_value_ok(int r, float x) {
    if (!isfinite(x)) return 0;
    if (r == CKPT_V) return x >= 0.f;
    if (r >= CKPT_ONEBIT) return fabs((double)x) <= CKPT_ONEBIT_ERR_MAX;
    return 1;
}
// ckpt_first_bad: the body offset of the first value in buf (k bytes at body offset pos, within one region, starting
// at a value) that the gate refuses, or UINT64_MAX; that value in *x.
static uint64_t ckpt_first_bad(const CkptHeader* h, const unsigned char* buf, size_t k, uint64_t pos, float* x) {
    uint64_t start;
    int size, r = ckpt_region_of(h, pos, &start, &size);
    for (size_t i = 0; i + size <= k; i += size) {
        if (size == 4) {
            memcpy(x, buf + i, 4);
        } else {
            uint16_t b;
            memcpy(&b, buf + i, 2);
            uint32_t u = (uint32_t)b << 16;  // bf16: the high half of an fp32
            memcpy(x, &u, 4);
        }
        if (!ckpt_value_ok(r, *x)) return pos + i;
    }
    return UINT64_MAX;
}
// ckpt_describe_bad: what is wrong with the value x at body offset `off` (ckpt_first_bad's): the region, the element
// and the value.
static void ckpt_describe_bad(const CkptHeader* h, uint64_t off, float x, char* why, size_t n) {
    static const char* region[] = {"fp32 master weights", "AdamW m", "AdamW v", "bf16 weights"};
    uint64_t start;
    int size, r = ckpt_region_of(h, off, &start, &size);
    char name[64];
    if (r < CKPT_ONEBIT)
        snprintf(name, sizeof name, "%s", region[r]);
    else if (r - CKPT_ONEBIT < h->onebit_world)
        snprintf(name, sizeof name, "1-bit Adam worker errors of rank %d", r - CKPT_ONEBIT);
    else
        snprintf(name, sizeof name, "1-bit Adam server errors");
    const char* what = !isfinite(x)  ? "that is not finite (NaN or Inf)"
                       : r == CKPT_V ? "below zero (v is a mean of squares)"
                                     : "beyond +-2^64 (no error a run makes)";
    snprintf(why, n, "its %s hold a value %s at element %llu of %llu (%g)", name, what,
             (unsigned long long)((off - start) / size), (unsigned long long)h->numel, (double)x);
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
// (the temporary file removed; every earlier checkpoint untouched), or -1 when the state does not pass the gate
// (ckpt_value_ok, checked as it is written: a value not finite, a negative v), what in err, nothing written. Rank 0
// writes and checks (the others give 1); under ZeRO-1 every rank calls it, to gather the shards (through the
// gradient buffer: call it between steps).
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
    int fd = buf ? create_fresh(tmp) : -1;  // (files.h: a link left at the .tmp name is replaced, not written through)
    int ok = fd >= 0 && write_all(fd, &h, sizeof h), why = buf ? errno : ENOMEM;  // why: errno of the failure
    uint32_t crc = crc32_update(0, &h, sizeof h);
    uint64_t pos = 0, bad = UINT64_MAX;  // the body offset; the first value the gate refuses
    float x = 0;
    void* dev[4];
    size_t bytes[4];
    for (int r = 0, k = ckpt_regions(m, dev, bytes); r < k; pos += bytes[r], r++) {
        const void* src = dev[r];
        if (ckpt_sharded(gr, r)) {  // every rank, whatever happened to the file
            zero_gather(gr, (const float*)dev[r], m->grad, m->stream);
            src = m->grad;
        }
        for (size_t off = 0; ok && off < bytes[r]; off += CKPT_CHUNK) {
            size_t n = bytes[r] - off < CKPT_CHUNK ? bytes[r] - off : CKPT_CHUNK;
            CUDA_CHECK(cudaMemcpy(buf, (const char*)src + off, n, cudaMemcpyDeviceToHost));
            crc = crc32_update(crc, buf, n);
            if ((bad = ckpt_first_bad(&h, buf, n, pos + off, &x)) != UINT64_MAX) ok = 0;
            if (ok && !(ok = write_all(fd, buf, n))) why = errno;
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
    if (bad != UINT64_MAX) {
        ckpt_describe_bad(&h, bad, x, err, errlen);
        unlink(tmp);
        return -1;
    }
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

// ckpt_open: path opened for reading when it is a regular file that starts with a header of this trainer's
// version whose sizes agree with the file's (the header in *h); else -1 and why.
static int ckpt_open(const char* path, CkptHeader* h, char* why, size_t n) {
    char err[FILES_ERR_LEN];
    long long size = 0;  // (files.h: a FIFO named like a checkpoint must not block, it is refused)
    int fd = open_regular(path, "an mlm.c checkpoint", FILE_MAX_CHECKPOINT, &size, err);
    if (fd < 0) {
        snprintf(why, n, "%s", err);
        return -1;
    }
    int ok = 0;
    if ((size_t)size < sizeof *h + 8 || !read_all(fd, h, sizeof *h))
        snprintf(why, n, "truncated: %lld bytes, shorter than a header", size);
    else if (!memcmp(h->magic, "MLMCKPT2", 8))
        snprintf(why, n, "an mlm.c checkpoint of version 2 (no token count); this trainer reads version %d",
                 CKPT_VERSION);
    else if (memcmp(h->magic, CKPT_MAGIC, 8) || h->version != CKPT_VERSION || h->header_bytes != sizeof *h)
        snprintf(why, n, "not an mlm.c checkpoint of version %d (magic %.8s)", CKPT_VERSION, CKPT_MAGIC);
    else if (h->body_bytes != (uint64_t)size - sizeof *h - 8)
        snprintf(why, n, "truncated or trailing bytes: %lld bytes, the header says %llu", size,
                 (unsigned long long)(sizeof *h + h->body_bytes + 8));
    else if ((h->x_bytes != 2 && h->x_bytes != 4) || h->onebit_world < 0 || h->onebit_world > 65536 ||
             h->numel > ((uint64_t)1 << 40) ||
             h->body_bytes != h->numel * (12 + (h->x_bytes == 4 ? 0 : (uint64_t)h->x_bytes)) + ckpt_onebit_bytes(h))
        snprintf(why, n, "its header is inconsistent: %llu body bytes for %llu parameters of %d-byte weights",
                 (unsigned long long)h->body_bytes, (unsigned long long)h->numel, h->x_bytes);
    else
        ok = 1;
    if (!ok) close(fd);
    return ok ? fd : -1;
}

// Where ckpt_body puts a checkpoint's state as it streams past (NULL: read through, as ckpt_verify does): region r
// of ckpt_regions at dev[r]; under ZeRO-1 a sharded region goes through the gradient buffer and this rank keeps
// its shard (zero_scatter, at the region's end).
typedef struct {
    BertModel* m;
    const GradReduce* gr;
    void* dev[4];
} CkptSink;

// ckpt_body: streams the body of the checkpoint open on fd (header *h, read) through its CRC and the gate
// (ckpt_value_ok), and into sink's buffers where sink is not NULL (the older files' 1-bit Adam errors are read
// through). 1 when the CRC matches and every value passes; else 0 and why (a read error: *read_error set too).
static int ckpt_body(int fd, const CkptHeader* h, CkptSink* sink, char* why, size_t n, int* read_error) {
    unsigned char* buf = (unsigned char*)malloc(CKPT_CHUNK);
    if (!buf) {
        snprintf(why, n, "out of host memory");
        return *read_error = 0, 0;
    }
    uint32_t crc = crc32_update(0, h, sizeof *h), trailer[2];
    uint64_t left = h->body_bytes, bad = UINT64_MAX;  // bad: the body offset of the first value refused
    float x = 0;                                      // that value
    int ok = 1;
    while (ok && left) {
        uint64_t pos = h->body_bytes - left, start, end = ckpt_region_end(h, pos);  // (chunks within a region)
        size_t k = end - pos < CKPT_CHUNK ? (size_t)(end - pos) : CKPT_CHUNK;
        int size, r = ckpt_region_of(h, pos, &start, &size);
        ok = read_all(fd, buf, k);
        crc = crc32_update(crc, buf, k);
        if (ok && bad == UINT64_MAX) bad = ckpt_first_bad(h, buf, k, pos, &x);
        if (ok && sink && r < CKPT_ONEBIT) {
            int shard = ckpt_sharded(sink->gr, r);
            char* dst = shard ? (char*)sink->m->grad : (char*)sink->dev[r];
            CUDA_CHECK(cudaMemcpy(dst + (pos - start), buf, k, cudaMemcpyHostToDevice));
            if (shard && pos + k == end) zero_scatter(sink->gr, sink->m->grad, (float*)sink->dev[r], sink->m->stream);
        }
        left -= k;
    }
    free(buf);
    *read_error = !ok || !read_all(fd, trailer, sizeof trailer);
    if (*read_error)
        snprintf(why, n, "read error: %s", strerror(errno));
    else if (trailer[0] != crc)
        snprintf(why, n, "checksum mismatch (stored %08x, computed %08x): corrupted", trailer[0], crc);
    else if (trailer[1] != 0)
        snprintf(why, n, "the 4 bytes after the CRC are %08x, not zero: corrupted", trailer[1]);
    else if (bad != UINT64_MAX) {
        ckpt_describe_bad(h, bad, x, why, n);
        size_t len = strlen(why);
        snprintf(why + len, n - len, ": not intact");
    } else
        return 1;
    return 0;
}

// ckpt_verify: 1 when path is an intact checkpoint: a regular file, whole, whose CRC matches and whose
// state passes the gate (ckpt_value_ok: weights and AdamW m finite, v >= 0, 1-bit Adam errors bounded; header in
// *h); else 0 and why.
static int ckpt_verify(const char* path, CkptHeader* h, char* why, size_t n) {
    int fd = ckpt_open(path, h, why, n), read_error;
    if (fd < 0) return 0;
    int ok = ckpt_body(fd, h, NULL, why, n, &read_error);
    close(fd);
    return ok;
}

// ckpt_layout_ok: whether the checkpoint's configuration is one this trainer can run (--eval runs it, and its
// sequence length T, 2 to the model's positions, as --seq takes them) and its slab is laid out as this trainer
// lays out that configuration. Since 2026-11-24 the word embeddings take bert_vocab_rows(V) rows (a multiple of
// 8; before, V rows), so a checkpoint of a model with V % 8 != 0 saved before that is refused, with what to do
// instead.
static int ckpt_layout_ok(const CkptHeader* h, char* why, size_t n) {
    if (!bert_config_check(&h->cfg)) {  // (it says why on stderr)
        snprintf(why, n, "its model configuration is not one this trainer can run");
        return 0;
    }
    // (what bert_config_check lets through: an intermediate size below 1 lays out a slab of wrapped sizes)
    if (h->cfg.intermediate < 1 || !(h->cfg.ln_eps < 1)) {
        snprintf(why, n,
                 "its model configuration is not one this trainer can run (intermediate size %d, expected "
                 "at least 1; layer_norm_eps %g, expected below 1)",
                 h->cfg.intermediate, (double)h->cfg.ln_eps);
        return 0;
    }
    if (h->T < 2 || h->T > h->cfg.max_position) {
        snprintf(why, n, "its sequence length %d is out of range (2 to the model's %d positions)", h->T,
                 h->cfg.max_position);
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

// ckpt_counters_ok: whether the header's counters are within their real ranges: the step (ckpt_check_run: 0 to
// --steps), the tokens trained on (0 to CKPT_TOKENS_MAX: 2^63 would read as negative in the metrics), the data
// position's epoch (data.h's bound, 2^40; its row: dataloader_restore, within the epoch). Else 0 and why.
static int ckpt_counters_ok(const CkptHeader* h, char* why, size_t n) {
    if (h->tokens >= CKPT_TOKENS_MAX)
        snprintf(why, n, "its token count %llu is out of range (0 to 2^62): not a count a run makes",
                 (unsigned long long)h->tokens);
    else if (h->data.epoch > (1ull << 40))
        snprintf(why, n, "its data position's epoch %llu is out of range (0 to 2^40)",
                 (unsigned long long)h->data.epoch);
    else
        return 1;
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
    } else if (h->x_bytes != (int32_t)sizeof(floatX) || h->body_bytes != ckpt_body_bytes(m) + ckpt_onebit_bytes(h)) {
        snprintf(buf, sizeof buf, "saved by a trainer with %d-byte weights; this one is %s", h->x_bytes, FLOATX_NAME);
        why = buf;
    } else if (h->step < 0 || h->step > steps) {
        snprintf(buf, sizeof buf, "its step %d is beyond --steps %d (raise --steps to train on)", h->step, steps);
        why = buf;
    } else if (!ckpt_counters_ok(h, buf, sizeof buf)) {
        why = buf;
    }
    if (why) {
        fprintf(stderr, "trainer: --resume: %s: %s\n", path, why);
        exit(1);
    }
}

// ckpt_read: --resume's and --eval's one read of a checkpoint: its header checked (ckpt_open), its body streamed to
// the device through the CRC and the gate (ckpt_body), then, for --resume (steps: --steps), the header against
// the run (ckpt_check_run: exit 1 when it is another model's; --eval gives steps -1 and made the model from the
// header). A header whose sizes are not this model's is read through (an intact one is another model's). 1 when
// it is intact and loaded; else 0 and why,
// the device state then undefined (the caller reads an older checkpoint over it, or stops). A read error after
// the header is fatal (exit 1): another rank may have read it whole, and the ranks must take the same checkpoint.
static int ckpt_read(const char* path, BertModel* m, const GradReduce* gr, CkptHeader* h, int steps, char* why,
                     size_t n) {
    int fd = ckpt_open(path, h, why, n), read_error = 0;
    if (fd < 0) return 0;
    CkptSink sink = {m, gr, {NULL, NULL, NULL, NULL}};
    size_t bytes[4];
    ckpt_regions(m, sink.dev, bytes);
    int fits = h->x_bytes == (int32_t)sizeof(floatX) && h->body_bytes == ckpt_body_bytes(m) + ckpt_onebit_bytes(h);
    int ok = ckpt_body(fd, h, fits ? &sink : NULL, why, n, &read_error);
    if (gr->zero) bert_zero_grad(m);  // (the staging area)
    close(fd);
    if (read_error) {
        fprintf(stderr, "trainer: %s: %s (did it change while it was being read?)\n", path, why);
        exit(1);
    }
    if (ok && steps >= 0) ckpt_check_run(path, h, m, steps);
    if (ok && !fits)
        snprintf(why, n, "its sizes are not this model's (%llu body bytes)", (unsigned long long)h->body_bytes);
    if (!ok || !fits) return 0;
    m->step = h->step;
    return 1;
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
        if (!ckpt_read(path, m, gr, &h, steps, why, sizeof why)) {
            if (verbose) fprintf(stderr, "trainer: --resume: skipped %s: %s\n", path, why);
            size_t len = strlen(skipped);  // the list in the final error (paths shortened to their file names)
            const char* name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
            if (len < 3000)
                snprintf(skipped + len, sizeof skipped - len, "%s%.64s: %.200s", len ? "; " : "", name, why);
            continue;
        }
        if (verbose && gr->onebit && h.step > gr->onebit->warmup)
            printf("--resume: 1-bit Adam's errors start from zero (checkpoints do not hold them)\n");
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
        char err[FILES_ERR_LEN];
        long long size = 0;
        int fd = open_regular(path, "an mlm.c checkpoint", FILE_MAX_CHECKPOINT, &size, err);
        int got = fd >= 0 && read_all(fd, &h, sizeof h) && !memcmp(h.magic, CKPT_MAGIC, 8);
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
// diverged_state: the state after `step` does not pass the gate (what: ckpt_describe_bad's, or the export's
// message above it), so no checkpoint or export of it was written: like diverged, the checkpoints holding the
// weights that gave that step are set aside and the message says what is left. Gives exit code 2.
static int diverged_state(const Ckpts* ck, int step, const char* what, int main_rank) {
    char left[9000];
    if (main_rank)
        fprintf(stderr,
                "trainer: diverged: step %d left the state not finite (%s); it was not written; stopping, exit code 2: "
                "%s\n",
                step, what, ckpt_set_aside(ck, step, step, left, sizeof left));
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

// write_end: every rank, after rank 0's write (ok: its result there, 1 written, 0 failed, -1 refused: the state
// did not pass the gate; any value elsewhere). Gives rank 0's result on every rank. Test hook
// (tests/test_launch.sh): MLM_TEST_SLOW_WRITE_S=S makes rank 0's writes take S seconds longer.
static int write_end(Comm* comm, Ckpts* ck, WriteWatch w, int ok) {
    const char* slow = getenv("MLM_TEST_SLOW_WRITE_S");
    int code = ok == 1 ? 0 : ok == 0 ? 1 : 2;  // rank 0's: written, failed, refused
    if (comm->rank == 0 && slow) comm_sleep_s(atof(slow));
    CommValue v[2] = {
        {"the write failed (1) or was refused (2)", comm->rank == 0 ? code : 0, 0, 0},
        {"milliseconds rank 0's write took", comm->rank == 0 ? (int64_t)((now_s() - w.t0) * 1e3) : 0, 0, 0}};
    comm_agree(comm, v, 2);
    comm->timeout_s = w.timeout_s;
    if (v[1].max / 1e3 > ck->slowest_write_s) ck->slowest_write_s = v[1].max / 1e3;
    return v[0].max == 0 ? 1 : v[0].max == 1 ? 0 : -1;
}

// onebit_settle: the host waits until --comm onebit's last step has updated every part on the communication stream
// (onebit_step_forward), before anything but the next step's forward reads the weights, the moments, the errors or
// the gradients. Nothing without onebit.
static void onebit_settle(const GradReduce* gr) {
    if (gr->onebit) comm_wait(gr->comm, gr->stream, "the 1-bit exchange");
}

// checkpoint_at: saves the model and the data position `pos` after `step` (a dropped step's: from before
// it). Gives the exit code on every rank: 0 written, 1 failed (with the reason), 2 the state did not pass the
// gate (diverged_state). Every rank calls it (under ZeRO-1 they gather the shards); rank 0 writes.
static int checkpoint_at(Ckpts* ck, BertModel* m, const GradReduce* gr, const DataLoaderState* pos, int step) {
    char why[4600], what[4600];
    onebit_settle(gr);
    WriteWatch w = write_begin(gr->comm, ck, (double)ckpt_body_bytes(m));
    int ok = save_checkpoint(ck, m, gr, pos, why, sizeof why);
    int agreed = write_end(gr->comm, ck, w, ok);
    if (agreed == 1) return 0;
    if (agreed == -1) return diverged_state(ck, step, why, gr->comm->rank == 0);
    if (gr->comm->rank != 0) snprintf(why, sizeof why, "rank 0 could not write the checkpoint (see its log)");
    fprintf(stderr, "trainer: step %d: %s; stopping: %s\n", step, why, ckpt_whats_on_disk(ck, what, sizeof what));
    return 1;
}
// checkpoint_now: checkpoint_at the loader's current position (its exit code).
static int checkpoint_now(Ckpts* ck, BertModel* m, const GradReduce* gr, DataLoader* train, int step) {
    DataLoaderState pos = dataloader_state(train);
    return checkpoint_at(ck, m, gr, &pos, step);
}
