// model.h: the BERT masked-language model of mlm.c.
//
//   1. configuration and named presets                         (BertConfig, bert_preset)
//   2. the parameter table: Hugging Face BertForMaskedLM names and shapes over one slab
//   3. the memory layout for (B, T, M): parameters, gradients, AdamW state, activations.
//      One source of truth: the memory planner prints it, bert_alloc allocates exactly it.
//   4. initialisation, figures (FLOPs per token)
//   5. the model on the device: forward, backward, gradient norm, AdamW   (needs kernels.cuh)
// (The Hugging Face interchange, model.safetensors + config.json written and read, is hf.h.)
//
// Shapes are written (B, T, C): B rows of T tokens, C = hidden size, NH heads of HD = C/NH,
// I = intermediate size, V = vocab size, M = masked positions in the batch (the MLM head runs
// only on those rows), L = layers.
//
// The storage type of weights and activations is floatX: bf16, or fp32 when the translation
// unit defines MLM_FP32 before including this file (the fp32 model checks gradients tightly).
// Master weights, gradients and the AdamW moments are always fp32.
#pragma once
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>
#include "kernels.cuh"  // the kernels, launch() and the cuBLASLt wrapper the model runs

// ---------------------------------------------------------------------------------------------
// 1. configuration

typedef struct {
    int vocab_size;       // V
    int max_position;     // P: rows of the position table (a sample is at most P tokens)
    int type_vocab_size;  // token types (2: sentence A / B)
    int hidden;           // C
    int layers;           // L
    int heads;            // NH (C / NH must be a multiple of 16: tensor-core tiles)
    int intermediate;     // I (the MLP's hidden width, usually 4C)
    float ln_eps;         // LayerNorm epsilon (1e-12 as in BERT)
    // the activation is always exact erf GELU; LayerNorm is post-residual as in BERT.
} BertConfig;

// Presets. The seed paper (arXiv 2509.05258) reports a "120M" and a "350M" BERT-like encoder
// without their shapes; we take the two standard encoder shapes (12 x 768 and 24 x 1024) with a
// 50,304-token vocabulary (a RoBERTa-sized BPE vocabulary, 50,265, rounded up to a multiple of
// 64), which gives 124.7M and 355.4M parameters: "paper-120m" and "paper-350m".
static const struct {
    const char* name;
    int vocab_size, max_position, hidden, layers, heads, intermediate;
} bert_presets[] = {
    {"tiny", 211, 40, 32, 2, 2, 64},  // tests: odd vocabulary, two layers, two 16-wide heads
    // a first run on a CPU: byte vocabulary, two 64-wide heads; 200 steps of B=4, T=256 take minutes on 2 cores
    {"mini", 260, 512, 128, 2, 2, 512},
    {"bert-base", 30522, 512, 768, 12, 12, 3072},
    {"bert-large", 30522, 512, 1024, 24, 16, 4096},
    {"paper-120m", 50304, 512, 768, 12, 12, 3072},
    {"paper-350m", 50304, 512, 1024, 24, 16, 4096},
};
#define BERT_NUM_PRESETS ((int)(sizeof(bert_presets) / sizeof(bert_presets[0])))

static inline int bert_preset(const char* name, BertConfig* c) {
    memset(c, 0, sizeof(*c));
    for (int i = 0; i < BERT_NUM_PRESETS; i++) {
        if (strcmp(name, bert_presets[i].name)) continue;
        c->vocab_size = bert_presets[i].vocab_size;
        c->max_position = bert_presets[i].max_position;
        c->type_vocab_size = 2;
        c->hidden = bert_presets[i].hidden;
        c->layers = bert_presets[i].layers;
        c->heads = bert_presets[i].heads;
        c->intermediate = bert_presets[i].intermediate;
        c->ln_eps = 1e-12f;
        return 1;
    }
    return 0;
}

// bert_config_check: 1 when the kernels can run this configuration; otherwise prints why and gives 0.
static inline int bert_config_check(const BertConfig* c) {
    const char* why = NULL;
    if (c->vocab_size < 1 || c->max_position < 1 || c->type_vocab_size < 1 || c->layers < 1 || c->heads < 1)
        why = "sizes must be positive";
    else if (c->hidden % c->heads)
        why = "hidden size must be a multiple of the head count";
    else if (!att_head_size_ok(c->hidden / c->heads))
        why = "head size (hidden / heads) must be " ATT_HEAD_SIZES " (the attention kernels' instances)";
    else if (c->hidden % 8 || c->intermediate % 8)
        why = "hidden and intermediate sizes must be multiples of 8 (128-bit loads)";
    else if (c->hidden > 4096)
        why = "hidden size must be at most 4096 (the LayerNorm and embedding backward kernels' blocks)";
    else if (!(c->ln_eps > 0))
        why = "layer_norm_eps must be positive";
    else if (c->vocab_size > (1 << 24) || c->max_position > (1 << 16) || c->type_vocab_size > (1 << 16) ||
             c->hidden > (1 << 16) || c->layers > 1024 || c->intermediate > (1 << 18))
        why =
            "sizes beyond the limits (vocab 2^24, positions 2^16, token types 2^16, hidden 2^16, 1024 layers, "
            "intermediate 2^18)";
    else if (((double)c->vocab_size + c->max_position + c->type_vocab_size) * c->hidden +
                 (double)c->layers * (4.0 * c->hidden * c->hidden + 2.0 * c->hidden * c->intermediate) >
             2e10)
        why = "more than 2e10 parameters (more than one GPU's memory can train)";
    if (why) fprintf(stderr, "model: unsupported configuration: %s\n", why);
    return why == NULL;
}

// ---------------------------------------------------------------------------------------------
// 2. the parameter table
//
// Every parameter is one named tensor in one contiguous slab. Names and shapes are those of
// Hugging Face's BertForMaskedLM (weights are (out, in) like torch.nn.Linear), so export is a
// walk over the table. The decoder's weight is tied to bert.embeddings.word_embeddings.weight
// and is not a separate tensor; its bias is cls.predictions.bias.
//
// Order in the slab: first every tensor AdamW decays (matrices and embeddings), then every one it
// does not (biases and LayerNorm), so decay is one boundary index. Within a layer, query, key and
// value weights are adjacent, and so are their biases: together they are the fused (3C, C) QKV
// projection and its (3C) bias.

#define BERT_MAX_NAME 64
typedef struct {
    char name[BERT_MAX_NAME];
    int rank;       // 1 or 2
    int shape[2];   // (rows, cols) or (n, 1)
    size_t offset;  // in elements, from the start of the slab
    size_t numel;
    size_t slab;  // elements it occupies in the slab: numel and its zero pad (numel rounded up to 8; word: Vp rows)
    int decay;    // AdamW weight decay applies
} BertTensor;

// per-layer tensor indices in the table (after the 3 embedding matrices), in slab order
enum {
    BL_QW,
    BL_KW,
    BL_VW,
    BL_AOW,
    BL_IW,
    BL_OW,  // matrices (decayed)
    BL_QB,
    BL_KB,
    BL_VB,
    BL_AOB,
    BL_ALNW,
    BL_ALNB,
    BL_IB,
    BL_OB,
    BL_OLNW,
    BL_OLNB,  // vectors
    BL_COUNT
};

