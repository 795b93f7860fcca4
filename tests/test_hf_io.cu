// test_hf_io.cu: Hugging Face checkpoints as transformers writes them, read by model.h.
//   - config.json with everything transformers adds (lists, nested objects, null, true, empty {} and []):
//     the sizes read back are the model's
//   - model.safetensors in BF16 and in F16 (written here, byte by byte): every value loaded is the one the
//     16-bit pattern means, computed here from the IEEE definition (normals, subnormals, -0, inf, NaN);
//     tensors the model does not have are skipped, and cls.predictions.decoder.bias stands for
//     cls.predictions.bias
//   - refused, with a message naming the file and the tensor or key: a dtype that is not a float type, a
//     wrong shape, data offsets outside the file, a malformed header, an unsupported activation, a config
//     without vocab_size; an export into a directory that does not exist
//   - bert_alloc refuses T beyond max_position; the phase timer reports marks it had no room for
#include "../model.h"
#include "testing.h"
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

static char dir[256];

// stderr of a call, captured through a file
static int saved_fd = -1;
static void capture_begin(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    fflush(stderr);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}
static std::string capture_end(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    std::string s;
    FILE* f = fopen(path, "rb");
    for (int c; f && (c = fgetc(f)) != EOF;) s += (char)c;
    if (f) fclose(f);
    return s;
}

static void write_text(const char* name, const std::string& s) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE* f = fopen(path, "wb");
    fwrite(s.data(), 1, s.size(), f);
    fclose(f);
}

// One tensor of a safetensors file, its bytes already in the dtype's little-endian encoding.
typedef struct {
    std::string name, dtype;
    std::vector<long long> shape;
    std::vector<unsigned char> bytes;
    std::string extra;  // more keys for its header entry, e.g. ,"foo":1
} StTensor;

// write_safetensors: DIR/model.safetensors from the tensors, in order; header_override replaces the JSON.
static void write_safetensors(const std::vector<StTensor>& ts, const char* header_override = NULL) {
    std::string h = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"written by test_hf_io\"}";
    std::vector<unsigned char> data;
    for (const StTensor& t : ts) {
        char buf[512];
        std::string shape;
        for (size_t k = 0; k < t.shape.size(); k++) shape += (k ? "," : "") + std::to_string(t.shape[k]);
        snprintf(buf, sizeof buf, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s]%s,\"data_offsets\":[%zu,%zu]}",
                 t.name.c_str(), t.dtype.c_str(), shape.c_str(), t.extra.c_str(), data.size(),
                 data.size() + t.bytes.size());
        h += buf;
        data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    }
    h += "}";
    if (header_override) h = header_override;
    std::string file(8, '\0');
    for (int b = 0; b < 8; b++) file[b] = (char)((uint64_t)h.size() >> (8 * b));
    file += h;
    file.append((const char*)data.data(), data.size());
    write_text("model.safetensors", file);
}

// config.json as transformers 4.x writes it for a BertForMaskedLM, with the sizes of c
static std::string config_json(const BertConfig* c, const char* act = "gelu", int with_vocab = 1) {
    char buf[2048];
    snprintf(
        buf, sizeof buf,
        "{\n  \"_name_or_path\": \"bert-test\",\n  \"architectures\": [\n    \"BertForMaskedLM\", \"Other\"\n  ],\n"
        "  \"attention_probs_dropout_prob\": 0.1,\n  \"classifier_dropout\": null,\n  \"gradient_checkpointing\": "
        "false,\n  \"hidden_act\": \"%s\",\n  \"hidden_dropout_prob\": 0.1,\n  \"hidden_size\": %d,\n"
        "  \"id2label\": {},\n  \"label2id\": { },\n  \"bad_words_ids\": [],\n"
        "  \"task_specific_params\": {\"fill-mask\": {\"top_k\": [1, 2.5e0, -3], \"ok\": true, \"s\": \"a\\\"b\"}},\n"
        "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n  \"layer_norm_eps\": %.9g,\n"
        "  \"max_position_embeddings\": %d,\n  \"model_type\": \"bert\",\n  \"num_attention_heads\": %d,\n"
        "  \"num_hidden_layers\": %d,\n  \"pad_token_id\": 0,\n  \"position_embedding_type\": \"absolute\",\n"
        "  \"torch_dtype\": \"bfloat16\",\n  \"transformers_version\": \"4.44.2\",\n  \"type_vocab_size\": %d,\n"
        "  \"use_cache\": true%s\n}\n",
        act, c->hidden, c->intermediate, (double)c->ln_eps, c->max_position, c->heads, c->layers, c->type_vocab_size,
        with_vocab ? ",\n  \"vocab_size\": " : "");
    std::string s = buf;
    if (with_vocab) {
        s.insert(s.size() - 3, std::to_string(c->vocab_size));
    }
    return s;
}

