// tests/test_fuzz_load.cu: the loaders of the files the trainer reads, fuzzed. From valid files of a tiny model,
// thousands of mutated ones (FUZZ_ITERS of each kind, default 3000; FUZZ_SEED picks other mutations):
//   - checkpoints (checkpoint.h, as --resume and --eval read them: ckpt_verify, ckpt_layout_ok,
//     ckpt_counters_ok, ckpt_read with and without a run to check against), of bf16 and fp32 weights, also older
//     files with 1-bit Adam errors: byte flips, truncations and extensions, header fields set to edge values (numel and
//     body_bytes 0, 1, 2^62, 2^63 and 2^64 - 1, negative x_bytes, onebit_world, step, T and config sizes, an infinite
//     layer_norm_eps, a token count of 2^63), state values the gate refuses (NaN, a negative v), each also
//     with its CRC recomputed so that the mutation gets past the checksum; and whole checkpoints forged for a
//     configuration or sequence length with one edge value (sizes, CRC right);
//   - model.safetensors (hf.h: bert_read_safetensors) in F32 (the export's own), BF16 and F16: byte flips in
//     the header and the data, the header length set to edge values, and header JSON mutations: other dtypes,
//     numbers of shapes and data_offsets set to -1, 1.5, 1e300, 2^64, nan, 0x10; duplicated, dropped and swapped
//     entries, tensors renamed (non-UTF-8 too), nesting 10^6 deep, JSON cut short, stray characters;
//   - config.json (bert_read_config): values replaced (negative, fractional, 2^31, strings, null, lists,
//     deep nesting), keys duplicated or dropped, non-UTF-8 bytes, truncations; tokenizer.json's vocabulary
//     (bert_tokenizer_vocab, read at start-up beside the shards) the same ways.
// Each input must be loaded, holding exactly what the file holds (checkpoints: every state array compared on
// the device; safetensors whose header was not touched: every weight against the data decoded here; a
// config.json of the model's sizes: loaded with the export's weights) and what the trainer takes for granted
// (every size positive, layer_norm_eps in (0, 1), a checkpoint's T within 2 and its positions), or refused with
// a message naming the file; never a crash, a hang (10 s per input: alarm) or an AddressSanitizer report
// (build/asan/test_fuzz_load). A failure prints the mutation and the seed that repeat it (FUZZ_SHOW=N: the first N
// failures of a kind, default 3; FUZZ_TRACE=1: every input's mutation on stderr). CPU build only (build.sh's
// CPU_ONLY_TESTS): it includes the whole trainer.
#define main trainer_main
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-truncation"  // (comm.h's, seen only at -O1, the ASan build's)
#include "../trainer.cu"
#pragma GCC diagnostic pop
#undef main
#include "testing.h"
#include <string>
#include <vector>

static char dir[256];                              // scratch: the inputs and the loaders' messages
static int log_fd = -1, out_fd = -1, err_fd = -1;  // while a loader runs, stdout and stderr go to log_fd
static char what[512];                             // the input being tried (the mutation), for messages
static uint64_t rng_state, fuzz_seed;

static uint64_t rnd(void) {  // xorshift64*
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static void on_alarm(int) {
    dup2(out_fd, 1);
    char msg[700];
    int n = snprintf(msg, sizeof msg, "FAIL test_fuzz_load: a loader hung (10 s) on: %s\n0 passed, 1 failed\n", what);
    if (write(1, msg, (size_t)n) < 0) _exit(1);
    _exit(1);
}

// quiet_begin / quiet_end: the loaders' output (stdout and stderr) into the emptied log while they run, with a
// deadline; quiet_end gives what they printed.
static void quiet_begin(void) {
    fflush(stdout), fflush(stderr);
    if (ftruncate(log_fd, 0) != 0) abort();
    dup2(log_fd, 1), dup2(log_fd, 2);
    alarm(10);
}
static std::string quiet_end(void) {
    alarm(0);
    fflush(stdout), fflush(stderr);
    dup2(out_fd, 1), dup2(err_fd, 2);
    std::string s;
    char buf[4096];
    off_t at = 0;
    for (ssize_t n; (n = pread(log_fd, buf, sizeof buf, at)) > 0; at += n) s.append(buf, (size_t)n);
    return s;
}

static void write_file(const char* path, const std::string& s) {
    static int trace = getenv("FUZZ_TRACE") != NULL;  // every input's mutation, as it is tried
    if (trace) fprintf(stderr, "fuzz: %s: %s\n", path, what);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(s.data(), 1, s.size(), f) != s.size() || fclose(f) != 0) {
        printf("FAIL test_fuzz_load: cannot write %s\n", path);
        exit(1);
    }
}
static std::string read_text(const char* path) {
    std::string s;
    FILE* f = fopen(path, "rb");
    for (int c; f && (c = fgetc(f)) != EOF;) s += (char)c;
    if (f) fclose(f);
    return s;
}

