// hf.h: the Hugging Face interchange: a BertForMaskedLM's model.safetensors and config.json, written by the export
// (bert_save_hf) and read by --init-from and --eval (bert_load_hf), with the few file and JSON helpers they need.
// model.h has the model; this file only moves its parameters in and out.
#pragma once
#include <glob.h>
#include <libgen.h>
#include "files.h"
#include "model.h"

// ---------------------------------------------------------------------------------------------
// Hugging Face interchange: model.safetensors + config.json (BertForMaskedLM)
//
// safetensors: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
// then the tensors' bytes (offsets relative to the end of the header). We write F32 (the master
// weights, so a round trip is bit-exact) and read F32, BF16 or F16. The decoder weight is tied to the
// word embeddings and is not written (transformers re-ties it on load); on read,
// cls.predictions.decoder.bias is accepted for cls.predictions.bias, and tensors this model does not
// have (the pooler, the next-sentence head, position_ids) are skipped.

// a minimal JSON reader, enough for safetensors headers and config.json
typedef struct {
    const char* s;
    const char* end;
    int err;
} BertJson;
static inline void bj_ws(BertJson* j) {
    while (j->s < j->end && (*j->s == ' ' || *j->s == '\n' || *j->s == '\r' || *j->s == '\t')) j->s++;
}
static inline int bj_peek(BertJson* j) {
    bj_ws(j);
    return j->s < j->end ? *j->s : -1;
}
static inline int bj_eat(BertJson* j, char c) {
    if (bj_peek(j) == c) {
        j->s++;
        return 1;
    }
    j->err = 1;
    return 0;
}
// a string into out (truncated to cap-1; escapes other than \" and \\ are kept as the escaped char)
static inline int bj_string(BertJson* j, char* out, size_t cap) {
    if (!bj_eat(j, '"')) return 0;
    size_t n = 0;
    while (j->s < j->end && *j->s != '"') {
        char c = *j->s++;
        if (c == '\\' && j->s < j->end) c = *j->s++;
        if (n + 1 < cap) out[n++] = c;
    }
    if (cap) out[n] = 0;
    return bj_eat(j, '"');
}
static inline int bj_digits(BertJson* j, const char** p) {  // [0-9]* from *p; gives how many
    const char* d = *p;
    while (*p < j->end && **p >= '0' && **p <= '9') (*p)++;
    return (int)(*p - d);
}
// a number as JSON writes one, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?: not strtod's hex, inf, nan or "+1"
static inline double bj_number(BertJson* j) {
    bj_ws(j);
    const char* p = j->s + (j->s < j->end && *j->s == '-');
    const char* first = p;
    int n = bj_digits(j, &p), ok = n > 0 && !(n > 1 && *first == '0');
    if (ok && p < j->end && *p == '.') p++, ok = bj_digits(j, &p) > 0;
    if (ok && p < j->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < j->end && (*p == '+' || *p == '-')) p++;
        ok = bj_digits(j, &p) > 0;
    }
    char* e = NULL;
    double v = ok ? strtod(j->s, &e) : 0;
    if (!ok || e != p) {
        j->err = 1;
        return 0;
    }
    j->s = p;
    return v;
}
// bj_sep: after a member or an element, the ',' before the next one (consumed), or the closing character (not):
// a trailing comma, or two values without one between them, are malformed
static inline void bj_sep(BertJson* j, char close) {
    if (bj_peek(j) == ',') {
        j->s++;
        if (bj_peek(j) == close) j->err = 1;
    } else if (bj_peek(j) != close) {
        j->err = 1;
    }
}
// bj_end: the closing character of the outermost object, then nothing but whitespace
static inline void bj_end(BertJson* j) {
    bj_eat(j, '}');
    if (bj_peek(j) != -1) j->err = 1;
}
// bj_skip: any value, nested at most BJ_MAX_DEPTH deep (deeper is malformed here: neither file needs it, and
// a recursion as deep as a hostile file's nesting would overflow the stack)
#define BJ_MAX_DEPTH 64
static inline void bj_skip_in(BertJson* j, int depth) {
    int c = bj_peek(j);
    char tmp[8];
    if (c == '"') {
        bj_string(j, tmp, sizeof(tmp));
        return;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (depth >= BJ_MAX_DEPTH) {
            j->err = 1;
            return;
        }
        j->s++;
        if (bj_peek(j) == close) {
            j->s++;
            return;
        }
        for (;;) {
            if (c == '{') {
                bj_string(j, tmp, sizeof(tmp));
                bj_eat(j, ':');
            }
            bj_skip_in(j, depth + 1);
            if (j->err) return;
            if (bj_peek(j) == ',') {
                j->s++;
                continue;
            }
            bj_eat(j, close);
            return;
        }
    }
    if (c == '-' && j->s + 1 < j->end && j->s[1] == 'I') j->s++, c = 'I';  // Python's -Infinity
    if (c == 't' || c == 'f' || c == 'n' || c == 'N' || c == 'I') {        // true, false, null; Python's NaN, Infinity
        while (j->s < j->end && ((*j->s >= 'a' && *j->s <= 'z') || (*j->s >= 'A' && *j->s <= 'Z'))) j->s++;
        return;
    }
    bj_number(j);
}
static inline void bj_skip(BertJson* j) { bj_skip_in(j, 0); }

