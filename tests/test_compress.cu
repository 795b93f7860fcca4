// test_compress.cu: the 1-bit Adam kernels of compress.h (--comm onebit) against plain C.
//   - onebit_worker: x = (b1 m + (1 - b1) clip g) / (sqrt(v / bc2) + eps) + e, one sign bit per element and
//     |x|_1 / n per group of ONEBIT_GROUP, the chunks of P ranks in their messages, the new worker error in
//     place; the part's end inside a group (padding not counted), a part of two ranges of the slab (the
//     elements outside it untouched)
//   - onebit_server: the average of P ranks' decompressed chunks plus the server error, compressed again
//   - onebit_adam_update: the decompressed average u of the ranks' D (b1 m + (1 - b1) clip g) (frozen v, D = 1 /
//     (sqrt(v / bc2) + eps)): w -= lr (u / bc1 + wd w) (weight decay on n_decay elements), m = u / D, the bf16
//     copy within one bf16 step of the master weight
//   - the whole compressed all-reduce of 3 simulated ranks (workers, the all-to-all and all-gather done on the
//     host) gives every element of the plain C pipeline
//   - the parts (onebit_layout): the buckets final before layer 0's event one part each (or merged up to a size),
//     the rest one part of two ranges; together they cover the slab once; or the whole slab one part
//   - error feedback on one rank through onebit_step_forward (2 parts): after T steps the sum of the applied
//     updates equals the sum of the inputs less the two final errors, and the errors stay bounded
//   - the variance steps (onebit_schedule) against a step-at-a-time count, for several warm-ups and --comm-refresh;
//     one lazy variance step (onebit_refresh_update, the kernel adamw_update with v's decay b2^I) against plain C
//     that updates v K times with the step's g^2 (so v = b2^K v + (1 - b2^K) g^2) and corrects with 1 - b2^t,
//     with clipping and weight decay; the floatX copy within one step of the master weight
//   - the sizes: the message is chunk / 8 + 4 chunk / ONEBIT_GROUP bytes, >= 16x fewer than fp32's all-reduce
#include "../kernels.cuh"
#pragma GCC diagnostic ignored "-Wunused-function"  // comm.h's start-up functions, which this test does not call
#include "../compress.h"
#include "testing.h"

#include <string.h>

static uint64_t rng = 777;
static float urand(void) {  // uniform in [-1, 1)
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / (double)(1 << 24)) * 2.f - 1.f;
}

// ---------------------------------------------------------------------------------------------
// Plain C

// ref_compress: a group's n_valid elements of x (the rest padding, taken as 0) into words, *scale and q.
static void ref_compress(const float* x, int n_valid, uint32_t* words, float* scale, float* q) {
    double s = 0;
    for (int e = 0; e < n_valid; e++) s += fabsf(x[e]);
    float sc = (float)(s / (n_valid > 0 ? n_valid : 1));
    for (int w = 0; w < ONEBIT_GROUP / 32; w++) words[w] = 0;
    for (int e = 0; e < ONEBIT_GROUP; e++) {
        int pos = (e < n_valid ? x[e] : 0.f) >= 0.f;
        words[e / 32] |= (uint32_t)pos << (e % 32);
        q[e] = pos ? sc : -sc;
    }
    *scale = sc;
}
// ref_decompress: element e of a message of `chunk` elements.
static float ref_decompress(const unsigned char* msg, size_t chunk, size_t e) {
    uint32_t w;
    float sc;
    memcpy(&w, msg + e / 32 * 4, 4);
    memcpy(&sc, msg + chunk / 8 + e / ONEBIT_GROUP * 4, 4);
    return (w >> (e % 32)) & 1u ? sc : -sc;
}
static void ref_worker(unsigned char* msgs, float* err, const float* g, const float* m, const float* v, size_t n,
                       size_t chunk, int world, float b1, float clip, float bc2, float eps) {
    size_t mb = onebit_msg_bytes(chunk), groups = (size_t)world * chunk / ONEBIT_GROUP;
    float x[ONEBIT_GROUP], q[ONEBIT_GROUP];
    for (size_t G = 0; G < groups; G++) {
        size_t base = G * ONEBIT_GROUP, j = base / chunk, e0 = base % chunk;
        int n_valid = base >= n ? 0 : (n - base < ONEBIT_GROUP ? (int)(n - base) : ONEBIT_GROUP);
        for (int e = 0; e < ONEBIT_GROUP; e++) {
            size_t i = base + e;
            x[e] = i < n ? (b1 * m[i] + (1.f - b1) * clip * g[i]) / (sqrtf(v[i] / bc2) + eps) + err[i] : 0.f;
        }
        float sc;
        ref_compress(x, n_valid, (uint32_t*)(msgs + j * mb) + e0 / 32, &sc, q);
        memcpy(msgs + j * mb + chunk / 8 + e0 / ONEBIT_GROUP * 4, &sc, 4);
        for (int e = 0; e < n_valid; e++) err[base + e] = x[e] - q[e];
    }
}
static void ref_server(unsigned char* out, float* err, const unsigned char* recv, int world, size_t chunk, size_t first,
                       size_t n) {
    size_t mb = onebit_msg_bytes(chunk);
    float y[ONEBIT_GROUP], q[ONEBIT_GROUP];
    for (size_t G = 0; G < chunk / ONEBIT_GROUP; G++) {
        size_t base = first + G * ONEBIT_GROUP;
        int n_valid = base >= n ? 0 : (n - base < ONEBIT_GROUP ? (int)(n - base) : ONEBIT_GROUP);
        for (int e = 0; e < ONEBIT_GROUP; e++) {
            float s = 0.f;
            for (int r = 0; r < world; r++) s += ref_decompress(recv + r * mb, chunk, G * ONEBIT_GROUP + e);
            y[e] = e < n_valid ? s / (float)world + err[G * ONEBIT_GROUP + e] : 0.f;
        }
        float sc;
        ref_compress(y, n_valid, (uint32_t*)out + G * (ONEBIT_GROUP / 32), &sc, q);
        memcpy(out + chunk / 8 + G * 4, &sc, 4);
        for (int e = 0; e < n_valid; e++) err[G * ONEBIT_GROUP + e] = y[e] - q[e];
    }
}

