// comm.h: where this process stands in a data-parallel job.
// Today: rank, world size and local rank, read from Slurm's environment (srun sets them), or a
// single process when there is no Slurm. The NCCL communicator and the gradient all-reduce are
// added with distributed training; the CPU build already carries NCCL's API (cpu/nccl.cpp).
#pragma once
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int rank;        // 0 .. world-1, over all nodes
    int world;       // number of processes (one per GPU)
    int local_rank;  // rank within this node: selects the GPU
} Comm;

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
    c.world = comm_env_int("SLURM_NTASKS", 1);
    c.rank = comm_env_int("SLURM_PROCID", 0);
    c.local_rank = comm_env_int("SLURM_LOCALID", 0);
    if (c.world < 1 || c.rank >= c.world) {
        fprintf(stderr, "comm: SLURM_PROCID=%d is not below SLURM_NTASKS=%d\n", c.rank, c.world);
        exit(1);
    }
    return c;
}
