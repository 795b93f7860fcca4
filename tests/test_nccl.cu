// tests/test_nccl.cu: the NCCL collectives mlm.c uses, between real processes.
//
// The parent makes a unique id, then forks the ranks; each child joins with ncclCommInitRank, runs
// the collectives, checks what it got against plain loops, and sends its pass/fail counts (and a
// hash of the results every rank must share, and a measured time) back through a pipe; the parent
// adds them up, checks the exit statuses and prints the summary.
// Covered: AllReduce (sum, avg, max, min; in and out of place), ReduceScatter and AllGather (in and
// out of place), Broadcast/Bcast, Reduce; float32 and bf16 (int32/int64 once); odd counts and
// counts larger than the shared-memory chunk; groups; ncclSend/ncclRecv in groups (an all-to-all, a
// ring shift); two ranks as threads of one process; and on
// the CPU emulation also the failures:
// a rank killed with SIGKILL in the middle (also under a collective on a stream: the stream stays busy until
// ncclCommAbort, as NCCL's kernel does), a rank that exits without ncclCommDestroy, a rank that
// stays away (timeout), a rank that never joins, ncclCommAbort from another thread, and ranks
// that call mismatched collectives or mismatched ncclSend/ncclRecv counts (the error after a peer's exit or
// death names that peer), and the bytes each rank sent (NCCL_EMU_STATS). The emulation's sums are checked
// bitwise against a plain-C model of NCCL's ring (each piece summed around the ring, rounded to the datatype
// at every hop: bf16 too), and for bf16 with 3+ ranks the model must differ from a sum rounded once, so that
// the per-hop rounding is really checked. Non-blocking communicators (config.blocking = 0): init and calls
// that return ncclInProgress and complete as ncclCommGetAsyncError polls them (both builds); on the emulation
// also a peer stopped with SIGSTOP (the call stays in progress; ncclCommAbort ends it), a rank that never joins
// a non-blocking init (abort ends it), and a killed peer.
//
// It also builds with nvcc against the real NCCL (nvcc -std=c++17 -arch=sm_90 tests/test_nccl.cu
// -lnccl). There the results are compared with a tolerance (NCCL sums in ring order, not rank
// order), each rank takes GPU rank % device count, the failure cases are skipped (real NCCL would
// hang in them), and a group of N ranks is skipped, with a line saying so, when there are fewer
// than N GPUs: real NCCL refuses two ranks of one communicator on the same device
// (ncclCommInitRank returns ncclInvalidUsage). A communicator of one rank runs on any GPU, so the
// collectives are also checked on one rank, which every machine can run.
#include <cuda_runtime.h>
#include <nccl.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testing.h"

#ifdef __CUDACC__
#define EMULATION 0  // the real NCCL
#else
#define EMULATION 1  // the CPU build (cpu/nccl.cpp): sums in a known ring order, so results are exact
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

// ---------------------------------------------------------------------------------------------
// Running ranks as child processes

// What a child sends back to the parent.
struct Report {
    int rank, passed, failed, done;
    double seconds;  // a time the scenario measured (< 0: none)
    uint64_t hash;   // hash of the results that must be identical on every rank (0: none)
};

typedef void (*ChildFn)(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep);

#define MAX_FORKS 8

// run_ranks: make an id, fork nforks children as ranks 0..nforks-1 of an nranks communicator and
// collect their reports (reps[r].done = 0 when rank r sent none) and wait statuses. A child still
// running after limit_s seconds is killed (status then says SIGKILL and its report is missing).
static void run_ranks(int nranks, int nforks, ChildFn fn, const void* arg, double limit_s, Report* reps,
                      int* statuses) {
    memset(reps, 0, sizeof(Report) * nforks);
    for (int r = 0; r < nforks; r++) statuses[r] = -1;
    ncclUniqueId id;
    ncclResult_t ir = ncclGetUniqueId(&id);
    CHECK(ir == ncclSuccess, "ncclGetUniqueId: %s", ncclGetErrorString(ir));
    int fds[2];
    if (pipe(fds) != 0) {
        CHECK(0, "pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pids[MAX_FORKS];
    for (int r = 0; r < nforks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[0]);
            tests_passed = tests_failed = 0;  // the child counts its own checks
            Report rep;
            memset(&rep, 0, sizeof rep);
            rep.rank = r;
            rep.seconds = -1;
            fn(r, nranks, &id, arg, &rep);
            rep.passed = tests_passed;
            rep.failed = tests_failed;
            rep.done = 1;
            fflush(stdout);
            fflush(stderr);
            ssize_t w = write(fds[1], &rep, sizeof rep);  // < PIPE_BUF: one atomic write
            _exit(w == (ssize_t)sizeof rep ? 0 : 3);
        }
        if (pids[r] < 0) CHECK(0, "fork: %s", strerror(errno));
    }
    close(fds[1]);
    // Read reports until every child has closed the pipe (exited) or the time is up.
    char bytes[sizeof(Report) * MAX_FORKS];
    size_t got = 0;
    double end = now_s() + limit_s;
    while (got < sizeof bytes) {
        double left = end - now_s();
        if (left <= 0) break;
        struct pollfd pfd = {fds[0], POLLIN, 0};
        int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) break;
        ssize_t n = read(fds[0], bytes + got, sizeof bytes - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    for (size_t i = 0; i + sizeof(Report) <= got; i += sizeof(Report)) {
        Report rep;
        memcpy(&rep, bytes + i, sizeof rep);
        if (rep.rank >= 0 && rep.rank < nforks) reps[rep.rank] = rep;
    }
    for (int r = 0; r < nforks; r++) {
        if (pids[r] <= 0) continue;
        int st = 0;
        pid_t w;
        // A child closes the pipe a moment before it can be reaped: poll until the limit.
        while ((w = waitpid(pids[r], &st, WNOHANG)) == 0 && now_s() < end) sleep_s(0.001);
        if (w == 0) {  // still running after the limit: stuck
            CHECK(0, "rank %d of %d still running after %.0f s: killed", r, nranks, limit_s);
            kill(pids[r], SIGKILL);
            w = waitpid(pids[r], &st, 0);
        }
        statuses[r] = w == pids[r] ? st : -1;
    }
}

// absorb: add each child's counts to ours; check it reported and exited normally, except rank
// `killed`, which must have died of SIGKILL (-1: none).
static void absorb(const char* what, int nforks, const Report* reps, const int* statuses, int killed) {
    for (int r = 0; r < nforks; r++) {
        if (r == killed) {
            CHECK(statuses[r] != -1 && WIFSIGNALED(statuses[r]) && WTERMSIG(statuses[r]) == SIGKILL,
                  "%s: rank %d should have died of SIGKILL (status 0x%x)", what, r, statuses[r]);
            continue;
        }
        CHECK(reps[r].done, "%s: rank %d sent no report", what, r);
        CHECK(statuses[r] != -1 && WIFEXITED(statuses[r]) && WEXITSTATUS(statuses[r]) == 0,
              "%s: rank %d did not exit normally (status 0x%x)", what, r, statuses[r]);
        tests_passed += reps[r].passed;
        tests_failed += reps[r].failed;
    }
}

// ---------------------------------------------------------------------------------------------
// Data: inputs, bf16, device buffers

// input_value: rank q's i-th input in [-1, 1), the same in every process.
static float input_value(int q, size_t i, int salt) {
    uint64_t z = (uint64_t)(q + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)salt * 0x94D049BB133111EBull;
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / 16777216.0) * 2.0f - 1.0f;
}

// bf16 <-> float, round to nearest even (what __float2bfloat16 does), written out so that the
// test needs nothing but bytes from the library.
static uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static size_t dt_size(ncclDataType_t dt) { return dt == ncclBfloat16 ? 2 : 4; }
static const char* dt_name(ncclDataType_t dt) { return dt == ncclBfloat16 ? "bf16" : "f32"; }
static float round_to(float x, ncclDataType_t dt) { return dt == ncclBfloat16 ? bf16_to_float(float_to_bf16(x)) : x; }

static void* dev_alloc(size_t bytes) {
    void* p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        printf("cudaMalloc(%zu): %s\n", bytes, cudaGetErrorString(e));
        fflush(stdout);
        _exit(4);
    }
    return p;
}