// bert_write_file: path holds a then b, atomically: written to path.tmp, flushed to disk, renamed over path
// (so a crash or a full disk leaves the old file whole, or no file). Gives 1 on success.
static inline int bert_write_file(const char* path, const void* a, size_t na, const void* b, size_t nb) {
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = create_fresh(tmp);  // (a link left at path.tmp is replaced, not written through)
    FILE* f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        fprintf(stderr, "model: cannot write %s: %s\n", tmp, strerror(errno));
        return 0;
    }
    int ok =
        fwrite(a, 1, na, f) == na && (nb == 0 || fwrite(b, 1, nb, f) == nb) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int why = errno;
    if (fclose(f) != 0 && ok) ok = 0, why = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, why = errno;
    if (!ok) {
        fprintf(stderr, "model: cannot write %s: %s\n", path, strerror(why));
        unlink(tmp);
    }
    return ok;
}

// bert_save_hf: writes dir/model.safetensors (F32) and dir/config.json for the host fp32 slab w; pad_id is
// the vocabulary's padding id (the shards' header). Dropout is 0: training here uses none. dir must exist.
// Gives 1 on success.
static inline int bert_save_hf(const char* dir, const BertParams* p, const float* w, int pad_id) {
    const BertConfig* c = &p->cfg;
    char path[4096];
    // config.json
    char cfg[2048];
    int n = snprintf(
        cfg, sizeof(cfg),
        "{\n  \"architectures\": [\"BertForMaskedLM\"],\n  \"model_type\": \"bert\",\n"
        "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"num_hidden_layers\": %d,\n"
        "  \"num_attention_heads\": %d,\n  \"intermediate_size\": %d,\n  \"hidden_act\": \"gelu_pytorch_tanh\",\n"
        "  \"hidden_dropout_prob\": 0.0,\n  \"attention_probs_dropout_prob\": 0.0,\n"
        "  \"max_position_embeddings\": %d,\n  \"type_vocab_size\": %d,\n  \"initializer_range\": 0.02,\n"
        "  \"layer_norm_eps\": %.9g,\n  \"pad_token_id\": %d,\n  \"position_embedding_type\": \"absolute\",\n"
        "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n",
        c->vocab_size, c->hidden, c->layers, c->heads, c->intermediate, c->max_position, c->type_vocab_size,
        (double)c->ln_eps, pad_id);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (!bert_write_file(path, cfg, (size_t)n, NULL, 0)) return 0;
    // safetensors header
    size_t cap = 256 + (size_t)p->n * 160, len = 0, data = 0;
    char* h = (char*)malloc(cap);
    if (!h) return 0;
    len += snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < p->n; i++) {
        const BertTensor* t = &p->t[i];
        if (t->rank == 2)
            len +=
                snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                         t->name, t->shape[0], t->shape[1], data, data + t->numel * 4);
        else
            len += snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                            t->name, t->shape[0], data, data + t->numel * 4);
        data += t->numel * 4;
    }
    len += snprintf(h + len, cap - len, "}");
    while ((8 + len) % 8) h[len++] = ' ';  // the data starts 8-byte aligned
    unsigned char* buf = (unsigned char*)malloc(8 + len + data);
    if (!buf) {
        fprintf(stderr, "model: out of host memory for the %zu-byte export\n", 8 + len + data);
        free(h);
        return 0;
    }
    uint64_t hl = len;
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)(hl >> (8 * b));
    memcpy(buf + 8, h, len);
    size_t o = 8 + len;
    for (int i = 0; i < p->n; i++) {  // little-endian host assumed (x86-64, aarch64)
        memcpy(buf + o, w + p->t[i].offset, p->t[i].numel * 4);
        o += p->t[i].numel * 4;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    int ok = bert_write_file(path, buf, o, NULL, 0);
    free(h);
    free(buf);
    return ok;
}