// One kind's tally: inputs loaded, refused with a message; the first failure is printed, each counts.
typedef struct {
    const char* kind;
    int inputs, loaded, refused, failed;
} Tally;
static void fail_input(Tally* t, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_input(Tally* t, const char* fmt, ...) {
    static int show = getenv("FUZZ_SHOW") ? atoi(getenv("FUZZ_SHOW")) : 3;  // failures printed per kind
    if (t->failed++ < show) {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL %s, input %d (%s; FUZZ_SEED=%llu): ", t->kind, t->inputs, what, (unsigned long long)fuzz_seed);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
}
static void tally_check(const Tally* t) {
    printf("%s: %d inputs, %d loaded, %d refused with a message, %d failed\n", t->kind, t->inputs, t->loaded,
           t->refused, t->failed);
    CHECK(t->failed == 0 && t->loaded > 0 && t->refused > 0, "%s: %d of %d inputs failed (see above); %d loaded",
          t->kind, t->failed, t->inputs, t->loaded);
}

// Generic mutations of s: bytes flipped (half the time within its first `head` bytes), cut short, extended, or
// a range zeroed. Says which in what.
static void mutate_bytes(std::string& s, size_t head) {
    size_t n = s.size();
    switch (below(4)) {
        case 0: {
            int k = 1 + (int)below(8);
            for (int i = 0; i < k && n; i++)
                s[below(2) && head ? below(head < n ? head : n) : below(n)] ^= (char)(1 + below(255));
            snprintf(what, sizeof what, "%d bytes flipped", k);
            break;
        }
        case 1:
            s.resize(below(n + 1));
            snprintf(what, sizeof what, "cut to %zu of %zu bytes", s.size(), n);
            break;
        case 2: {
            size_t k = 1 + below(64);
            for (size_t i = 0; i < k; i++) s += (char)below(256);
            snprintf(what, sizeof what, "%zu random bytes appended", k);
            break;
        }
        default: {
            size_t a = below(n + 1), b = a + below(n - a + 1);
            for (size_t i = a; i < b; i++) s[i] = 0;
            snprintf(what, sizeof what, "bytes [%zu, %zu) zeroed", a, b);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tiny model whose files are fuzzed

static BertConfig tiny_cfg(void) {
    BertConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 13, c.max_position = 8, c.type_vocab_size = 2, c.hidden = 16, c.layers = 1, c.heads = 1;
    c.intermediate = 24, c.ln_eps = 1e-12f;
    return c;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

// make_ckpt: a valid checkpoint of params p with x_bytes-byte weights and 1-bit Adam errors of W ranks, sequence
// length T.
static std::string make_ckpt(const BertParams* p, int x_bytes, int W, int T = 8) {
    CkptHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION, h.header_bytes = sizeof h, h.cfg = p->cfg, h.T = T, h.step = 3, h.x_bytes = x_bytes;
    h.onebit_world = W, h.numel = p->numel, h.tokens = 1000, h.data.version = DATA_STATE_VERSION;
    h.body_bytes =
        p->numel * (12 + (x_bytes == 2 ? 2 : 0)) + (W ? (W + 1) * p->numel * 4 : 0);  // (older files' errors)
    std::string s((const char*)&h, sizeof h);
    std::vector<float> master(p->numel);
    for (size_t r = 0; r < 3 + (size_t)(W ? W + 1 : 0); r++) {  // master, m, v, then the 1-bit errors
        for (size_t i = 0; i < p->numel; i++) {
            float x = (float)((double)below(2000) / 1000.0 - (r == 2 ? 0.0 : 1.0));  // v >= 0
            if (r == 0) master[i] = x;
            s.append((const char*)&x, 4);
        }
        for (size_t i = 0; r == 2 && x_bytes == 2 && i < p->numel; i++) {  // the bf16 weights come after v
            __nv_bfloat16 b = __float2bfloat16(master[i]);
            s.append((const char*)&b, 2);
        }
    }
    s.append(8, '\0');
    return s;
}
static void ckpt_fix_crc(std::string& s) {
    if (s.size() < sizeof(CkptHeader) + 8) return;
    uint32_t t[2] = {crc32_update(0, s.data(), s.size() - 8), 0};
    memcpy(&s[s.size() - 8], t, 8);
}

// forge_ckpt: what a forger makes: a whole checkpoint, CRC and sizes right, of a configuration (or sequence
// length) with one value set to an edge value: s is left as it was when the configuration has no slab to build.
static void forge_ckpt(std::string& s, const BertConfig* base) {
    static const int32_t vals[] = {-8, -1, 0, 1, 2, 7, 8, 9, 16, 24, 40, 1 << 16, INT32_MIN, INT32_MAX};
    BertConfig c = *base;
    int32_t* fields[] = {&c.vocab_size, &c.max_position, &c.type_vocab_size, &c.hidden,
                         &c.layers,     &c.heads,        &c.intermediate};
    static const char* names[] = {
        "vocab_size", "max_position", "type_vocab_size", "hidden", "layers", "heads", "intermediate", "T", "ln_eps"};
    int k = (int)below(9), T = 8;
    int32_t v = vals[below(sizeof vals / sizeof vals[0])];
    if (k < 7)
        *fields[k] = v;
    else if (k == 7)
        T = v;
    else
        c.ln_eps = below(2) ? INFINITY : 1e30f;
    if (k < 8)
        snprintf(what, sizeof what, "forged: a checkpoint of %s %d", names[k], v);
    else
        snprintf(what, sizeof what, "forged: a checkpoint of ln_eps %g", (double)c.ln_eps);
    // the forger's own slab: only of what bert_params_build can lay out, and small
    if (c.layers < 1 || c.layers > 4 || c.vocab_size < 1 || c.max_position < 1 || c.type_vocab_size < 1 ||
        c.hidden < 1 || c.hidden > 64 || c.vocab_size > 4096 || c.max_position > 4096 || c.type_vocab_size > 4096 ||
        c.intermediate > 4096 || c.intermediate < -4096)
        return;
    BertParams p;
    bert_params_build(&p, &c);
    if (p.numel < (1 << 20)) s = make_ckpt(&p, 2, 0, T), ckpt_fix_crc(s);
    bert_params_free(&p);
}

// mutate_ckpt: a header field set to an edge value, a state value the gate refuses, or generic bytes; then,
// half the time, the CRC recomputed.
static void mutate_ckpt(std::string& s, size_t numel) {
    static const uint64_t u64s[] = {0,
                                    1,
                                    2,
                                    7,
                                    (uint64_t)1 << 32,
                                    (uint64_t)1 << 62,
                                    ((uint64_t)1 << 62) + 1,
                                    (uint64_t)1 << 63,
                                    ~(uint64_t)0,
                                    ~(uint64_t)0 / 12,
                                    ~(uint64_t)0 / 14};
    static const int32_t i32s[] = {0, -1, 1, 2, 3, 4, 8, 16, 24, -8, INT32_MIN, INT32_MAX, 1 << 30, 1 << 24};
    static const float floats[] = {NAN, INFINITY, -INFINITY, -1.0f, -0.0f, 1e38f, 3e38f, 1e-45f};
    struct Field {
        const char* name;
        size_t off;
        int size;  // 4: an int32, 8: a uint64, -4: a float
    };
    static const Field fields[] = {
        {"version", offsetof(CkptHeader, version), 4},
        {"header_bytes", offsetof(CkptHeader, header_bytes), 4},
        {"cfg.vocab_size", offsetof(CkptHeader, cfg.vocab_size), 4},
        {"cfg.max_position", offsetof(CkptHeader, cfg.max_position), 4},
        {"cfg.type_vocab_size", offsetof(CkptHeader, cfg.type_vocab_size), 4},
        {"cfg.hidden", offsetof(CkptHeader, cfg.hidden), 4},
        {"cfg.layers", offsetof(CkptHeader, cfg.layers), 4},
        {"cfg.heads", offsetof(CkptHeader, cfg.heads), 4},
        {"cfg.intermediate", offsetof(CkptHeader, cfg.intermediate), 4},
        {"cfg.ln_eps", offsetof(CkptHeader, cfg.ln_eps), -4},
        {"T", offsetof(CkptHeader, T), 4},
        {"step", offsetof(CkptHeader, step), 4},
        {"x_bytes", offsetof(CkptHeader, x_bytes), 4},
        {"onebit_world", offsetof(CkptHeader, onebit_world), 4},
        {"numel", offsetof(CkptHeader, numel), 8},
        {"body_bytes", offsetof(CkptHeader, body_bytes), 8},
        {"tokens", offsetof(CkptHeader, tokens), 8},
        {"data.epoch", offsetof(CkptHeader, data.epoch), 8},
        {"data.row", offsetof(CkptHeader, data.row), 8},
    };
    size_t k = below(10);
    if (k < 5) {  // a header field
        const Field* f = &fields[below(sizeof fields / sizeof fields[0])];
        if (f->size == 8) {
            uint64_t v = below(3) ? u64s[below(sizeof u64s / sizeof u64s[0])] : numel * (1 + below(20)) + below(3) - 1;
            memcpy(&s[f->off], &v, 8);
            snprintf(what, sizeof what, "header %s = %llu", f->name, (unsigned long long)v);
        } else if (f->size == 4) {
            int32_t v = i32s[below(sizeof i32s / sizeof i32s[0])];
            memcpy(&s[f->off], &v, 4);
            snprintf(what, sizeof what, "header %s = %d", f->name, v);
        } else {
            float v = floats[below(sizeof floats / sizeof floats[0])];
            memcpy(&s[f->off], &v, 4);
            snprintf(what, sizeof what, "header %s = %g", f->name, (double)v);
        }
    } else if (k < 8) {  // a state value: any float32 slot of the body (a bf16 pair or a trailer word too)
        size_t body = s.size() - sizeof(CkptHeader) - 8, at = sizeof(CkptHeader) + 2 * below(body / 2);
        float v = floats[below(sizeof floats / sizeof floats[0])];
        memcpy(&s[at], &v, at + 4 <= s.size() ? 4 : 2);
        snprintf(what, sizeof what, "body byte %zu = %g", at - sizeof(CkptHeader), (double)v);
    } else {
        mutate_bytes(s, sizeof(CkptHeader));
    }
    if (below(2)) {
        ckpt_fix_crc(s);
        strncat(what, ", CRC recomputed", sizeof what - strlen(what) - 1);
    }
}

// check_ckpt_loaded: the model holds the checkpoint's state: master weights, m, v, the bf16 weights.
static int check_ckpt_loaded(const std::string& s, const BertModel* m) {
    size_t n = m->p.numel, at = sizeof(CkptHeader);
    std::vector<char> got(n * 4);
    const void* dev[4] = {m->master, m->adam_m, m->adam_v, m->w};
    for (int r = 0; r < (sizeof(floatX) == 2 ? 4 : 3); r++) {
        size_t bytes = r == 3 ? n * sizeof(floatX) : n * 4;
        CUDA_CHECK(cudaMemcpy(got.data(), dev[r], bytes, cudaMemcpyDeviceToHost));
        if (memcmp(got.data(), s.data() + at, bytes)) return 0;
        at += bytes;
    }
    return 1;
}

static void fuzz_checkpoints(int iters) {
    BertConfig cfg = tiny_cfg();
    BertParams p;
    bert_params_build(&p, &cfg);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    BertModel model;
    if (!bert_alloc(&model, &cfg, 1, 8, mlm_cap(1, 8), stream)) {
        CHECK(0, "bert_alloc of the tiny model");
        return;
    }
    Comm comm;
    memset(&comm, 0, sizeof comm);
    comm.world = 1;
    GradReduce gr;
    memset(&gr, 0, sizeof gr);
    gr.comm = &comm;
    const int steps = 10;
    std::string seeds[4] = {make_ckpt(&p, 2, 0), make_ckpt(&p, 2, 2), make_ckpt(&p, 4, 0), make_ckpt(&p, 4, 1)};
    for (std::string& s : seeds) ckpt_fix_crc(s);
    char path[300];
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    Tally t = {"checkpoints", 0, 0, 0, 0};
    for (int i = 0; i < iters + 4; i++, t.inputs++) {
        std::string s = seeds[i % 4];
        if (i < 4)
            snprintf(what, sizeof what, "the valid seed %d", i);
        else if (below(8) == 0)
            forge_ckpt(s, &cfg);
        else
            mutate_ckpt(s, p.numel);
        write_file(path, s);
        CkptHeader h, he;
        char why[256] = "", why_eval[256] = "";
        quiet_begin();
        int intact = ckpt_verify(path, &h, why, sizeof why);
        int ok = intact && ckpt_layout_ok(&h, why, sizeof why) && ckpt_counters_ok(&h, why, sizeof why);
        int fits = intact && h.x_bytes == (int32_t)sizeof(floatX) &&
                   h.body_bytes == ckpt_body_bytes(&model) + ckpt_onebit_bytes(&h);
        // --eval's read (no run to check against: the state streamed to the device where its sizes are this
        // model's), for every input
        int eval_read = ckpt_read(path, &model, &gr, &he, -1, why_eval, sizeof why_eval);
        int eval_state = eval_read && check_ckpt_loaded(s, &model);
        // --resume's read of what this run takes (ckpt_check_run exits on another model, precision or step)
        int runs = ok && fits && !memcmp(&h.cfg, &cfg, sizeof cfg) && h.T == 8 && h.step >= 0 && h.step <= steps;
        int loaded = runs && ckpt_read(path, &model, &gr, &h, steps, why, sizeof why);
        std::string printed = quiet_end();
        if (eval_read != fits)
            fail_input(&t, "--eval's read gave %d for an intact checkpoint of this model's sizes: %d (%s)", eval_read,
                       fits, why_eval);
        if (!eval_read && !why_eval[0]) fail_input(&t, "--eval's read refused it without a reason");
        if (eval_read && !eval_state) fail_input(&t, "--eval's read loaded it, but the model does not hold its state");
        if (runs && !loaded) fail_input(&t, "--resume's read refused what it takes: %s", why);
        if (i < 4 && !ok) fail_input(&t, "a valid checkpoint refused: %s", why);
        if (!ok && !why[0]) fail_input(&t, "refused without a reason");
        if (ok) {
            // what was accepted holds what the header says, and what the trainer takes for granted (--eval runs
            // the checkpoint's own configuration and sequence length)
            const BertConfig* c = &h.cfg;
            if (s.size() != sizeof(CkptHeader) + h.body_bytes + 8) fail_input(&t, "accepted with the wrong size");
            if (h.tokens >= CKPT_TOKENS_MAX || h.data.epoch > (1ull << 40))
                fail_input(&t, "accepted counters out of range");
            if (c->vocab_size < 1 || c->max_position < 1 || c->type_vocab_size < 1 || c->hidden < 1 || c->layers < 1 ||
                c->heads < 1 || c->intermediate < 1 || !(c->ln_eps > 0 && c->ln_eps < 1))
                fail_input(&t, "accepted a configuration with a size below 1 or layer_norm_eps %g outside (0, 1)",
                           (double)c->ln_eps);
            if (h.T < 2 || h.T > c->max_position)
                fail_input(&t, "accepted sequence length %d (2 to the %d positions)", h.T, c->max_position);
        }
        if (loaded && !check_ckpt_loaded(s, &model)) fail_input(&t, "loaded, but the model does not hold its state");
        if (loaded && model.step != h.step) fail_input(&t, "loaded step %d, the file says %d", model.step, h.step);
        if (i < 4 && (i % 4 < 2) == (sizeof(floatX) == 2) && !loaded) fail_input(&t, "the valid seed was not loaded");
        t.loaded += loaded, t.refused += !ok;
        (void)printed;
    }
    tally_check(&t);
    bert_free(&model);
    bert_params_free(&p);
}

// ---------------------------------------------------------------------------------------------
// model.safetensors and config.json

// make_st: a safetensors file of weights w (table p) in dtype (F32, BF16 or F16), entries listed in the
// table's order or reversed; the tensors' data in the table's order.
static std::string make_st(const BertParams* p, const float* w, const char* dtype, int reversed) {
    int es = strcmp(dtype, "F32") ? 2 : 4;
    std::string h = "{\"__metadata__\":{\"format\":\"pt\"}", data;
    std::vector<std::string> entries;
    for (int i = 0; i < p->n; i++) {
        const BertTensor* t = &p->t[i];
        char e[512], shape[64];
        if (t->rank == 2)
            snprintf(shape, sizeof shape, "%d,%d", t->shape[0], t->shape[1]);
        else
            snprintf(shape, sizeof shape, "%d", t->shape[0]);
        snprintf(e, sizeof e, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}", t->name, dtype,
                 shape, data.size(), data.size() + t->numel * es);
        entries.push_back(e);
        for (size_t k = 0; k < t->numel; k++) {
            float x = w[t->offset + k];
            if (es == 4) {
                data.append((const char*)&x, 4);
            } else {  // BF16 rounded, F16 truncated (any bits do: the check decodes what the file holds)
                __nv_bfloat16 b = __float2bfloat16(x);
                uint32_t u;
                memcpy(&u, &x, 4);
                int e = (int)(u >> 23 & 255) - 112;
                uint16_t f =
                    (uint16_t)(u >> 16 & 0x8000) | (e > 0 && e < 31 ? (uint16_t)(e << 10 | (u >> 13 & 1023)) : 0);
                data.append(!strcmp(dtype, "BF16") ? (const char*)&b : (const char*)&f, 2);
            }
        }
    }
    for (int i = 0; i < p->n; i++) h += entries[reversed ? p->n - 1 - i : i];
    h += "}";
    uint64_t hl = h.size();
    return std::string((const char*)&hl, 8) + h + data;
}

// The spans of JSON tokens in text: numbers and strings (start, length), for the mutations below.
static void json_tokens(const std::string& j, std::vector<std::pair<size_t, size_t>>* nums,
                        std::vector<std::pair<size_t, size_t>>* strs) {
    for (size_t i = 0; i < j.size();) {
        if (j[i] == '"') {
            size_t e = i + 1;
            while (e < j.size() && j[e] != '"') e += j[e] == '\\' ? 2 : 1;
            strs->push_back({i + 1, (e < j.size() ? e : j.size()) - i - 1});
            i = e + 1;
        } else if (j[i] == '-' || (j[i] >= '0' && j[i] <= '9')) {
            size_t e = i + 1;
            while (e < j.size() && strchr("0123456789.eE+-", j[e])) e++;
            nums->push_back({i, e - i});
            i = e;
        } else {
            i++;
        }
    }
}

// mutate_json: one mutation of the JSON text j (a safetensors header or config.json); names: strings to put
// in place of a string (dtypes, tensor names).
static void mutate_json(std::string& j, const std::vector<std::string>& names) {
    static const char* numbers[] = {"-1",
                                    "0",
                                    "1",
                                    "1.5",
                                    "1e300",
                                    "-0",
                                    "9e15",
                                    "9007199254740993",
                                    "18446744073709551616",
                                    "nan",
                                    "inf",
                                    "-inf",
                                    "0x10",
                                    "1e-400",
                                    "2147483648",
                                    "4294967296",
                                    "1073741825",
                                    "16",
                                    "8",
                                    "24",
                                    "1e",
                                    "--1",
                                    "\"16\"",
                                    "null",
                                    "true",
                                    "[16]",
                                    "{\"a\":1}"};
    static const char* strings[] = {"F32",  "BF16",    "F16",      "F64",          "I64",         "U8",
                                    "BOOL", "F8_E4M3", "",         "f32",          "F32\\u0000",  "\xff\xfe\x80",
                                    "gelu", "relu",    "absolute", "relative_key", "__metadata__"};
    std::vector<std::pair<size_t, size_t>> nums, strs;
    json_tokens(j, &nums, &strs);
    size_t k = below(12);
    if (k < 3 && !nums.empty()) {
        auto t = nums[below(nums.size())];
        const char* v = numbers[below(sizeof numbers / sizeof numbers[0])];
        snprintf(what, sizeof what, "number %s at %zu = %s", j.substr(t.first, t.second).c_str(), t.first, v);
        j.replace(t.first, t.second, v);
    } else if (k < 5 && !strs.empty()) {
        auto t = strs[below(strs.size())];
        std::string v =
            below(2) || names.empty() ? strings[below(sizeof strings / sizeof strings[0])] : names[below(names.size())];
        if (!below(8)) v = std::string(300 + below(2000), 'x');
        snprintf(what, sizeof what, "string \"%.60s\" = \"%.60s\"", j.substr(t.first, t.second).c_str(), v.c_str());
        j.replace(t.first, t.second, v);
    } else if (k < 7) {  // an entry (or key and value) duplicated or dropped: from a ',"' to the next
        size_t a = j.find(",\"", below(j.size()));
        if (a == std::string::npos) a = j.find(",\"");
        size_t b = a == std::string::npos ? a : j.find(",\"", a + 2);
        if (b == std::string::npos) b = j.size() - 1;
        if (a == std::string::npos || b <= a) return mutate_bytes(j, j.size());
        std::string e = j.substr(a, b - a);
        if (k == 5)
            j.insert(b, e);
        else
            j.erase(a, b - a);
        snprintf(what, sizeof what, "%s: %.80s", k == 5 ? "duplicated" : "dropped", e.c_str());
    } else if (k == 7) {  // nesting
        static const size_t depths[] = {20, 200, 5000, 1000000};
        size_t d = depths[below(4)], at = j.find(':');
        if (at == std::string::npos) return mutate_bytes(j, j.size());
        int closed = (int)below(2);
        j.insert(at + 1, std::string(d, '[') + "1" + (closed ? std::string(d, ']') : "") + ",");
        snprintf(what, sizeof what, "a value nested %zu deep%s", d, closed ? "" : ", never closed");
    } else if (k == 8) {  // a stray structural character
        static const char chars[] = "{}[]\":,\\ \x00\xff";
        size_t at = below(j.size() + 1);
        char c = chars[below(sizeof chars - 1)];
        j.insert(at, 1, c);
        snprintf(what, sizeof what, "character 0x%02x inserted at %zu", (unsigned char)c, at);
    } else if (k == 9) {  // two numbers swapped (data_offsets of different tensors, shapes)
        if (nums.size() < 2) return mutate_bytes(j, j.size());
        auto a = nums[below(nums.size())], b = nums[below(nums.size())];
        if (a.first > b.first) std::swap(a, b);
        if (a.first == b.first) return mutate_bytes(j, j.size());
        std::string va = j.substr(a.first, a.second), vb = j.substr(b.first, b.second);
        j.replace(b.first, b.second, va);
        j.replace(a.first, a.second, vb);
        snprintf(what, sizeof what, "numbers %s and %s swapped", va.c_str(), vb.c_str());
    } else {
        mutate_bytes(j, j.size());
    }
}

// decode16: a BF16 or F16 value as hf.h's converters (checked against IEEE in test_hf_io) give it.
static float decode16(const unsigned char* b, int bf) {
    uint16_t h = (uint16_t)(b[0] | b[1] << 8);
    return bf ? bert_bf16_to_f32(h) : bert_f16_to_f32(h);
}

static void fuzz_safetensors(int iters) {
    BertConfig cfg = tiny_cfg();
    BertParams p;
    bert_params_build(&p, &cfg);
    std::vector<float> w0(p.numel), w(p.numel);
    bert_init_host(&p, w0.data(), 7);
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!bert_save_hf(dir, &p, w0.data(), 0)) {
        CHECK(0, "bert_save_hf of the tiny model into %s", dir);
        return;
    }
    static const char* dtypes[] = {"F32", "BF16", "F16"};
    std::string seeds[4] = {read_text(path), make_st(&p, w0.data(), "BF16", 1), make_st(&p, w0.data(), "F16", 0),
                            make_st(&p, w0.data(), "F32", 1)};
    std::vector<std::string> names;
    for (int i = 0; i < p.n; i++) names.push_back(p.t[i].name);
    Tally t = {"model.safetensors", 0, 0, 0, 0};
    for (int i = 0; i < iters + 4; i++, t.inputs++) {
        int seed = i % 4;
        std::string s = seeds[seed];
        uint64_t hl;
        memcpy(&hl, s.data(), 8);
        int header_kept = 1;  // the header as the seed's: the weights can be checked against the data
        if (i < 4) {
            snprintf(what, sizeof what, "the valid seed %d", i);
        } else {
            size_t k = below(10);
            if (k < 2) {  // bytes of the data (the weights then are what those bytes say, or refused)
                std::string d = s.substr(8 + hl);
                size_t n = 1 + below(4);
                for (size_t q = 0; q < n; q++) d[below(d.size())] ^= (char)(1 + below(255));
                s = s.substr(0, 8 + hl) + d;
                snprintf(what, sizeof what, "%zu data bytes flipped", n);
            } else if (k < 3) {  // the header length
                static const uint64_t hls[] = {0, 1, 2, 7, 8, ~(uint64_t)0, (uint64_t)1 << 63, (uint64_t)1 << 32};
                uint64_t v = below(2) ? hls[below(8)] : hl + below(17) - 8;
                if (!below(4)) v = s.size() - 8 + below(3) - 1;
                memcpy(&s[0], &v, 8);
                header_kept = 0;
                snprintf(what, sizeof what, "header length %llu (was %llu)", (unsigned long long)v,
                         (unsigned long long)hl);
            } else {  // the header JSON, its length then set to match it (but now and then not)
                std::string j = s.substr(8, hl), d = s.substr(8 + hl);
                if (k < 4)
                    mutate_bytes(j, j.size());
                else
                    mutate_json(j, names);
                uint64_t nl = below(10) ? j.size() : hl;
                s = std::string((const char*)&nl, 8) + j + d;
                header_kept = 0;
            }
        }
        write_file(path, s);
        quiet_begin();
        int ok = bert_read_safetensors(path, &p, w.data());
        std::string printed = quiet_end();
        if (i < 4 && !ok) fail_input(&t, "a valid file refused: %s", printed.c_str());
        if (!ok && printed.find(path) == std::string::npos)
            fail_input(&t, "refused without a message naming the file (printed: \"%.200s\")", printed.c_str());
        if (ok && header_kept) {  // every weight is what the (mutated) data holds
            const unsigned char* d = (const unsigned char*)s.data() + 8 + hl;
            int bad = 0, bf = seed == 1;
            size_t at = 0;
            for (int q = 0; q < p.n; q++) {
                const BertTensor* te = &p.t[q];
                for (size_t e = 0; e < te->numel; e++) {
                    float x;
                    if (seed == 1 || seed == 2)
                        x = decode16(d + at + 2 * e, bf);
                    else
                        memcpy(&x, d + at + 4 * e, 4);
                    bad += memcmp(&x, &w[te->offset + e], 4) != 0 || !isfinite(x);
                }
                at += te->numel * (seed == 1 || seed == 2 ? 2 : 4);
            }
            if (bad) fail_input(&t, "loaded %d weights that are not the file's (%s)", bad, dtypes[seed % 3]);
        }
        t.loaded += ok, t.refused += !ok;
    }
    tally_check(&t);
    bert_params_free(&p);
}

static void fuzz_config(int iters) {
    BertConfig cfg = tiny_cfg();
    BertParams p;
    bert_params_build(&p, &cfg);
    std::vector<float> w0(p.numel);
    bert_init_host(&p, w0.data(), 7);
    if (!bert_save_hf(dir, &p, w0.data(), 0)) {  // model.safetensors: the export's, for the loads
        CHECK(0, "bert_save_hf of the tiny model into %s", dir);
        return;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    std::string seed = read_text(path);  // with what Python's json writes for floats JSON has no number for
    seed.insert(1, "\n  \"python_nan\": NaN,\n  \"python_ninf\": [-Infinity, Infinity],");
    std::vector<std::string> keys = {"vocab_size",        "hidden_size",
                                     "num_hidden_layers", "num_attention_heads",
                                     "intermediate_size", "max_position_embeddings",
                                     "type_vocab_size",   "layer_norm_eps",
                                     "hidden_act",        "position_embedding_type"};
    Tally t = {"config.json", 0, 0, 0, 0};
    for (int i = 0; i < iters + 1; i++, t.inputs++) {
        std::string s = seed;
        if (i == 0)
            snprintf(what, sizeof what, "the valid seed");
        else if (below(4))
            mutate_json(s, keys);
        else
            mutate_bytes(s, s.size());
        write_file(path, s);
        BertConfig c;
        quiet_begin();
        int ok = bert_read_config(path, &c);
        std::string printed = quiet_end();
        if (i == 0 && !ok) fail_input(&t, "the valid config.json refused: %s", printed.c_str());
        if (!ok && printed.find(path) == std::string::npos &&
            printed.find("unsupported configuration") == std::string::npos)
            fail_input(&t, "refused without a message naming the file (printed: \"%.200s\")", printed.c_str());
        if (ok && (c.vocab_size < 1 || c.max_position < 1 || c.type_vocab_size < 1 || c.hidden < 1 || c.layers < 1 ||
                   c.heads < 1 || c.intermediate < 1))
            fail_input(&t, "accepted a configuration with a size below 1 (intermediate_size %d)", c.intermediate);
        // sizes as the model's: the whole export loads, with its weights
        if (ok && c.vocab_size == cfg.vocab_size && c.hidden == cfg.hidden && c.layers == cfg.layers &&
            c.heads == cfg.heads && c.intermediate == cfg.intermediate && c.max_position == cfg.max_position &&
            c.type_vocab_size == cfg.type_vocab_size) {
            BertConfig c2;
            BertParams p2;
            float* w2 = NULL;
            quiet_begin();
            int loaded = bert_load_hf(dir, &c2, &p2, &w2);
            printed = quiet_end();
            if (!loaded || memcmp(w2, w0.data(), p.numel * sizeof(float)))
                fail_input(&t, "a config.json of the model's sizes, but the export did not load as written: %s",
                           printed.c_str());
            if (loaded) free(w2), bert_params_free(&p2);
        }
        t.loaded += ok, t.refused += !ok;
    }
    tally_check(&t);
    bert_params_free(&p);
}

// tokenizer.json (hf.h: bert_tokenizer_vocab, what start-up reads beside the shards): a WordPiece vocabulary (an
// object of token: id) and a Unigram one (a list of [token, score]), each with added tokens. Its answer is the
// vocabulary size, or -1 (refused: the caller says so, naming the file).
static void fuzz_tokenizer(int iters) {
    static const char* seeds[2] = {
        "{\"version\": \"1.0\", \"truncation\": null, \"added_tokens\": [{\"id\": 0, \"content\": \"[PAD]\", "
        "\"special\": true}, {\"id\": 5, \"content\": \"[MASK]\", \"special\": true}], \"normalizer\": "
        "{\"type\": \"BertNormalizer\", \"lowercase\": false}, \"model\": {\"type\": \"WordPiece\", "
        "\"unk_token\": \"[UNK]\", \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"a\": 2, \"b\": 3, \"##c\": 4}}}",
        "{\"added_tokens\": [{\"id\": 3, \"content\": \"<mask>\"}], \"model\": {\"type\": \"Unigram\", "
        "\"vocab\": [[\"<pad>\", 0.0], [\"a\", -1.5], [\"b\", -2.25e0], [\"c\", -3]], \"unk_id\": 0}}"};
    static const long long want[2] = {6, 4};
    std::vector<std::string> names = {"model", "vocab", "added_tokens", "id", "type", "[PAD]"};
    Tally t = {"tokenizer.json", 0, 0, 0, 0};
    for (int i = 0; i < iters + 2; i++, t.inputs++) {
        std::string s = seeds[i % 2];
        if (i < 2)
            snprintf(what, sizeof what, "the valid seed %d", i);
        else if (below(4))
            mutate_json(s, names);
        else
            mutate_bytes(s, s.size());
        quiet_begin();
        long long v = bert_tokenizer_vocab(s.c_str(), s.size());
        quiet_end();
        if (i < 2 && v != want[i]) fail_input(&t, "the valid seed gave %lld ids, not %lld", v, want[i]);
        if (v != -1 && (v < 1 || v > 2147483648ll)) fail_input(&t, "gave %lld ids: neither -1 nor 1 to 2^31", v);
        t.loaded += v >= 0, t.refused += v < 0;
    }
    tally_check(&t);
}

int main(void) {
    const char* it = getenv("FUZZ_ITERS");
    int iters = it && *it ? atoi(it) : 3000;
    const char* sd = getenv("FUZZ_SEED");
    uint64_t seed = fuzz_seed = sd && *sd ? strtoull(sd, NULL, 10) : 1;
    // (in memory where there is /dev/shm: thousands of small files written and read, no disk to wait for)
    snprintf(dir, sizeof dir, "/dev/shm/mlm_fuzz_load_XXXXXX");
    if (!mkdtemp(dir)) snprintf(dir, sizeof dir, "/tmp/mlm_fuzz_load_XXXXXX");
    if (dir[1] == 't' && !mkdtemp(dir)) {
        printf("FAIL test_fuzz_load: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char logp[300];
    snprintf(logp, sizeof logp, "%s/printed.txt", dir);
    log_fd = open(logp, O_RDWR | O_CREAT | O_TRUNC | O_APPEND, 0644);
    out_fd = dup(1), err_fd = dup(2);
    signal(SIGALRM, on_alarm);
    printf("fuzz: %d inputs of each kind, FUZZ_SEED=%llu\n", iters, (unsigned long long)seed);
    double t0 = now_s();
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    fuzz_checkpoints(iters);
    printf("  (%.1f s)\n", now_s() - t0);
    rng_state = seed * 0x9E3779B97F4A7C15ull + 2;
    fuzz_safetensors(iters);
    printf("  (%.1f s)\n", now_s() - t0);
    rng_state = seed * 0x9E3779B97F4A7C15ull + 3;
    fuzz_config(iters);
    printf("  (%.1f s)\n", now_s() - t0);
    rng_state = seed * 0x9E3779B97F4A7C15ull + 4;
    fuzz_tokenizer(iters);
    printf("  (%.1f s)\n", now_s() - t0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    return test_summary();
}
