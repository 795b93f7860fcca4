// bench_matmul.cu: the matmuls of one training step, each timed with the trainer's own cuBLASLt plan (the
// algorithm blas_plan takes: the heuristic's first) and with every other algorithm the heuristic proposes for
// the same descriptors, so that one run shows how far each shape is from the GPU's peak and how much of the
// step's matmul time another choice of algorithm would save.
//
//   build/gpu/bench_matmul [--preset bert-base] [--seq 512] [--batch B] [--algos 16] [--iters 10] [--out TABLE]
//   build/gpu/bench_matmul --tune DIR/matmul_algos.txt --out TABLE [--algos 16] [--iters 10]
//   build/bench_matmul --tiny          the CPU build's smoke test (the tiny preset, B=4, T=32, one iteration)
//
// The shapes are not listed here by hand: the program allocates the model at B rows (default: the largest whose
// bert_mem_plan fits the free memory less the trainer's reserve, 5% of the device and at least 1 GiB), runs one
// forward and backward on a synthetic batch (full rows, 15% of the tokens masked), and reads back the plans that
// step made in the model's Blas, each with the number of calls the step made of it. It then frees the model,
// allocates operands for the largest plan, and times every plan: `iters` calls after 2 warm-up calls, CUDA events
// around them. Per plan it prints the shape (cuBLASLt's column-major m x n x k; the trainer's row-major view is in
// kernels.cuh, blas_matmul), the calls per step, ms and TFLOP/s (2 m n k per call) of the trainer's algorithm
// ("own") and of the fastest other one offered when it is faster ("#r": the heuristic's rank r; else "own" again),
// and both times the calls per step; then their sums (the step's matmul time by this
// count, to hold against `./trainer --bench`'s "matmuls" phase) and one line `bench-matmul-result ...`.
// With --tune TABLE the shapes come from an algorithm table instead (kernels.cuh, blas_table_read): the
// DIR/matmul_algos.txt a training run (or `./trainer --bench --out DIR`) wrote, so they are exactly that run's,
// micro-batch included, and "own" is the table's algorithm. --out TABLE writes a table with the fastest algorithm
// of each shape (a faster one is timed a second time, against the own one again, and kept only if it wins again),
// for `./trainer --matmul-algos TABLE`; the trainer otherwise runs the heuristic's first, the same on every rank
// and every run, and with a table its algorithms, the same on every rank and every run too.
#include "../model.h"
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define BENCH_MAX_ALGOS 32

static int bench_masked(int B, int T) { return (int)(0.15 * B * T) + 1; }  // 15% of the tokens, at least one

// one step's forward and backward on a synthetic batch of B full rows of T tokens, M of them masked: leaves in
// m->blas the plans of every matmul the step ran, with their call counts.
static void run_one_step(BertModel* m, int B, int T, int M, uint64_t seed) {
    int N = B * T, V = m->cfg.vocab_size;
    std::vector<int> tok(N), lo(N), hi(N), pos(M), lab(M);
    for (int n = 0; n < N; n++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tok[n] = (int)((seed >> 33) % V);
        lo[n] = 0, hi[n] = T;  // one sample per row: every token attends to keys [0, T)
    }
    for (int i = 0; i < M; i++) pos[i] = (int)((long long)i * N / M), lab[i] = tok[pos[i]];
    int* d;
    CUDA_CHECK(cudaMalloc((void**)&d, (3 * (size_t)N + 2 * M) * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(d, tok.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d + N, lo.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d + 2 * N, hi.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d + 3 * N, pos.data(), M * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d + 3 * N + M, lab.data(), M * sizeof(int), cudaMemcpyHostToDevice));
    BertBatch bt = {d, NULL, d + N, d + 2 * N, d + 3 * N, d + 3 * N + M, B, T, M};
    bert_forward(m, &bt, 1.f / M);
    bert_backward(m, &bt);
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    cudaFree(d);
}

// time_plan: ms per call of plan p with algorithm algo (NULL: the plan's own), on operands A, B and D (D also C
// when the step gave it a C, beta 1) and bias; `iters` calls timed after 2 warm-up calls. The plan's own algorithm
// is swapped out for the run and put back.
static float time_plan(Blas* bl, MatmulPlan* p, const cublasLtMatmulAlgo_t* algo, const void* A, const void* B, void* D,
                       void* bias, int iters, cudaEvent_t e0, cudaEvent_t e1) {
    MatmulPlan saved = *p;
    if (algo) p->algo = *algo, p->has_algo = 1;
    int acc = p->acc_calls > 0;
    for (int i = 0; i < 2 + iters; i++) {
        if (i == 2) CUDA_CHECK(cudaEventRecord(e0, 0));
        blas_matmul(bl, 0, p->ta, p->tb, p->m, p->n, p->k, A, p->lda, B, p->ldb, D, p->ldd, p->cd, acc ? D : NULL,
                    acc ? 1.f : 0.f, p->epi, bias);
    }
    CUDA_CHECK(cudaEventRecord(e1, 0));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaGetLastError());
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    p->algo = saved.algo, p->has_algo = saved.has_algo, p->calls = saved.calls, p->acc_calls = saved.acc_calls;
    return ms / iters;
}