// upload/download n floats as datatype dt to/from device memory at d.
static void upload(void* d, const float* h, size_t n, ncclDataType_t dt) {
    if (dt == ncclBfloat16) {
        uint16_t* t = (uint16_t*)malloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) t[i] = float_to_bf16(h[i]);
        cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice);
        free(t);
    } else {
        cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice);
    }
}
static void download(float* h, const void* d, size_t n, ncclDataType_t dt) {
    cudaDeviceSynchronize();
    if (dt == ncclBfloat16) {
        uint16_t* t = (uint16_t*)malloc(n * 2 + 2);
        cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < n; i++) h[i] = bf16_to_float(t[i]);
        free(t);
    } else {
        cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost);
    }
}

static uint64_t fnv(uint64_t h, const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// check_result: exact on the emulation (the ring model below), a tolerance on real NCCL.
static void check_result(const char* what, int rank, ncclDataType_t dt, const float* got, const float* want, size_t n) {
    char name[200];
    snprintf(name, sizeof name, "%s %s n=%zu rank %d", what, dt_name(dt), n, rank);
    float tol = EMULATION ? 0.0f : (dt == ncclBfloat16 ? 1e-2f : 1e-5f);
    check_close(name, got, want, n, tol, tol);
}

#define NCCL_OK(call)                                                                                                  \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        CHECK(r_ == ncclSuccess, "rank %d: %s: %s (%s)", rank, #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
    } while (0)

// use_gpu: each rank takes GPU rank % count (on the CPU runtime there is one "device").
static void use_gpu(int rank) {
    int ndev = 1;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) ndev = 1;
    cudaSetDevice(rank % ndev);
}

// ---------------------------------------------------------------------------------------------
// The collectives, checked against plain loops

struct CollArgs {
    const char* chunk_bytes;  // NCCL_EMU_CHUNK_BYTES for the emulation (NULL: its default, 4 MiB)
    const size_t* sizes;
    int nsizes;
};

// State shared by the checks of one (size, datatype): all ranks' inputs, already in the datatype.
struct Case {
    ncclComm_t comm;
    int rank, nranks;
    size_t n;
    ncclDataType_t dt;
    size_t chunk_elems;  // elements of dt in one chunk of the emulation (the ring model's pieces)
    float* x;            // x[q * n + i]: rank q's i-th input
    float *want, *got;   // scratch, nranks * n each
    uint64_t hash;       // of everything that must be the same on all ranks
};

// A plain-C model of NCCL's ring (cpu/nccl.cpp, "The ring's order and rounding"): ring piece r is summed
// x_{r+1} + x_{r+2} + ... + x_r (ranks mod N), each partial sum rounded to the datatype (bf16 at every hop).
// Which piece an element is in: AllReduce cuts each chunk of the emulation (NCCL_EMU_CHUNK_BYTES per rank,
// rounded as emu_chunk_elems does) into N slices, slice r being piece r; ReduceScatter's block r is piece r.

// emu_chunk_elems: elements of datatype dt in one chunk of the emulation (its env_chunk_bytes rule).
static size_t emu_chunk_elems(const char* chunk_env, int nranks, ncclDataType_t dt) {
    size_t chunk = chunk_env ? (size_t)strtoull(chunk_env, NULL, 10) : ((size_t)4 << 20);
    size_t min_chunk = 8 * (size_t)nranks > 1024 ? 8 * (size_t)nranks : 1024;
    if (chunk < min_chunk) chunk = min_chunk;
    return ((chunk + 63) & ~(size_t)63) / dt_size(dt);
}

// ring_piece: the ring piece of element i of an AllReduce of `count` elements (chunks of `per`).
static int ring_piece(size_t i, size_t count, size_t per, int N) {
    size_t off = i / per * per, n = count - off < per ? count - off : per, j = i - off;
    int r = (int)(j * N / n);
    while (r + 1 < N && n * (r + 1) / N <= j) r++;
    while (r > 0 && n * r / N > j) r--;
    return r;
}

// reduce_model: want[i] = the ring's x_{f+1}[base + i] op ... op x_f[base + i] where f is element i's ring
// piece (block >= 0: all elements are ReduceScatter block `block`), rounded to the datatype at every hop,
// ncclAvg's terms first multiplied by 1/N in the datatype, when ring = 1; in rank order 0..N-1 in fp32,
// rounded once (ncclAvg: the sum / N), when ring = 0 (what the emulation did before it followed the ring).
// For `count` elements; x_q is the q-th input of length `len`.
static void reduce_model(const Case* k, const float* x, size_t len, size_t base, size_t count, ncclRedOp_t op,
                         int block, int ring, float* want) {
    int N = k->nranks;
    for (size_t i = 0; i < count; i++) {
        int f = !ring ? 0 : block >= 0 ? (block + 1) % N : (ring_piece(i, count, k->chunk_elems, N) + 1) % N;
        // ncclAvg on the ring: NCCL's PreMulSum, each term times float(1.0 / N) stored in the datatype
        float scale = round_to((float)(1.0 / N), k->dt);
        int premul = ring && op == ncclAvg;
        float a = x[(size_t)f * len + base + i];
        if (premul) a = round_to(a * scale, k->dt);
        for (int hop = 1; hop < N; hop++) {
            float b = x[(size_t)((f + hop) % N) * len + base + i];
            if (premul) b = round_to(b * scale, k->dt);
            if (op == ncclMax)
                a = b > a ? b : a;
            else if (op == ncclMin)
                a = b < a ? b : a;
            else
                a = ring ? round_to(a + b, k->dt) : a + b;
        }
        if (op == ncclAvg && !premul) a = a / (float)N;
        want[i] = round_to(a, k->dt);
    }
}
static void reduce_plain(const Case* k, const float* x, size_t len, size_t base, size_t count, ncclRedOp_t op,
                         float* want) {
    reduce_model(k, x, len, base, count, op, -1, 1, want);
}

// ring_matters: for a bf16 sum of 3+ ranks, some elements of the ring's answer must differ from a sum
// rounded once (else the check of the per-hop rounding could not fail). The count of such elements.
static size_t ring_matters(const Case* k, const float* x, size_t len, size_t count, int block, const float* ring) {
    float* once = (float*)malloc(count * sizeof(float));
    reduce_model(k, x, len, 0, count, ncclSum, block, 0, once);
    size_t differ = 0;
    for (size_t i = 0; i < count; i++) differ += once[i] != ring[i];
    free(once);
    return differ;
}

static void test_allreduce(Case* k, ncclRedOp_t op, int in_place, const char* what) {
    int rank = k->rank;
    size_t n = k->n, bytes = n * dt_size(k->dt);
    void* send = dev_alloc(bytes);
    void* recv = in_place ? send : dev_alloc(bytes);
    upload(send, k->x + (size_t)rank * n, n, k->dt);
    NCCL_OK(ncclAllReduce(send, recv, n, k->dt, op, k->comm, 0));
    download(k->got, recv, n, k->dt);
    reduce_plain(k, k->x, n, 0, n, op, k->want);
    check_result(what, rank, k->dt, k->got, k->want, n);
    if (EMULATION && k->dt == ncclBfloat16 && op == ncclSum && k->nranks >= 3 && n >= 999)
        CHECK(ring_matters(k, k->x, n, n, -1, k->want) > 0,
              "%s bf16 n=%zu: the ring model never differs from one rounding: the check cannot fail", what, n);
    k->hash = fnv(k->hash, k->got, n * sizeof(float));
    if (!in_place) {  // the input must be untouched
        download(k->want, send, n, k->dt);
        CHECK(memcmp(k->want, k->x + (size_t)rank * n, n * sizeof(float)) == 0, "%s: rank %d: sendbuff changed", what,
              rank);
        cudaFree(recv);
    }
    cudaFree(send);
}