typedef struct {
    BertConfig cfg;
    int n;           // tensors in the table
    BertTensor* t;   // n entries (malloc'd)
    size_t numel;    // parameters in the slab
    size_t n_decay;  // the first n_decay elements are decayed
    // indices into t[] of the named tensors the model uses
    int word, pos, type, emb_ln_w, emb_ln_b;
    int head_w, head_b, head_ln_w, head_ln_b, dec_b;
    int layer0_mat,
        layer0_vec;  // layer l, matrix j (0..5): t[layer0_mat + 6*l + j]; vector j (0..9): t[layer0_vec + 10*l + j]
} BertParams;

// bert_vocab_rows: V rounded up to a multiple of 8, the vocabulary dimension of the MLM head's decoder matmuls.
// cuBLASLt 13.0 on an H100 runs them on its Hopper kernels only when that dimension is a multiple of 8: at
// bert-base (4096 rows, C = 768) V = 30522 took 2.13 ms a chunk (cutlass sm80 kernels, 230-390 TFLOP/s), 30528
// 0.95 ms (680-800 TFLOP/s) (2026-11-24). So the word embeddings keep Vp - V zero rows after them in the slab.
static inline int bert_vocab_rows(int V) { return (V + 7) & ~7; }

// bert_add_tensor_rows: a tensor of (rows, cols) (cols 0: a vector of rows) that occupies slab_rows rows of the
// slab (>= rows; the rows beyond hold zeros)
static inline void bert_add_tensor_rows(BertParams* p, const char* name, int rows, int cols, int decay, int slab_rows) {
    BertTensor* t = &p->t[p->n++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->rank = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols ? cols : 1;
    t->numel = (size_t)rows * (cols ? cols : 1);
    t->offset = p->numel;
    t->decay = decay;
    // every tensor starts on a 16-byte boundary in both the fp32 and the bf16 slab
    t->slab = ((size_t)slab_rows * (cols ? cols : 1) + 7) & ~(size_t)7;
    p->numel += t->slab;
}
static inline void bert_add_tensor(BertParams* p, const char* name, int rows, int cols, int decay) {
    bert_add_tensor_rows(p, name, rows, cols, decay, rows);
}

// bert_params_build: fills the table for cfg (free with bert_params_free).
static inline void bert_params_build(BertParams* p, const BertConfig* cfg) {
    memset(p, 0, sizeof(*p));
    p->cfg = *cfg;
    int C = cfg->hidden, I = cfg->intermediate, L = cfg->layers;
    p->t = (BertTensor*)calloc((size_t)(10 + BL_COUNT * L), sizeof(BertTensor));
    char nm[BERT_MAX_NAME];
    p->word = p->n;
    bert_add_tensor_rows(p, "bert.embeddings.word_embeddings.weight", cfg->vocab_size, C, 1,
                         bert_vocab_rows(cfg->vocab_size));  // also the decoder: Vp rows, see bert_vocab_rows
    p->pos = p->n;
    bert_add_tensor(p, "bert.embeddings.position_embeddings.weight", cfg->max_position, C, 1);
    p->type = p->n;
    bert_add_tensor(p, "bert.embeddings.token_type_embeddings.weight", cfg->type_vocab_size, C, 1);
    p->layer0_mat = p->n;
    static const char* mats[6] = {"attention.self.query.weight", "attention.self.key.weight",
                                  "attention.self.value.weight", "attention.output.dense.weight",
                                  "intermediate.dense.weight",   "output.dense.weight"};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < 6; j++) {
            snprintf(nm, sizeof(nm), "bert.encoder.layer.%d.%s", l, mats[j]);
            int rows = j == 4 ? I : C, cols = j == 5 ? I : C;
            bert_add_tensor(p, nm, rows, cols, 1);
        }
    p->head_w = p->n;
    bert_add_tensor(p, "cls.predictions.transform.dense.weight", C, C, 1);
    p->n_decay = p->numel;
    p->emb_ln_w = p->n;
    bert_add_tensor(p, "bert.embeddings.LayerNorm.weight", C, 0, 0);
    p->emb_ln_b = p->n;
    bert_add_tensor(p, "bert.embeddings.LayerNorm.bias", C, 0, 0);
    p->layer0_vec = p->n;
    static const char* vecs[10] = {"attention.self.query.bias",         "attention.self.key.bias",
                                   "attention.self.value.bias",         "attention.output.dense.bias",
                                   "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
                                   "intermediate.dense.bias",           "output.dense.bias",
                                   "output.LayerNorm.weight",           "output.LayerNorm.bias"};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < 10; j++) {
            snprintf(nm, sizeof(nm), "bert.encoder.layer.%d.%s", l, vecs[j]);
            bert_add_tensor(p, nm, j == 6 ? I : C, 0, 0);
        }
    p->head_b = p->n;
    bert_add_tensor(p, "cls.predictions.transform.dense.bias", C, 0, 0);
    p->head_ln_w = p->n;
    bert_add_tensor(p, "cls.predictions.transform.LayerNorm.weight", C, 0, 0);
    p->head_ln_b = p->n;
    bert_add_tensor(p, "cls.predictions.transform.LayerNorm.bias", C, 0, 0);
    p->dec_b = p->n;
    bert_add_tensor(p, "cls.predictions.bias", cfg->vocab_size, 0, 0);
}
static inline void bert_params_free(BertParams* p) {
    free(p->t);
    p->t = NULL;
    p->n = 0;
}

// the offset (elements) of layer l's matrix j (BL_QW..BL_OW) or vector j (BL_QB..BL_OLNB)
static inline size_t bert_layer_off(const BertParams* p, int l, int j) {
    if (j < BL_QB) return p->t[p->layer0_mat + 6 * l + j].offset;
    return p->t[p->layer0_vec + 10 * l + (j - BL_QB)].offset;
}
static inline int bert_find_tensor(const BertParams* p, const char* name) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->t[i].name, name)) return i;
    return -1;
}
// parameters in the model (the slab also holds pad elements, which stay zero: alignment, and word's Vp - V rows)
static inline size_t bert_param_count(const BertParams* p) {
    size_t n = 0;
    for (int i = 0; i < p->n; i++) n += p->t[i].numel;
    return n;
}

// ---------------------------------------------------------------------------------------------
// 3. the memory layout for (B, T, M)
//
// Activations are one slab of bytes; every buffer starts on a 256-byte boundary. "Saved" buffers
// are kept from forward to backward, one per layer; "scratch" buffers are reused by every layer.
// The element size of floatX buffers is given (2 for bf16, 4 for fp32) so the planner can size
// either mode without compiling it.