// model_shapes: the plans one training step of the preset at B rows of T makes (B 0: the largest whose
// bert_mem_plan fits the free memory less the trainer's reserve, as the trainer's planner; written back). 0, or
// the exit code after a message.
static int model_shapes(const char* preset, int T, int* Bp, std::vector<MatmulPlan>* shapes) {
    int B = *Bp;
    BertConfig cfg;
    if (!bert_preset(preset, &cfg)) {
        fprintf(stderr, "bench_matmul: --preset %s: no such preset (bert-base, bert-large, tiny, ...)\n", preset);
        return 2;
    }
    if (T > cfg.max_position) {
        fprintf(stderr, "bench_matmul: --seq %d: more than the preset's %d positions\n", T, cfg.max_position);
        return 2;
    }
    size_t free_b, total_b;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    size_t reserve = total_b / 20 > ((size_t)1 << 30) ? total_b / 20 : ((size_t)1 << 30);
    size_t budget = free_b > reserve ? free_b - reserve : 0;
    if (!B) {  // the largest B whose plan fits (bisection, as the trainer's planner)
        int lo = 0, hi = 1;
        while (bert_mem_plan(&cfg, hi, T, bench_masked(hi, T), sizeof(floatX)).total <= budget && hi < (1 << 20))
            lo = hi, hi *= 2;
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2;
            if (bert_mem_plan(&cfg, mid, T, bench_masked(mid, T), sizeof(floatX)).total <= budget)
                lo = mid;
            else
                hi = mid;
        }
        if (!lo) {
            fprintf(stderr, "bench_matmul: not even B = 1 fits in %.2f GiB free\n", free_b / 1073741824.0);
            return 1;
        }
        B = lo;
    }
    int masked = bench_masked(B, T);
    BertModel m;
    if (!bert_alloc(&m, &cfg, B, T, masked, (cudaStream_t)0)) return 1;
    std::vector<float> w(m.p.numel);
    bert_init_host(&m.p, w.data(), 1234);
    bert_set_params(&m, w.data());
    run_one_step(&m, B, T, masked, 99);
    shapes->assign(m.blas.plan, m.blas.plan + m.blas.n);
    bert_free(&m);
    *Bp = B;
    return 0;
}

static const char* plan_kind(const MatmulPlan* p) {  // the trainer's three matmul wrappers, told apart by layout
    if (p->ta && !p->tb) return "forward";
    if (!p->ta && !p->tb) return "d input";
    return "d weight";
}
static const char* plan_epi(const MatmulPlan* p) {
    return p->epi == BLAS_EPI_BIAS ? "bias" : p->epi == BLAS_EPI_BGRADB ? "bgradb" : p->acc_calls ? "+= C" : "-";
}