// bert_read_file: the whole of a regular file of at most max_bytes (files.h: read_whole_file; `what` it should be),
// malloc'd with a 0 after it (not counted in *size); NULL with one line naming the file when it cannot be opened or
// read, is not a regular file (a directory, a FIFO: opened without blocking, refused without reading) or is larger.
static inline char* bert_read_file(const char* path, const char* what, long long max_bytes, size_t* size) {
    char err[FILES_ERR_LEN];
    char* buf = read_whole_file(path, what, max_bytes, size, err);
    if (!buf && !strncmp(err, "cannot open: ", 13))  // (a missing file, said as it always was)
        fprintf(stderr, "model: cannot open %s: %s\n", path, err + 13);
    else if (!buf)
        fprintf(stderr, "model: %s: %s\n", path, err);
    return buf;
}

// bert_read_config: reads a Hugging Face config.json into c. Gives 1 on success.
static inline int bert_read_config(const char* path, BertConfig* c) {
    size_t n;
    char* buf = bert_read_file(path, "a Hugging Face config.json", FILE_MAX_JSON, &n);
    if (!buf) return 0;
    memset(c, 0, sizeof(*c));
    c->type_vocab_size = 2;
    c->ln_eps = 1e-12f;
    c->max_position = 512;
    BertJson j = {buf, buf + n, 0};
    char key[128], str[64];
    int ok = 1;  // (malformed JSON sets j.err: said below)
    bj_eat(&j, '{');
    while (ok && !j.err && bj_peek(&j) != '}') {
        bj_string(&j, key, sizeof(key));
        bj_eat(&j, ':');
        int* target = NULL;
        if (!strcmp(key, "vocab_size"))
            target = &c->vocab_size;
        else if (!strcmp(key, "hidden_size"))
            target = &c->hidden;
        else if (!strcmp(key, "num_hidden_layers"))
            target = &c->layers;
        else if (!strcmp(key, "num_attention_heads"))
            target = &c->heads;
        else if (!strcmp(key, "intermediate_size"))
            target = &c->intermediate;
        else if (!strcmp(key, "max_position_embeddings"))
            target = &c->max_position;
        else if (!strcmp(key, "type_vocab_size"))
            target = &c->type_vocab_size;
        int c0 = bj_peek(&j);  // a number starts with a digit or '-' (a string, true, null, [...] are not numbers)
        int is_num = c0 == '-' || (c0 >= '0' && c0 <= '9');
        if ((target || !strcmp(key, "layer_norm_eps")) && !is_num && c0 >= 0) {  // (the end: malformed JSON)
            int len = 0;  // the value as written, up to its end or 16 characters
            while (j.s + len < j.end && len < 16 && j.s[len] != ',' && j.s[len] != '}' && j.s[len] != '\n') len++;
            fprintf(stderr, "model: %s: %s %.*s: expected a number%s\n", path, key, len, j.s,
                    c0 == '"' ? ", not a string" : "");
            ok = 0;
            break;
        }
        if (target) {
            double v = bj_number(&j);
            if (!(v >= 0 && v <= (1 << 30) && v == (double)(long long)v)) {
                fprintf(stderr, "model: %s: %s %g: expected an integer in [0, 2^30]\n", path, key, v);
                ok = 0;
                v = 0;
            }
            *target = (int)v;
        } else if (!strcmp(key, "layer_norm_eps")) {
            double v = bj_number(&j);
            if (!(v > 0 && v < 1)) {  // (also NaN)
                fprintf(stderr, "model: %s: layer_norm_eps %g: expected a number in (0, 1)\n", path, v);
                ok = 0;
            }
            c->ln_eps = (float)v;
        } else if (!strcmp(key, "hidden_act")) {  // GELU: mlm.c computes its tanh form (kernels.cuh, gelu_tanh_grad)
            bj_string(&j, str, sizeof(str));
            if (!strcmp(str, "gelu")) {
                printf(
                    "model: %s: hidden_act \"gelu\" is the exact (erf) GELU; this model computes the tanh form, "
                    "within 5e-4 of it, and exports \"gelu_pytorch_tanh\"\n",
                    path);
            } else if (strcmp(str, "gelu_pytorch_tanh") && strcmp(str, "gelu_new")) {
                fprintf(stderr, "model: %s: hidden_act \"%s\" is not supported (gelu_pytorch_tanh, gelu_new or gelu)\n",
                        path, str);
                ok = 0;
            }
        } else if (!strcmp(key, "position_embedding_type")) {
            bj_string(&j, str, sizeof(str));
            if (strcmp(str, "absolute")) {
                fprintf(stderr, "model: %s: position_embedding_type \"%s\" is not supported (absolute)\n", path, str);
                ok = 0;
            }
        } else
            bj_skip(&j);
        bj_sep(&j, '}');
    }
    if (ok && !j.err) bj_end(&j);
    free(buf);
    if (ok && j.err) {
        fprintf(stderr, "model: %s: malformed JSON\n", path);
        return 0;
    }
    if (ok && !c->vocab_size) {
        fprintf(stderr, "model: %s: no vocab_size\n", path);
        ok = 0;
    }
    if (ok && c->intermediate < 1) {  // (bert_config_check lets 0 through: a layer without its MLP)
        fprintf(stderr, "model: %s: intermediate_size %d (or none): expected a positive integer\n", path,
                c->intermediate);
        ok = 0;
    }
    return ok && bert_config_check(c);
}