typedef struct {
    // saved, embeddings: x0 = LayerNorm(word + position + type)
    size_t emb_out;    // (B, T, C) floatX          the input of layer 0
    size_t emb_stats;  // (B, T, 2) fp32            LayerNorm mean, rstd
    // saved, per layer (a layer's buffers are at offset + l * stride)
    size_t qkv;        // (B, T, 3C) floatX         Q | K | V, heads contiguous inside each
    size_t atty;       // (B, T, C) floatX          attention output, before the output projection
    size_t lse;        // (B, NH, T) fp32           softmax log-sum-exp of each query row
    size_t res1;       // (B, T, C) floatX          x + attn_out (the LayerNorm input)
    size_t ln1;        // (B, T, C) floatX          LayerNorm(res1)
    size_t ln1_stats;  // (B, T, 2) fp32
    size_t fc1;        // (B, T, I) floatX          pre = ln1 W1^T + b1, GELU's input (the GELU_AUX_BIAS epilogue's aux)
    size_t gelu;       // (B, T, I) floatX          GELU(pre): the MLP's second matmul's input
    size_t res2;       // (B, T, C) floatX          ln1 + mlp_out
    size_t ln2;        // (B, T, C) floatX          LayerNorm(res2): the layer's output
    size_t ln2_stats;  // (B, T, 2) fp32
    size_t layer_stride;
    // saved, MLM head on the M masked rows
    size_t h_in;     // (M, C) floatX             gathered final hidden rows
    size_t h_pre;    // (M, C) floatX             dense + bias, before GELU (the GELU_AUX_BIAS epilogue's aux)
    size_t h_act;    // (M, C) floatX             GELU(h_pre)
    size_t h_ln;     // (M, C) floatX             LayerNorm(h_act)
    size_t h_stats;  // (M, 2) fp32
    size_t logits;   // (R, Vp) floatX            one chunk of the decoder's rows (bert_head_decoder); Vp = V
                     //                           rounded up to 8; becomes dlogits in place
    size_t losses;   // (M) fp32                  per-row cross-entropy
    size_t loss;     // (4) fp32                  [0] mean loss of the micro-batch
    // scratch, shared by all layers
    size_t proj;  // (B, T, C) floatX          a projection output before its residual LayerNorm
    // backward scratch
    size_t d_x;      // (B, T, C) floatX          dLoss/d(layer output), flows down the stack
    size_t d_res;    // (B, T, C) floatX          dLoss/d(residual sum)
    size_t d_ln1;    // (B, T, C) floatX
    size_t d_fc1;    // (B, T, I) floatX          dLoss/dpre
    size_t d_qkv;    // (B, T, 3C) floatX
    size_t d_atty;   // (B, T, C) floatX
    size_t d_delta;  // (B, NH, T) fp32           rowsum(dO * O) for attention backward
    size_t d_h;      // (M, C) floatX             head backward
    size_t d_h2;     // (M, C) floatX
    // backward scratch of the deterministic reductions (no floating-point atomics; see kernels.cuh)
    size_t ln_part;    // max of (launch_grid_cap(), 3C) fp32: LayerNorm backward's blocks' dgamma, dbeta, dbias
                       //   partials, (colsum_grid_y(I), I) fp32: the MLP's first bias's (column_sums),
                       //   (colsum_grid_y(Vp), Vp) fp32: the decoder bias's (column_sums, in the forward), and
                       //   att_part_floats: the attention backward blocks' qkv bias partials
    size_t emb_keys;   // (sort_pow2(3BT)) u64        embedding backward: (table row << 32 | token) sort keys
    size_t emb_carry;  // (EMB_CHUNKS, 2, C) fp32     embedding backward: pieces of rows that cross chunks
    size_t emb_dx;     // (B, T, C) fp32              embedding backward: dLoss/dx; shares d_qkv's bytes
                       //                             (3C floatX >= C fp32; d_qkv is free by then)
    size_t dvec;       // (numel - n_decay) fp32      a micro-step's gradient of the decoder bias, summed in the
                       //                             forward (bert_head_decoder), at its offset in the slab's
                       //                             vector region; added to the gradients at the end of the backward
    size_t total;      // bytes
    int B, T, M, Vp;
    int R;  // rows of the MLM head's decoder per chunk (bert_head_rows): the logits buffer holds (R, Vp)
} BertActLayout;

// The MLM head's decoder and loss run on at most BERT_HEAD_CHUNK masked rows at a time (bert_head_decoder),
// so its logits take (R, Vp) floatX, not (M, Vp): at bert-base (V = 30522) 4096 rows are 0.23 GiB in bf16,
// and each chunk's matmuls are still large enough to fill an H100.
#define BERT_HEAD_CHUNK 4096
static inline int bert_head_rows(int M) { return M < BERT_HEAD_CHUNK ? M : BERT_HEAD_CHUNK; }

static inline size_t bert_align256(size_t x) { return (x + 255) & ~(size_t)255; }

// bert_act_layout: the activation layout for B rows of T tokens with at most M masked positions,
// with floatX of xsize bytes. Gives the total bytes.
static inline size_t bert_act_layout(BertActLayout* a, const BertConfig* c, int B, int T, int M, int xsize) {
    memset(a, 0, sizeof(*a));
    size_t BT = (size_t)B * T, C = c->hidden, I = c->intermediate, NH = c->heads;
    int Vp = bert_vocab_rows(c->vocab_size);
    a->B = B;
    a->T = T;
    a->M = M;
    a->Vp = Vp;
    a->R = bert_head_rows(M);
    size_t off = 0;
#define ACT(field, bytes)                           \
    do {                                            \
        a->field = off;                             \
        off = bert_align256(off + (size_t)(bytes)); \
    } while (0)
    ACT(emb_out, BT * C * xsize);
    ACT(emb_stats, BT * 2 * 4);
    size_t l0 = off;
    ACT(qkv, BT * 3 * C * xsize);
    ACT(atty, BT * C * xsize);
    ACT(lse, BT * NH * 4);
    ACT(res1, BT * C * xsize);
    ACT(ln1, BT * C * xsize);
    ACT(ln1_stats, BT * 2 * 4);
    ACT(fc1, BT * I * xsize);
    ACT(gelu, BT * I * xsize);
    ACT(res2, BT * C * xsize);
    ACT(ln2, BT * C * xsize);
    ACT(ln2_stats, BT * 2 * 4);
    a->layer_stride = off - l0;
    off = l0 + a->layer_stride * c->layers;
    ACT(h_in, (size_t)M * C * xsize);
    ACT(h_pre, (size_t)M * C * xsize);
    ACT(h_act, (size_t)M * C * xsize);
    ACT(h_ln, (size_t)M * C * xsize);
    ACT(h_stats, (size_t)M * 2 * 4);
    ACT(logits, (size_t)a->R * Vp * xsize);
    ACT(losses, (size_t)M * 4);
    ACT(loss, 4 * 4);
    ACT(proj, BT * C * xsize);
    ACT(d_x, BT * C * xsize);
    ACT(d_res, BT * C * xsize);
    ACT(d_ln1, BT * C * xsize);
    ACT(d_fc1, BT * I * xsize);
    ACT(d_qkv, BT * 3 * C * xsize);
    ACT(d_atty, BT * C * xsize);
    ACT(d_delta, BT * NH * 4);
    ACT(d_h, (size_t)M * C * xsize);
    ACT(d_h2, (size_t)M * C * xsize);
    // LayerNorm's, the column sums' (the MLP's first bias, the decoder bias) or the attention backward's partials
    // (one at a time)
    size_t part = ln_part_floats((int)C), gpart = colsum_part_floats((int)I), vpart = colsum_part_floats(Vp);
    size_t apart = att_part_floats(B, T, (int)C, (int)(C / NH));
    part = part > gpart ? part : gpart;
    part = part > vpart ? part : vpart;
    ACT(ln_part, (part > apart ? part : apart) * 4);
    ACT(emb_keys, emb_keys_count((long long)BT) * 8);
    ACT(emb_carry, emb_carry_floats((int)C) * 4);
    a->emb_dx = a->d_qkv;
    BertParams p;
    bert_params_build(&p, c);
    ACT(dvec, (p.numel - p.n_decay) * 4);
    bert_params_free(&p);
#undef ACT
    a->total = off;
    return off;
}