// ReduceScatter with recvcount ceil(n / N): rank r gets block r of the sum of all ranks' inputs.
static void test_reducescatter(Case* k, int in_place) {
    int rank = k->rank, N = k->nranks;
    size_t rc = (k->n + N - 1) / N, len = (size_t)N * rc, es = dt_size(k->dt);
    float* mine = (float*)malloc(len * sizeof(float));   // this rank's input
    float* block = (float*)malloc(len * sizeof(float));  // block[q * rc + i]: rank q's input rank * rc + i
    for (size_t j = 0; j < len; j++) mine[j] = round_to(input_value(rank, j, 7), k->dt);
    for (int q = 0; q < N; q++)
        for (size_t i = 0; i < rc; i++) block[q * rc + i] = round_to(input_value(q, rank * rc + i, 7), k->dt);
    void* send = dev_alloc(len * es);
    upload(send, mine, len, k->dt);
    void* recv = in_place ? (char*)send + (size_t)rank * rc * es : dev_alloc(rc * es);
    NCCL_OK(ncclReduceScatter(send, recv, rc, k->dt, ncclSum, k->comm, 0));
    download(k->got, recv, rc, k->dt);
    reduce_model(k, block, rc, 0, rc, ncclSum, rank, 1, k->want);
    check_result(in_place ? "ReduceScatter in-place" : "ReduceScatter", rank, k->dt, k->got, k->want, rc);
    if (EMULATION && k->dt == ncclBfloat16 && N >= 3 && rc >= 333)
        CHECK(ring_matters(k, block, rc, rc, rank, k->want) > 0,
              "ReduceScatter bf16 rc=%zu: the ring model never differs from one rounding", rc);
    if (!in_place) cudaFree(recv);
    cudaFree(send);
    free(mine);
    free(block);
}

// AllGather: everyone gets all ranks' n inputs, in rank order.
static void test_allgather(Case* k, int in_place) {
    int rank = k->rank, N = k->nranks;
    size_t n = k->n, es = dt_size(k->dt), len = (size_t)N * n;
    void* recv = dev_alloc(len * es);
    void* send;
    if (in_place) {
        for (size_t j = 0; j < len; j++) k->want[j] = 1234.0f;  // other ranks' blocks: overwritten
        upload(recv, k->want, len, k->dt);
        send = (char*)recv + (size_t)rank * n * es;
    } else {
        send = dev_alloc(n * es);
    }
    upload(send, k->x + (size_t)rank * n, n, k->dt);
    NCCL_OK(ncclAllGather(send, recv, n, k->dt, k->comm, 0));
    download(k->got, recv, len, k->dt);
    check_result(in_place ? "AllGather in-place" : "AllGather", rank, k->dt, k->got, k->x, len);
    k->hash = fnv(k->hash, k->got, len * sizeof(float));
    if (!in_place) cudaFree(send);
    cudaFree(recv);
}

// Broadcast from the last rank (out of place), and Bcast from rank 0 (in place).
static void test_broadcast(Case* k) {
    int rank = k->rank, N = k->nranks;
    size_t n = k->n, bytes = n * dt_size(k->dt);
    void* send = dev_alloc(bytes);
    void* recv = dev_alloc(bytes);
    upload(send, k->x + (size_t)rank * n, n, k->dt);
    NCCL_OK(ncclBroadcast(send, recv, n, k->dt, N - 1, k->comm, 0));
    download(k->got, recv, n, k->dt);
    check_result("Broadcast root N-1", rank, k->dt, k->got, k->x + (size_t)(N - 1) * n, n);
    k->hash = fnv(k->hash, k->got, n * sizeof(float));
    upload(send, k->x + (size_t)rank * n, n, k->dt);
    NCCL_OK(ncclBcast(send, n, k->dt, 0, k->comm, 0));
    download(k->got, send, n, k->dt);
    check_result("Bcast in-place root 0", rank, k->dt, k->got, k->x, n);
    k->hash = fnv(k->hash, k->got, n * sizeof(float));
    cudaFree(send);
    cudaFree(recv);
}

// Reduce (sum) to rank 1 % N; the other ranks pass recvbuff = NULL, as NCCL allows.
static void test_reduce(Case* k) {
    int rank = k->rank, root = 1 % k->nranks;
    size_t n = k->n, bytes = n * dt_size(k->dt);
    void* send = dev_alloc(bytes);
    void* recv = rank == root ? dev_alloc(bytes) : NULL;
    upload(send, k->x + (size_t)rank * n, n, k->dt);
    NCCL_OK(ncclReduce(send, recv, n, k->dt, ncclSum, root, k->comm, 0));
    if (rank == root) {
        download(k->got, recv, n, k->dt);
        reduce_plain(k, k->x, n, 0, n, ncclSum, k->want);
        check_result("Reduce to root 1", rank, k->dt, k->got, k->want, n);
        cudaFree(recv);
    }
    cudaFree(send);
}

// A group: an AllReduce and an AllGather (nested one level deeper) run at the outer ncclGroupEnd.
static void test_group(Case* k) {
    int rank = k->rank, N = k->nranks;
    size_t n = k->n, es = dt_size(k->dt);
    void* a = dev_alloc(n * es);
    void* g = dev_alloc((size_t)N * n * es);
    void* s = dev_alloc(n * es);
    upload(a, k->x + (size_t)rank * n, n, k->dt);
    upload(s, k->x + (size_t)rank * n, n, k->dt);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(a, a, n, k->dt, ncclSum, k->comm, 0));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllGather(s, g, n, k->dt, k->comm, 0));
    NCCL_OK(ncclGroupEnd());
    NCCL_OK(ncclGroupEnd());
    download(k->got, a, n, k->dt);
    reduce_plain(k, k->x, n, 0, n, ncclSum, k->want);
    check_result("group: AllReduce", rank, k->dt, k->got, k->want, n);
    download(k->got, g, (size_t)N * n, k->dt);
    check_result("group: AllGather", rank, k->dt, k->got, k->x, (size_t)N * n);
    cudaFree(a);
    cudaFree(g);
    cudaFree(s);
}

// ncclSend/ncclRecv in groups (NCCL: the sends from a to b match b's receives from a in call order; a group
// completes as a whole): an all-to-all (rank r sends block q of its input to rank q and receives rank q's block
// r into block q), then a ring shift (all of it to r + 1, from r - 1) in a second group.
static void test_sendrecv(Case* k) {
    int rank = k->rank, N = k->nranks;
    size_t n = k->n, es = dt_size(k->dt), bn = n / N;
    void* send = dev_alloc(n * es);
    void* recv = dev_alloc(n * es);
    upload(send, k->x + (size_t)rank * n, n, k->dt);
    NCCL_OK(ncclGroupStart());
    for (int q = 0; q < N; q++) {
        NCCL_OK(ncclSend((char*)send + q * bn * es, bn, k->dt, q, k->comm, 0));
        NCCL_OK(ncclRecv((char*)recv + q * bn * es, bn, k->dt, q, k->comm, 0));
    }
    NCCL_OK(ncclGroupEnd());
    download(k->got, recv, (size_t)N * bn, k->dt);
    for (int q = 0; q < N; q++)
        for (size_t i = 0; i < bn; i++) k->want[q * bn + i] = k->x[(size_t)q * n + rank * bn + i];
    check_result("all-to-all (ncclSend/ncclRecv)", rank, k->dt, k->got, k->want, (size_t)N * bn);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclRecv(recv, n, k->dt, (rank + N - 1) % N, k->comm, 0));
    NCCL_OK(ncclSend(send, n, k->dt, (rank + 1) % N, k->comm, 0));
    NCCL_OK(ncclGroupEnd());
    download(k->got, recv, n, k->dt);
    check_result("ring shift (ncclSend/ncclRecv)", rank, k->dt, k->got, k->x + (size_t)((rank + N - 1) % N) * n, n);
    cudaFree(send);
    cudaFree(recv);
}