// ---------------------------------------------------------------------------------------------

static void* dalloc(size_t bytes) {
    void* p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes));
    return p;
}
static void* up(const void* h, size_t bytes) {
    void* d = dalloc(bytes);
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static void down(void* h, const void* d, size_t bytes) { CUDA_OK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost)); }
static float* frand(size_t n, float scale) {
    float* h = (float*)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = urand() * scale;
    return h;
}

// msgs_match: the sign bits (a bit may differ only where the reference's value is within tol of 0) and the
// scales (relative 1e-5) of `count` messages.
static int msgs_match(const char* what, const unsigned char* got, const unsigned char* want, const float* x_ref,
                      size_t chunk, int count, size_t n_x) {
    size_t mb = onebit_msg_bytes(chunk), bad_bits = 0, bad_scales = 0;
    for (int j = 0; j < count; j++)
        for (size_t e = 0; e < chunk; e++) {
            float a = ref_decompress(got + j * mb, chunk, e), b = ref_decompress(want + j * mb, chunk, e);
            size_t i = (size_t)j * chunk + e;
            int sign_differs = (a >= 0) != (b >= 0);
            if (sign_differs && !(x_ref && i < n_x && fabsf(x_ref[i]) < 1e-6f) && b != 0.f) bad_bits++;
            if (!(fabsf(fabsf(a) - fabsf(b)) <= 1e-5f * fabsf(b) + 1e-12f)) bad_scales++;
        }
    CHECK(bad_bits == 0 && bad_scales == 0, "%s: %zu signs and %zu scales differ from plain C", what, bad_bits,
          bad_scales);
    return bad_bits == 0 && bad_scales == 0;
}

// The part of test_pipeline: elements j < PN1 at slab index PLO + j, the rest at PLO2 + (j - PN1), in a slab of
// PSLAB elements; the arrays the kernels see are by slab index, the plain C ones by the part's index.
#define PSLAB 2900
#define PLO 400
#define PN1 1200
#define PLO2 1900
static float* to_slab(const float* part, size_t n, float fill) {  // a slab array: part's values, fill elsewhere
    float* a = (float*)malloc(PSLAB * 4);
    for (size_t i = 0; i < PSLAB; i++) a[i] = fill;
    for (size_t j = 0; j < n; j++) a[onebit_at(j, PLO, PN1, PLO2)] = part[j];
    return a;
}
static float* from_slab(const float* d_slab, size_t n, int* outside, float fill) {  // the part's values; outside:
    float* a = (float*)malloc(PSLAB * 4);                                           // += elements not fill there
    float* part = (float*)malloc(n * 4);
    down(a, d_slab, PSLAB * 4);
    for (size_t j = 0; j < n; j++) part[j] = a[onebit_at(j, PLO, PN1, PLO2)], a[onebit_at(j, PLO, PN1, PLO2)] = fill;
    for (size_t i = 0; outside && i < PSLAB; i++) *outside += a[i] != fill;
    free(a);
    return part;
}