// the whole memory plan of a training process (bytes), from the same functions bert_alloc uses
typedef struct {
    size_t n_params;                   // parameters (the slab, with its few pad elements)
    size_t state_numel;                // elements of master weights and AdamW m, v held here (ZeRO-1: a shard)
    size_t slack;                      // elements after the slab in the gradients and floatX weights (ZeRO-1's padding)
    size_t params_master;              // fp32 master weights
    size_t params_x;                   // floatX weights the kernels read (absent in fp32 mode: they are the master)
    size_t grads;                      // fp32 gradients
    size_t adam;                       // fp32 m and v
    size_t acts;                       // activations (BertActLayout.total)
    size_t act_saved_per_token_layer;  // bytes kept from forward to backward per token per layer
    size_t cublas_workspace;
    size_t norm_scratch;  // the gradient norm's partial sums and result
    size_t total;
    // the MLM head's logits (in acts): (head_R, Vp) floatX, where the whole (M, Vp) would take head_logits_whole
    size_t head_logits, head_logits_whole;
    int head_R, Vp;
} BertMemPlan;

#define BERT_CUBLAS_WORKSPACE ((size_t)32 << 20)
// bert_mem_plan_sharded: the plan of a process that holds state_numel elements of the master weights and
// AdamW m, v (ZeRO-1: its shard; 0: all of them). The floatX weights and the gradients stay whole, with
// `slack` more elements after the slab (a collective's padding may write there). A sharded master cannot
// double as the fp32 weights, so then the floatX copy exists in fp32 mode too.
static inline BertMemPlan bert_mem_plan_sharded(const BertConfig* c, int B, int T, int M, int xsize, size_t state_numel,
                                                size_t slack) {
    BertMemPlan m;
    memset(&m, 0, sizeof(m));
    BertParams p;
    bert_params_build(&p, c);
    m.n_params = p.numel;
    bert_params_free(&p);
    m.state_numel = state_numel ? state_numel : m.n_params;
    m.slack = slack;
    m.params_master = m.state_numel * 4;
    m.params_x = xsize == 4 && m.state_numel == m.n_params && !slack ? 0 : (m.n_params + slack) * xsize;
    m.grads = (m.n_params + slack) * 4;
    m.adam = m.state_numel * 8;
    BertActLayout a;
    m.acts = bert_act_layout(&a, c, B, T, M, xsize);
    m.act_saved_per_token_layer = a.layer_stride / ((size_t)B * T);
    m.head_R = a.R, m.Vp = a.Vp;
    m.head_logits = (size_t)a.R * a.Vp * xsize;
    m.head_logits_whole = (size_t)M * a.Vp * xsize;
    m.cublas_workspace = BERT_CUBLAS_WORKSPACE;
    m.norm_scratch = (launch_grid_cap() + 1) * sizeof(float);
    m.total = m.params_master + m.params_x + m.grads + m.adam + m.acts + m.cublas_workspace + m.norm_scratch;
    return m;
}
static inline BertMemPlan bert_mem_plan(const BertConfig* c, int B, int T, int M, int xsize) {
    return bert_mem_plan_sharded(c, B, T, M, xsize, 0, 0);
}

static inline void bert_print_mem_plan(const BertMemPlan* pm, int B, int T, int M, int xsize) {
    BertMemPlan m = *pm;
    double G = 1.0 / (1 << 30);
    printf("memory plan (B=%d, T=%d, M=%d, %s activations): %.3f GiB\n", B, T, M, xsize == 2 ? "bf16" : "fp32",
           m.total * G);
    printf(
        "  parameters %zu: master fp32 %.3f GiB, floatX copy %.3f GiB, gradients fp32 %.3f GiB, AdamW m+v %.3f GiB\n",
        m.n_params, m.params_master * G, m.params_x * G, m.grads * G, m.adam * G);
    if (m.state_numel != m.n_params)
        printf("  ZeRO-1: this process holds %zu of the %zu master weights and AdamW moments\n", m.state_numel,
               m.n_params);
    printf("  activations %.3f GiB (%zu bytes per token per layer kept for backward), cuBLASLt workspace %.3f GiB\n",
           m.acts * G, m.act_saved_per_token_layer, m.cublas_workspace * G);
    printf(
        "  MLM head: logits in chunks of (R, Vp) = (%d, %d) x %d bytes, %.3f GiB; the whole (M, Vp) = (%d, %d) would "
        "take %.3f GiB\n",
        m.head_R, m.Vp, xsize, m.head_logits * G, M, m.Vp, m.head_logits_whole * G);
}
static inline void bert_print_plan(const BertConfig* c, int B, int T, int M, int xsize) {
    BertMemPlan m = bert_mem_plan(c, B, T, M, xsize);
    bert_print_mem_plan(&m, B, T, M, xsize);
}

// ---------------------------------------------------------------------------------------------
// 4. initialisation and figures