// Integer types, once: int32 sum and int64 max.
static void test_integers(ncclComm_t comm, int rank, int N) {
    enum { n = 1001 };
    int32_t a[n], want_a[n];
    int64_t b[n], want_b[n];
    for (int i = 0; i < n; i++) {
        a[i] = rank * 100000 + i - 500;
        want_a[i] = 0;
        for (int q = 0; q < N; q++) want_a[i] += q * 100000 + i - 500;
        b[i] = ((int64_t)(i % 7 == rank ? 3 : 1) << 40) + rank;
        want_b[i] = INT64_MIN;
        for (int q = 0; q < N; q++) {
            int64_t v = ((int64_t)(i % 7 == q ? 3 : 1) << 40) + q;
            if (v > want_b[i]) want_b[i] = v;
        }
    }
    void* da = dev_alloc(sizeof a);
    void* db = dev_alloc(sizeof b);
    cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    NCCL_OK(ncclAllReduce(da, da, n, ncclInt32, ncclSum, comm, 0));
    NCCL_OK(ncclAllReduce(db, db, n, ncclInt64, ncclMax, comm, 0));
    cudaDeviceSynchronize();
    cudaMemcpy(a, da, sizeof a, cudaMemcpyDeviceToHost);
    cudaMemcpy(b, db, sizeof b, cudaMemcpyDeviceToHost);
    CHECK(memcmp(a, want_a, sizeof a) == 0, "rank %d: int32 AllReduce sum wrong", rank);
    CHECK(memcmp(b, want_b, sizeof b) == 0, "rank %d: int64 AllReduce max wrong", rank);
    cudaFree(da);
    cudaFree(db);
}

static void collectives_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    const CollArgs* a = (const CollArgs*)arg;
    if (a->chunk_bytes) setenv("NCCL_EMU_CHUNK_BYTES", a->chunk_bytes, 1);
    use_gpu(rank);
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
    CHECK(r == ncclSuccess, "rank %d: ncclCommInitRank: %s", rank, ncclGetErrorString(r));
    if (r != ncclSuccess) return;
    int count = -1, me = -1;
    NCCL_OK(ncclCommCount(comm, &count));
    NCCL_OK(ncclCommUserRank(comm, &me));
    CHECK(count == nranks && me == rank, "rank %d: ncclCommCount %d, ncclCommUserRank %d", rank, count, me);

    for (int si = 0; si < a->nsizes; si++) {
        for (int d = 0; d < 2; d++) {
            Case k;
            memset(&k, 0, sizeof k);
            k.comm = comm;
            k.rank = rank;
            k.nranks = nranks;
            k.n = a->sizes[si];
            k.dt = d ? ncclBfloat16 : ncclFloat32;
            k.chunk_elems = emu_chunk_elems(a->chunk_bytes, nranks, k.dt);
            size_t len = (size_t)nranks * k.n;
            k.x = (float*)malloc(len * sizeof(float));
            k.want = (float*)malloc(len * sizeof(float));
            k.got = (float*)malloc(len * sizeof(float));
            for (int q = 0; q < nranks; q++)
                for (size_t i = 0; i < k.n; i++) k.x[q * k.n + i] = round_to(input_value(q, i, si), k.dt);
            int all = k.n < 100000;  // the big counts (slow under ASan) run one variant of each collective
            test_allreduce(&k, ncclSum, 0, "AllReduce sum");
            if (all) test_allreduce(&k, ncclSum, 1, "AllReduce sum in-place");
            test_allreduce(&k, ncclAvg, 1, "AllReduce avg in-place");
            if (all) test_allreduce(&k, ncclMax, 1, "AllReduce max in-place");
            if (all) test_allreduce(&k, ncclMin, 0, "AllReduce min");
            test_reducescatter(&k, 0);
            if (all) test_reducescatter(&k, 1);
            if (all) test_allgather(&k, 0);
            test_allgather(&k, 1);
            test_broadcast(&k);
            if (all) test_reduce(&k);
            if (all) test_group(&k);
            test_sendrecv(&k);
            rep->hash = fnv(rep->hash ? rep->hash : 0xcbf29ce484222325ull, &k.hash, sizeof k.hash);
            free(k.x);
            free(k.want);
            free(k.got);
        }
    }
    test_integers(comm, rank, nranks);
    {
        void* z = dev_alloc(4);
        NCCL_OK(ncclAllReduce(z, z, 0, ncclFloat32, ncclSum, comm, 0));  // count 0: nothing to do
        cudaFree(z);
    }

#if EMULATION
    // Mismatched calls (rank 0 passes another count): every rank must get ncclInvalidUsage, and the
    // communicator stays failed.
    if (nranks > 1) {
        void* b = dev_alloc(101 * 4);
        r = ncclAllReduce(b, b, rank == 0 ? 100 : 101, ncclFloat32, ncclSum, comm, 0);
        CHECK(r == ncclInvalidUsage, "rank %d: mismatched AllReduce gave %s, want invalid usage", rank,
              ncclGetErrorString(r));
        ncclResult_t ae = ncclSuccess;
        NCCL_OK(ncclCommGetAsyncError(comm, &ae));
        CHECK(ae == ncclInvalidUsage, "rank %d: async error after the mismatch: %s", rank, ncclGetErrorString(ae));
        cudaFree(b);
    }
#endif
    NCCL_OK(ncclCommDestroy(comm));
}

// Two ranks as two threads of one process, each with its own communicator.
struct ThreadRank {
    const ncclUniqueId* id;
    int rank, nranks;
    ncclComm_t comm;
    ncclResult_t init, coll;
    float got[1001];
};

static void* thread_rank(void* arg) {
    ThreadRank* t = (ThreadRank*)arg;
    use_gpu(t->rank);
    t->init = ncclCommInitRank(&t->comm, t->nranks, *t->id, t->rank);
    if (t->init != ncclSuccess) return NULL;
    float x[1001];
    for (int i = 0; i < 1001; i++) x[i] = input_value(t->rank, i, 99);
    void* b = dev_alloc(sizeof x);
    upload(b, x, 1001, ncclFloat32);
    t->coll = ncclAllReduce(b, b, 1001, ncclFloat32, ncclSum, t->comm, 0);
    download(t->got, b, 1001, ncclFloat32);
    cudaFree(b);
    return NULL;
}

static void threads_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    ThreadRank t[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        memset(&t[r], 0, sizeof t[r]);
        t[r].id = id;
        t[r].rank = r;
        t[r].nranks = nranks;
        pthread_create(&th[r], NULL, thread_rank, &t[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    float want[1001];
    for (int i = 0; i < 1001; i++) want[i] = input_value(0, i, 99) + input_value(1, i, 99);
    for (int r = 0; r < 2; r++) {
        CHECK(t[r].init == ncclSuccess && t[r].coll == ncclSuccess, "thread rank %d: init %s, AllReduce %s", r,
              ncclGetErrorString(t[r].init), ncclGetErrorString(t[r].coll));
        check_result("AllReduce between threads", r, ncclFloat32, t[r].got, want, 1001);
    }
    CHECK(memcmp(t[0].got, t[1].got, sizeof t[0].got) == 0, "threads: ranks got different bits");
#if EMULATION
    // One thread driving both ranks in one group: refused (the emulation needs a thread per rank),
    // rather than a deadlock.
    if (t[0].comm && t[1].comm) {
        void* b = dev_alloc(16);
        NCCL_OK(ncclGroupStart());
        NCCL_OK(ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, t[0].comm, 0));
        NCCL_OK(ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, t[1].comm, 0));
        ncclResult_t r = ncclGroupEnd();
        CHECK(r == ncclInvalidUsage, "one thread, two ranks in a group: %s, want invalid usage", ncclGetErrorString(r));
        cudaFree(b);
    }
#endif
    for (int r = 0; r < 2; r++)
        if (t[r].comm) NCCL_OK(ncclCommDestroy(t[r].comm));
}

// ---------------------------------------------------------------------------------------------
// Non-blocking communicators (ncclConfig_t.blocking = 0), as NCCL documents them: init and every call
// may return ncclInProgress; ncclCommGetAsyncError then says ncclInProgress until the operation is
// done (ncclSuccess) or failed. The caller polls; this is what comm.h's watchdog does.

// poll_comm: ncclCommGetAsyncError until it is not ncclInProgress, or limit_s passes (then ncclInProgress).
static ncclResult_t poll_comm(ncclComm_t comm, double limit_s) {
    double end = now_s() + limit_s;
    ncclResult_t ae = ncclInProgress;
    while (now_s() < end) {
        if (ncclCommGetAsyncError(comm, &ae) != ncclSuccess) return ncclInternalError;
        if (ae != ncclInProgress) return ae;
        sleep_s(0.0005);
    }
    return ae;
}

static ncclComm_t nonblocking_init(int nranks, const ncclUniqueId* id, int rank, ncclResult_t* first) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    *first = ncclCommInitRankConfig(&comm, nranks, *id, rank, &config);
    return comm;
}