// The IEEE meaning of a 16-bit pattern, from the definitions (double arithmetic, not bit moves).
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}
static double bf16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp((double)m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(1.0 + m / 128.0, e - 127);
    return s ? -v : v;
}
// same value, and for zeros the same sign; NaN matches NaN
static int same_value(float got, double want) {
    if (isnan(want)) return isnan(got);
    return (double)got == want && signbit(got) == signbit(want);
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint16_t rand16(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint16_t)(rng >> 24);
}
// a random finite 16-bit pattern (F16: exponent field < 31; BF16: < 255), a tenth of them subnormal
static uint16_t rand_finite(int bf) {
    uint16_t h = rand16();
    int eshift = bf ? 7 : 10, emax = bf ? 255 : 31;
    int e = (h >> eshift) & emax;
    if (rand16() % 10 == 0)
        e = 0;
    else if (e == emax)
        e = emax - 1;
    return (uint16_t)((h & ~(emax << eshift)) | (e << eshift));
}

// The tensors of table p in dtype (BF16 or F16) with random patterns, the few special ones at the start of
// the word embeddings; want receives the fp32 slab the load must give.
static std::vector<StTensor> half_tensors(const BertParams* p, int bf, std::vector<double>& want) {
    static const uint16_t f16_special[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8001, 0x03FF, 0x0400,
                                           0x8000, 0x0000, 0x7C00, 0xFC00, 0x7E00, 0x3555};
    static const uint16_t bf16_special[] = {0x3F80, 0xC040, 0x7F7F, 0x0001, 0x8001, 0x007F, 0x0080,
                                            0x8000, 0x0000, 0x7F80, 0xFF80, 0x7FC0, 0x3EAB};
    const uint16_t* special = bf ? bf16_special : f16_special;
    std::vector<StTensor> ts;
    want.assign(p->numel, 0);
    for (int i = 0; i < p->n; i++) {
        const BertTensor* t = &p->t[i];
        StTensor s;
        s.name = i == p->dec_b ? "cls.predictions.decoder.bias" : t->name;
        s.dtype = bf ? "BF16" : "F16";
        s.shape.push_back(t->shape[0]);
        if (t->rank == 2) s.shape.push_back(t->shape[1]);
        for (size_t k = 0; k < t->numel; k++) {
            uint16_t h = (i == 0 && k < 13) ? special[k] : rand_finite(bf);
            s.bytes.push_back((unsigned char)(h & 255));
            s.bytes.push_back((unsigned char)(h >> 8));
            want[t->offset + k] = bf ? bf16_value(h) : f16_value(h);
        }
        if (i == 1) s.extra = ",\"quant\":{\"bits\":[16,{}],\"kind\":null}";  // a key we do not know: skipped
        ts.push_back(s);
        if (i == 2) {  // tensors this model does not have, in the dtypes transformers uses for them
            StTensor pos = {"bert.embeddings.position_ids", "I64", {1, 40}, std::vector<unsigned char>(320, 0), ""};
            StTensor pool = {"bert.pooler.dense.bias", "F32", {32}, std::vector<unsigned char>(128, 0), ""};
            StTensor nsp = {"cls.seq_relationship.bias", "I16", {2}, std::vector<unsigned char>(4, 0), ""};
            ts.push_back(pos), ts.push_back(pool), ts.push_back(nsp);
        }
    }
    return ts;
}