static void test_sizes(void) {
    CHECK(onebit_chunk(1000, 4) == 256, "onebit_chunk(1000, 4) = %zu, want 256", onebit_chunk(1000, 4));
    CHECK(onebit_chunk(1025, 1) == 1280, "onebit_chunk(1025, 1) = %zu, want 1280", onebit_chunk(1025, 1));
    CHECK(onebit_server_elems(1000, 256, 3) == 232 && onebit_server_elems(1000, 256, 4) == 0,
          "onebit_server_elems: %zu %zu, want 232 0", onebit_server_elems(1000, 256, 3),
          onebit_server_elems(1000, 256, 4));
    CHECK(onebit_msg_bytes(2048) == 2048 / 8 + 2048 / ONEBIT_GROUP * 4, "onebit_msg_bytes(2048) = %zu",
          onebit_msg_bytes(2048));
    // bert-base's slab on 64 ranks (its layout's events: the head, 12 layers, then the rest): at least 16x fewer
    // bytes than fp32's ring all-reduce (2 (P-1)/P 4 n)
    const size_t numel = 109518912, top = numel - 102144;
    size_t ready_lo[13];
    for (int k = 0; k < 13; k++) ready_lo[k] = top - 589824 - (size_t)k * 7077888;
    Comm c;
    memset(&c, 0, sizeof c);
    c.world = 64;
    GradReduce g;
    grad_reduce_layout(&g, &c, numel, top, ready_lo, 14, 6553600, 0, 0);
    OneBit ob;
    onebit_layout(&ob, &g, 0, 10, (size_t)25 << 20);  // parts of 100 MB
    double fp32 = 2.0 * 63 / 64 * 4 * numel, one = (double)onebit_step_bytes(&ob);
    CHECK(fp32 / one >= 16, "bert-base on 64 ranks: %.0f bytes per step, fp32 %.0f: only %.1fx fewer", one, fp32,
          fp32 / one);
    printf("bytes per step, bert-base on 64 ranks in %d parts: onebit %.0f, fp32 %.0f (%.1fx fewer)\n", ob.n_parts, one,
           fp32, fp32 / one);
    free(ob.part);
    grad_reduce_free(&g);
}

// onebit_layout on a small slab: 5000 elements, the vector region from 4700, events at 4000, 2500, 1000 (layer 0's)
// and the last; buckets of 600 elements on 3 ranks.
static void test_parts(void) {
    const size_t numel = 5000, ready_lo[3] = {4000, 2500, 1000};
    Comm c;
    memset(&c, 0, sizeof c);
    c.world = 3;
    GradReduce g;
    grad_reduce_layout(&g, &c, numel, 4700, ready_lo, 4, 600, 0, 0);
    OneBit ob;
    onebit_layout(&ob, &g, 1, 5, 0);  // a part per bucket
    unsigned char* seen = (unsigned char*)calloc(numel, 1);
    int bad = 0, tails = 0;
    size_t msg = 0, server = 0;
    for (int i = 0; i < ob.n_parts; i++) {
        const OneBitPart* p = &ob.part[i];
        for (size_t j = 0; j < p->n; j++) seen[onebit_at(j, p->lo, p->n1, p->lo2)]++;
        tails += p->event == 3;
        bad += (p->event == 3) != (i == ob.n_parts - 1);  // the last part, and only it, at the last event
        bad += p->chunk != onebit_chunk(p->n, 3) || p->msg_off != msg || p->server_off != server;
        msg += 3 * p->msg_bytes, server += p->chunk;
    }
    int once = 0;
    for (size_t i = 0; i < numel; i++) once += seen[i] == 1;
    const OneBitPart* t = &ob.part[ob.n_parts - 1];
    CHECK(once == (int)numel, "the parts cover %d of the slab's %zu elements exactly once", once, numel);
    CHECK(bad == 0 && tails == 1 && msg == ob.msg_total && server == ob.server_total,
          "the parts: %d wrong, %d at the last event (want 1)", bad, tails);
    // the buckets of the last two events (layer 0's and the last): [1092, 2892) and [0, 1092) are [0, 2892); then the
    // vector region [4692, 5000) (from 4700 down to a multiple of 4 x 3)
    CHECK(t->lo == 0 && t->n1 == 2892 && t->lo2 == 4692 && t->n == 3200 && ob.n_parts == g.n - 6 + 1,
          "the last part: %zu elements ([%zu, +%zu) and [%zu, ...)), %d parts of %d buckets; want [0, +2892), [4692, "
          "5000)",
          t->n, t->lo, t->n1, t->lo2, ob.n_parts, g.n);
    printf("%d buckets -> %d parts; the last: [%zu, %zu) and [%zu, %zu)\n", g.n, ob.n_parts, t->lo, t->lo + t->n1,
           t->lo2, t->lo2 + t->n - t->n1);
    free(seen);
    free(ob.part);
    // parts of at most 1200 elements: [4092, 4692) (event 0) and [3492, 4092) (event 1) merge, sent after event 1;
    // [2892, 3492) alone; then the last part
    onebit_layout(&ob, &g, 1, 5, 1200);
    CHECK(ob.n_parts == 3 && ob.part[0].lo == 3492 && ob.part[0].n == 1200 && ob.part[0].event == 1 &&
              ob.part[1].lo == 2892 && ob.part[1].n == 600 && ob.part[2].n == 3200,
          "parts of at most 1200: %d parts, the first [%zu, +%zu) after event %d; want 3, [3492, +1200) after 1",
          ob.n_parts, ob.part[0].lo, ob.part[0].n, ob.part[0].event);
    free(ob.part);
    // SIZE_MAX (--comm onebit): the whole slab one part, in slab order
    onebit_layout(&ob, &g, 1, 5, SIZE_MAX);
    CHECK(ob.n_parts == 1 && ob.part[0].lo == 0 && ob.part[0].n1 == numel && ob.part[0].n == numel,
          "one part: %d parts, the first [%zu, +%zu) of %zu; want [0, 5000)", ob.n_parts, ob.part[0].lo, ob.part[0].n1,
          ob.part[0].n);
    free(ob.part);
    grad_reduce_free(&g);
}

