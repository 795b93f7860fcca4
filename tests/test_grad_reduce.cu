// test_grad_reduce.cu: the pieces of the bucketed gradient reduction and ZeRO-1 (comm.h) that one process
// can check. The collectives themselves run in tests/test_data_parallel.sh (2 processes).
//   - grad_to_bf16 / grad_from_bf16 (the --grad-reduce bf16 casts) against plain C: round to nearest even,
//     zero padding, the sum scaled back by 1/world
//   - accumulate_sum (ZeRO-1's sum of squares): adds the partial sums to acc in a fixed order
//   - adamw_update with a base index: updating a piece of the slab gives bit for bit what updating the
//     whole slab gives there (ZeRO-1's shards round exactly as one process would)
//   - grad_reduce_layout: the buckets cover the slab once, each is final at its event, all but the topmost
//     are a multiple of 4 * world, the pieces tile each bucket, the shard is about 1/world of the slab
#include "../kernels.cuh"
#include "../model.h"
#pragma GCC diagnostic ignored "-Wunused-function"  // comm.h's start-up functions, which this test does not call
#include "../comm.h"
#include "testing.h"

#include <string.h>

// plain C: float -> bf16 bits, round to nearest even (NaN not needed here)
static uint16_t ref_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float ref_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t rng = 12345;
static float urand(void) {  // uniform in [-1, 1)
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / (double)(1 << 24)) * 2.f - 1.f;
}