static inline float bert_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float bert_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return s ? -f : f;
    }
    if (e == 31)
        u = s | 0x7F800000u | (m << 13);
    else
        u = s | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// A parsed safetensors file: its entries and where their bytes are.
typedef struct {
    char name[160];
    char dtype[16];  // "F32", "BF16", "F16", "I32", "I64", ...
    int rank;
    long long shape[4];
    size_t begin, end;  // byte offsets into data
} BertStEntry;
typedef struct {
    char* buf;         // the whole file
    const char* data;  // the byte buffer after the header
    size_t data_len;
    int n;
    BertStEntry* e;
} BertSt;

static inline void bert_st_free(BertSt* st) {
    free(st->buf);
    free(st->e);
    memset(st, 0, sizeof(*st));
}

// bert_st_dtype_bytes: the bytes per element of a safetensors dtype; 0 for a name the format does not have.
static inline int bert_st_dtype_bytes(const char* d) {
    static const char* names[] = {"BOOL", "U8",   "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16",
                                  "F16",  "BF16", "I32", "U32",     "F32",     "I64",     "U64", "F64"};
    static const int bytes[] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    for (int i = 0; i < (int)(sizeof bytes / sizeof bytes[0]); i++)
        if (!strcmp(d, names[i])) return bytes[i];
    return 0;
}

// bert_st_entry_ok: one header entry checked on its own: a known dtype, a shape of at most 4 whole
// non-negative sizes, two whole data_offsets [begin, end] with begin <= end <= the data's bytes, and exactly
// the bytes the shape needs. Prints what is wrong and gives 0.
static inline int bert_st_entry_ok(const char* path, const BertStEntry* en, int bad_shape, int n_off,
                                   const double off[2], size_t data_len) {
    int esize = bert_st_dtype_bytes(en->dtype);
    double numel = 1;
    for (int k = 0; k < en->rank && k < 4; k++) numel *= (double)en->shape[k];
    if (!esize)
        fprintf(stderr,
                "model: %s: %s has dtype \"%s\", not a safetensors dtype (F32, BF16, F16, I64, U8, ... expected)\n",
                path, en->name, en->dtype);
    else if (en->rank > 4 || bad_shape)
        fprintf(stderr, "model: %s: %s has a bad shape (expected at most 4 whole non-negative sizes)\n", path,
                en->name);
    else if (n_off != 2 || off[0] < 0 || off[1] < 0)
        fprintf(stderr, "model: %s: %s has bad data_offsets (expected two whole non-negative numbers [begin, end])\n",
                path, en->name);
    else if (off[0] > off[1] || off[1] > (double)data_len)
        fprintf(stderr, "model: %s: %s has data_offsets [%.0f, %.0f] outside the file's %zu data bytes\n", path,
                en->name, off[0], off[1], data_len);
    else if (off[1] - off[0] != numel * esize)
        fprintf(stderr,
                "model: %s: %s: its shape of %.0f %s elements needs %.0f bytes, its data_offsets [%.0f, %.0f] hold "
                "%.0f\n",
                path, en->name, numel, en->dtype, numel * esize, off[0], off[1], off[1] - off[0]);
    else
        return 1;
    return 0;
}