// The worker, the server and the update of 3 simulated ranks, and the pipeline as a whole.
static void test_pipeline(void) {
    const int P = 3;
    const size_t n = 2000, n_decay = 1500;  // chunk 768: 3 chunks, the last group cut by the slab's end
    size_t chunk = onebit_chunk(n, P), mb = onebit_msg_bytes(chunk);
    CHECK(chunk == 768, "chunk %zu, want 768", chunk);
    const float b1 = 0.9f, b2 = 0.98f, eps = 1e-6f, lr = 1e-2f, wd = 0.1f, bc1 = 0.6f, bc2 = 1.f - powf(b2, 5.f);
    float *m = frand(n, 0.01f), *v = frand(n, 1e-4f), *w = frand(n, 1.f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]) + (i % 97 == 0 ? 0.f : 1e-8f);  // a few v = 0
    float* g[P];
    float* werr[P];
    unsigned char *send_ref = (unsigned char*)calloc(P, P * mb), *send_got = (unsigned char*)calloc(P, P * mb);
    float* x_ref = (float*)malloc(P * n * sizeof(float));
    float clip_w = 0.7f;  // the step's clip factor (the worker's)
    int outside = 0;      // slab elements outside the part that a kernel changed
    float *m_slab = to_slab(m, n, 0.f), *v_slab = to_slab(v, n, 1.f);
    float* d_m = (float*)up(m_slab, PSLAB * 4);
    float* d_v = (float*)up(v_slab, PSLAB * 4);
    // 1. the workers
    for (int r = 0; r < P; r++) {
        g[r] = frand(n, 0.05f);
        werr[r] = frand(n, 1e-3f);
        for (size_t i = 0; i < n; i++)  // the value the reference compresses, for the sign check
            x_ref[r * n + i] = (b1 * m[i] + (1.f - b1) * clip_w * g[r][i]) / (sqrtf(v[i] / bc2) + eps) + werr[r][i];
        float *g_slab = to_slab(g[r], n, 5.f), *e_slab = to_slab(werr[r], n, 3.f);
        float* d_g = (float*)up(g_slab, PSLAB * 4);
        float* d_e = (float*)up(e_slab, PSLAB * 4);
        unsigned char* d_msgs = (unsigned char*)dalloc(P * mb);
        CUDA_OK(cudaMemset(d_msgs, 0xab, P * mb));
        size_t groups = P * chunk / ONEBIT_GROUP;
        launch(onebit_worker, dim3(2), dim3(ONEBIT_THREADS), 0, (cudaStream_t)0, d_msgs, d_e, (const float*)d_g,
               (const float*)d_m, (const float*)d_v, (size_t)PLO, (size_t)PN1, (size_t)PLO2, n, chunk, groups, b1,
               clip_w, bc2, eps);
        down(send_got + r * P * mb, d_msgs, P * mb);
        float* e_got = from_slab(d_e, n, &outside, 3.f);  // the new error, in place
        free(g_slab), free(e_slab);
        ref_worker(send_ref + r * P * mb, werr[r], g[r], m, v, n, chunk, P, b1, clip_w, bc2, eps);
        char what[64];
        snprintf(what, sizeof what, "onebit_worker, rank %d", r);
        msgs_match(what, send_got + r * P * mb, send_ref + r * P * mb, x_ref + r * n, chunk, P, n);
        snprintf(what, sizeof what, "onebit_worker's error, rank %d", r);
        check_close(what, e_got, werr[r], n, 1e-4f, 1e-4f);
        free(e_got);
        cudaFree(d_g), cudaFree(d_e), cudaFree(d_msgs);
    }
    // 2. the all-to-all (on the host, from the kernel's messages); 3. the servers; 4. the all-gather
    unsigned char *gathered_ref = (unsigned char*)calloc(P, mb), *gathered_got = (unsigned char*)calloc(P, mb);
    unsigned char* gathered_c = (unsigned char*)calloc(P, mb);  // plain C from the workers on
    for (int j = 0; j < P; j++) {
        unsigned char* recv = (unsigned char*)malloc(P * mb);
        for (int q = 0; q < P; q++) memcpy(recv + q * mb, send_got + q * P * mb + j * mb, mb);
        float* serr = frand(chunk, 1e-3f);
        for (size_t e = onebit_server_elems(n, chunk, j); e < chunk; e++) serr[e] = 0.f;
        float* serr_c = (float*)malloc(chunk * 4);
        unsigned char* recv_c = (unsigned char*)malloc(P * mb);
        memcpy(serr_c, serr, chunk * 4);
        for (int q = 0; q < P; q++) memcpy(recv_c + q * mb, send_ref + q * P * mb + j * mb, mb);
        ref_server(gathered_c + j * mb, serr_c, recv_c, P, chunk, (size_t)j * chunk, n);
        free(serr_c), free(recv_c);
        unsigned char* d_recv = (unsigned char*)up(recv, P * mb);
        float* d_serr = (float*)up(serr, chunk * 4);  // (0 past the part's end, as onebit_alloc leaves it)
        unsigned char* d_out = (unsigned char*)dalloc(mb);
        launch(onebit_server, dim3(2), dim3(ONEBIT_THREADS), 0, (cudaStream_t)0, d_out, d_serr,
               (const unsigned char*)d_recv, P, chunk, (size_t)j * chunk, n);
        float* serr_got = (float*)malloc(chunk * 4);
        down(gathered_got + j * mb, d_out, mb);
        down(serr_got, d_serr, chunk * 4);
        ref_server(gathered_ref + j * mb, serr, recv, P, chunk, (size_t)j * chunk, n);
        char what[64];
        snprintf(what, sizeof what, "onebit_server, rank %d", j);
        msgs_match(what, gathered_got + j * mb, gathered_ref + j * mb, NULL, chunk, 1, 0);
        snprintf(what, sizeof what, "onebit_server's error, rank %d", j);
        check_close(what, serr_got, serr, chunk, 1e-5f, 1e-4f);
        free(recv), free(serr), free(serr_got);
        cudaFree(d_recv), cudaFree(d_serr), cudaFree(d_out);
    }
    // 4. the update from the gathered messages
    // (n_decay counts slab elements: the part's first n_decay - PLO elements decay)
    float* w_slab = to_slab(w, n, 2.f);
    float* d_w = (float*)up(w_slab, PSLAB * 4);
    floatX* d_x = (floatX*)dalloc(PSLAB * sizeof(floatX));
    unsigned char* d_all = (unsigned char*)up(gathered_got, P * mb);
    launch(onebit_adam_update, dim3(3), dim3(256), 0, (cudaStream_t)0, d_w, d_x, d_m, (const float*)d_v,
           (const unsigned char*)d_all, (size_t)PLO, (size_t)PN1, (size_t)PLO2, n, n_decay, chunk, lr, eps, wd, bc1,
           bc2, 42u);
    float *w_want = (float*)malloc(n * 4), *m_want = (float*)malloc(n * 4);
    float *w_got = from_slab(d_w, n, &outside, 2.f), *m_got = from_slab(d_m, n, &outside, 0.f);
    floatX* x_slab = (floatX*)malloc(PSLAB * sizeof(floatX));
    floatX* x_got = (floatX*)malloc(n * sizeof(floatX));
    down(x_slab, d_x, PSLAB * sizeof(floatX));
    for (size_t j = 0; j < n; j++) x_got[j] = x_slab[onebit_at(j, PLO, PN1, PLO2)];
    free(x_slab), free(w_slab), free(m_slab), free(v_slab);
    CHECK(outside == 0, "onebit_worker or onebit_adam_update changed %d slab elements outside the part", outside);
    int far = 0;
    for (size_t i = 0; i < n; i++) {
        float u = ref_decompress(gathered_got + i / chunk * mb, chunk, i % chunk);
        float d = sqrtf(v[i] / bc2) + eps;
        w_want[i] = w[i] - lr * (u / bc1 + (onebit_at(i, PLO, PN1, PLO2) < n_decay ? wd * w[i] : 0.f));
        m_want[i] = u * d;
        float xf = (float)x_got[i], step = fabsf(w_want[i]) * (sizeof(floatX) == 2 ? 1.f / 128 : 1e-6f);
        far += !(fabsf(xf - w_want[i]) <= step + 1e-30f);
    }
    check_close("onebit_adam_update: master weights", w_got, w_want, n, 1e-6f, 1e-5f);
    check_close("onebit_adam_update: momentum", m_got, m_want, n, 1e-9f, 1e-5f);
    CHECK(far == 0, "onebit_adam_update: %d floatX weights more than one step from the master weight", far);
    // the pipeline as a whole, in plain C from the workers on: the same averaged step (a sign may flip where a
    // sum in the kernels' and in plain C's float order differ near 0: at most 0.5% of the elements)
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float a = ref_decompress(gathered_c + i / chunk * mb, chunk, i % chunk);
        float b = ref_decompress(gathered_got + i / chunk * mb, chunk, i % chunk);
        bad += !(fabsf(a - b) <= 1e-5f * fabsf(a));
    }
    CHECK(bad <= (int)(n / 200), "3 ranks: %d of %zu elements of the averaged step differ from the plain C pipeline",
          bad, n);
    free(gathered_c);
    for (int r = 0; r < P; r++) free(g[r]), free(werr[r]);
    free(m), free(v), free(w), free(send_ref), free(send_got), free(x_ref), free(gathered_ref), free(gathered_got);
    free(w_got), free(m_got), free(w_want), free(m_want), free(x_got);
    cudaFree(d_m), cudaFree(d_v), cudaFree(d_w), cudaFree(d_x), cudaFree(d_all);
}