static void nonblocking_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    use_gpu(rank);
    ncclResult_t r0;
    ncclComm_t comm = nonblocking_init(nranks, id, rank, &r0);
    CHECK(r0 == ncclInProgress || r0 == ncclSuccess, "rank %d: non-blocking init gave %s", rank,
          ncclGetErrorString(r0));
    CHECK(comm != NULL, "rank %d: non-blocking init gave no communicator handle", rank);
    if (!comm) return;
#if EMULATION
    CHECK(r0 == ncclInProgress, "rank %d: the emulation's non-blocking init should return ncclInProgress", rank);
#endif
    ncclResult_t r = poll_comm(comm, 20);
    CHECK(r == ncclSuccess, "rank %d: non-blocking init ended with %s", rank, ncclGetErrorString(r));
    if (r != ncclSuccess) return;
    size_t n = 40009;
    float* x = (float*)malloc(n * sizeof(float));
    float* got = (float*)malloc(n * sizeof(float));
    float* want = (float*)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        x[i] = input_value(rank, i, 7);
        float a = input_value(0, i, 7);
        for (int q = 1; q < nranks; q++) a += input_value(q, i, 7);
        want[i] = a;
    }
    void* b = dev_alloc(n * 4);
    for (int round = 0; round < 3; round++) {  // several calls in a row, each polled
        upload(b, x, n, ncclFloat32);
        r = ncclAllReduce(b, b, n, ncclFloat32, ncclSum, comm, 0);
        CHECK(r == ncclInProgress || r == ncclSuccess, "rank %d: non-blocking AllReduce gave %s", rank,
              ncclGetErrorString(r));
        r = poll_comm(comm, 20);
        CHECK(r == ncclSuccess, "rank %d: non-blocking AllReduce ended with %s", rank, ncclGetErrorString(r));
        cudaStreamSynchronize(0);
        download(got, b, n, ncclFloat32);
        check_result("non-blocking AllReduce", rank, ncclFloat32, got, want, n);
    }
    // Two calls queued before one poll (a group of two), then one poll for both.
    void* c = dev_alloc(n * 4);
    upload(b, x, n, ncclFloat32);
    upload(c, x, n, ncclFloat32);
    NCCL_OK(ncclGroupStart());
    ncclAllReduce(b, b, n, ncclFloat32, ncclSum, comm, 0);
    ncclAllReduce(c, c, n, ncclFloat32, ncclSum, comm, 0);
    r = ncclGroupEnd();
    CHECK(r == ncclInProgress || r == ncclSuccess, "rank %d: non-blocking group gave %s", rank, ncclGetErrorString(r));
    r = poll_comm(comm, 20);
    CHECK(r == ncclSuccess, "rank %d: non-blocking group ended with %s", rank, ncclGetErrorString(r));
    cudaStreamSynchronize(0);
    download(got, c, n, ncclFloat32);
    check_result("non-blocking group", rank, ncclFloat32, got, want, n);
    r = ncclCommDestroy(comm);
    CHECK(r == ncclSuccess || r == ncclInProgress, "rank %d: ncclCommDestroy gave %s", rank, ncclGetErrorString(r));
    cudaFree(b);
    cudaFree(c);
    free(x);
    free(got);
    free(want);
    rep->hash = 1;
}

// Non-blocking init with a rank that never comes: it stays ncclInProgress, and ncclCommAbort ends it
// (the watchdog's path at start-up; on real NCCL too, with one GPU: the absent rank needs none).
static void nb_noshow_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    setenv("NCCL_EMU_TIMEOUT_S", "600", 1);
    use_gpu(rank);
    ncclResult_t r0;
    ncclComm_t comm = nonblocking_init(nranks, id, rank, &r0);
    CHECK(r0 == ncclInProgress && comm, "rank %d: non-blocking init gave %s", rank, ncclGetErrorString(r0));
    if (!comm) return;
    ncclResult_t r = poll_comm(comm, 0.5);
    CHECK(r == ncclInProgress, "rank %d: init without rank 2 ended with %s, want still ncclInProgress", rank,
          ncclGetErrorString(r));
    double t0 = now_s();
    NCCL_OK(ncclCommAbort(comm));
    rep->seconds = now_s() - t0;
    CHECK(rep->seconds < (EMULATION ? 0.5 : 10), "rank %d: ncclCommAbort during init took %.3f s", rank, rep->seconds);
}

#if EMULATION
// ---------------------------------------------------------------------------------------------
// Failures (emulation only): every rank must get an error within a bounded time, never hang.

static int is_remote_failure(ncclResult_t r) { return r == ncclRemoteError || r == ncclSystemError; }

static double* shared_kill_time;  // written by the victim just before it kills itself

static void* kill_me_soon(void* arg) {
    (void)arg;
    sleep_s(0.05);
    *(volatile double*)shared_kill_time = now_s();
    kill(getpid(), SIGKILL);
    return NULL;
}

// A rank SIGKILLs itself while all ranks loop over AllReduces of many chunks; the others must fail.
static void killed_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    int victim = *(const int*)arg;
    setenv("NCCL_EMU_CHUNK_BYTES", "4096", 1);  // many chunks: the kill lands inside a collective
    ncclComm_t comm = NULL;
    NCCL_OK(ncclCommInitRank(&comm, nranks, *id, rank));
    if (!comm) return;
    size_t n = 50000;
    void* b = dev_alloc(n * 4);
    cudaMemset(b, 0, n * 4);
    NCCL_OK(ncclAllReduce(b, b, n, ncclFloat32, ncclSum, comm, 0));
    if (rank == victim) {
        pthread_t t;
        pthread_create(&t, NULL, kill_me_soon, NULL);
        for (double end = now_s() + 10; now_s() < end;) ncclAllReduce(b, b, n, ncclFloat32, ncclSum, comm, 0);
        _exit(5);  // not reached: killed
    }
    ncclResult_t r = ncclSuccess;
    double t_err = 0, end = now_s() + 8;
    while (r == ncclSuccess && now_s() < end) {
        r = ncclAllReduce(b, b, n, ncclFloat32, ncclSum, comm, 0);
        t_err = now_s();
    }
    CHECK(is_remote_failure(r), "rank %d: AllReduce with a killed peer gave %s, want a remote/system error", rank,
          ncclGetErrorString(r));
    double kill_time = *(volatile double*)shared_kill_time;
    rep->seconds = t_err - kill_time;
    CHECK(kill_time > 0 && rep->seconds < 2.0, "rank %d: error %.3f s after the peer was killed (want < 2 s)", rank,
          rep->seconds);
    ncclResult_t ae = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(comm, &ae));
    CHECK(is_remote_failure(ae), "rank %d: async error %s, want a remote/system error", rank, ncclGetErrorString(ae));
    double t0 = now_s();
    r = ncclAllReduce(b, b, n, ncclFloat32, ncclSum, comm, 0);
    CHECK(r != ncclSuccess && now_s() - t0 < 0.5, "rank %d: a later AllReduce gave %s after %.3f s", rank,
          ncclGetErrorString(r), now_s() - t0);
    NCCL_OK(ncclCommAbort(comm));
    cudaFree(b);
}

// Rank 1 returns (and its process exits) without ncclCommDestroy; rank 0's next call must fail.
// The parent does not reap rank 1 while rank 0 runs: the emulation must see through the zombie.
static void exit_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    ncclComm_t comm = NULL;
    NCCL_OK(ncclCommInitRank(&comm, nranks, *id, rank));
    if (!comm) return;
    void* b = dev_alloc(1000 * 4);
    cudaMemset(b, 0, 1000 * 4);
    NCCL_OK(ncclAllReduce(b, b, 1000, ncclFloat32, ncclSum, comm, 0));
    if (rank == 1) return;  // exits, communicator not destroyed
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(b, b, 1000, ncclFloat32, ncclSum, comm, 0);
    rep->seconds = now_s() - t0;
    CHECK(is_remote_failure(r), "rank 0: AllReduce after the peer exited gave %s", ncclGetErrorString(r));
    CHECK(rep->seconds < 2.0, "rank 0: took %.3f s to notice the exited peer (want < 2 s)", rep->seconds);
    CHECK(strstr(ncclGetLastError(comm), "rank 1 (pid ") && strstr(ncclGetLastError(comm), "died"),
          "rank 0: the error after the peer's exit must name it, got '%s'", ncclGetLastError(comm));
    ncclResult_t ae = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(comm, &ae));
    CHECK(is_remote_failure(ae), "rank 0: async error %s", ncclGetErrorString(ae));
    NCCL_OK(ncclCommAbort(comm));
    cudaFree(b);
}