// bert_st_by_range, bert_st_by_name: qsort's orders of entry pointers (a hostile header may hold millions of
// entries: no quadratic sort)
static inline int bert_st_by_range(const void* a, const void* b) {
    const BertStEntry *x = *(const BertStEntry*const*)a, *y = *(const BertStEntry*const*)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x < y ? -1 : x > y;  // ties in the header's order
}
static inline int bert_st_by_name(const void* a, const void* b) {
    return strcmp((*(const BertStEntry* const*)a)->name, (*(const BertStEntry* const*)b)->name);
}

// bert_st_layout_ok: every tensor named once (which of two would be meant cannot be known), and the tensors'
// byte ranges, in offset order, tile the data exactly, as the safetensors format requires (its library refuses
// the rest): no two overlap, no byte is left between them or after the last. Prints the first problem and
// gives 0.
static inline int bert_st_layout_ok(const char* path, const BertSt* st) {
    const BertStEntry** order = (const BertStEntry**)malloc((st->n + 1) * sizeof(*order));
    if (!order) {
        fprintf(stderr, "model: %s: out of host memory for %d entries\n", path, st->n);
        return 0;
    }
    for (int i = 0; i < st->n; i++) order[i] = &st->e[i];
    int ok = 1;
    qsort(order, st->n, sizeof(*order), bert_st_by_name);
    for (int k = 1; ok && k < st->n; k++)
        if (!strcmp(order[k]->name, order[k - 1]->name)) {
            fprintf(stderr, "model: %s: tensor %s appears twice in the header\n", path, order[k]->name);
            ok = 0;
        }
    qsort(order, st->n, sizeof(*order), bert_st_by_range);
    size_t at = 0;  // the end of the bytes covered so far
    for (int k = 0; ok && k < st->n; k++) {
        const BertStEntry* e = order[k];
        if (e->begin < at) {
            const BertStEntry* p = order[k - 1];
            fprintf(stderr, "model: %s: %s (data_offsets [%zu, %zu]) overlaps %s ([%zu, %zu])\n", path, e->name,
                    e->begin, e->end, p->name, p->begin, p->end);
            ok = 0;
        } else if (e->begin > at) {
            fprintf(stderr, "model: %s: data bytes [%zu, %zu) belong to no tensor (a hole before %s)\n", path, at,
                    e->begin, e->name);
            ok = 0;
        }
        at = e->end;
    }
    if (ok && at != st->data_len) {
        fprintf(stderr, "model: %s: %zu data bytes after the last tensor's end (%zu) belong to no tensor\n", path,
                st->data_len - at, at);
        ok = 0;
    }
    free(order);
    return ok;
}