static void test_config(const BertConfig* c) {
    write_text("config.json", config_json(c));
    BertConfig got;
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int ok = bert_read_config(path, &got);
    CHECK(ok, "config.json as transformers writes it: read");
    CHECK(ok && got.vocab_size == c->vocab_size && got.hidden == c->hidden && got.layers == c->layers &&
              got.heads == c->heads && got.intermediate == c->intermediate && got.max_position == c->max_position &&
              got.type_vocab_size == c->type_vocab_size && got.ln_eps == c->ln_eps,
          "config.json: sizes V %d C %d L %d NH %d I %d P %d, want %d %d %d %d %d %d", got.vocab_size, got.hidden,
          got.layers, got.heads, got.intermediate, got.max_position, c->vocab_size, c->hidden, c->layers, c->heads,
          c->intermediate, c->max_position);
}

static void test_half_import(const BertConfig* c, int bf) {
    BertParams p;
    bert_params_build(&p, c);
    std::vector<double> want;
    write_text("config.json", config_json(c));
    write_safetensors(half_tensors(&p, bf, want));
    BertConfig got;
    BertParams gp;
    float* w = NULL;
    capture_begin();
    int ok = bert_load_hf(dir, &got, &gp, &w);
    std::string err = capture_end();
    CHECK(ok, "%s import: bert_load_hf failed: %s", bf ? "BF16" : "F16", err.c_str());
    if (ok) {
        CHECK(gp.numel == p.numel, "%s import: %zu parameters, want %zu", bf ? "BF16" : "F16", gp.numel, p.numel);
        size_t bad = 0, first = 0;
        for (size_t k = 0; k < p.numel; k++)
            if (!same_value(w[k], want[k]) && !bad++) first = k;
        CHECK(bad == 0, "%s import: %zu of %zu values differ from the patterns' meaning; first [%zu] %.9g, want %.9g",
              bf ? "BF16" : "F16", bad, p.numel, first, bad ? w[first] : 0.f, bad ? want[first] : 0.0);
        // the special patterns, spelled out
        if (bf)
            CHECK(w[0] == 1.0f && w[1] == -3.0f && w[3] == ldexpf(1, -133) && w[6] == ldexpf(1, -126) && isinf(w[9]) &&
                      w[9] > 0 && isinf(w[10]) && w[10] < 0 && isnan(w[11]) && signbit(w[7]),
                  "BF16 specials: %g %g %g %g %g %g %g", w[0], w[1], w[3], w[6], w[9], w[10], w[11]);
        else
            CHECK(w[0] == 1.0f && w[1] == -2.0f && w[2] == 65504.0f && w[3] == ldexpf(1, -24) &&
                      w[4] == -ldexpf(1, -24) && w[5] == ldexpf(1023, -24) && w[6] == ldexpf(1, -14) && isinf(w[9]) &&
                      w[9] > 0 && isinf(w[10]) && w[10] < 0 && isnan(w[11]) && signbit(w[7]) && !signbit(w[8]),
                  "F16 specials: %g %g %g %g %g %g %g %g %g %g", w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[9], w[10],
                  w[11]);
        // cls.predictions.bias came from cls.predictions.decoder.bias
        const BertTensor* db = &p.t[p.dec_b];
        CHECK(same_value(w[db->offset + 5], want[db->offset + 5]) && want[db->offset + 5] != 0,
              "cls.predictions.bias from cls.predictions.decoder.bias");
        free(w);
        bert_params_free(&gp);
    }
    bert_params_free(&p);
}

// refused: bert_load_hf gives 0 and prints a line containing `want`
static void expect_refused(const char* what, const char* want) {
    BertConfig got;
    BertParams gp;
    float* w = NULL;
    capture_begin();
    int ok = bert_load_hf(dir, &got, &gp, &w);
    std::string err = capture_end();
    CHECK(!ok && err.find(want) != std::string::npos && w == NULL, "%s: load gave %d and '%s', want 0 and '%s'", what,
          ok, err.c_str(), want);
    if (ok) {
        free(w);
        bert_params_free(&gp);
    }
}

static StTensor& by_name(std::vector<StTensor>& ts, const char* name) {
    for (StTensor& t : ts)
        if (t.name == name) return t;
    printf("FAIL test_hf_io: no tensor %s\n", name);
    exit(1);
}