// Rank 1 is alive but stays away for 1.5 s; with NCCL_EMU_TIMEOUT_S=1 rank 0 must give up after
// about 1 s, and rank 1's late call must then fail at once.
static void timeout_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    setenv("NCCL_EMU_TIMEOUT_S", "1", 1);
    ncclComm_t comm = NULL;
    NCCL_OK(ncclCommInitRank(&comm, nranks, *id, rank));
    if (!comm) return;
    void* b = dev_alloc(1000 * 4);
    cudaMemset(b, 0, 1000 * 4);
    if (rank == 1) sleep_s(1.5);
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(b, b, 1000, ncclFloat32, ncclSum, comm, 0);
    rep->seconds = now_s() - t0;
    CHECK(is_remote_failure(r), "rank %d: AllReduce with an absent peer gave %s", rank, ncclGetErrorString(r));
    if (rank == 0)
        CHECK(rep->seconds > 0.9 && rep->seconds < 3.0, "rank 0: timed out after %.3f s, want about 1 s", rep->seconds);
    else
        CHECK(rep->seconds < 0.5, "rank 1: late call failed after %.3f s, want at once", rep->seconds);
    NCCL_OK(ncclCommAbort(comm));
    cudaFree(b);
}

// Only 2 of 3 ranks ever call ncclCommInitRank: both must fail after the timeout (1 s).
static void noshow_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    setenv("NCCL_EMU_TIMEOUT_S", "1", 1);
    ncclComm_t comm = NULL;
    double t0 = now_s();
    ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
    rep->seconds = now_s() - t0;
    CHECK(r != ncclSuccess, "rank %d: ncclCommInitRank without rank 2 succeeded", rank);
    CHECK(rep->seconds > 0.9 && rep->seconds < 3.0, "rank %d: init failed after %.3f s, want about 1 s", rank,
          rep->seconds);
    CHECK(comm == NULL, "rank %d: a failed init left a communicator", rank);
}

// ncclCommAbort from another thread must unblock a call waiting for a peer that is late.
struct Blocked {
    ncclComm_t comm;
    void* buf;
    ncclResult_t r;
    double t_end;
};
static void* blocked_allreduce(void* arg) {
    Blocked* b = (Blocked*)arg;
    b->r = ncclAllReduce(b->buf, b->buf, 1000, ncclFloat32, ncclSum, b->comm, 0);
    b->t_end = now_s();
    return NULL;
}

// Point to point on 3 ranks, and the bytes counted (NCCL_EMU_STATS): an all-to-all of 10 floats per pair
// (each rank sends 2 x 40 bytes; to itself nothing) and an AllReduce of 30 floats (2 (P-1)/P x 120 bytes =
// 160) make 240 bytes in 2 calls; then a group whose counts do not match (rank 0 sends 100 floats to rank 1,
// which receives 101) fails on every rank with ncclInvalidUsage and is not counted.
static void p2p_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    char path[256];
    snprintf(path, sizeof path, "%s", (const char*)arg);
    setenv("NCCL_EMU_STATS", path, 1);
    ncclComm_t comm = NULL;
    NCCL_OK(ncclCommInitRank(&comm, nranks, *id, rank));
    float* d = (float*)dev_alloc(101 * 3 * sizeof(float));
    float* e = (float*)dev_alloc(101 * 3 * sizeof(float));
    NCCL_OK(ncclGroupStart());
    for (int q = 0; q < nranks; q++) {
        NCCL_OK(ncclSend(d + q * 10, 10, ncclFloat32, q, comm, 0));
        NCCL_OK(ncclRecv(e + q * 10, 10, ncclFloat32, q, comm, 0));
    }
    NCCL_OK(ncclGroupEnd());
    NCCL_OK(ncclAllReduce(d, d, 30, ncclFloat32, ncclSum, comm, 0));
    NCCL_OK(ncclGroupStart());
    if (rank == 0) NCCL_OK(ncclSend(d, 100, ncclFloat32, 1, comm, 0));
    if (rank == 1) NCCL_OK(ncclRecv(e, 101, ncclFloat32, 0, comm, 0));
    if (rank == 2) NCCL_OK(ncclSend(d, 5, ncclFloat32, 2, comm, 0));
    if (rank == 2) NCCL_OK(ncclRecv(e, 5, ncclFloat32, 2, comm, 0));
    ncclResult_t r = ncclGroupEnd();
    CHECK(r == ncclInvalidUsage, "rank %d: mismatched ncclSend/ncclRecv counts gave %s, want invalid usage", rank,
          ncclGetErrorString(r));
    NCCL_OK(ncclCommDestroy(comm));
    char file[300], line[200] = "", want[200];
    snprintf(file, sizeof file, "%s.%d", path, rank);
    FILE* f = fopen(file, "r");
    if (f && !fgets(line, sizeof line, f)) line[0] = 0;
    if (f) fclose(f);
    snprintf(want, sizeof want, "nccl-emu-stats rank %d nranks 3 calls 2 bytes_sent 240\n", rank);
    CHECK(!strcmp(line, want), "rank %d: NCCL_EMU_STATS wrote '%s', want '%s'", rank, line, want);
    cudaFree(d);
    cudaFree(e);
    rep->seconds = -1;
}

static void abort_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    ncclComm_t comm = NULL;
    NCCL_OK(ncclCommInitRank(&comm, nranks, *id, rank));
    if (!comm) return;
    void* buf = dev_alloc(1000 * 4);
    cudaMemset(buf, 0, 1000 * 4);
    if (rank == 0) {
        Blocked b = {comm, buf, ncclSuccess, 0};
        pthread_t t;
        pthread_create(&t, NULL, blocked_allreduce, &b);
        sleep_s(0.2);
        double t_abort = now_s();
        NCCL_OK(ncclCommAbort(comm));
        pthread_join(t, NULL);
        rep->seconds = b.t_end - t_abort;
        CHECK(b.r != ncclSuccess, "rank 0: the AllReduce interrupted by ncclCommAbort returned success");
        CHECK(rep->seconds < 0.5, "rank 0: the blocked AllReduce returned %.3f s after ncclCommAbort", rep->seconds);
    } else {
        sleep_s(0.6);
        double t0 = now_s();
        ncclResult_t r = ncclAllReduce(buf, buf, 1000, ncclFloat32, ncclSum, comm, 0);
        CHECK(is_remote_failure(r) && now_s() - t0 < 0.5,
              "rank 1: AllReduce after the peer aborted gave %s after %.3f s", ncclGetErrorString(r), now_s() - t0);
        NCCL_OK(ncclCommAbort(comm));
    }
    cudaFree(buf);
}