// bert_st_open_max: reads and validates a safetensors file of at most max_bytes. Gives 1 on success.
static inline int bert_st_open_max(const char* path, BertSt* st, long long max_bytes) {
    memset(st, 0, sizeof(*st));
    size_t n;
    st->buf = bert_read_file(path, "a safetensors file", max_bytes, &n);
    if (!st->buf) return 0;
    uint64_t hl = 0;
    if (n >= 8)
        for (int b = 0; b < 8; b++) hl |= (uint64_t)(unsigned char)st->buf[b] << (8 * b);
    if (n < 8 || hl > n - 8) {
        fprintf(stderr, "model: %s: not a safetensors file (bad header length)\n", path);
        bert_st_free(st);
        return 0;
    }
    st->data = st->buf + 8 + hl;
    st->data_len = n - 8 - hl;
    int cap = 64;
    st->e = (BertStEntry*)malloc(cap * sizeof(BertStEntry));
    if (!st->e) {
        bert_st_free(st);
        return 0;
    }
    BertJson j = {st->buf + 8, st->buf + 8 + hl, 0};
    char key[64];
    int ok = 1;
    bj_eat(&j, '{');
    while (!j.err && bj_peek(&j) != '}') {
        BertStEntry en;
        memset(&en, 0, sizeof(en));
        bj_string(&j, en.name, sizeof(en.name));
        bj_eat(&j, ':');
        if (!strcmp(en.name, "__metadata__")) {
            bj_skip(&j);
            bj_sep(&j, '}');
            continue;
        }
        double off[2] = {-1, -1};
        int n_off = 0, bad_shape = 0;
        bj_eat(&j, '{');
        while (!j.err && bj_peek(&j) != '}') {
            bj_string(&j, key, sizeof(key));
            bj_eat(&j, ':');
            if (!strcmp(key, "dtype"))
                bj_string(&j, en.dtype, sizeof(en.dtype));
            else if (!strcmp(key, "shape") || !strcmp(key, "data_offsets")) {
                int is_shape = key[0] == 's', k = 0;
                bj_eat(&j, '[');
                while (!j.err && bj_peek(&j) != ']') {
                    double v = bj_number(&j);
                    int whole = v >= 0 && v <= 9e15 && v == floor(v);  // an exact non-negative integer
                    if (is_shape) {
                        if (k < 4) en.shape[k] = whole ? (long long)v : -1;
                        bad_shape |= !whole;
                    } else if (k < 2)
                        off[k] = whole ? v : -1;
                    k++;
                    bj_sep(&j, ']');
                }
                bj_eat(&j, ']');
                if (is_shape)
                    en.rank = k;
                else
                    n_off = k;
            } else
                bj_skip(&j);
            bj_sep(&j, '}');
        }
        bj_eat(&j, '}');
        bj_sep(&j, '}');
        if (j.err) break;
        if (!bert_st_entry_ok(path, &en, bad_shape, n_off, off, st->data_len)) {
            ok = 0;
            break;
        }
        en.begin = (size_t)off[0];
        en.end = (size_t)off[1];
        if (st->n == cap) {
            BertStEntry* e = (BertStEntry*)realloc(st->e, 2 * cap * sizeof(BertStEntry));
            if (!e) {
                fprintf(stderr, "model: %s: out of host memory for %d entries\n", path, 2 * cap);
                ok = 0;
                break;
            }
            st->e = e, cap *= 2;
        }
        st->e[st->n++] = en;
    }
    if (ok && !j.err) bj_end(&j);
    if (j.err) {
        fprintf(stderr, "model: %s: malformed header\n", path);
        ok = 0;
    }
    if (ok && !bert_st_layout_ok(path, st)) ok = 0;
    if (!ok) bert_st_free(st);
    return ok;
}
// bert_st_open: bert_st_open_max with the bound of the largest model this trainer runs (2e10 F32 parameters).
static inline int bert_st_open(const char* path, BertSt* st) { return bert_st_open_max(path, st, 80ll << 30); }
static inline const BertStEntry* bert_st_find(const BertSt* st, const char* name) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->e[i].name, name)) return &st->e[i];
    return NULL;
}
static inline size_t bert_st_numel(const BertStEntry* e) {
    size_t n = 1;
    for (int k = 0; k < e->rank; k++) n *= (size_t)e->shape[k];
    return n;
}
// bert_st_read_f32: converts entry e (F32, BF16 or F16) into dst (bert_st_numel(e) floats). Gives 1 on success.
static inline int bert_st_read_f32(const BertSt* st, const BertStEntry* e, float* dst) {
    const unsigned char* src = (const unsigned char*)st->data + e->begin;
    size_t numel = bert_st_numel(e);
    if (!strcmp(e->dtype, "F32")) {
        memcpy(dst, src, numel * 4);
        return 1;
    }  // little-endian host
    int bf = !strcmp(e->dtype, "BF16");
    if (!bf && strcmp(e->dtype, "F16")) return 0;
    for (size_t i = 0; i < numel; i++) {
        uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
        dst[i] = bf ? bert_bf16_to_f32(h) : bert_f16_to_f32(h);
    }
    return 1;
}

// bert_all_finite: 1 when the n floats of tensor `name` are all finite; else prints the first value that is
// not (NaN or Inf weights would train or evaluate to NaN without a word) and gives 0.
static inline int bert_all_finite(const char* path, const char* name, const float* x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            fprintf(stderr, "model: %s: %s holds %s at element %zu: weights must be finite numbers\n", path, name,
                    isnan(x[i]) ? "NaN"
                    : x[i] > 0  ? "+Inf"
                                : "-Inf",
                    i);
            return 0;
        }
    return 1;
}

