// test_lamb.cu: bert_lamb_step (LAMB: kernels lamb_moments, lamb_trust_ratio, lamb_apply) against a plain-C
// reference, on the mini preset's parameter table (its 65,536-element matrices take the most slices a tensor
// gets, BERT_LAMB_PARTS, with a grid-stride loop; its vectors one):
//   - three steps with new gradients each, clipping active: master weights, Adam's m and v, within fp32 rounding
//     of the reference (double-precision norms, the same float update);
//   - the trust ratio's edge cases: a tensor whose weights are all zero (ratio 1: a plain Adam step) and a
//     non-decayed tensor whose gradient is zero (u = 0: no change);
//   - the ratio matters: the step differs from AdamW's by more than rounding (the test would see LAMB replaced
//     by AdamW);
//   - the floatX copy (bf16 build): each weight one of the two bf16 neighbours of its master, both directions
//     taken (stochastic rounding, as AdamW);
//   - determinism: the same steps from the same state give bit for bit the same weights and moments.
// Runs in both storage modes; tests/test_lamb_fp32.cu defines MLM_FP32 and includes this file.
#include "../model.h"
#include "testing.h"
#include <string.h>
#include <vector>

static const int FP32 = sizeof(floatX) == 4;
typedef std::vector<float> vf;

// the reference step: Adam's bias-corrected moments, u = m_hat / (sqrt(v_hat) + eps) + wd * w on decayed
// tensors, per tensor r = |w| / |u| (1 when either is 0; norms in double), w -= lr * r * u
static void lamb_ref(const BertParams* p, vf& w, vf& m, vf& v, const vf& g, int t, float lr, float b1, float b2,
                     float eps, float wd, float clip) {
    float bc1 = 1.f - powf(b1, (float)t), bc2 = 1.f - powf(b2, (float)t);
    vf u(w.size(), 0.f);
    for (int k = 0; k < p->n; k++) {
        const BertTensor* tt = &p->t[k];
        double w2 = 0, u2 = 0;
        for (size_t i = tt->offset; i < tt->offset + tt->numel; i++) {
            float gi = g[i] * clip;
            m[i] = b1 * m[i] + (1.f - b1) * gi;
            v[i] = b2 * v[i] + (1.f - b2) * gi * gi;
            u[i] = m[i] / bc1 / (sqrtf(v[i] / bc2) + eps) + (tt->decay ? wd * w[i] : 0.f);
            w2 += (double)w[i] * w[i];
            u2 += (double)u[i] * u[i];
        }
        float r = w2 > 0 && u2 > 0 ? (float)(sqrt(w2) / sqrt(u2)) : 1.f;
        for (size_t i = tt->offset; i < tt->offset + tt->numel; i++) w[i] -= lr * r * u[i];
    }
}

static vf device_vec(const float* d, size_t n) {
    vf h(n);
    CUDA_OK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
static int same_bits(const vf& a, const vf& b) {
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * 4);
}

