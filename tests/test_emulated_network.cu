// tests/test_emulated_network.cu: the CPU NCCL's emulated network (NCCL_EMU_GBPS, NCCL_EMU_LATENCY_US in
// cpu/nccl.cpp). Ranks are forked processes, as in test_nccl.cu. Checks, lower bounds only (a loaded machine
// may always be slower):
//   - 2 ranks at 0.8 Gbit/s and 20 ms: an AllReduce of 4 MB takes at least 20 ms + 2 (P-1)/P x 4 MB / 1e8 B/s,
//     a ReduceScatter and an AllGather of a 4 MB buffer at least 20 ms + (P-1)/P x 4 MB / 1e8 B/s, and the
//     results are still right; 4 ranks: the AllReduce at least 20 ms + 2 x 3/4 x 4 MB / 1e8 B/s;
//   - latency only (no NCCL_EMU_GBPS): a 4-byte AllReduce takes at least the latency;
//   - a bad value (not a number, negative) stops the process with one line naming the variable.
// CPU build only (build.sh's CPU_ONLY_TESTS): the real NCCL has no emulated network.
#include <nccl.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testing.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { ALLREDUCE, REDUCESCATTER, ALLGATHER };
static const char* const names[] = {"AllReduce", "ReduceScatter", "AllGather"};

typedef struct {
    int passed, failed;
    double seconds;
} Result;

// one_rank: join the communicator, time one collective over `total` floats (the whole buffer), check it.
static void one_rank(int rank, int nranks, const ncclUniqueId* id, int kind, size_t total, Result* res) {
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
    CHECK(r == ncclSuccess, "rank %d: ncclCommInitRank: %s", rank, ncclGetErrorString(r));
    if (r != ncclSuccess) return;
    size_t per = total / nranks;
    float *x, *y;
    CUDA_OK(cudaMalloc(&x, total * sizeof(float)));
    CUDA_OK(cudaMalloc(&y, total * sizeof(float)));
    float* h = (float*)malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) h[i] = (float)(rank + 1) + (float)(i % 7);
    CUDA_OK(cudaMemcpy(x, h, total * sizeof(float), cudaMemcpyHostToDevice));
    double t0 = now_s();
    if (kind == ALLREDUCE) r = ncclAllReduce(x, y, total, ncclFloat32, ncclSum, comm, 0);
    if (kind == REDUCESCATTER) r = ncclReduceScatter(x, y, per, ncclFloat32, ncclSum, comm, 0);
    if (kind == ALLGATHER) r = ncclAllGather(x, y, per, ncclFloat32, comm, 0);
    CUDA_OK(cudaStreamSynchronize(0));
    res->seconds = now_s() - t0;
    CHECK(r == ncclSuccess, "rank %d: nccl%s: %s", rank, names[kind], ncclGetErrorString(r));
    CUDA_OK(cudaMemcpy(h, y, (kind == REDUCESCATTER ? per : total) * sizeof(float), cudaMemcpyDeviceToHost));
    double ranks_sum = nranks * (nranks + 1) / 2.0;
    int bad = 0;
    for (size_t i = 0; i < (kind == REDUCESCATTER ? per : total) && !bad; i++) {
        size_t g = kind == REDUCESCATTER ? rank * per + i : i;  // the element of the whole buffer
        double want =
            kind == ALLGATHER ? (double)(g / per + 1) + (double)(g % per % 7) : ranks_sum + nranks * (double)(g % 7);
        if (h[i] != (float)want) {
            printf("rank %d %s: [%zu] = %g, want %g\n", rank, names[kind], i, h[i], want);
            bad = 1;
        }
    }
    CHECK(!bad, "rank %d: %s results", rank, names[kind]);
    ncclCommDestroy(comm);
    cudaFree(x);
    cudaFree(y);
    free(h);
}