// Collectives on a stream (cpu/runtime.cpp's stream workers, as NCCL's kernels on the GPU): the call
// returns once enqueued and the result is there after cudaStreamSynchronize; then rank 1 never comes to a
// second AllReduce (NCCL_EMU_TIMEOUT_S=600): rank 0's stream stays busy, and ncclCommAbort makes the
// collective blocked on the stream's worker fail and return, so cudaStreamSynchronize returns.
static void stream_abort_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    setenv("NCCL_EMU_TIMEOUT_S", "600", 1);
    ncclComm_t comm = NULL;
    NCCL_OK(ncclCommInitRank(&comm, nranks, *id, rank));
    if (!comm) return;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t n = 1000;
    float x[1000], got[1000];
    for (size_t i = 0; i < n; i++) x[i] = (float)(rank + 1) * (float)i;
    void* buf = dev_alloc(n * 4);
    CUDA_OK(cudaMemcpy(buf, x, n * 4, cudaMemcpyHostToDevice));
    NCCL_OK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, s));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "rank %d: cudaStreamSynchronize after an AllReduce", rank);
    CUDA_OK(cudaMemcpy(got, buf, n * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != 3.0f * (float)i;
    CHECK(bad == 0, "rank %d: AllReduce on a stream: %d of %zu values wrong", rank, bad, n);
    if (rank == 0) {
        double t0 = now_s();
        ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, s);
        CHECK(r == ncclSuccess && now_s() - t0 < 0.1, "rank 0: an AllReduce on a stream gave %s after %.3f s",
              ncclGetErrorString(r), now_s() - t0);
        sleep_s(0.3);
        CHECK(cudaStreamQuery(s) == cudaErrorNotReady,
              "rank 0: the stream of an AllReduce rank 1 never joined is done");
        ncclResult_t ae = ncclInternalError;
        NCCL_OK(ncclCommGetAsyncError(comm, &ae));
        CHECK(ae == ncclSuccess, "rank 0: ncclCommGetAsyncError with a collective in flight: %s",
              ncclGetErrorString(ae));
        double t_abort = now_s();
        NCCL_OK(ncclCommAbort(comm));
        CHECK(cudaStreamSynchronize(s) == cudaSuccess, "rank 0: cudaStreamSynchronize after ncclCommAbort");
        rep->seconds = now_s() - t_abort;
        CHECK(rep->seconds < 1.0, "rank 0: the stream was done %.3f s after ncclCommAbort", rep->seconds);
    } else {
        sleep_s(0.8);
        NCCL_OK(ncclCommAbort(comm));
    }
    cudaStreamDestroy(s);
    cudaFree(buf);
}

// A collective on a stream whose peer died (arg: 1 for a non-blocking communicator, the trainer's kind). On a
// GPU NCCL's kernel spins for data that never comes until ncclCommAbort stops it: the stream stays busy
// (cudaStreamQuery: cudaErrorNotReady, and an event recorded after it stays pending) while
// ncclCommGetAsyncError reports the error, so the host never reads a sum that never happened. The
// abort then ends the collective and the stream is done (and usable: a later copy runs).
static void stream_dead_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    int nonblocking = *(const int*)arg;
    setenv("NCCL_EMU_TIMEOUT_S", "600", 1);
    ncclComm_t comm = NULL;
    ncclResult_t r0 = ncclSuccess;
    if (nonblocking) {
        comm = nonblocking_init(nranks, id, rank, &r0);
        CHECK(comm && poll_comm(comm, 10) == ncclSuccess, "rank %d: non-blocking init failed", rank);
    } else {
        NCCL_OK(ncclCommInitRank(&comm, nranks, *id, rank));
    }
    if (!comm) return;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CUDA_OK(cudaEventCreate(&ev));
    size_t n = 1000;
    void* buf = dev_alloc(n * 4);
    CUDA_OK(cudaMemset(buf, 0, n * 4));
    NCCL_OK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, s));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "rank %d: the first AllReduce on a stream", rank);
    if (rank == 1) kill(getpid(), SIGKILL);  // both ranks are past the first AllReduce
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, s);
    CHECK(r == ncclSuccess, "rank 0: enqueueing an AllReduce on a stream gave %s", ncclGetErrorString(r));
    CUDA_OK(cudaEventRecord(ev, s));
    ncclResult_t ae = ncclSuccess;
    double t0 = now_s();
    while (now_s() - t0 < 5 && ncclCommGetAsyncError(comm, &ae) == ncclSuccess && ae == ncclSuccess) sleep_s(0.001);
    CHECK(is_remote_failure(ae), "rank 0: ncclCommGetAsyncError with a dead peer gave %s, want a remote/system error",
          ncclGetErrorString(ae));
    sleep_s(0.2);  // time enough for a wrongly finished collective to let its stream go
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady,
          "rank 0: the stream of an AllReduce whose peer died is done before ncclCommAbort (want cudaErrorNotReady)");
    CHECK(cudaEventQuery(ev) == cudaErrorNotReady,
          "rank 0: an event after the failed AllReduce completed before the abort");
    double t_abort = now_s();
    NCCL_OK(ncclCommAbort(comm));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "rank 0: cudaStreamSynchronize after ncclCommAbort");
    rep->seconds = now_s() - t_abort;
    CHECK(rep->seconds < 1.0, "rank 0: the stream was done %.3f s after ncclCommAbort", rep->seconds);
    CHECK(cudaEventQuery(ev) == cudaSuccess, "rank 0: the event after the aborted AllReduce is not done");
    CHECK(cudaMemsetAsync(buf, 0, n * 4, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess,
          "rank 0: the stream is not usable after ncclCommAbort");
    cudaEventDestroy(ev);
    cudaStreamDestroy(s);
    cudaFree(buf);
}

// Non-blocking, a peer that stops (SIGSTOP) without dying: with NCCL_EMU_TIMEOUT_S large only the
// caller's own deadline can catch it. Rank 0's AllReduce must stay ncclInProgress (no hang inside the
// call), and ncclCommAbort must end it at once; rank 1, continued, then fails at once too.
static int* shared_pid;  // rank 1's pid, for rank 0 to continue it

static void stopped_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    setenv("NCCL_EMU_TIMEOUT_S", "600", 1);
    ncclResult_t r0;
    ncclComm_t comm = nonblocking_init(nranks, id, rank, &r0);
    CHECK(comm && poll_comm(comm, 10) == ncclSuccess, "rank %d: non-blocking init failed", rank);
    if (!comm) return;
    void* b = dev_alloc(1000 * 4);
    cudaMemset(b, 0, 1000 * 4);
    if (rank == 1) {
        *(volatile int*)shared_pid = getpid();
        raise(SIGSTOP);  // until rank 0 continues it
        double t0 = now_s();
        ncclResult_t r = ncclAllReduce(b, b, 1000, ncclFloat32, ncclSum, comm, 0);
        if (r == ncclInProgress) r = poll_comm(comm, 5);
        CHECK(is_remote_failure(r) && now_s() - t0 < 0.5, "rank 1: AllReduce after rank 0 aborted gave %s after %.3f s",
              ncclGetErrorString(r), now_s() - t0);
        NCCL_OK(ncclCommAbort(comm));
        cudaFree(b);
        return;
    }
    while (!*(volatile int*)shared_pid) sleep_s(0.001);
    ncclResult_t r = ncclAllReduce(b, b, 1000, ncclFloat32, ncclSum, comm, 0);
    CHECK(r == ncclInProgress, "rank 0: AllReduce with a stopped peer gave %s, want ncclInProgress",
          ncclGetErrorString(r));
    r = poll_comm(comm, 1.0);
    CHECK(r == ncclInProgress, "rank 0: after 1 s with a stopped peer: %s, want still ncclInProgress",
          ncclGetErrorString(r));
    double t0 = now_s();
    NCCL_OK(ncclCommAbort(comm));
    rep->seconds = now_s() - t0;
    CHECK(rep->seconds < 0.5, "rank 0: ncclCommAbort took %.3f s", rep->seconds);
    kill(*shared_pid, SIGCONT);
    cudaFree(b);
}

// Non-blocking, a peer killed mid-run: ncclCommGetAsyncError reports the error (not ncclInProgress forever).
static void nb_killed_child(int rank, int nranks, const ncclUniqueId* id, const void* arg, Report* rep) {
    (void)arg;
    setenv("NCCL_EMU_TIMEOUT_S", "600", 1);
    ncclResult_t r0;
    ncclComm_t comm = nonblocking_init(nranks, id, rank, &r0);
    CHECK(comm && poll_comm(comm, 10) == ncclSuccess, "rank %d: non-blocking init failed", rank);
    if (!comm) return;
    void* b = dev_alloc(1000 * 4);
    cudaMemset(b, 0, 1000 * 4);
    ncclAllReduce(b, b, 1000, ncclFloat32, ncclSum, comm, 0);  // both ranks are up and past init
    CHECK(poll_comm(comm, 10) == ncclSuccess, "rank %d: the first non-blocking AllReduce failed", rank);
    if (rank == 0) *(volatile int*)&shared_pid[1] = 1;  // rank 0 saw it succeed: now rank 1 may die
    if (rank == 1) {
        while (!*(volatile int*)&shared_pid[1]) sleep_s(0.001);
        kill(getpid(), SIGKILL);
    }
    double t0 = now_s();
    ncclAllReduce(b, b, 1000, ncclFloat32, ncclSum, comm, 0);
    ncclResult_t r = poll_comm(comm, 5);
    rep->seconds = now_s() - t0;
    CHECK(is_remote_failure(r) && rep->seconds < 2,
          "rank 0: non-blocking AllReduce with a killed peer: %s after %.3f s", ncclGetErrorString(r), rep->seconds);
    // the message, read right after the poll saw the error (the trainer's watchdog does so), names the peer
    const char* msg = ncclGetLastError(comm);
    CHECK(strstr(msg, "rank 1 (pid ") && strstr(msg, "died"),
          "rank 0: the error after the peer's death must name it, got '%s'", msg);
    NCCL_OK(ncclCommAbort(comm));
    cudaFree(b);
}