static void test_casts(void) {
    const size_t n = 1003, padded = 1024;
    float *h = (float*)malloc(n * 4), *d_g, *d_back;
    __nv_bfloat16* d_b;
    for (size_t i = 0; i < n; i++) h[i] = urand() * (i % 7 == 0 ? 1e-3f : 3.f);
    h[5] = 1.00390625f;  // exactly half-way between two bf16 values: rounds to even (1.0)
    h[6] = 1.01171875f;  // half-way, rounds up to the even neighbour
    CUDA_CHECK(cudaMalloc((void**)&d_g, n * 4));
    CUDA_CHECK(cudaMalloc((void**)&d_back, n * 4));
    CUDA_CHECK(cudaMalloc((void**)&d_b, padded * 2));
    CUDA_CHECK(cudaMemcpy(d_g, h, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_b, 0xff, padded * 2));  // garbage the padding must overwrite
    launch(grad_to_bf16, dim3(3), dim3(256), 0, (cudaStream_t)0, d_b, (const float*)d_g, n, padded);
    uint16_t* b = (uint16_t*)malloc(padded * 2);
    CUDA_CHECK(cudaMemcpy(b, d_b, padded * 2, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += b[i] != ref_bf16(h[i]);
    for (size_t i = n; i < padded; i++) bad += b[i] != 0;
    CHECK(bad == 0, "grad_to_bf16: %d of %zu values differ from round-to-nearest-even / zero padding", bad, padded);
    CHECK(b[5] == 0x3f80 && b[6] == 0x3f82, "grad_to_bf16: ties to even: got %04x %04x, want 3f80 3f82", b[5], b[6]);
    // the way back: the bf16 "sum over 3 ranks" times 1/3
    const float scale = 1.f / 3.f;
    launch(grad_from_bf16, dim3(2), dim3(256), 0, (cudaStream_t)0, d_back, (const __nv_bfloat16*)d_b, n, scale);
    float *back = (float*)malloc(n * 4), *want = (float*)malloc(n * 4);
    CUDA_CHECK(cudaMemcpy(back, d_back, n * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) want[i] = ref_from_bf16(ref_bf16(h[i])) * scale;
    check_close("grad_from_bf16 (x 1/3)", back, want, n, 0.f, 0.f);
    free(h), free(b), free(back), free(want);
    cudaFree(d_g), cudaFree(d_back), cudaFree(d_b);
}

static void test_sumsq_add(void) {
    const int n = 700;
    float h[700], *d_p, *d_acc, acc = 2.5f;
    double want = 2.5;
    for (int i = 0; i < n; i++) h[i] = fabsf(urand()), want += h[i];
    CUDA_CHECK(cudaMalloc((void**)&d_p, n * 4));
    CUDA_CHECK(cudaMalloc((void**)&d_acc, 4));
    CUDA_CHECK(cudaMemcpy(d_p, h, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_acc, &acc, 4, cudaMemcpyHostToDevice));
    launch(accumulate_sum, dim3(1), dim3(256), 0, (cudaStream_t)0, d_acc, (const float*)d_p, n);
    float got;
    CUDA_CHECK(cudaMemcpy(&got, d_acc, 4, cudaMemcpyDeviceToHost));
    CHECK(fabs(got - want) <= 1e-5 * want, "accumulate_sum: acc %.7g, want %.7g", got, want);
    cudaFree(d_p), cudaFree(d_acc);
}

// adamw_update on [lo, lo + n) of a slab through base = lo equals the whole slab's update there
static void test_adamw_base(void) {
    const size_t N = 4096, lo = 1028, n = 1500, n_decay = 2000;
    float* h[4];  // master, grad, m, v
    for (int k = 0; k < 4; k++) {
        h[k] = (float*)malloc(N * 4);
        for (size_t i = 0; i < N; i++) h[k][i] = k == 3 ? fabsf(urand()) * 1e-3f : urand();
    }
    float *d[2][4], norm = 3.f, *d_norm;  // d[0]: the whole slab; d[1]: a shard holding [lo, lo + n)
    floatX* dw[2];
    CUDA_CHECK(cudaMalloc((void**)&d_norm, 4));
    CUDA_CHECK(cudaMemcpy(d_norm, &norm, 4, cudaMemcpyHostToDevice));
    for (int s = 0; s < 2; s++) {
        CUDA_CHECK(cudaMalloc((void**)&dw[s], N * sizeof(floatX)));
        CUDA_CHECK(cudaMemset(dw[s], 0, N * sizeof(floatX)));
        for (int k = 0; k < 4; k++) {
            size_t len = s == 0 || k == 1 ? N : n;  // the shard's gradient stays whole (as in training)
            CUDA_CHECK(cudaMalloc((void**)&d[s][k], len * 4));
            CUDA_CHECK(cudaMemcpy(d[s][k], h[k] + (len == N ? 0 : lo), len * 4, cudaMemcpyHostToDevice));
        }
    }
    launch(adamw_update, dim3(4), dim3(256), 0, (cudaStream_t)0, d[0][0], dw[0], (const float*)d[0][1], d[0][2],
           d[0][3], N, n_decay, 1e-3f, 0.9f, 0.98f, 1e-6f, 0.01f, 0.1f, 0.02f, (const float*)d_norm, 1.f, 7u,
           (size_t)0);
    launch(adamw_update, dim3(3), dim3(256), 0, (cudaStream_t)0, d[1][0], dw[1] + lo, (const float*)d[1][1] + lo,
           d[1][2], d[1][3], n, n_decay - lo, 1e-3f, 0.9f, 0.98f, 1e-6f, 0.01f, 0.1f, 0.02f, (const float*)d_norm, 1.f,
           7u, lo);
    int bad = 0;
    float *a = (float*)malloc(N * 4), *b = (float*)malloc(n * 4);
    for (int k = 0; k < 4; k++) {
        if (k == 1) continue;
        CUDA_CHECK(cudaMemcpy(a, d[0][k], N * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(b, d[1][k], n * 4, cudaMemcpyDeviceToHost));
        bad += memcmp(a + lo, b, n * 4) != 0;
    }
    floatX *wa = (floatX*)malloc(N * sizeof(floatX)), *wb = (floatX*)malloc(N * sizeof(floatX));
    CUDA_CHECK(cudaMemcpy(wa, dw[0], N * sizeof(floatX), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(wb, dw[1], N * sizeof(floatX), cudaMemcpyDeviceToHost));
    int wbad = memcmp(wa + lo, wb + lo, n * sizeof(floatX)) != 0;
    CHECK(bad == 0 && wbad == 0, "adamw_update on a piece with base %zu: %d fp32 arrays and %d floatX range differ", lo,
          bad, wbad);
    free(a), free(b), free(wa), free(wb);
    for (int k = 0; k < 4; k++) free(h[k]);
    for (int s = 0; s < 2; s++) {
        cudaFree(dw[s]);
        for (int k = 0; k < 4; k++) cudaFree(d[s][k]);
    }
    cudaFree(d_norm);
}

// grad_reduce_layout on bert-base's and tiny's slabs, for several world sizes and bucket sizes
static void test_layout(const char* preset, int world, size_t bucket_elems, int zero) {
    BertConfig cfg;
    bert_preset(preset, &cfg);
    if (!strcmp(preset, "tiny") || cfg.vocab_size <= 0) cfg.vocab_size = strcmp(preset, "tiny") ? 30522 : 211;
    BertParams p;
    bert_params_build(&p, &cfg);
    int E = bert_grad_ready_count(&p);
    size_t ready_lo[64];
    for (int k = 0; k < E; k++) ready_lo[k] = bert_grad_ready_lo(&p, k);
    Comm c;
    memset(&c, 0, sizeof c);
    c.world = world;
    GradReduce g;
    int ok_cover = 1, ok_ready = 1, ok_align = 1, ok_order = 1, ok_piece = 1;
    size_t states[2] = {0, 0};
    for (int r = 0; r < world && r < 2; r++) {
        c.rank = r;
        grad_reduce_layout(&g, &c, p.numel, p.n_decay, ready_lo, E, bucket_elems, zero, 1);
        unsigned char* seen = (unsigned char*)calloc(p.numel, 1);
        size_t A = 4 * (size_t)world;
        for (int i = 0; i < g.n; i++) {
            const GradBucket* b = &g.b[i];
            for (size_t j = b->lo; j < b->lo + b->n && j < p.numel; j++) seen[j]++;
            if (b->lo + b->n > p.numel) ok_cover = 0;
            // final at its event: inside [ready_lo, n_decay) unless it is the last event
            if (b->event < E - 1 && (b->lo < ready_lo[b->event] || b->lo + b->n > p.n_decay)) ok_ready = 0;
            if (b->lo + b->n != p.numel && b->n % A) ok_align = 0;
            if (i && b->event < g.b[i - 1].event) ok_order = 0;
            if (b->piece % 4 || (size_t)world * b->piece < b->n || (size_t)world * b->piece >= b->n + 5 * A)
                ok_piece = 0;
            size_t off, n, sum = 0;
            for (int q = 0; q < world; q++) {
                grad_reduce_piece(&g, b, q, &off, &n);
                if (n && (off != b->lo + (size_t)q * b->piece || n % 4)) ok_piece = 0;
                sum += n;
            }
            if (sum != b->n) ok_piece = 0;
        }
        for (size_t j = 0; j < p.numel; j++) ok_cover &= seen[j] == 1;
        free(seen);
        states[r] = g.state_numel;
        if (r == 0) {
            CHECK(ok_cover && ok_ready && ok_align && ok_order && ok_piece,
                  "%s, world %d, buckets of %zu, zero %d: cover %d, final at its event %d, multiple of 4 world %d, "
                  "launch order %d, pieces %d",
                  preset, world, bucket_elems, zero, ok_cover, ok_ready, ok_align, ok_order, ok_piece);
            size_t want = zero ? p.numel / world : p.numel;
            CHECK(g.state_numel >= want && g.state_numel <= want + (size_t)g.n * 8,
                  "%s, world %d, zero %d: the shard holds %zu of %zu elements (want about %zu)", preset, world, zero,
                  g.state_numel, p.numel, want);
            CHECK(!zero || g.slack < 5 * A, "%s, world %d: slack %zu (want < %zu)", preset, world, g.slack, 5 * A);
            CHECK(!zero ? g.slack == 0 : 1, "no slack without ZeRO");
            if (!strcmp(preset, "bert-base") && world == 2 && bucket_elems == (25u << 20) / 4 && zero)
                printf("bert-base, world 2, 25 MB buckets: %d buckets, shard %zu of %zu, slack %zu, stage %zu\n", g.n,
                       g.state_numel, p.numel, g.slack, g.stage_elems);
        }
        grad_reduce_free(&g);
    }
    if (world > 1) CHECK(states[0] == states[1], "the shard size is the same on every rank");
    bert_params_free(&p);
}

int main(void) {
    test_casts();
    test_sumsq_add();
    test_adamw_base();
    const size_t mb25 = (25u << 20) / 4;
    int worlds[] = {1, 2, 3, 8, 256};
    for (int z = 0; z < 2; z++)
        for (int i = 0; i < 5; i++) {
            test_layout("bert-base", worlds[i], mb25, z);
            test_layout("tiny", worlds[i], 64, z);
            test_layout("tiny", worlds[i], 1000, z);
        }
    test_layout("tiny", 3, 1, 1);  // the smallest buckets allowed
    return test_summary();
}