int main(int argc, char** argv) {
    const char *preset = "bert-base", *tune = NULL, *out = NULL;
    int T = 512, B = 0, n_algos = 16, iters = 10, tiny = 0;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--tiny"))
            tiny = 1;
        else if (!strcmp(a, "--preset") && has)
            preset = argv[++i];
        else if (!strcmp(a, "--seq") && has && atoi(argv[i + 1]) > 0)
            T = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && has && atoi(argv[i + 1]) > 0)
            B = atoi(argv[++i]);
        else if (!strcmp(a, "--algos") && has && atoi(argv[i + 1]) > 0 && atoi(argv[i + 1]) <= BENCH_MAX_ALGOS)
            n_algos = atoi(argv[++i]);
        else if (!strcmp(a, "--iters") && has && atoi(argv[i + 1]) > 0)
            iters = atoi(argv[++i]);
        else if (!strcmp(a, "--tune") && has)
            tune = argv[++i];
        else if (!strcmp(a, "--out") && has)
            out = argv[++i];
        else {
            fprintf(stderr,
                    "bench_matmul: unknown or incomplete option '%s' (expected --preset NAME, --seq T >= 1, --batch B "
                    ">= 1, --algos 1..%d, --iters N >= 1, --tune TABLE, --out TABLE, --tiny)\n",
                    a, BENCH_MAX_ALGOS);
            return 2;
        }
    }
    if (tiny) preset = "tiny", T = 32, B = B ? B : 4, iters = 1;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    double peak = device_peak_tflops(prop.name);
    static BlasTable in;  // --tune's table (static: 512 entries)
    std::vector<MatmulPlan> shapes;
    size_t ws = BERT_CUBLAS_WORKSPACE;  // the trainer's workspace (bert_mem_plan)
    char what[256];
    if (tune) {  // 1. the shapes (and their algorithms) of a run's table
        if (!blas_table_read("bench_matmul: --tune", tune, &in)) return 2;
        if (strcmp(in.device, prop.name) || in.version != (long long)cublasLtGetVersion()) {
            fprintf(stderr,
                    "bench_matmul: --tune %s: recorded on %s with cuBLASLt %lld; this is %s with cuBLASLt %lld\n", tune,
                    in.device, in.version, prop.name, (long long)cublasLtGetVersion());
            return 2;
        }
        for (int i = 0; i < in.n; i++) {
            const BlasTableEntry* e = &in.e[i];
            MatmulPlan p;
            memset(&p, 0, sizeof p);
            p.ta = e->ta, p.tb = e->tb, p.m = e->m, p.n = e->n, p.k = e->k, p.lda = e->lda, p.ldb = e->ldb;
            p.ldd = e->ldd, p.epi = e->epi, p.ab = (cudaDataType)e->ab, p.cd = (cudaDataType)e->cd;
            p.calls = e->calls, p.acc_calls = e->acc ? e->calls : 0;
            shapes.push_back(p);
        }
        snprintf(what, sizeof what, "the %d shapes of %s", in.n, tune);
    } else {  // 1. one step of the model at B: the plans it makes, with their calls
        int rc = model_shapes(preset, T, &B, &shapes);
        if (rc) return rc;
        snprintf(what, sizeof what, "%s T=%d B=%d (N = %d rows, M = %d masked), %d matmul shapes in a step", preset, T,
                 B, B * T, bench_masked(B, T), (int)shapes.size());
    }
    int np = (int)shapes.size();

    // 2. operands for the largest plan, and a fresh Blas with the trainer's workspace
    size_t a_bytes = 0, b_bytes = 0, d_bytes = 0, bias_bytes = 0;
    for (const MatmulPlan& p : shapes) {
        size_t ab = sizeof(floatX), cd = p.cd == CUDA_R_32F ? 4 : 2;
        a_bytes = std::max(a_bytes, (size_t)p.lda * (p.ta ? p.m : p.k) * ab);
        b_bytes = std::max(b_bytes, (size_t)p.ldb * (p.tb ? p.k : p.n) * ab);
        d_bytes = std::max(d_bytes, (size_t)p.ldd * p.n * cd);
        bias_bytes = std::max(bias_bytes, (size_t)std::max(p.m, p.n) * 4);
    }
    void *A, *Bm, *D, *bias;
    CUDA_CHECK(cudaMalloc(&A, a_bytes));
    CUDA_CHECK(cudaMalloc(&Bm, b_bytes));
    CUDA_CHECK(cudaMalloc(&D, d_bytes));
    CUDA_CHECK(cudaMalloc(&bias, bias_bytes));
    {  // operands of small random values (bf16 or fp32 alike: the bytes of floats in [-1, 1) halves)
        std::vector<floatX> h(std::max(a_bytes, b_bytes) / sizeof(floatX));
        uint64_t s = 7;
        for (size_t i = 0; i < h.size(); i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = (floatX)((float)((s >> 40) & 0xffff) / 65536.f - 0.5f);
        }
        CUDA_CHECK(cudaMemcpy(A, h.data(), a_bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(Bm, h.data(), b_bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(D, 0, d_bytes));
        CUDA_CHECK(cudaMemset(bias, 0, bias_bytes));
    }
    Blas bl;
    blas_init(&bl, ws);
    bl.table = tune ? &in : NULL;  // "own": --tune's algorithm, else the heuristic's first (as the trainer)
    static BlasTable best_table;   // --out: the fastest of each shape
    snprintf(best_table.device, sizeof best_table.device, "%s", prop.name);
    best_table.version = (long long)cublasLtGetVersion();
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));

    // 3. every plan: the trainer's algorithm, then each one the heuristic offers
    printf("bench_matmul: %s, %s storage, %s, up to %d algorithms each, %d timed calls\n", prop.name, FLOATX_NAME, what,
           n_algos, iters);
    printf("%2s %-9s %-6s %6s %7s %6s %5s | %9s %8s %6s | %5s %4s %9s %8s %6s | %10s %10s\n", "#", "kind", "epi", "m",
           "n", "k", "calls", "ms", "TFLOP/s", "%peak", "algos", "best", "best ms", "TFLOP/s", "gain", "step ms",
           "best step");
    double step_ms = 0, best_step_ms = 0, flops_step = 0;
    long long calls = 0;
    for (int i = 0; i < np; i++) {
        MatmulPlan* p = blas_plan(&bl, shapes[i].ta, shapes[i].tb, shapes[i].m, shapes[i].n, shapes[i].k, shapes[i].lda,
                                  shapes[i].ldb, shapes[i].ldd, shapes[i].ab, shapes[i].cd, shapes[i].epi);
        p->calls = shapes[i].calls, p->acc_calls = shapes[i].acc_calls;
        double flops = 2.0 * p->m * p->n * (double)p->k;
        float ms = time_plan(&bl, p, NULL, A, Bm, D, bias, iters, e0, e1), best = ms;
        cublasLtMatmulHeuristicResult_t res[BENCH_MAX_ALGOS];
        int found = blas_heuristic(&bl, p, n_algos, res);
        int best_j = 0;  // 0: the trainer's own algorithm; else the heuristic's rank of a faster one
        for (int j = 0; j < found; j++) {
            if (res[j].state != CUBLAS_STATUS_SUCCESS || res[j].workspaceSize > bl.workspace_size) continue;
            if (p->has_algo && !memcmp(&res[j].algo, &p->algo, sizeof(p->algo))) continue;  // the trainer's: timed
            float t = time_plan(&bl, p, &res[j].algo, A, Bm, D, bias, iters, e0, e1);
            if (t < best) best = t, best_j = j + 1;
        }
        if (best_j) {  // a faster one, timed again against the own one: it must win twice
            float ms2 = time_plan(&bl, p, NULL, A, Bm, D, bias, iters, e0, e1);
            float best2 = time_plan(&bl, p, &res[best_j - 1].algo, A, Bm, D, bias, iters, e0, e1);
            ms = std::min(ms, ms2), best = std::min(best, best2);
            if (best2 >= ms2) best_j = 0, best = ms;
        }
        if (p->has_algo) {  // the shape and its fastest algorithm, for --out
            Blas one = bl;
            one.n = 1, one.plan[0] = *p;
            if (best_j) one.plan[0].algo = res[best_j - 1].algo;
            blas_table_add(&best_table, &one, 1);
            best_table.e[best_table.n - 1].ms = best;
        }
        double tf = flops / ms / 1e9, tf_best = flops / best / 1e9;
        char pk[16] = "n/a";
        if (peak > 0) snprintf(pk, sizeof pk, "%.1f%%", 100 * tf / peak);
        char bj[16] = "own";
        if (best_j) snprintf(bj, sizeof bj, "#%d", best_j);
        printf("%2d %-9s %-6s %6d %7d %6d %5lld | %9.3f %8.1f %6s | %5d %4s %9.3f %8.1f %5.1f%% | %10.3f %10.3f\n",
               i + 1, plan_kind(p), plan_epi(p), p->m, p->n, p->k, p->calls, ms, tf, pk, found, bj, best, tf_best,
               100.0 * (ms - best) / ms, ms * p->calls, best * p->calls);
        step_ms += ms * p->calls, best_step_ms += best * p->calls, flops_step += flops * p->calls, calls += p->calls;
    }
    printf(
        "a step's %lld matmuls (%.1f TFLOP): %.3f ms with the trainer's algorithms (%.1f TFLOP/s), %.3f ms with the "
        "fastest offered for each shape (%.1f%% less)\n",
        calls, flops_step / 1e12, step_ms, flops_step / step_ms / 1e9, best_step_ms,
        100.0 * (step_ms - best_step_ms) / step_ms);
    char source[1100];
    if (tune)
        snprintf(source, sizeof source, "table=%s", tune);
    else
        snprintf(source, sizeof source, "preset=%s T=%d batch=%d", preset, T, B);
    printf("bench-matmul-result %s matmuls=%lld step_ms=%.3f best_step_ms=%.3f tflops=%.1f\n", source, calls, step_ms,
           best_step_ms, flops_step / step_ms / 1e9);
    if (out) {
        if (!blas_table_write(&best_table, out)) return 1;
        printf("bench_matmul: wrote %s, the fastest algorithm of each of its %d shapes (./trainer --matmul-algos %s)\n",
               out, best_table.n, out);
    }
    blas_free(&bl);
    cudaFree(A), cudaFree(Bm), cudaFree(D), cudaFree(bias);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 0;
}