static void test_refusals(const BertConfig* c) {
    BertParams p;
    bert_params_build(&p, c);
    std::vector<double> want;
    std::vector<StTensor> good = half_tensors(&p, 1, want), ts;
    write_text("config.json", config_json(c));
    char msg[512];

    ts = good;  // a table tensor stored as integers, with the right byte count
    by_name(ts, p.t[3].name).dtype = "I16";
    write_safetensors(ts);
    snprintf(msg, sizeof msg, "model.safetensors: %s has dtype I16 (F32, BF16 or F16 expected)", p.t[3].name);
    expect_refused("an I16 tensor", msg);

    ts = good;  // 8-byte elements: half the count, same bytes
    StTensor& t2 = by_name(ts, p.t[2].name);
    t2.dtype = "F64";
    t2.shape[t2.shape.size() - 1] /= 4;
    write_safetensors(ts);
    snprintf(msg, sizeof msg, "model.safetensors: %s has the wrong shape for this config", p.t[2].name);
    expect_refused("an F64 tensor of a quarter of the elements", msg);

    ts = good;  // the word embeddings transposed: the same bytes, the wrong shape
    std::swap(by_name(ts, p.t[0].name).shape[0], by_name(ts, p.t[0].name).shape[1]);
    write_safetensors(ts);
    snprintf(msg, sizeof msg, "model.safetensors: %s has the wrong shape for this config", p.t[0].name);
    expect_refused("a transposed tensor", msg);

    ts = good;  // one element more in the shape than in the bytes
    by_name(ts, p.t[1].name).shape[0] += 1;
    write_safetensors(ts);
    snprintf(msg, sizeof msg, "model.safetensors: %s has a bad shape or bad data offsets", p.t[1].name);
    expect_refused("a shape larger than the data", msg);

    write_safetensors(good, "{\"bert.embeddings.word_embeddings.weight\" {\"dtype\":\"BF16\"}}");
    expect_refused("a header without its colon", "model.safetensors: malformed header");

    write_safetensors(good);
    write_text("config.json", config_json(c, "relu"));
    expect_refused("hidden_act relu", "config.json: hidden_act \"relu\" is not supported");
    write_text("config.json", config_json(c, "gelu", 0));
    expect_refused("no vocab_size", "config.json: no vocab_size");

    // the export needs its directory
    char missing[300];
    snprintf(missing, sizeof missing, "%s/no-such-dir", dir);
    std::vector<float> w(p.numel, 0.5f);
    capture_begin();
    int ok = bert_save_hf(missing, &p, w.data(), 0);
    std::string err = capture_end();
    CHECK(!ok && err.find("cannot write " + std::string(missing) + "/config.json.tmp") != std::string::npos,
          "export into a missing directory: gave %d, '%s'", ok, err.c_str());
    bert_params_free(&p);
}

static void test_alloc_and_timer(const BertConfig* c) {
    BertModel m;
    capture_begin();
    int ok = bert_alloc(&m, c, 1, c->max_position + 1, 64, 0);
    std::string err = capture_end();
    char want[128];
    snprintf(want, sizeof want, "T = %d exceeds max_position %d", c->max_position + 1, c->max_position);
    CHECK(!ok && err.find(want) != std::string::npos, "bert_alloc with T > max_position: gave %d, '%s'", ok,
          err.c_str());

    // the phase timer: marks beyond its capacity are lost and reported, then it starts over
    PhaseTimer t;
    phase_timer_init(&t, 3);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    for (int i = 0; i < 5; i++) phase_mark(&t, i % 2 ? PHASE_MATMUL : PHASE_OPTIM, s);
    CHECK(t.n == 3 && t.overflow, "5 marks in a timer of 3: %d kept, overflow %d", t.n, t.overflow);
    CHECK(phase_timer_collect(&t) == 0, "a collect after lost marks reports them");
    for (int i = 0; i < 3; i++) phase_mark(&t, PHASE_MATMUL, s);
    CHECK(phase_timer_collect(&t) == 1 && t.n == 0, "3 marks in a timer of 3: collected");
    phase_timer_free(&t);
    CUDA_OK(cudaStreamDestroy(s));
}

int main(void) {
    const char* tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/mlm_hf_io_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        printf("FAIL cannot create a temporary directory %s\n", dir);
        return 1;
    }
    BertConfig c;
    bert_preset("tiny", &c);
    c.vocab_size = 260;
    test_config(&c);
    test_half_import(&c, 1);
    test_half_import(&c, 0);
    test_refusals(&c);
    test_alloc_and_timer(&c);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    return test_summary();
}