// run: fork nranks ranks with the environment given, run one collective, give the slowest rank's time
// (-1 when a rank failed); the ranks' checks are added to this process's.
static double run(int nranks, int kind, size_t total, const char* gbps, const char* latency_us) {
    if (gbps) setenv("NCCL_EMU_GBPS", gbps, 1);
    if (latency_us) setenv("NCCL_EMU_LATENCY_US", latency_us, 1);
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pids[8];
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[0]);
            tests_passed = tests_failed = 0;
            Result res = {0, 0, -1};
            one_rank(r, nranks, &id, kind, total, &res);
            res.passed = tests_passed, res.failed = tests_failed;
            fflush(stdout);
            _exit(write(fds[1], &res, sizeof res) == (ssize_t)sizeof res ? 0 : 3);
        }
    }
    close(fds[1]);
    unsetenv("NCCL_EMU_GBPS");
    unsetenv("NCCL_EMU_LATENCY_US");
    double slowest = 0;
    int got = 0;
    Result res;
    while (read(fds[0], &res, sizeof res) == (ssize_t)sizeof res) {
        tests_passed += res.passed, tests_failed += res.failed, got++;
        if (res.seconds > slowest) slowest = res.seconds;
    }
    close(fds[0]);
    for (int r = 0; r < nranks; r++) waitpid(pids[r], NULL, 0);
    CHECK(got == nranks, "%d of %d ranks reported", got, nranks);
    return got == nranks ? slowest : -1;
}

// bad_env: a rank with NAME=VALUE must exit 1 saying "NAME=VALUE: expected ...", one line on stderr.
static void bad_env(const char* name, const char* value) {
    int fds[2];
    if (pipe(fds) != 0) return;
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        setenv(name, value, 1);
        ncclComm_t comm;
        ncclCommInitRank(&comm, 2, id, 0);  // exits before it waits for rank 1
        _exit(0);
    }
    close(fds[1]);
    char msg[512] = "";
    ssize_t n = read(fds[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    char want[128];
    snprintf(want, sizeof want, "%s=%s: expected a number", name, value);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(msg, want) &&
              strchr(msg, '\n') == msg + strlen(msg) - 1,
          "%s=%s: exit status %d, stderr '%s' (want exit 1 and one line with '%s')", name, value, status, msg, want);
}

int main(void) {
    const size_t total = 1 << 20;  // floats: a 4 MB buffer
    const double bw = 0.8e9 / 8, lat = 0.02, bytes = 4.0 * total;
    double t = run(2, ALLREDUCE, total, "0.8", "20000");
    printf("2 ranks, AllReduce of 4 MB at 0.8 Gbit/s + 20 ms: %.3f s (model %.3f s)\n", t, lat + bytes / bw);
    CHECK(t >= lat + bytes / bw, "AllReduce took %.4f s, under the model's %.4f s", t, lat + bytes / bw);
    t = run(2, REDUCESCATTER, total, "0.8", "20000");
    CHECK(t >= lat + 0.5 * bytes / bw, "ReduceScatter took %.4f s, under the model's %.4f s", t,
          lat + 0.5 * bytes / bw);
    t = run(2, ALLGATHER, total, "0.8", "20000");
    CHECK(t >= lat + 0.5 * bytes / bw, "AllGather took %.4f s, under the model's %.4f s", t, lat + 0.5 * bytes / bw);
    t = run(4, ALLREDUCE, total, "0.8", "20000");
    CHECK(t >= lat + 1.5 * bytes / bw, "4 ranks: AllReduce took %.4f s, under the model's %.4f s", t,
          lat + 1.5 * bytes / bw);
    t = run(2, ALLREDUCE, 4, NULL, "50000");  // latency only
    CHECK(t >= 0.05, "latency only: a 16-byte AllReduce took %.4f s, under 50 ms", t);
    bad_env("NCCL_EMU_GBPS", "fast");
    bad_env("NCCL_EMU_LATENCY_US", "-5");
    return test_summary();
}