// splitmix64 / Box-Muller: deterministic host initialisation
static inline uint64_t bert_splitmix(uint64_t* s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float bert_normal(uint64_t* s) {
    double u1 = ((bert_splitmix(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = ((bert_splitmix(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
// bert_init_host: BERT's initialisation into a host fp32 slab of p->numel: matrices and embeddings
// N(0, 0.02), biases 0, LayerNorm weights 1 (Hugging Face's _init_weights).
static inline void bert_init_host(const BertParams* p, float* w, uint64_t seed) {
    memset(w, 0, p->numel * sizeof(float));
    uint64_t s = seed;
    for (int i = 0; i < p->n; i++) {
        const BertTensor* t = &p->t[i];
        float* x = w + t->offset;
        if (t->rank == 2) {
            for (size_t j = 0; j < t->numel; j++) x[j] = 0.02f * bert_normal(&s);
        } else if (strstr(t->name, "LayerNorm.weight")) {
            for (size_t j = 0; j < t->numel; j++) x[j] = 1.0f;
        }
    }
}

// Training FLOPs per token: 6 per weight per token for the encoder's matmuls (forward 2, backward 4),
// attention's two (T x T x HD) products per head (4 T C per token forward, 8 backward, plus the
// recomputation of Q K^T in each of the two backward kernels and of dO V^T: 4 T C more), and the
// MLM head on the masked fraction only (dense C x C and decoder C x V per masked token).
// Embedding lookups, LayerNorm, GELU and softmax are left out (a few hundred FLOPs per element).
typedef struct {
    double encoder_matmul, attention, head, total;  // what the hardware executes
    double model;                                   // the usual "6N + 12 L T C" model FLOPs, head sparse
} BertFlops;
static inline BertFlops bert_flops_per_token(const BertConfig* c, int T, double mask_fraction) {
    BertFlops f;
    double C = c->hidden, I = c->intermediate, L = c->layers, V = c->vocab_size;
    double w_layer = 4 * C * C + 2 * C * I;
    f.encoder_matmul = 6 * L * w_layer;
    f.attention = L * (12 * T * C + 4 * T * C + 2 * T * C);  // fwd 4TC, bwd 8TC, recompute QK^T twice + dO V^T once
    f.head = mask_fraction * 6 * (C * C + C * V);
    f.total = f.encoder_matmul + f.attention + f.head;
    f.model = f.encoder_matmul + L * 12 * T * C + f.head;
    return f;
}

// ---------------------------------------------------------------------------------------------
// 5. the model on the device

// One micro-batch, device pointers. Token n = b * T + t.
typedef struct {
    const int* tokens;      // (B, T) token ids (padding: any valid id, e.g. 0)
    const int* types;       // (B, T) token types, or NULL for all 0
    const int* seg_lo;      // (B, T) token (b, t) attends to keys [seg_lo, seg_hi) of row b: its own sample;
    const int* seg_hi;      //        padding tokens have seg_lo == seg_hi. Positions restart at each seg_lo.
    const int* mlm_pos;     // (M) masked positions, indices into the flattened (B * T), distinct among
    const int* mlm_labels;  // (M) the rows whose target id (label) is >= 0; label < 0: a padding row, ignored
    int B, T, M;
} BertBatch;

// bert_segments: host helper building seg_lo / seg_hi (B, T) for rows packed with samples:
// row b holds n_samples[b] samples whose lengths follow one another in lens (row 0's, then row 1's, ...);
// the rest of each row is padding. Gives 0 when a row overflows T.
static inline int bert_segments(int B, int T, const int* n_samples, const int* lens, int* seg_lo, int* seg_hi) {
    int k = 0;
    for (int b = 0; b < B; b++) {
        int s = 0;
        for (int i = 0; i < n_samples[b]; i++, k++) {
            if (lens[k] < 0 || s + lens[k] > T) return 0;
            for (int t = s; t < s + lens[k]; t++) {
                seg_lo[b * T + t] = s;
                seg_hi[b * T + t] = s + lens[k];
            }
            s += lens[k];
        }
        for (int t = s; t < T; t++) {
            seg_lo[b * T + t] = 0;
            seg_hi[b * T + t] = 0;
        }
    }
    return 1;
}

typedef struct {
    BertConfig cfg;
    BertParams p;
    BertActLayout act;
    int B, T, M;          // capacity
    size_t state_numel;   // elements of master, adam_m, adam_v: p.numel, or a ZeRO-1 shard (bert_alloc_sharded)
    float* master;        // (state_numel) fp32 master weights
    floatX* w;            // (numel) floatX weights the kernels read (== master in fp32 mode, unsharded)
    float* grad;          // (numel) fp32
    float* adam_m;        // (state_numel) fp32
    float* adam_v;        // (state_numel) fp32
    unsigned char* acts;  // act.total bytes
    float* norm_partial;  // grad-norm scratch (launch_grid_cap() floats) and norm[0] at the end
    float* norm;
    Blas blas;
    cudaStream_t stream;
    int step;
    // NULL, or layers + 2 events that bert_backward records on its stream as gradients become final, so a
    // data-parallel trainer can reduce them while the backward goes on (see bert_grad_ready_lo)
    cudaEvent_t* grad_ready;
    // NULL, or layers + 1 events bert_forward waits for on its stream before it reads layer l's weights (l = layers:
    // the head's): another stream may still be updating the weights, part by part in the forward's order (the
    // trainer's --comm onebit). Waiting for an event that was never recorded is a no-op (CUDA's rule).
    cudaEvent_t* weights_ready;
    // NULL, or (M) floats: bert_forward with dlogit_scale 0 writes there whether each masked row's top
    // prediction is its label (validation's accuracy; see bert_head_decoder)
    float* hits;
    // the Hopper candidates (bf16, sm_90a) this model runs, as masks; 0: the default kernels everywhere
    int att_wgmma;  // ATT_WG_FWD, _DQ, _DKDV: those attention kernels by the wgmma ones (attention.cuh; the trainer's
                    // choose_attention sets them where the device runs them)
} BertModel;

// bert_grad_ready_lo: after bert_backward records grad_ready[k], the gradients [lo, n_decay) of the slab's
// matrix region are final for the micro-step (nothing later in the backward writes them), for lo given
// here. The backward runs the head, then layers L-1 .. 0, then the embeddings, which is the matrix
// region from its end down: k = 0 the head's dense matrix, k = 1..L layer L-k's six matrices, k = L+1
// everything (0: the word embeddings, which the tied decoder also wrote at the start, and the whole
// vector region [n_decay, numel), whose bias gradients are added at the very end).
static inline size_t bert_grad_ready_lo(const BertParams* p, int k) {
    int L = p->cfg.layers;
    if (k == 0) return p->t[p->head_w].offset;
    if (k <= L) return p->t[p->layer0_mat + 6 * (L - k)].offset;
    return 0;
}
static inline int bert_grad_ready_count(const BertParams* p) { return p->cfg.layers + 2; }

#define ACT_X(m, field) ((floatX*)((m)->acts + (m)->act.field))
#define ACT_F(m, field) ((float*)((m)->acts + (m)->act.field))
#define ACT_XL(m, field, l) ((floatX*)((m)->acts + (m)->act.field + (size_t)(l) * (m)->act.layer_stride))
#define ACT_FL(m, field, l) ((float*)((m)->acts + (m)->act.field + (size_t)(l) * (m)->act.layer_stride))

// bert_alloc_sharded: allocates everything bert_mem_plan_sharded counts, for at most B rows of T tokens and M
// masked positions, with state_numel elements of master weights and AdamW state (0: all) and `slack` elements
// after the slab's gradients and floatX weights.
static inline int bert_alloc_sharded(BertModel* m, const BertConfig* cfg, int B, int T, int M, cudaStream_t stream,
                                     size_t state_numel, size_t slack) {
    memset(m, 0, sizeof(*m));
    if (!bert_config_check(cfg)) return 0;
    if (T > cfg->max_position) {
        fprintf(stderr, "model: T = %d exceeds max_position %d\n", T, cfg->max_position);
        return 0;
    }
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->M = M;
    m->stream = stream;
    bert_params_build(&m->p, cfg);
    bert_act_layout(&m->act, cfg, B, T, M, (int)sizeof(floatX));
    // every size below comes from the plan
    BertMemPlan pl = bert_mem_plan_sharded(cfg, B, T, M, (int)sizeof(floatX), state_numel, slack);
    m->state_numel = pl.state_numel;
    CUDA_CHECK(cudaMalloc((void**)&m->master, pl.params_master));
    if (pl.params_x == 0)
        m->w = (floatX*)m->master;  // fp32 mode: the kernels read the master weights
    else
        CUDA_CHECK(cudaMalloc((void**)&m->w, pl.params_x));
    CUDA_CHECK(cudaMalloc((void**)&m->grad, pl.grads));
    CUDA_CHECK(cudaMalloc((void**)&m->adam_m, pl.adam / 2));
    CUDA_CHECK(cudaMalloc((void**)&m->adam_v, pl.adam / 2));
    CUDA_CHECK(cudaMalloc((void**)&m->acts, pl.acts));
    CUDA_CHECK(cudaMalloc((void**)&m->norm_partial, pl.norm_scratch));
    m->norm = m->norm_partial + launch_grid_cap();
    CUDA_CHECK(cudaMemset(m->grad, 0, pl.grads));
    CUDA_CHECK(cudaMemset(m->adam_m, 0, pl.adam / 2));
    CUDA_CHECK(cudaMemset(m->adam_v, 0, pl.adam / 2));
    CUDA_CHECK(cudaMemset(m->acts, 0, pl.acts));
    blas_init(&m->blas, pl.cublas_workspace);
    return 1;
}
// bert_alloc: allocates everything bert_mem_plan counts, for at most B rows of T tokens and M masked positions.
static inline int bert_alloc(BertModel* m, const BertConfig* cfg, int B, int T, int M, cudaStream_t stream) {
    return bert_alloc_sharded(m, cfg, B, T, M, stream, 0, 0);
}
static inline void bert_free(BertModel* m) {
    if (m->w != (floatX*)m->master) cudaFree(m->w);
    cudaFree(m->master);
    cudaFree(m->grad);
    cudaFree(m->adam_m);
    cudaFree(m->adam_v);
    cudaFree(m->acts);
    cudaFree(m->norm_partial);
    blas_free(&m->blas);
    bert_params_free(&m->p);
    memset(m, 0, sizeof(*m));
}
// bert_set_params: uploads a host fp32 slab (p.numel floats) as the master weights and refreshes the floatX copy.
// (Not for a sharded model: its trainer places the shard.)
static inline void bert_set_params(BertModel* m, const float* host) {
    size_t n = m->p.numel;
    if (m->state_numel != n) {
        fprintf(stderr, "model: bert_set_params on a sharded model\n");
        exit(1);
    }
    CUDA_CHECK(cudaMemcpyAsync(m->master, host, n * sizeof(float), cudaMemcpyHostToDevice, m->stream));
    if (m->w != (floatX*)m->master)
        launch(copy_to_floatX, dim3(launch_grid_cap()), dim3(256), 0, m->stream, m->w, (const float*)m->master, n);
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
}
static inline void bert_get_params(BertModel* m, float* host) {
    if (m->state_numel != m->p.numel) {
        fprintf(stderr, "model: bert_get_params on a sharded model\n");
        exit(1);
    }
    CUDA_CHECK(cudaMemcpy(host, m->master, m->p.numel * sizeof(float), cudaMemcpyDeviceToHost));
}
static inline void bert_zero_grad(BertModel* m) {
    CUDA_CHECK(cudaMemsetAsync(m->grad, 0, m->p.numel * sizeof(float), m->stream));
}

static inline const floatX* bert_w(const BertModel* m, int tensor) { return m->w + m->p.t[tensor].offset; }
static inline float* bert_g(const BertModel* m, int tensor) { return m->grad + m->p.t[tensor].offset; }
static inline const floatX* bert_lw(const BertModel* m, int l, int j) { return m->w + bert_layer_off(&m->p, l, j); }
static inline float* bert_lg(const BertModel* m, int l, int j) { return m->grad + bert_layer_off(&m->p, l, j); }
// where a micro-step's decoder bias gradient is summed (bert_backward then adds it to the gradients)
static inline float* bert_gb(const BertModel* m, int tensor) {
    return ACT_F(m, dvec) + (m->p.t[tensor].offset - m->p.n_decay);
}

// bert_head_decoder: the MLM head's tied decoder and its loss on the M rows of h_ln, R = m->act.R rows at a
// time, so the (M, Vp) logits never exist. The matmuls run over all Vp = bert_vocab_rows(V) rows of Wword and
// dec_b (the Vp - V pad rows hold zeros; a multiple of 8 keeps cuBLASLt on its fast kernels); the loss reads the
// first V columns and its backward writes 0 to the others, so the pad rows get a zero gradient and d_h none
// from them. For each chunk of rows [r0, r0 + n), n = min(R, M - r0):
//   logits (n, Vp) = h_ln[r0:] Wword^T + dec_b                      (cuBLASLt, the bias in its epilogue)
//   losses[r0:] = the rows' cross-entropies; with dlogit_scale != 0 the chunk becomes dLoss/dlogits in place
// and then, with dlogit_scale != 0, the decoder's backward while the chunk exists:
//   grad(word) += dlogits^T h_ln[r0:]      (beta 1: accumulates over chunks and micro-steps, in chunk order)
//   d_h[r0:] = dlogits Wword               (dLoss/dh_ln: bert_backward starts from it)
//   dvec(dec_b) += the column sums of dlogits  (column_sums and partials_sum, in chunk order)
// With dlogit_scale 0 (validation) and m->hits set, hits[r0:] = 1 where a row's top logit is its label.
// Every sum is in a fixed order (no atomics): the same inputs give the same bits.
static inline void bert_head_decoder(BertModel* m, const int* labels, int M, float dlogit_scale) {
    cudaStream_t s = m->stream;
    Blas* bl = &m->blas;
    const BertParams* p = &m->p;
    int C = m->cfg.hidden, V = m->cfg.vocab_size, Vp = m->act.Vp, R = m->act.R;
    floatX* logits = ACT_X(m, logits);
    for (int r0 = 0; r0 < M; r0 += R) {
        int n = M - r0 < R ? M - r0 : R;
        const floatX* h = ACT_X(m, h_ln) + (size_t)r0 * C;
        matmul_forward(bl, s, logits, Vp, h, bert_w(m, p->word), bert_w(m, p->dec_b), n, C, Vp);
        launch(cross_entropy_forward_backward, dim3(n), dim3(256), 0, s, logits, ACT_F(m, losses) + r0, labels + r0, n,
               V, Vp, dlogit_scale);
        if (dlogit_scale == 0.f) {
            if (m->hits)
                launch(argmax_hits, dim3(n), dim3(256), 0, s, m->hits + r0, (const floatX*)logits, labels + r0, n, V,
                       Vp);
            continue;
        }
        matmul_backward_weight(bl, s, bert_g(m, p->word), NULL, logits, Vp, h, n, C, Vp);
        matmul_backward_input(bl, s, ACT_X(m, d_h) + (size_t)r0 * C, logits, Vp, bert_w(m, p->word), NULL, n, C, Vp);
        launch_column_sums(s, bert_gb(m, p->dec_b), ACT_F(m, ln_part), logits, n, Vp);
    }
}

// bert_forward: the encoder and the MLM head on batch; the micro-batch's mean loss (over its rows with a
// label >= 0) is left at
// ACT_F(m, loss)[0] (device). When dlogit_scale != 0 (training: 1 / the number of masked tokens the loss
// averages over) the head's decoder is also differentiated here, chunk by chunk (bert_head_decoder): it
// adds the decoder's part of the word embeddings' gradient, leaves dec_b's in dvec and dLoss/dh_ln in
// ACT_X(m, d_h), ready for bert_backward. With 0 only the losses are computed, and ACT_X(m, logits) keeps
// the last chunk's logits (all M rows when M <= act.R); with m->hits set, also the accuracy's hits.
static inline void bert_forward(BertModel* m, const BertBatch* bt, float dlogit_scale) {
    const BertConfig* c = &m->cfg;
    cudaStream_t s = m->stream;
    Blas* bl = &m->blas;
    int B = bt->B, T = bt->T, M = bt->M, C = c->hidden, I = c->intermediate, NH = c->heads, HD = C / NH;
    int N = B * T;
    const BertParams* p = &m->p;
    if (m->weights_ready) CUDA_CHECK(cudaStreamWaitEvent(s, m->weights_ready[0], 0));  // the embeddings, layer 0
    launch_embedding_layernorm_forward(s, ACT_X(m, emb_out), ACT_F(m, emb_stats), bt->tokens, bt->types, bt->seg_lo,
                                       bt->seg_hi, bert_w(m, p->word), bert_w(m, p->pos), bert_w(m, p->type),
                                       bert_w(m, p->emb_ln_w), bert_w(m, p->emb_ln_b), N, T, C, c->ln_eps);
    for (int l = 0; l < c->layers; l++) {
        const floatX* x = l == 0 ? ACT_X(m, emb_out) : ACT_XL(m, ln2, l - 1);
        floatX *qkv = ACT_XL(m, qkv, l), *atty = ACT_XL(m, atty, l), *proj = ACT_X(m, proj);
        if (m->weights_ready && l > 0) CUDA_CHECK(cudaStreamWaitEvent(s, m->weights_ready[l], 0));
        matmul_forward(bl, s, qkv, 3 * C, x, bert_lw(m, l, BL_QW), bert_lw(m, l, BL_QB), N, C, 3 * C);
        launch_attention_forward(s, atty, ACT_FL(m, lse, l), qkv, bt->seg_lo, bt->seg_hi, B, T, NH, HD, m->att_wgmma);
        matmul_forward(bl, s, proj, C, atty, bert_lw(m, l, BL_AOW), NULL, N, C, C);  // (its bias: in the LayerNorm)
        launch(residual_layernorm_forward, dim3(ceil_div(N, 4)), dim3(128), 0, s, ACT_XL(m, res1, l), ACT_XL(m, ln1, l),
               ACT_FL(m, ln1_stats, l), x, (const floatX*)proj, bert_lw(m, l, BL_AOB), bert_lw(m, l, BL_ALNW),
               bert_lw(m, l, BL_ALNB), N, C, c->ln_eps);
        // the MLP: fc1 = ln1 W1^T + b1 and gelu = GELU(fc1) from one matmul, then proj = gelu W2^T
        matmul_forward_gelu(bl, s, ACT_XL(m, gelu, l), ACT_XL(m, fc1, l), ACT_XL(m, ln1, l), bert_lw(m, l, BL_IW),
                            bert_lw(m, l, BL_IB), N, C, I);
        matmul_forward(bl, s, proj, C, ACT_XL(m, gelu, l), bert_lw(m, l, BL_OW), NULL, N, I, C);  // (bias: LayerNorm)
        launch(residual_layernorm_forward, dim3(ceil_div(N, 4)), dim3(128), 0, s, ACT_XL(m, res2, l), ACT_XL(m, ln2, l),
               ACT_FL(m, ln2_stats, l), (const floatX*)ACT_XL(m, ln1, l), (const floatX*)proj, bert_lw(m, l, BL_OB),
               bert_lw(m, l, BL_OLNW), bert_lw(m, l, BL_OLNB), N, C, c->ln_eps);
    }
    // MLM head on the M masked rows only (its weights, and the gradients its decoder adds to, ready first)
    if (m->weights_ready) CUDA_CHECK(cudaStreamWaitEvent(s, m->weights_ready[c->layers], 0));
    if (M > 0) {
        launch(gather_rows, dim3(ceil_div((long long)M * C / X128, 256)), dim3(256), 0, s, ACT_X(m, h_in),
               (const floatX*)ACT_XL(m, ln2, c->layers - 1), bt->mlm_pos, M, C);
        matmul_forward_gelu(bl, s, ACT_X(m, h_act), ACT_X(m, h_pre), ACT_X(m, h_in), bert_w(m, p->head_w),
                            bert_w(m, p->head_b), M, C, C);
        launch(layernorm_forward, dim3(ceil_div(M, 4)), dim3(128), 0, s, ACT_X(m, h_ln), ACT_F(m, h_stats),
               (const floatX*)ACT_X(m, h_act), bert_w(m, p->head_ln_w), bert_w(m, p->head_ln_b), M, C, c->ln_eps);
        bert_head_decoder(m, bt->mlm_labels, M, dlogit_scale);
    }
    launch(loss_mean, dim3(1), dim3(256), 0, s, ACT_F(m, loss), (const float*)ACT_F(m, losses), bt->mlm_labels, M);
}

// bert_backward: adds dLoss/dparameters to m->grad (fp32; zero it with bert_zero_grad at the start of a
// step). Needs the activations of bert_forward(m, bt, dlogit_scale != 0) on the same batch, which already
// added the decoder's part of the word embeddings' gradient and left dec_b's in dvec (added here at the end).
static inline void bert_backward(BertModel* m, const BertBatch* bt) {
    const BertConfig* c = &m->cfg;
    cudaStream_t s = m->stream;
    Blas* bl = &m->blas;
    int B = bt->B, T = bt->T, M = bt->M, C = c->hidden, I = c->intermediate, NH = c->heads, HD = C / NH,
        V = c->vocab_size;
    int N = B * T;
    const BertParams* p = &m->p;
    floatX *d_x = ACT_X(m, d_x), *d_res = ACT_X(m, d_res), *d_ln1 = ACT_X(m, d_ln1), *d_fc1 = ACT_X(m, d_fc1);
    floatX *d_qkv = ACT_X(m, d_qkv), *d_atty = ACT_X(m, d_atty);
    float* part = ACT_F(m, ln_part);  // the LayerNorm backward's and the column sums' partial sums
    CUDA_CHECK(cudaMemsetAsync(d_x, 0, (size_t)N * C * sizeof(floatX), s));
    if (M > 0) {
        floatX *d_h = ACT_X(m, d_h), *d_h2 = ACT_X(m, d_h2);
        // the decoder was differentiated in the forward (bert_head_decoder): d_h = dLoss/dh_ln
        // head LayerNorm and GELU in one kernel (d_h2 = dLoss/dh_pre, and head_b's gradient: its column sums), then
        // the dense layer
        launch_layernorm_backward(s, d_h2, bert_g(m, p->head_ln_w), bert_g(m, p->head_ln_b), bert_g(m, p->head_b), part,
                                  d_h, ACT_X(m, h_act), ACT_F(m, h_stats), bert_w(m, p->head_ln_w), ACT_X(m, h_pre), M,
                                  C);
        matmul_backward_weight(bl, s, bert_g(m, p->head_w), NULL, d_h2, C, ACT_X(m, h_in), M, C, C);
        matmul_backward_input(bl, s, d_h, d_h2, C, bert_w(m, p->head_w), NULL, M, C, C);
        launch(scatter_rows, dim3(ceil_div((long long)M * C / X128, 256)), dim3(256), 0, s, d_x, (const floatX*)d_h,
               bt->mlm_pos, bt->mlm_labels, M, C);
    }
    if (m->grad_ready) CUDA_CHECK(cudaEventRecord(m->grad_ready[0], s));  // the head's dense matrix
    for (int l = c->layers - 1; l >= 0; l--) {
        const floatX* x = l == 0 ? ACT_X(m, emb_out) : ACT_XL(m, ln2, l - 1);
        const floatX *ln1 = ACT_XL(m, ln1, l), *fc1 = ACT_XL(m, fc1, l), *gelu = ACT_XL(m, gelu, l);
        // output LayerNorm: ln2 = LN(ln1 + fc2); d_res is the gradient of both ln1 (residual) and fc2
        // (and b2's gradient, the column sums of d_res, from the same kernel)
        launch_layernorm_backward(s, d_res, bert_lg(m, l, BL_OLNW), bert_lg(m, l, BL_OLNB), bert_lg(m, l, BL_OB), part,
                                  d_x, ACT_XL(m, res2, l), ACT_FL(m, ln2_stats, l), bert_lw(m, l, BL_OLNW), NULL, N, C);
        // fc2 = GELU(fc1) W2^T + b2, fc1 = ln1 W1^T + b1: d_fc1 = (d_res W2) * GELU'(fc1) from one matmul (the
        // DGELU epilogue), then b1's gradient, the column sums of d_fc1
        matmul_backward_input_gelu(bl, s, d_fc1, d_res, bert_lw(m, l, BL_OW), fc1, N, I, C);
        matmul_backward_weight(bl, s, bert_lg(m, l, BL_OW), NULL, d_res, C, gelu, N, I, C);
        launch_column_sums(s, bert_lg(m, l, BL_IB), part, d_fc1, N, I);
        // d_ln1 = d_fc1 W1 + d_res (the residual branch)
        matmul_backward_weight(bl, s, bert_lg(m, l, BL_IW), NULL, d_fc1, I, ln1, N, C, I);
        matmul_backward_input(bl, s, d_ln1, d_fc1, I, bert_lw(m, l, BL_IW), d_res, N, C, I);
        // attention LayerNorm: ln1 = LN(x + proj)
        launch_layernorm_backward(s, d_res, bert_lg(m, l, BL_ALNW), bert_lg(m, l, BL_ALNB), bert_lg(m, l, BL_AOB), part,
                                  d_ln1, ACT_XL(m, res1, l), ACT_FL(m, ln1_stats, l), bert_lw(m, l, BL_ALNW), NULL, N,
                                  C);
        // proj = atty Wo^T + bo (bo's gradient came from the LayerNorm backward above)
        matmul_backward_weight(bl, s, bert_lg(m, l, BL_AOW), NULL, d_res, C, ACT_XL(m, atty, l), N, C, C);
        matmul_backward_input(bl, s, d_atty, d_res, C, bert_lw(m, l, BL_AOW), NULL, N, C, C);
        // (and bqkv's gradient, the column sums of d_qkv, from the same kernels)
        launch_attention_backward(s, d_qkv, bert_lg(m, l, BL_QB), ACT_F(m, d_delta), part, d_atty, ACT_XL(m, qkv, l),
                                  ACT_XL(m, atty, l), ACT_FL(m, lse, l), bt->seg_lo, bt->seg_hi, B, T, NH, HD,
                                  m->att_wgmma);
        // qkv = x Wqkv^T + bqkv (the three biases are adjacent: one (3C) bias); d_x = d_qkv Wqkv + d_res
        matmul_backward_weight(bl, s, bert_lg(m, l, BL_QW), NULL, d_qkv, 3 * C, x, N, C, 3 * C);
        matmul_backward_input(bl, s, d_x, d_qkv, 3 * C, bert_lw(m, l, BL_QW), d_res, N, C, 3 * C);
        if (m->grad_ready) CUDA_CHECK(cudaEventRecord(m->grad_ready[c->layers - l], s));  // layer l's matrices
    }
    launch_embedding_backward(s, bert_g(m, p->word), bert_g(m, p->pos), bert_g(m, p->type), bert_g(m, p->emb_ln_w),
                              bert_g(m, p->emb_ln_b), ACT_F(m, emb_dx), (uint64_t*)(m->acts + m->act.emb_keys),
                              ACT_F(m, emb_carry), part, (const floatX*)d_x, (const float*)ACT_F(m, emb_stats),
                              bt->tokens, bt->types, bt->seg_lo, bt->seg_hi, bert_w(m, p->word), bert_w(m, p->pos),
                              bert_w(m, p->type), bert_w(m, p->emb_ln_w), N, T, C, V, c->max_position);
    // the micro-step's decoder bias gradient (summed in the forward), added to the gradients
    launch_add_and_clear(s, m->grad + p->n_decay, ACT_F(m, dvec), p->numel - p->n_decay);
    if (m->grad_ready) CUDA_CHECK(cudaEventRecord(m->grad_ready[c->layers + 1], s));  // everything
}

// bert_grad_norm: the global L2 norm of the gradients, left at m->norm[0] (device; no host sync).
static inline void bert_grad_norm(BertModel* m) {
    launch(grad_norm_partial, dim3(launch_grid_cap()), dim3(256), 0, m->stream, m->norm_partial, (const float*)m->grad,
           m->p.numel);
    launch(grad_norm_finish, dim3(1), dim3(256), 0, m->stream, m->norm, (const float*)m->norm_partial,
           launch_grid_cap());
}

// bert_adamw_range: the AdamW update of step m->step for the slab's elements [lo, lo + n) (n and lo multiples
// of 4), whose master weights and moments are at master, adam_m, adam_v + state_off (ZeRO-1: a piece of the
// shard; else state_off = lo). Clipping to max_norm (<= 0: none) by the norm at m->norm[0].
static inline void bert_adamw_range(BertModel* m, size_t lo, size_t n, size_t state_off, float lr, float b1, float b2,
                                    float eps, float wd, float max_norm) {
    float bc1 = 1.f - powf(b1, (float)m->step), bc2 = 1.f - powf(b2, (float)m->step);
    size_t n_decay = m->p.n_decay > lo ? (m->p.n_decay - lo < n ? m->p.n_decay - lo : n) : 0;
    size_t blocks = (n + 1023) / 1024;  // 4 elements per thread; a small piece needs few blocks
    int grid = blocks < (size_t)launch_grid_cap() ? (int)(blocks ? blocks : 1) : launch_grid_cap();
    launch(adamw_update, dim3(grid), dim3(256), 0, m->stream, m->master + state_off, m->w + lo,
           (const float*)m->grad + lo, m->adam_m + state_off, m->adam_v + state_off, n, n_decay, lr, b1, b2, eps, wd,
           bc1, bc2, (const float*)m->norm, max_norm, (uint32_t)m->step, lo);
}

// bert_adamw_step: one AdamW step (step counts from 1) with gradient clipping to max_norm (<= 0: none)
// using the norm bert_grad_norm computed. No weight decay on biases and LayerNorm parameters.
static inline void bert_adamw_step(BertModel* m, float lr, float b1, float b2, float eps, float wd, float max_norm) {
    m->step++;
    bert_adamw_range(m, 0, m->p.numel, 0, lr, b1, b2, eps, wd, max_norm);
}