// bert_params_all_finite: 1 when every tensor of table p in the slab w is finite (bert_all_finite, which names the
// first value that is not; path: the file they are read from or written to).
static inline int bert_params_all_finite(const char* path, const BertParams* p, const float* w) {
    for (int i = 0; i < p->n; i++)
        if (!bert_all_finite(path, p->t[i].name, w + p->t[i].offset, p->t[i].numel)) return 0;
    return 1;
}

// bert_read_safetensors: reads the tensors of table p from path into the host fp32 slab w
// (p->numel floats, zeroed first). Every tensor of the table must be present with its shape and a float dtype:
// all are checked before the slab is touched (a config.json of a huge model beside a small file is refused
// here, not after zeroing gigabytes).
// The file may be at most twice the table's F32 bytes and 64 MiB (the header, tensors this model does not have): a
// larger one is not this model's, and is refused before it is read into memory.
static inline int bert_read_safetensors(const char* path, const BertParams* p, float* w) {
    BertSt st;
    if (!bert_st_open_max(path, &st, (long long)p->numel * 8 + (64ll << 20))) return 0;
    const BertStEntry** found = (const BertStEntry**)malloc((p->n + 1) * sizeof(*found));
    int ok = found != NULL;
    if (!ok) fprintf(stderr, "model: %s: out of host memory\n", path);
    for (int i = 0; ok && i < p->n; i++) {
        const BertTensor* t = &p->t[i];
        const BertStEntry* e = bert_st_find(&st, t->name);
        if (!e && i == p->dec_b) e = bert_st_find(&st, "cls.predictions.decoder.bias");
        if (!e) {
            fprintf(stderr, "model: %s: missing tensor %s\n", path, t->name);
            ok = 0;
        } else if (e->rank != t->rank || e->shape[0] != t->shape[0] || (t->rank == 2 && e->shape[1] != t->shape[1])) {
            fprintf(stderr, "model: %s: %s has the wrong shape for this config\n", path, t->name);
            ok = 0;
        } else if (strcmp(e->dtype, "F32") && strcmp(e->dtype, "BF16") && strcmp(e->dtype, "F16")) {
            fprintf(stderr, "model: %s: %s has dtype %s (F32, BF16 or F16 expected)\n", path, t->name, e->dtype);
            ok = 0;
        }
        if (ok) found[i] = e;
    }
    if (ok) memset(w, 0, p->numel * sizeof(float));
    for (int i = 0; ok && i < p->n; i++) {
        const BertTensor* t = &p->t[i];
        ok = bert_st_read_f32(&st, found[i], w + t->offset) && bert_all_finite(path, t->name, w + t->offset, t->numel);
    }
    free(found);
    bert_st_free(&st);
    return ok;
}

// bert_load_hf: reads dir/config.json into cfg, builds the table p and fills a new host slab
// (*w, malloc'd, p->numel floats) from dir/model.safetensors. Gives 1 on success.
static inline int bert_load_hf(const char* dir, BertConfig* cfg, BertParams* p, float** w) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (!bert_read_config(path, cfg)) return 0;
    bert_params_build(p, cfg);
    *w = (float*)malloc(p->numel * sizeof(float));
    if (!*w) {
        fprintf(stderr, "model: %s: out of host memory for %zu parameters\n", dir, p->numel);
        bert_params_free(p);
        return 0;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (!bert_read_safetensors(path, p, *w)) {
        free(*w);
        *w = NULL;
        bert_params_free(p);
        return 0;
    }
    return 1;
}

