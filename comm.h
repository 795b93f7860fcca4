// comm.h: data-parallel communication. One process per GPU; srun starts them and tells each its
// rank (SLURM_PROCID), the world size (SLURM_NTASKS) and its rank on the node (SLURM_LOCALID,
// which picks the GPU). Ranks meet through NCCL: rank 0 makes a unique id and publishes it as a
// file in a directory every rank can see (the run's output directory, on a shared file system);
// the others wait for the file, then all join the communicator. Gradients are averaged with one
// AllReduce per step. With one process there is no NCCL at all.
#pragma once
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int rank;         // 0 .. world-1, over all nodes
    int world;        // number of processes (one per GPU)
    int local_rank;   // rank within this node: selects the GPU
    ncclComm_t nccl;  // NULL when world == 1
} Comm;

#define NCCL_CHECK(call)                                                                                  \
    do {                                                                                                  \
        ncclResult_t r_ = (call);                                                                         \
        if (r_ != ncclSuccess) {                                                                          \
            fprintf(stderr, "NCCL error at %s:%d: %s (%s)\n", __FILE__, __LINE__, ncclGetErrorString(r_), \
                    ncclGetLastError(NULL));                                                              \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

// comm_env_int: an integer environment variable, or dflt when unset; exits on a malformed value.
static int comm_env_int(const char* name, int dflt) {
    const char* s = getenv(name);
    if (!s || !*s) return dflt;
    char* end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1000000) {
        fprintf(stderr, "comm: environment variable %s=%s is not a non-negative integer\n", name, s);
        exit(1);
    }
    return (int)v;
}

// comm_from_env: rank/world from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun), else one process.
static Comm comm_from_env(void) {
    Comm c;
    memset(&c, 0, sizeof c);
    c.world = comm_env_int("SLURM_NTASKS", 1);
    c.rank = comm_env_int("SLURM_PROCID", 0);
    c.local_rank = comm_env_int("SLURM_LOCALID", 0);
    if (c.world < 1 || c.rank >= c.world) {
        fprintf(stderr, "comm: SLURM_PROCID=%d is not below SLURM_NTASKS=%d\n", c.rank, c.world);
        exit(1);
    }
    return c;
}

// comm_init: joins the NCCL communicator of all ranks (nothing when world == 1). The unique id travels
// through DIR/nccl_id.JOB.STEP, written atomically by rank 0; other ranks wait up to timeout_s for it.
static void comm_init(Comm* c, const char* dir, int timeout_s) {
    if (c->world == 1) return;
    char path[4096], tmp[4200];
    const char* job = getenv("SLURM_JOB_ID");
    const char* step = getenv("SLURM_STEP_ID");
    snprintf(path, sizeof path, "%s/nccl_id.%s.%s", dir, job ? job : "local", step ? step : "0");
    ncclUniqueId id;
    if (c->rank == 0) {
        NCCL_CHECK(ncclGetUniqueId(&id));
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE* f = fopen(tmp, "wb");
        if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
            fprintf(stderr, "comm: cannot write the NCCL id to %s (is --out a directory every rank can write?)\n",
                    path);
            exit(1);
        }
    } else {
        int waited_ms = 0;
        FILE* f;
        while (!(f = fopen(path, "rb"))) {
            if (waited_ms >= timeout_s * 1000) {
                fprintf(stderr, "comm: rank %d waited %d s for %s from rank 0 (is --out on a shared file system?)\n",
                        c->rank, timeout_s, path);
                exit(1);
            }
            usleep(20000);
            waited_ms += 20;
        }
        size_t got = fread(&id, sizeof id, 1, f);
        fclose(f);
        if (got != 1) {
            fprintf(stderr, "comm: %s is truncated\n", path);
            exit(1);
        }
    }
    NCCL_CHECK(ncclCommInitRank(&c->nccl, c->world, id, c->rank));
    if (c->rank == 0) unlink(path);  // everyone has joined: the id is no longer needed
}

// comm_average: in-place average over all ranks of n floats on the device (nothing when world == 1).
static void comm_average(Comm* c, float* x, size_t n, cudaStream_t s) {
    if (c->world == 1) return;
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclFloat32, ncclAvg, c->nccl, s));
}

// comm_sum: in-place sum over all ranks of n floats on the device (nothing when world == 1).
static void comm_sum(Comm* c, float* x, size_t n, cudaStream_t s) {
    if (c->world == 1) return;
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c->nccl, s));
}

static void comm_free(Comm* c) {
    if (c->nccl) ncclCommDestroy(c->nccl);
    c->nccl = NULL;
}