#endif  // EMULATION

// ---------------------------------------------------------------------------------------------

// enough_gpus: on real NCCL, how many GPUs there are (asked in a child: CUDA must not be initialized
// in the parent before it forks the ranks). On the emulation any number of ranks can run.
static int enough_gpus(int nranks, const char* what) {
#if EMULATION
    (void)nranks, (void)what;
    return 1;
#else
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 100 ? 100 : n);
    }
    int st = 0;
    waitpid(p, &st, 0);
    int n = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    if (n < nranks)
        printf(
            "skipped: %s on %d ranks: real NCCL needs a GPU per rank (two ranks on one device: ncclInvalidUsage), "
            "found %d GPU%s\n",
            what, nranks, n, n == 1 ? "" : "s");
    return n >= nranks;
#endif
}

static void run_collectives(int nranks, const char* chunk, const size_t* sizes, int nsizes) {
    if (!enough_gpus(nranks, "the collectives")) return;
    CollArgs a = {chunk, sizes, nsizes};
    Report reps[MAX_FORKS];
    int st[MAX_FORKS];
    char what[64];
    snprintf(what, sizeof what, "collectives, %d rank%s", nranks, nranks == 1 ? "" : "s");
    double t0 = now_s();
    run_ranks(nranks, nranks, collectives_child, &a, 60, reps, st);
    absorb(what, nranks, reps, st, -1);
    for (int r = 1; r < nranks; r++)
        CHECK(reps[r].hash == reps[0].hash, "%s: rank %d's results differ from rank 0's (hash %016llx vs %016llx)",
              what, r, (unsigned long long)reps[r].hash, (unsigned long long)reps[0].hash);
    printf("%s (chunk %s): %.2f s\n", what, chunk ? chunk : "default", now_s() - t0);
}

int main(void) {
    int version = 0;
    ncclResult_t r = ncclGetVersion(&version);
    CHECK(r == ncclSuccess && version >= 20000, "ncclGetVersion: %s, %d", ncclGetErrorString(r), version);
    CHECK(strlen(ncclGetErrorString(ncclRemoteError)) > 0, "ncclGetErrorString");

    // Counts: odd ones, and ones larger than the chunk each rank's buffer holds.
    static const size_t sizes2[] = {1, 7, 1001, 40009};  // 64 KiB chunk: 40009 floats take 3 chunks
    static const size_t sizes4[] = {1, 3, 999, 5003};    // 4 KiB chunk: many chunks
    static const size_t sizes3[] = {13, 1048583};        // default 4 MiB chunk: 4 MB + 28 bytes of f32
    static const size_t sizes1[] = {1, 1001, 40009};     // one rank: what every machine with a GPU can run
    run_collectives(1, "65536", sizes1, 3);
    run_collectives(2, "65536", sizes2, 4);
    run_collectives(4, "4096", sizes4, 4);
    run_collectives(3, NULL, sizes3, 2);

    Report reps[MAX_FORKS];
    int st[MAX_FORKS];
    for (int nr = 1; nr <= 2; nr++)
        if (enough_gpus(nr, "non-blocking communicators")) {
            run_ranks(nr, nr, nonblocking_child, NULL, 60, reps, st);
            absorb("non-blocking communicators", nr, reps, st, -1);
        }
    run_ranks(2, 1, nb_noshow_child, NULL, 60, reps, st);
    absorb("non-blocking init, rank 1 never joins", 1, reps, st, -1);
    printf("non-blocking init without rank 1: ncclInProgress after 0.5 s; ncclCommAbort took %.3f s\n",
           reps[0].seconds);
    if (enough_gpus(2, "two ranks as threads of one process")) {
        run_ranks(2, 1, threads_child, NULL, 30, reps, st);
        absorb("two ranks as threads", 1, reps, st, -1);
    }

#if EMULATION
    shared_kill_time = (double*)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared_kill_time != MAP_FAILED, "mmap");
    if (shared_kill_time == MAP_FAILED) return test_summary();

    int victim = 2;
    *shared_kill_time = 0;
    run_ranks(4, 4, killed_child, &victim, 20, reps, st);
    absorb("killed peer", 4, reps, st, victim);
    double worst = 0;
    for (int q = 0; q < 4; q++)
        if (q != victim && reps[q].seconds > worst) worst = reps[q].seconds;
    printf("killed peer (SIGKILL mid-AllReduce, 4 ranks): slowest survivor got its error %.3f s after the kill\n",
           worst);

    run_ranks(2, 2, exit_child, NULL, 20, reps, st);
    absorb("exit without destroy", 2, reps, st, -1);
    printf("peer exited without ncclCommDestroy: noticed after %.3f s\n", reps[0].seconds);

    run_ranks(2, 2, timeout_child, NULL, 20, reps, st);
    absorb("absent peer", 2, reps, st, -1);
    printf("alive but absent peer, NCCL_EMU_TIMEOUT_S=1: error after %.3f s\n", reps[0].seconds);

    run_ranks(3, 2, noshow_child, NULL, 20, reps, st);
    absorb("rank never joins", 2, reps, st, -1);
    printf("rank that never calls ncclCommInitRank, NCCL_EMU_TIMEOUT_S=1: error after %.3f s\n", reps[0].seconds);

    char stats[64];
    snprintf(stats, sizeof stats, "/tmp/mlm_nccl_stats_%d", (int)getpid());
    run_ranks(3, 3, p2p_child, stats, 20, reps, st);
    absorb("point to point, byte counts", 3, reps, st, -1);
    for (int q = 0; q < 3; q++) {
        char f[96];
        snprintf(f, sizeof f, "%s.%d", stats, q);
        unlink(f);
    }

    run_ranks(2, 2, abort_child, NULL, 20, reps, st);
    absorb("abort", 2, reps, st, -1);
    printf("ncclCommAbort from another thread: blocked call returned after %.3f s\n", reps[0].seconds);
    run_ranks(2, 2, stream_abort_child, NULL, 20, reps, st);
    absorb("abort, collective on a stream", 2, reps, st, -1);
    printf("ncclCommAbort with a collective blocked on a stream: the stream was done after %.3f s\n", reps[0].seconds);
    for (int nb = 0; nb < 2; nb++) {
        const char* what = nb ? "dead peer, collective on a stream, non-blocking" : "dead peer, collective on a stream";
        run_ranks(2, 2, stream_dead_child, &nb, 20, reps, st);
        absorb(what, 2, reps, st, 1);
        printf("%s: busy until ncclCommAbort, done %.3f s after it\n", what, reps[0].seconds);
    }
    shared_pid = (int*)(shared_kill_time + 1);
    run_ranks(2, 2, stopped_child, NULL, 20, reps, st);
    absorb("non-blocking, stopped peer", 2, reps, st, -1);
    printf("non-blocking, peer stopped (SIGSTOP): still ncclInProgress after 1 s; ncclCommAbort took %.3f s\n",
           reps[0].seconds);

    shared_pid[1] = 0;
    run_ranks(2, 2, nb_killed_child, NULL, 20, reps, st);
    absorb("non-blocking, killed peer", 2, reps, st, 1);
    printf("non-blocking, killed peer: ncclCommGetAsyncError reported it after %.3f s\n", reps[0].seconds);
    munmap(shared_kill_time, 4096);
#else
    printf("skipped: the failure cases (they run on the CPU emulation only)\n");
#endif
    return test_summary();
}