// Error feedback on one rank, through onebit_step_forward (2 parts: buckets of 300 elements, events at 400 and the
// last): with b1 = 0, v = 0, eps = 1, lr = 1, no decay, the step applies u_t and
// w_T = w_0 - sum_t u_t = w_0 - (sum_t g_t - e_worker - e_server).
static void test_error_feedback(void) {
    const size_t n = 1000, ready_lo[1] = {400};
    const int T = 40;
    Comm c;
    memset(&c, 0, sizeof c);
    c.world = 1;
    GradReduce g;
    grad_reduce_layout(&g, &c, n, 900, ready_lo, 2, 300, 0, 0);
    grad_reduce_start(&g);
    OneBit ob;
    onebit_layout(&ob, &g, 0, 1, 0);
    onebit_alloc(&ob);
    CHECK(ob.n_parts == 2 && ob.part[1].n == 700, "%d parts (want 2), the last of %zu elements (want 700)", ob.n_parts,
          ob.part[ob.n_parts - 1].n);
    float *w = (float*)calloc(n, 4), *sum_g = (float*)calloc(n, 4), *zero = (float*)calloc(n, 4);
    float* d_w = (float*)up(w, n * 4);
    floatX* d_x = (floatX*)dalloc(n * sizeof(floatX));
    float* d_m = (float*)up(zero, n * 4);
    float* d_v = (float*)up(zero, n * 4);
    float* d_g = (float*)dalloc(n * 4);
    double max_err = 0, max_g = 0;
    float *ew = (float*)malloc(n * 4), *es = (float*)calloc(n, 4), *srv = (float*)malloc(ob.server_total * 4);
    for (int t = 1; t <= T; t++) {
        float* gh = frand(n, 1.f);
        for (size_t i = 0; i < n; i++) gh[i] = gh[i] * (1.f + (float)(i % 10)) + 0.3f, sum_g[i] += gh[i];
        for (size_t i = 0; i < n; i++) max_g = fabs(gh[i]) > max_g ? fabs(gh[i]) : max_g;
        CUDA_OK(cudaMemcpy(d_g, gh, n * 4, cudaMemcpyHostToDevice));
        onebit_step_forward(&ob, &g, t + 1, d_g, d_w, d_x, d_m, d_v, 0, 1.f, 0.f, 0.5f, 1.f, 0.f, 1.f);
        CUDA_OK(cudaStreamSynchronize(g.stream));
        down(ew, ob.worker_err, n * 4);
        down(srv, ob.server_err, ob.server_total * 4);
        for (int k = 0; k < ob.n_parts; k++) {  // the server errors by slab index (one rank: chunk 0 of each part)
            const OneBitPart* p = &ob.part[k];
            for (size_t j = 0; j < p->n; j++) es[onebit_at(j, p->lo, p->n1, p->lo2)] = srv[p->server_off + j];
        }
        for (size_t i = 0; i < n; i++) {
            max_err = fabs(ew[i]) > max_err ? fabs(ew[i]) : max_err;
            max_err = fabs(es[i]) > max_err ? fabs(es[i]) : max_err;
        }
        free(gh);
    }
    down(w, d_w, n * 4);
    float* want = (float*)malloc(n * 4);
    for (size_t i = 0; i < n; i++) want[i] = -(sum_g[i] - ew[i] - es[i]);
    check_close("error feedback: w_T = -(sum of g - worker error - server error)", w, want, n, 2e-3f, 1e-4f);
    CHECK(max_err < 8 * max_g, "error feedback: an error reached %g (inputs up to %g): not bounded", max_err, max_g);
    printf("error feedback over %d steps: largest error %.3g, largest input %.3g\n", T, max_err, max_g);
    onebit_free(&ob);
    grad_reduce_free(&g);
    free(w), free(sum_g), free(zero), free(ew), free(es), free(srv), free(want);
    cudaFree(d_w), cudaFree(d_x), cudaFree(d_m), cudaFree(d_v), cudaFree(d_g);
}