// bert_tokenizer_vocab: the vocabulary of a Hugging Face tokenizer.json: 1 + the highest id of its model's vocab (an
// object of token: id, as WordPiece, WordLevel and BPE write it, or a list of [token, score], Unigram's, ids by
// position) and of its added_tokens. -1 when the JSON is malformed, an id is not a whole number below 2^31, or there
// is no model.vocab.
static inline long long bert_tokenizer_vocab(const char* json, size_t n) {
    BertJson j = {json, json + n, 0};
    char key[64];
    long long top = -1;
    int have_vocab = 0;
    bj_eat(&j, '{');
    while (!j.err && bj_peek(&j) != '}') {
        bj_string(&j, key, sizeof key);
        bj_eat(&j, ':');
        int model = !strcmp(key, "model") && bj_peek(&j) == '{', added = !strcmp(key, "added_tokens");
        if (!model && !(added && bj_peek(&j) == '[')) {
            bj_skip(&j);
            if (bj_peek(&j) == ',') j.s++;
            continue;
        }
        j.s++;  // model: {"vocab": ...}; added_tokens: [{"id": N, ...}, ...]
        while (!j.err && bj_peek(&j) != (model ? '}' : ']')) {
            if (added) bj_eat(&j, '{');
            while (!j.err && bj_peek(&j) != '}') {
                bj_string(&j, key, sizeof key);
                bj_eat(&j, ':');
                int c = bj_peek(&j), list = c == '[';
                if (added && !strcmp(key, "id")) {
                    double id = bj_number(&j);
                    if (!(id >= 0 && id < 2147483648.0 && id == floor(id)))
                        j.err = 1;
                    else if (id > top)  // (only a whole id in range is converted)
                        top = (long long)id;
                } else if (model && !strcmp(key, "vocab") && (c == '{' || list)) {
                    have_vocab = 1;
                    j.s++;
                    for (long long i = 0; !j.err && bj_peek(&j) != (list ? ']' : '}'); i++) {
                        double id = (double)i;  // a list: the position
                        if (list)
                            bj_skip(&j);
                        else {
                            char tok[8];
                            bj_string(&j, tok, sizeof tok);
                            bj_eat(&j, ':');
                            id = bj_number(&j);
                        }
                        if (!(id >= 0 && id < 2147483648.0 && id == floor(id)))
                            j.err = 1;
                        else if (id > top)
                            top = (long long)id;
                        if (bj_peek(&j) == ',') j.s++;
                    }
                    bj_eat(&j, list ? ']' : '}');
                } else
                    bj_skip(&j);
                if (bj_peek(&j) == ',') j.s++;
            }
            if (added) {
                bj_eat(&j, '}');
                if (bj_peek(&j) == ',') j.s++;
            } else
                break;
        }
        bj_eat(&j, model ? '}' : ']');
        if (bj_peek(&j) == ',') j.s++;
    }
    return j.err || !have_vocab ? -1 : top + 1;
}

// BertTokenizer: the tokenizer.json beside the training shards (tools/prepare.py leaves it there), read whole at
// start-up and kept for the export, which copies it beside the model: one that cannot be read, or the tokenizer of
// another vocabulary, fails before step 1, not at the export after the whole run.
typedef struct {
    char path[4200];  // DIR/tokenizer.json, DIR: the first shard's directory
    char* json;       // its n bytes; NULL: there is none
    size_t n;
} BertTokenizer;

// bert_tokenizer_load: t from the directory of the first shard of data_glob, whose vocabulary has `vocab` ids. Gives 1
// (t->json NULL when there is no tokenizer.json), or 0 after a message.
static inline int bert_tokenizer_load(const char* data_glob, long long vocab, BertTokenizer* t) {
    memset(t, 0, sizeof *t);
    glob_t g;
    int rc = glob(data_glob, 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) {  // (data.h has said why)
        if (rc == 0) globfree(&g);
        return 1;
    }
    char first[4096], err[FILES_ERR_LEN];
    snprintf(first, sizeof first, "%s", g.gl_pathv[0]);
    globfree(&g);
    snprintf(t->path, sizeof t->path, "%s/tokenizer.json", dirname(first));
    struct stat st;
    if (stat(t->path, &st) != 0 && errno == ENOENT) return 1;  // none (the export says what it has instead)
    t->json = read_whole_file(t->path, "a Hugging Face tokenizer.json", FILE_MAX_TOKENIZER, &t->n, err);
    long long have = t->json ? bert_tokenizer_vocab(t->json, t->n) : 0;
    if (!t->json)
        fprintf(stderr, "trainer: --data %s: %s: %s; the export copies it beside the model: fix or remove it\n",
                data_glob, t->path, err);
    else if (have < 0)
        fprintf(stderr,
                "trainer: --data %s: %s: not a Hugging Face tokenizer.json (malformed JSON, or no model.vocab of "
                "whole ids); the export copies it beside the model: fix or remove it\n",
                data_glob, t->path);
    else if (have != vocab)
        fprintf(stderr,
                "trainer: --data %s: %s has a vocabulary of %lld ids, the shards have %lld: the tokenizer of other "
                "shards, which the export would pair with this model; put the one that wrote these shards there, or "
                "remove it\n",
                data_glob, t->path, have, vocab);
    else
        return 1;
    free(t->json);
    t->json = NULL;
    return 0;
}