int main(void) {
    BertConfig c;
    bert_preset("mini", &c);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    BertModel m;
    CHECK(bert_alloc(&m, &c, 1, 8, 1, s), "alloc");
    const BertParams* p = &m.p;
    size_t n = p->numel;
    CHECK(m.lamb_parts == BERT_LAMB_PARTS, "mini: %d slices per tensor, want %d", m.lamb_parts, BERT_LAMB_PARTS);

    // weights: random, with one LayerNorm bias all zero (its ratio is 1) and the slab's padding zero
    vf w(n, 0.f);
    for (int k = 0; k < p->n; k++) test_fill(&w[p->t[k].offset], p->t[k].numel, -0.1f, 0.1f);
    const BertTensor* zero_w = &p->t[p->emb_ln_b];
    const BertTensor* zero_g = &p->t[p->head_b];  // not decayed: u = 0 at step 1
    for (size_t i = 0; i < zero_w->numel; i++) w[zero_w->offset + i] = 0.f;
    bert_set_params(&m, w.data());
    vf rw = w, rm(n, 0.f), rv(n, 0.f);

    float lr = 2e-2f, b1 = 0.9f, b2 = 0.98f, eps = 1e-6f, wd = 0.01f;
    vf g(n, 0.f);
    std::vector<vf> grads;
    for (int t = 1; t <= 3; t++) {
        for (int k = 0; k < p->n; k++) test_fill(&g[p->t[k].offset], p->t[k].numel, -1.f, 1.f);
        if (t == 1)
            for (size_t i = 0; i < zero_g->numel; i++) g[zero_g->offset + i] = 0.f;
        grads.push_back(g);
        CUDA_OK(cudaMemcpy(m.grad, g.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        bert_grad_norm(&m);
        float norm;
        CUDA_OK(cudaMemcpy(&norm, m.norm, sizeof norm, cudaMemcpyDeviceToHost));
        float max_norm = 0.5f * norm;  // clipping active: every gradient scaled by 1/2
        bert_lamb_step(&m, lr, b1, b2, eps, wd, max_norm);
        CUDA_OK(cudaStreamSynchronize(s));
        vf before = rw;
        lamb_ref(p, rw, rm, rv, g, t, lr, b1, b2, eps, wd, max_norm / norm);
        vf got = device_vec(m.master, n);
        char what[64];
        snprintf(what, sizeof what, "step %d: master weights", t);
        check_close(what, got.data(), rw.data(), n, 1e-6f, 2e-5f);
        snprintf(what, sizeof what, "step %d: Adam m", t);
        vf gm = device_vec(m.adam_m, n), gv = device_vec(m.adam_v, n);
        check_close(what, gm.data(), rm.data(), n, 1e-7f, 1e-5f);
        snprintf(what, sizeof what, "step %d: Adam v", t);
        check_close(what, gv.data(), rv.data(), n, 1e-9f, 1e-5f);
        if (t == 1) {
            // the zero-gradient vector did not move; the zero-weight vector took a plain Adam step of lr (ratio 1)
            int still = 1, adam = 1;
            for (size_t i = 0; i < zero_g->numel; i++) still &= got[zero_g->offset + i] == before[zero_g->offset + i];
            for (size_t i = 0; i < zero_w->numel; i++) {
                float gi = g[zero_w->offset + i] * 0.5f, want = -lr * gi / (fabsf(gi) + eps);  // m_hat / sqrt(v_hat)
                adam &= fabsf(got[zero_w->offset + i] - want) <= 1e-6f * lr + 1e-5f * fabsf(want);
            }
            CHECK(still, "a tensor with zero gradient (u = 0, ratio 1) moved");
            CHECK(adam, "a tensor with zero weights: not a plain Adam step of lr (ratio 1)");
            // the ratio matters: a matrix's step is |w| / |u| times AdamW's, far from 1 here
            const BertTensor* q = &p->t[p->layer0_mat];
            double d_lamb = 0, d_adam = 0;
            for (size_t i = q->offset; i < q->offset + q->numel; i++) {
                float gi = g[i] * 0.5f;
                float adamw = before[i] - lr * (gi / fabsf(gi) + wd * before[i]);
                d_lamb += fabs((double)got[i] - before[i]);
                d_adam += fabs((double)adamw - before[i]);
            }
            CHECK(d_lamb < 0.5 * d_adam && d_lamb > 0,
                  "LAMB's step %.4g vs AdamW's %.4g: the trust ratio was not applied", d_lamb, d_adam);
        }
        if (!FP32 && t == 3) {  // the bf16 copy: a neighbour of the master, rounded both ways
            std::vector<floatX> wx(n);
            CUDA_OK(cudaMemcpy(wx.data(), m.w, n * sizeof(floatX), cudaMemcpyDeviceToHost));
            size_t bad = 0, up = 0, inexact = 0;
            for (size_t i = 0; i < n; i++) {
                float x = (float)wx[i], lo, hi;
                uint32_t u, d, e;
                memcpy(&u, &got[i], 4);
                d = u & 0xffff0000u;
                e = d + 0x10000u;
                memcpy(&lo, &d, 4);
                memcpy(&hi, &e, 4);
                bad += x != lo && x != hi;
                if (u & 0xffff) inexact++, up += x == hi;
            }
            CHECK(bad == 0, "bf16 weights: %zu not a neighbour of the master", bad);
            CHECK(up > inexact / 4 && up < inexact * 3 / 4 + 1, "stochastic rounding: %zu of %zu rounded up", up,
                  inexact);
        }
    }

    // determinism: the same three steps again from the same start give the same bits
    vf w1 = device_vec(m.master, n), m1 = device_vec(m.adam_m, n), v1 = device_vec(m.adam_v, n);
    std::vector<floatX> x1(n), x2(n);
    CUDA_OK(cudaMemcpy(x1.data(), m.w, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    bert_set_params(&m, w.data());
    CUDA_OK(cudaMemset(m.adam_m, 0, n * sizeof(float)));
    CUDA_OK(cudaMemset(m.adam_v, 0, n * sizeof(float)));
    m.step = 0;
    for (int t = 1; t <= 3; t++) {
        CUDA_OK(cudaMemcpy(m.grad, grads[t - 1].data(), n * sizeof(float), cudaMemcpyHostToDevice));
        bert_grad_norm(&m);
        float norm;
        CUDA_OK(cudaMemcpy(&norm, m.norm, sizeof norm, cudaMemcpyDeviceToHost));
        bert_lamb_step(&m, lr, b1, b2, eps, wd, 0.5f * norm);
    }
    CUDA_OK(cudaMemcpy(x2.data(), m.w, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    CHECK(same_bits(w1, device_vec(m.master, n)) && same_bits(m1, device_vec(m.adam_m, n)) &&
              same_bits(v1, device_vec(m.adam_v, n)) && !memcmp(x1.data(), x2.data(), n * sizeof(floatX)),
          "the same LAMB steps twice: different bits");
    bert_free(&m);
    CUDA_OK(cudaStreamDestroy(s));
    return test_summary();
}