// schedule_ref: the variance steps counted a step at a time, in the form of DeepSpeed's ZeroOneAdam (an interval
// that doubles after every kappa updates; here measured from the last variance step): after the warm-up of
// W steps a step is a variance step when its distance from the last one reaches the interval, and the interval
// doubles after every S of them while it is below K (here: then it stays K; S = 0: every K). Fills is[1..T].
static void schedule_ref(int W, int S, int K, int T, char* is) {
    int last = W, gap = 1, count = 0;
    for (int t = 1; t <= T; t++) {
        is[t] = t <= W;
        if (t <= W || K <= 0 || t - last < (S > 0 ? gap : K)) continue;
        is[t] = 1, last = t;
        if (gap < K && ++count == S) count = 0, gap *= 2;
        if (gap > K) gap = K;
    }
}

// The variance steps (warm-up W, longest spacing K): onebit_schedule against schedule_ref for every step, the count
// and the step of v's last update; then one lazy variance step at t = 61 (W = 5, K = 4: spacing 4 there) against
// plain C.
static void test_refresh(void) {
    const int T = 3000, Ws[] = {1, 5, 25, 300}, Ks[] = {0, 1, 4, 100, 1000}, Ss[] = {0, 1, 3, 16};
    char* is = (char*)malloc(T + 1);
    int bad = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 5; b++)
            for (int c = 0; c < 4; c++) {
                schedule_ref(Ws[a], Ss[c], Ks[b], T, is);
                int last = 0, count = 0;
                for (int t = 1; t <= T; t++) {
                    if (is[t]) last = t, count++;
                    int n, got = onebit_schedule(Ws[a], Ss[c], Ks[b], t, &n);
                    if ((got != last || n != count) && bad++ < 5)
                        printf("  W %d S %d K %d step %d: last variance step %d (want %d), count %d (want %d)\n", Ws[a],
                               Ss[c], Ks[b], t, got, last, n, count);
                }
            }
    CHECK(bad == 0, "the variance steps: %d steps where onebit_schedule and the counting reference differ", bad);
    free(is);
    OneBit ob;
    memset(&ob, 0, sizeof ob);  // the schedule needs only warmup and refresh, the variance step numel
    ob.world = 1, ob.warmup = 5, ob.refresh = 4, ob.var_steps = 16, ob.numel = 1000;
    // W = 5, S = 16: steps 6..21 (spacing 1), 23..53 (2), then 57, 61, ... (K = 4)
    const int steps[] = {5, 6, 21, 22, 23, 53, 54, 56, 57, 60, 61},
              want_v[] = {5, 6, 21, 21, 23, 53, 53, 53, 57, 57, 61};
    const int want_refresh[] = {0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1};
    bad = 0;
    for (int k = 0; k < 11; k++)
        if (onebit_v_step(&ob, steps[k]) != want_v[k] || onebit_is_refresh(&ob, steps[k]) != want_refresh[k]) {
            printf("  step %d: v_step %d (want %d), variance step %d (want %d)\n", steps[k],
                   onebit_v_step(&ob, steps[k]), want_v[k], onebit_is_refresh(&ob, steps[k]), want_refresh[k]);
            bad++;
        }
    CHECK(bad == 0, "the variance steps after a warm-up of 5, K = 4: %d steps wrong", bad);
    CHECK(onebit_var_decay(&ob, 61, 0.5f) == 0.0625f && onebit_var_decay(&ob, 22 + 1, 0.5f) == 0.25f &&
              onebit_var_decay(&ob, 7, 0.5f) == 0.5f,
          "the kept share of v: b2^(steps since v's last update)");
    ob.refresh = 0;
    CHECK(onebit_v_step(&ob, 100) == 5 && !onebit_is_refresh(&ob, 9), "no variance steps: v_step(100) = %d, want 5",
          onebit_v_step(&ob, 100));
    ob.refresh = 4;

    const size_t n = 1000, n_decay = 600;
    const int t = 61, K = 4;
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.9f, eps = 1e-8f, wd = 0.1f, max_norm = 1.f, norm = 2.f;  // clip 0.5
    float *w = frand(n, 1.f), *g = frand(n, 1.f), *m = frand(n, 0.1f), *v = frand(n, 0.01f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *d_w = (float*)up(w, n * 4), *d_g = (float*)up(g, n * 4), *d_m = (float*)up(m, n * 4);
    float *d_v = (float*)up(v, n * 4), *d_norm = (float*)up(&norm, 4);
    floatX* d_x = (floatX*)dalloc(n * sizeof(floatX));
    onebit_refresh_update(&ob, (cudaStream_t)0, t, d_w, d_x, d_g, d_m, d_v, n_decay, d_norm, lr, b1, b2, eps, wd,
                          max_norm);
    CUDA_OK(cudaDeviceSynchronize());
    float *got_w = (float*)malloc(n * 4), *got_m = (float*)malloc(n * 4), *got_v = (float*)malloc(n * 4);
    floatX* got_x = (floatX*)malloc(n * sizeof(floatX));
    down(got_w, d_w, n * 4), down(got_m, d_m, n * 4), down(got_v, d_v, n * 4), down(got_x, d_x, n * sizeof(floatX));
    float *want_w = (float*)malloc(n * 4), *want_m = (float*)malloc(n * 4), *want_vv = (float*)malloc(n * 4);
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
        double gi = 0.5 * g[i], mi = b1 * (double)m[i] + (1 - b1) * gi, vi = v[i];
        for (int k = 0; k < K; k++) vi = b2 * vi + (1 - b2) * gi * gi;  // the K steps since v's last update
        want_m[i] = (float)mi, want_vv[i] = (float)vi;
        want_w[i] = (float)(w[i] - lr * (mi / bc1 / (sqrt(vi / bc2) + eps) + (i < n_decay ? wd * w[i] : 0.)));
    }
    check_close("lazy refresh: m = b1 m + (1 - b1) clip g", got_m, want_m, n, 1e-7f, 1e-5f);
    check_close("lazy refresh: v = b2^K v + (1 - b2^K) (clip g)^2", got_v, want_vv, n, 1e-9f, 1e-5f);
    check_close("lazy refresh: w -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd w), bc2 = 1 - b2^t", got_w, want_w, n,
                1e-6f, 1e-5f);
    int far = 0;
    for (size_t i = 0; i < n; i++) {
        float step = fabsf(got_w[i]) * (sizeof(floatX) == 2 ? 1.f / 128 : 1e-6f);
        far += !(fabsf((float)got_x[i] - got_w[i]) <= step + 1e-30f);
    }
    CHECK(far == 0, "lazy refresh: %d floatX weights more than one step from the master weight", far);
    free(w), free(g), free(m), free(v), free(got_w), free(got_m), free(got_v), free(got_x);
    free(want_w), free(want_m), free(want_vv);
    cudaFree(d_w), cudaFree(d_g), cudaFree(d_m), cudaFree(d_v), cudaFree(d_norm), cudaFree(d_x);
}

int main(void) {
    test_sizes();
    test_parts();
    test_pipeline();
    test_error_feedback();
    test_refresh();
    return test_summary();
}
