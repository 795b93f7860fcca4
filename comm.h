// comm.h: data-parallel communication. One process per GPU.
//
// Launch. Each process learns its rank, the world size and its rank on the node from torchrun-style
// variables when WORLD_SIZE is set (RANK, WORLD_SIZE, LOCAL_RANK), else from srun (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID), else it is the only one. A job script that runs ./trainer itself, not
// through srun, has SLURM_NTASKS > 1 but no SLURM_STEP_ID (Slurm sets it in job steps only): it is told
// to use srun. The GPU (comm_device): local rank L of a node where the process sees D devices uses
// device L when L < D (each task sees all of the node's GPUs), device 0 when D == 1 (each task sees its
// own: srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES with one device; the CPU build has one device),
// and is an error otherwise.
//
// Bootstrap: the ranks need rank 0's ncclUniqueId. With --bootstrap tcp (the default) rank 0 serves it
// on a TCP port to world-1 connections: the address is MASTER_ADDR, else the first host of Slurm's
// node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST), else 127.0.0.1; the port is MASTER_PORT, else
// 20000 + (a hash of the launch tag) % 20000, never one fixed port. The launch tag hashes the job id,
// step id, restart count (a requeued job keeps its id) and --out: rank 0 refuses a connection that
// does not say the same tag, so a stranger (another job on the node) never gets the id, nor gives one.
// Each connect is bounded by the deadline (a black-holed address costs --nccl-timeout, not the kernel's
// SYN retries), and rank 0's listen backlog is at least the world size (all ranks may connect at once).
// With --bootstrap file rank 0 writes the id to DIR/nccl_id.JOB.STEP.RESTART (DIR: --out, on a shared
// file system), which names the launch, and rewrites it every 0.1 s until every rank has joined; a rank
// takes the id only once it has seen the file rewritten, so a stale file of an earlier run is never used.
//
// No hangs: the communicator is non-blocking (ncclConfig_t.blocking = 0), and every wait (init, each
// collective's enqueue, each host sync on a stream with collectives) polls ncclCommGetAsyncError and
// cudaStreamQuery against a deadline (--nccl-timeout, default 120 s). On an error or at the deadline the
// rank aborts the communicator (ncclCommAbort: the other ranks' collectives then fail too) and exits 1
// with one line that names the step and the collective.
//
// Gradients are averaged in buckets that overlap the backward, optionally with ZeRO-1 (the last section). See NCCL's
// user guide, "Creating a communicator with options" and "Fault tolerance".
#pragma once
#include "parse.h"  // the one reading of a number: the launchers' variables, MASTER_PORT
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "files.h"  // open_regular, create_fresh: the id file

typedef struct {
    int rank;               // 0 .. world-1, over all nodes
    int world;              // number of processes (one per GPU)
    int local_rank;         // rank within this node: selects the GPU (comm_device)
    int device;             // the CUDA device this process uses
    ncclComm_t nccl;        // NULL when world == 1
    double timeout_s;       // --nccl-timeout: the deadline of every wait (bootstrap, init, collectives)
    int step;               // the training step under way, for messages (0: before step 1)
    volatile int* release;  // test hook MLM_TEST_STALL: comm_die sets it, ending a stalled kernel (NULL: none)
    uint64_t sent;          // bytes this rank has sent through NCCL so far, by comm_count's model
    uint64_t calls;         // NCCL collectives (a group of sends and receives: one) this rank has made
} Comm;

// comm_count: adds one NCCL call's bytes to c->sent, by the algorithm model NCCL's ring collectives and
// point-to-point calls follow (the same model cpu/nccl.cpp counts with under NCCL_EMU_STATS, so a test can
// compare the two). P ranks, `bytes` of the call's buffer: AllReduce 2 (P-1) bytes / P (integer division);
// ReduceScatter and AllGather: `bytes` is one rank's block, (P-1) bytes; Broadcast: bytes from every rank
// but the one before the root (`peer`) in the ring; Send: bytes to another rank (`peer`; to itself: 0).
// Nothing when world == 1 (no NCCL call is made).
enum { COMM_ALLREDUCE, COMM_REDUCESCATTER, COMM_ALLGATHER, COMM_BROADCAST, COMM_SEND };
static inline void comm_count(Comm* c, int kind, size_t bytes, int peer) {
    if (c->world == 1) return;
    uint64_t P = (uint64_t)c->world, B = bytes;
    if (kind == COMM_ALLREDUCE) c->sent += 2 * (P - 1) * B / P;
    if (kind == COMM_REDUCESCATTER || kind == COMM_ALLGATHER) c->sent += (P - 1) * B;
    if (kind == COMM_BROADCAST && c->rank != (peer + c->world - 1) % c->world) c->sent += B;
    if (kind == COMM_SEND && c->rank != peer) c->sent += B;
    if (kind != COMM_SEND) c->calls++;
}

#define COMM_DEFAULT_TIMEOUT_S 120.0

#define NCCL_CHECK(call)                                                                                  \
    do {                                                                                                  \
        ncclResult_t r_ = (call);                                                                         \
        if (r_ != ncclSuccess) {                                                                          \
            fprintf(stderr, "NCCL error at %s:%d: %s (%s)\n", __FILE__, __LINE__, ncclGetErrorString(r_), \
                    ncclGetLastError(NULL));                                                              \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

static inline double comm_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void comm_sleep_s(double s) {
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

// ----------------------------------------------------------------------------
// Launch: rank, world, local rank, device

// comm_env_int: an integer environment variable, or dflt when unset; exits on a malformed value.
static inline int comm_env_int(const char* name, int dflt) {
    const char* s = getenv(name);
    if (!s || !*s) return dflt;
    int v;
    if (!parse_int(s, 0, 1000000, &v)) {
        fprintf(stderr, "comm: environment variable %s=%s is not a non-negative integer (at most 1000000)\n", name, s);
        exit(1);
    }
    return v;
}

static inline int comm_env_set(const char* name) { return getenv(name) && *getenv(name); }

// comm_env_pair: a rank variable and its world-size variable come together: exits with one line naming
// the one that is missing (WORLD_SIZE=2 without RANK must not quietly become rank 0 of 2).
static inline void comm_env_pair(const char* rank_var, const char* world_var) {
    if (comm_env_set(rank_var) && comm_env_set(world_var)) return;
    const char* have = comm_env_set(rank_var) ? rank_var : world_var;
    fprintf(stderr,
            "comm: %s=%s is set but %s is not: a launcher sets both (srun: SLURM_PROCID and SLURM_NTASKS; "
            "torchrun: RANK and WORLD_SIZE)\n",
            have, getenv(have), have == rank_var ? world_var : rank_var);
    exit(1);
}

// comm_from_env: rank, world and local rank of this process (see the top of this file). Exits with one
// line on values that make no sense, when a rank or world-size variable comes without the other, and for
// a job script that forgot srun.
static inline Comm comm_from_env(void) {
    Comm c;
    memset(&c, 0, sizeof c);
    c.timeout_s = COMM_DEFAULT_TIMEOUT_S;
    const char *rank_var = "SLURM_PROCID", *world_var = "SLURM_NTASKS";
    if (comm_env_set("WORLD_SIZE") || (comm_env_set("RANK") && !comm_env_set("SLURM_NTASKS"))) {  // torchrun style
        rank_var = "RANK", world_var = "WORLD_SIZE";
        comm_env_pair("RANK", "WORLD_SIZE");
        c.world = comm_env_int("WORLD_SIZE", 1);
        c.rank = comm_env_int("RANK", 0);
        c.local_rank = comm_env_int("LOCAL_RANK", 0);
    } else {
        c.world = comm_env_int("SLURM_NTASKS", 1);
        c.rank = comm_env_int("SLURM_PROCID", 0);
        c.local_rank = comm_env_int("SLURM_LOCALID", 0);
        int in_step = (getenv("SLURM_STEP_ID") && *getenv("SLURM_STEP_ID")) || getenv("SLURM_STEPID");
        if (getenv("SLURM_JOB_ID") && !in_step && c.world > 1) {
            fprintf(stderr,
                    "trainer: started by a Slurm job script (SLURM_JOB_ID=%s, SLURM_NTASKS=%d) but not by srun: "
                    "launch one process per GPU with `srun -K ./trainer ...`\n",
                    getenv("SLURM_JOB_ID"), c.world);
            exit(1);
        }
        if (c.world > 1) comm_env_pair("SLURM_PROCID", "SLURM_NTASKS");  // srun sets both
    }
    if (c.world < 1 || c.rank >= c.world) {
        fprintf(stderr, "comm: %s=%d is not below %s=%d\n", rank_var, c.rank, world_var, c.world);
        exit(1);
    }
    return c;
}

// comm_device: the CUDA device of local rank `local_rank` when the process sees `ndev` devices (the
// rule at the top of this file); -1 with a message in err when there is none for it.
static inline int comm_device(int local_rank, int ndev, char* err, size_t n) {
    if (ndev >= 1 && local_rank < ndev) return local_rank;
    if (ndev == 1) return 0;
    const char* vis = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(err, n,
             "local rank %d but this process sees %d GPU(s)%s%s%s: run at most one process per GPU (srun "
             "--ntasks-per-node), and let each see either all of the node's GPUs or only its own "
             "(--gpus-per-task=1)",
             local_rank, ndev, vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
    return -1;
}

// ----------------------------------------------------------------------------
// Bootstrap: where rank 0 is, and a tag that names this launch

// comm_first_host: the first host name of a Slurm host list ("node[01-03,07],gpu5" -> "node01";
// "rack[1-2]-n[3-4]" -> "rack1-n3"; zero padding kept). 0, or -1 when the list is malformed.
static inline int comm_first_host(const char* list, char* out, size_t n) {
    size_t k = 0;
    const char* p = list;
    if (!p || !*p || *p == ',') return -1;
    while (*p && *p != ',') {
        if (*p == '[') {  // a range set: its first number
            p++;
            if (*p < '0' || *p > '9') return -1;
            while (*p >= '0' && *p <= '9') {
                if (k + 1 >= n) return -1;
                out[k++] = *p++;
            }
            if (*p != '-' && *p != ',' && *p != ']') return -1;
            while (*p && *p != ']') p++;
            if (*p != ']') return -1;
            p++;
            continue;
        }
        if (*p == ']') return -1;
        if (k + 1 >= n) return -1;
        out[k++] = *p++;
    }
    out[k] = 0;
    return k > 0 ? 0 : -1;
}

static inline uint64_t comm_hash(uint64_t h, const char* s) {  // FNV-1a over a string, and its end
    for (; s && *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return (h ^ 0xff) * 0x100000001b3ull;
}

// comm_launch_tag: a 64-bit name for this launch that every rank computes alike: the job id, the step
// id and the restart count (a requeued job keeps its id), the world size and the run's --out.
static inline uint64_t comm_launch_tag(const Comm* c, const char* out) {
    const char* vars[] = {"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "MASTER_PORT"};
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 4; i++) h = comm_hash(h, getenv(vars[i]));
    char w[32];
    snprintf(w, sizeof w, "%d", c->world);
    return comm_hash(comm_hash(h, w), out);
}

// comm_port: MASTER_PORT, else 20000 + tag % 20000. -1 (message in err) for a bad MASTER_PORT.
static inline int comm_port(uint64_t tag, char* err, size_t n) {
    const char* s = getenv("MASTER_PORT");
    if (!s || !*s) return 20000 + (int)(tag % 20000);
    int v;
    if (!parse_int(s, 1, 65535, &v)) {
        snprintf(err, n, "MASTER_PORT=%s: expected a TCP port in [1, 65535]", s);
        return -1;
    }
    return v;
}

// comm_master_addr: MASTER_ADDR, else the first host of SLURM_STEP_NODELIST or SLURM_JOB_NODELIST,
// else 127.0.0.1 (one node, started by hand). 0, or -1 with a message in err.
static inline int comm_master_addr(char* out, size_t n, char* err, size_t en) {
    const char* m = getenv("MASTER_ADDR");
    if (m && *m) {
        snprintf(out, n, "%s", m);
        return 0;
    }
    const char* vars[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"};
    for (int i = 0; i < 2; i++) {
        const char* l = getenv(vars[i]);
        if (!l || !*l) continue;
        if (comm_first_host(l, out, n) == 0) return 0;
        snprintf(err, en, "%s=%s: not a Slurm host list (set MASTER_ADDR)", vars[i], l);
        return -1;
    }
    snprintf(out, n, "127.0.0.1");
    return 0;
}

// What travels on the wire: a client's hello, and rank 0's answer.
#define COMM_HELLO_MAGIC "MLMBOOT1"
typedef struct {
    char magic[8];
    uint64_t tag;
    int32_t rank, world;
} CommHello;
typedef struct {
    char magic[8];
    uint64_t tag;
    ncclUniqueId id;
} CommIdMsg;

// comm_io: read (writing = 0) or write n bytes of fd before the deadline. 0, or -1.
static inline int comm_io(int fd, void* p, size_t n, int writing, double deadline) {
    char* b = (char*)p;
    while (n > 0) {
        double left = deadline - comm_now_s();
        if (left <= 0) return -1;
        struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) return -1;
        ssize_t k = writing ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0) return -1;
        b += k, n -= (size_t)k;
    }
    return 0;
}

// comm_backlog: the listen backlog of rank 0's socket: at least the world size, since all the other ranks
// may connect at once (the kernel caps it at net.core.somaxconn, 4096 by default since Linux 5.4).
static inline int comm_backlog(int world) { return world > 128 ? world : 128; }

// comm_connect: connect fd to a, giving up at the deadline (a blocking connect to a black-holed address
// waits for the kernel's SYN retries, minutes). 0, or -1 with errno set (ETIMEDOUT at the deadline).
static inline int comm_connect(int fd, const struct sockaddr* a, socklen_t n, double deadline) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return -1;
    if (connect(fd, a, n) == 0) return 0;
    if (errno != EINPROGRESS) return -1;
    for (;;) {
        double left = deadline - comm_now_s();
        if (left <= 0) return errno = ETIMEDOUT, -1;
        struct pollfd pfd = {fd, POLLOUT, 0};
        int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return -1;
        if (pr == 0) continue;
        int e = 0;
        socklen_t el = sizeof e;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) return -1;
        if (e != 0) return errno = e, -1;
        return 0;  // connected; fd stays non-blocking (comm_io polls)
    }
}

// comm_serve_id: rank 0 listens on `port` and gives the id to world-1 distinct ranks that say the
// same tag. 0, or -1 with a message in err.
static inline int comm_serve_id(const Comm* c, int port, uint64_t tag, const ncclUniqueId* id, double deadline,
                                char* err, size_t en) {
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (ls < 0) return snprintf(err, en, "socket: %s", strerror(errno)), -1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET, a.sin_port = htons((uint16_t)port), a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(ls, (struct sockaddr*)&a, sizeof a) != 0 || listen(ls, comm_backlog(c->world)) != 0) {
        snprintf(err, en,
                 "rank 0 cannot listen on TCP port %d: %s (set MASTER_PORT to a free port, or use --bootstrap file)",
                 port, strerror(errno));
        close(ls);
        return -1;
    }
    char* seen = (char*)calloc((size_t)c->world, 1);
    int served = 0, refused = 0;
    while (served < c->world - 1) {
        double left = deadline - comm_now_s();
        struct pollfd pfd = {ls, POLLIN, 0};
        int pr = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
            snprintf(err, en, "rank 0 (TCP port %d) heard from %d of the %d other ranks in %.0f s%s", port, served,
                     c->world - 1, c->timeout_s, refused ? "; refused connections from another launch" : "");
            break;
        }
        int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        CommHello h;
        double until = comm_now_s() + 5.0 < deadline ? comm_now_s() + 5.0 : deadline;  // a silent peer
        int ok = comm_io(fd, &h, sizeof h, 0, until) == 0 && !memcmp(h.magic, COMM_HELLO_MAGIC, 8) && h.tag == tag &&
                 h.world == c->world && h.rank > 0 && h.rank < c->world && !seen[h.rank];
        if (ok) {
            CommIdMsg m;
            memcpy(m.magic, COMM_HELLO_MAGIC, 8);
            m.tag = tag, m.id = *id;
            if (comm_io(fd, &m, sizeof m, 1, until) == 0) seen[h.rank] = 1, served++;
        } else {
            refused++;
        }
        close(fd);
    }
    free(seen);
    close(ls);
    return served == c->world - 1 ? 0 : -1;
}

// comm_fetch_id: a rank > 0 connects to rank 0 (retrying until the deadline: rank 0 may not listen
// yet; each connect is bounded by the deadline too) and reads the id. 0, or -1 with a message in err.
// (getaddrinfo may still block on a slow DNS server: MASTER_ADDR as an IP address avoids it.)
static inline int comm_fetch_id(const Comm* c, const char* host, int port, uint64_t tag, ncclUniqueId* id,
                                double deadline, char* err, size_t en) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const char* last = "no answer";
    char why[256];
    int refused = 0;  // someone listened there but did not give us the id
    while (comm_now_s() < deadline) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_INET, hints.ai_socktype = SOCK_STREAM;
        int g = getaddrinfo(host, ps, &hints, &res);
        if (g != 0) {
            snprintf(why, sizeof why, "cannot resolve %s: %s", host, gai_strerror(g));
            last = why;
            comm_sleep_s(0.5);
            continue;
        }
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int got = -1;
        if (fd >= 0 && comm_connect(fd, res->ai_addr, res->ai_addrlen, deadline) == 0) {
            CommHello h;
            memcpy(h.magic, COMM_HELLO_MAGIC, 8);
            h.tag = tag, h.rank = c->rank, h.world = c->world;
            CommIdMsg m;
            if (comm_io(fd, &h, sizeof h, 1, deadline) == 0 && comm_io(fd, &m, sizeof m, 0, deadline) == 0 &&
                !memcmp(m.magic, COMM_HELLO_MAGIC, 8) && m.tag == tag) {
                *id = m.id;
                got = 0;
            } else {
                last = "connected, but no id came back", refused = 1;
            }
        } else if (fd >= 0) {
            snprintf(why, sizeof why, "%s%s", strerror(errno),
                     errno == ETIMEDOUT ? ": no answer to the connection (a wrong or unreachable MASTER_ADDR, or a "
                                          "firewall dropping the port?)"
                                        : "");
            last = why;
        }
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        if (got == 0) return 0;
        comm_sleep_s(0.1);
    }
    snprintf(err, en, "rank %d got no NCCL id from rank 0 at %s:%d in %.0f s (last: %s%s)", c->rank, host, port,
             c->timeout_s, last,
             refused ? "; whoever listened there refused this launch's tag: another job's rank 0, or a rank 0 with "
                       "another --out, world size or MASTER_PORT?"
                     : "");
    return -1;
}

// The id file of --bootstrap file. A stale file (an earlier launch with the same tag that died before every
// rank joined) must never cost a timeout: rank 0 keeps its file alive, rewriting it every COMM_BEAT_S with
// the next `beat` until every rank has joined, and a reader takes an id only once it has seen that id's
// file rewritten (its beat change). A dead launch's file never changes, so a reader waits for the live
// rank 0's file, whatever the clocks, and without Slurm as with it.
#define COMM_FILE_MAGIC "MLMNCID2"
#define COMM_BEAT_S 0.1
typedef struct {
    char magic[8];
    uint64_t tag;
    double created;  // CLOCK_REALTIME seconds when rank 0 wrote it first (for messages)
    uint64_t beat;   // 0, 1, 2, ...: rank 0 rewrites the file with the next one every COMM_BEAT_S
    ncclUniqueId id;
} CommIdFile;

static inline double comm_realtime_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// comm_id_path: DIR/nccl_id.JOB.STEP.RESTART ("local.0.0" without Slurm).
static inline void comm_id_path(char* path, size_t n, const char* dir) {
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID"), *rs = getenv("SLURM_RESTART_COUNT");
    snprintf(path, n, "%s/nccl_id.%s.%s.%s", dir, job && *job ? job : "local", step && *step ? step : "0",
             rs && *rs ? rs : "0");
}

// comm_write_id_file: f to path, atomically (path.tmp, then rename). 0, or -1.
static inline int comm_write_id_file(const char* path, const CommIdFile* f) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = create_fresh(tmp);
    if (fd < 0) return -1;
    int ok = write(fd, f, sizeof *f) == (ssize_t)sizeof *f;
    if (close(fd) != 0) ok = 0;
    if (ok && rename(tmp, path) == 0) return 0;
    unlink(tmp);
    return -1;
}

// Rank 0's heartbeat: a thread that rewrites the id file with beat + 1 every COMM_BEAT_S until stopped.
typedef struct {
    char path[4096];
    CommIdFile f;
    volatile int stop;
    int running;
    pthread_t thread;
} CommBeat;
static CommBeat comm_beat;

static inline void* comm_beat_main(void* arg) {
    CommBeat* b = (CommBeat*)arg;
    while (!b->stop) {
        comm_sleep_s(COMM_BEAT_S);
        b->f.beat++;
        if (!b->stop) comm_write_id_file(b->path, &b->f);  // a failed rewrite: the next one tries again
    }
    return NULL;
}

// comm_beat_stop: every rank has joined (or the bootstrap is over): stop rewriting and remove the file.
static inline void comm_beat_stop(void) {
    if (!comm_beat.running) return;
    comm_beat.stop = 1;
    pthread_join(comm_beat.thread, NULL);
    comm_beat.running = 0;
    unlink(comm_beat.path);
}

// comm_file_id: --bootstrap file. Rank 0 writes the id (atomically, over any stale file) and keeps it
// beating (comm_beat_stop ends that); the others wait for a file of this launch (its tag) whose beat they
// see change. 0, or -1 with a message in err.
static inline int comm_file_id(const Comm* c, const char* dir, uint64_t tag, ncclUniqueId* id, double deadline,
                               char* err, size_t en) {
    char path[4096];
    comm_id_path(path, sizeof path, dir);
    CommIdFile f;
    if (c->rank == 0) {
        comm_beat_stop();
        memset(&comm_beat, 0, sizeof comm_beat);
        snprintf(comm_beat.path, sizeof comm_beat.path, "%s", path);
        memcpy(comm_beat.f.magic, COMM_FILE_MAGIC, 8);
        comm_beat.f.tag = tag, comm_beat.f.created = comm_realtime_s(), comm_beat.f.id = *id;
        if (comm_write_id_file(path, &comm_beat.f) != 0) {
            snprintf(err, en, "cannot write the NCCL id to %.3000s (is --out a directory every rank can write?)", path);
            return -1;
        }
        if (pthread_create(&comm_beat.thread, NULL, comm_beat_main, &comm_beat) != 0) {
            unlink(path);
            snprintf(err, en, "cannot start the thread that keeps %.3000s fresh", path);
            return -1;
        }
        comm_beat.running = 1;
        return 0;
    }
    const char* last = "no such file";
    int seen = 0;  // a file of this launch's tag was read: its id and beat
    uint64_t seen_beat = 0;
    ncclUniqueId seen_id;
    memset(&seen_id, 0, sizeof seen_id);
    char why[FILES_ERR_LEN];
    while (comm_now_s() < deadline) {
        long long size = 0;  // (a FIFO or a directory named like it must not block the wait: refused, said)
        int fd = open_regular(path, "an NCCL id file", FILE_MAX_SMALL, &size, why);
        if (fd < 0 && errno != ENOENT) last = why;
        if (fd >= 0) {
            int got = size >= (long long)sizeof f && read_fd(fd, &f, sizeof f, 0);
            close(fd);
            if (!got)
                last = "truncated";
            else if (memcmp(f.magic, COMM_FILE_MAGIC, 8) != 0)
                last = "not an NCCL id file";
            else if (f.tag != tag)
                last = "from another launch (other --out, world size or MASTER_PORT)";
            else if (!seen || memcmp(&f.id, &seen_id, sizeof f.id) != 0) {
                seen = 1, seen_id = f.id, seen_beat = f.beat;
                last = "stale: never rewritten, so its rank 0 is gone (an earlier run that died?)";
            } else if (f.beat != seen_beat) {
                *id = f.id;
                return 0;
            }
        }
        comm_sleep_s(0.02);
    }
    snprintf(err, en, "rank %d waited %.0f s for the NCCL id in %.3000s (%s; is --out on a shared file system?)",
             c->rank, c->timeout_s, path, last);
    return -1;
}

// ----------------------------------------------------------------------------
// The watchdog: every wait on NCCL goes through comm_poll

// comm_die: abort the communicator (the other ranks' waits then fail too) and exit 1 with one line
// that names the rank, the step and what was waited for.
static inline void comm_die(Comm* c, const char* what, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void comm_die(Comm* c, const char* what, const char* fmt, ...) {
    char why[512], step[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (c->step > 0)
        snprintf(step, sizeof step, "step %d", c->step);
    else
        snprintf(step, sizeof step, "before step 1");
    fprintf(stderr, "trainer: rank %d of %d: %s: %s: %s; aborting the communicator\n", c->rank, c->world, step, what,
            why);
    fflush(stderr);
    if (c->release) *c->release = 1;  // a stalled kernel (the test hook) ends: the process can exit
    if (c->nccl) ncclCommAbort(c->nccl);
    c->nccl = NULL;
    exit(1);  // ncclCommAbort has ended this rank's NCCL kernels, so the CUDA runtime's exit handlers do not wait
}

// comm_poll: wait until the communicator has nothing in progress and, when s is not NULL, stream s has
// finished all its work; polls ncclCommGetAsyncError (and cudaStreamQuery) with the deadline
// timeout_s. Dies (comm_die) on an NCCL or CUDA error or at the deadline.
static inline void comm_poll(Comm* c, cudaStream_t s, const char* what, double timeout_s) {
    double start = comm_now_s(), last = start;
    for (long i = 0;; i++) {
        ncclResult_t ae = ncclSuccess;  // one rank (no communicator): only the stream is polled
        ncclResult_t r = c->nccl ? ncclCommGetAsyncError(c->nccl, &ae) : ncclSuccess;
        if (r != ncclSuccess) ae = r;
        if (ae != ncclSuccess && ae != ncclInProgress)
            comm_die(c, what, "NCCL error: %s (%s)", ncclGetErrorString(ae), ncclGetLastError(c->nccl));
        int done = ae == ncclSuccess;
        if (done && s) {
            cudaError_t q = cudaStreamQuery(s);
            if (q == cudaErrorNotReady)
                done = 0;
            else if (q != cudaSuccess)
                comm_die(c, what, "CUDA error: %s", cudaGetErrorString(q));
        }
        if (done) return;
        double t = comm_now_s();
        // Time this process did not run (stopped, SIGSTOP/SIGCONT, or suspended) is not the others' fault:
        // it does not count, and a peer's abort in the meantime is reported instead of a timeout.
        if (t - last > 1.0) start += t - last;
        last = t;
        if (t - start > timeout_s && c->world > 1)
            comm_die(c, what,
                     "no progress for %.0f s (--nccl-timeout %g): a rank died, stopped or fell behind (see the other "
                     "ranks' logs)",
                     t - start, c->timeout_s);
        if (t - start > timeout_s)  // one process: no other rank to wait for; its own device work is what is late
            comm_die(c, what,
                     "no progress for %.0f s (--nccl-timeout %g): this process's own device work has not finished "
                     "(one process: no other rank is waited for); a step slower than that needs a larger "
                     "--nccl-timeout or a smaller --batch, and a hung kernel ends here",
                     t - start, c->timeout_s);
        if (i < 100)
            sched_yield();
        else
            comm_sleep_s(i < 1000 ? 1e-5 : 2e-4);  // at most 0.2 ms late; ~5000 cheap polls a second
    }
}

// comm_check: the result of an NCCL call on c. ncclInProgress (a non-blocking communicator: the call is
// still being enqueued) is polled to completion before anything else may use the communicator or read
// the call's result on the host; an error dies (comm_die).
static inline void comm_check(Comm* c, ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) comm_die(c, what, "NCCL error: %s (%s)", ncclGetErrorString(r), ncclGetLastError(c->nccl));
    comm_poll(c, NULL, what, c->timeout_s);
}

// comm_wait: wait for all the work on stream s (its collectives included): cudaStreamSynchronize with
// the watchdog. `what` names the collective for the message when something goes wrong. Every host sync
// on a stream that may hold collectives goes through here.
// With one rank too: a host sync never blocks in the CUDA runtime, so a kernel that never ends (or the
// MLM_TEST_STALL hook) stops the run at the deadline instead of hanging it.
static inline void comm_wait(Comm* c, cudaStream_t s, const char* what) { comm_poll(c, s, what, c->timeout_s); }

// ----------------------------------------------------------------------------
// Joining

typedef struct {
    const char* bootstrap;  // "tcp" or "file"
    const char* dir;        // --bootstrap file: where the id file goes (--out)
    const char* out;        // --out (part of the launch tag; may be NULL)
    double started;         // CLOCK_REALTIME when this process started
} CommBootstrap;

// comm_init: rank 0's ncclUniqueId to every rank (comm_bootstrap), then a non-blocking communicator of
// all ranks, polled with the deadline (nothing when world == 1). Dies with one line on any failure.
static inline void comm_init(Comm* c, const CommBootstrap* b) {
    if (c->world == 1) return;
    uint64_t tag = comm_launch_tag(c, b->out);
    double deadline = comm_now_s() + c->timeout_s;
    char err[4096] = "", host[256] = "";
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    int rc;
    if (!strcmp(b->bootstrap, "file")) {
        rc = comm_file_id(c, b->dir, tag, &id, deadline, err, sizeof err);
    } else {
        int port = comm_port(tag, err, sizeof err);
        rc = port < 0 || comm_master_addr(host, sizeof host, err, sizeof err) ? -1 : 0;
        if (rc == 0)
            rc = c->rank == 0 ? comm_serve_id(c, port, tag, &id, deadline, err, sizeof err)
                              : comm_fetch_id(c, host, port, tag, &id, deadline, err, sizeof err);
    }
    if (rc != 0) comm_die(c, "bootstrap (the NCCL id)", "%s", err);
    // Non-blocking: init returns ncclInProgress and completes in the background; comm_poll waits for it
    // with the deadline (NCCL's user guide, "Creating a communicator with options").
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->nccl, c->world, id, c->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        c->nccl = NULL;
        comm_die(c, "ncclCommInitRankConfig", "NCCL error: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
    }
    comm_poll(c, NULL, "ncclCommInitRankConfig", deadline - comm_now_s() + 1e-3);
    comm_beat_stop();  // --bootstrap file, rank 0: every rank has joined; the id file is no longer needed
}

// comm_sum: in-place sum over all ranks of n floats on the device (nothing when world == 1).
static inline void comm_sum(Comm* c, float* x, size_t n, cudaStream_t s, const char* what) {
    if (c->world == 1) return;
    comm_check(c, ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c->nccl, s), what);
    comm_count(c, COMM_ALLREDUCE, n * sizeof(float), 0);
}

// ----------------------------------------------------------------------------
// Agreement: the ranks compare values before they commit to a plan

typedef struct {
    const char* name;  // what it is, for the message
    int64_t value;     // this rank's
    int64_t min, max;  // over all ranks (comm_agree fills them)
} CommValue;

// An agreement table (comm_agree_flags): each entry a flag's name, how to show it, and this rank's value.
enum { COMM_INT, COMM_REAL, COMM_FINGERPRINT, COMM_SMALLEST };  // COMM_SMALLEST: all take the minimum, no error
typedef struct {
    const char* name;
    int kind;
    int64_t value;  // COMM_REAL: the double's bits
} CommFlag;
static inline CommFlag comm_flag_int(const char* name, int64_t value) {
    CommFlag f = {name, COMM_INT, value};
    return f;
}
static inline CommFlag comm_flag_real(const char* name, double d) {
    CommFlag f = {name, COMM_REAL, 0};
    memcpy(&f.value, &d, sizeof d);
    return f;
}
static inline CommFlag comm_flag_fingerprint(const char* name, uint64_t h) {
    CommFlag f = {name, COMM_FINGERPRINT, (int64_t)h};
    return f;
}
static inline CommFlag comm_flag_smallest(const char* name, int64_t value) {
    CommFlag f = {name, COMM_SMALLEST, value};
    return f;
}
static inline double comm_real_of(int64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

// comm_fmt_real: d with the fewest digits that read back as d (as a float when d is one: --lr 5e-3 is
// "0.005", not 0.00499999989).
static inline const char* comm_fmt_real(char* buf, size_t n, double d) {
    int is_float = (double)(float)d == d;
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, d);
        double back = strtod(buf, NULL);
        if (is_float ? (float)back == (float)d : back == d) break;
    }
    return buf;
}

// comm_agree: the minimum and maximum over all ranks of each value, with one AllReduce (MAX of the
// values and of their negations), waited for with the watchdog. With one rank, min = max = value.
static inline void comm_agree(Comm* c, CommValue* v, int n) {
    for (int i = 0; i < n; i++) v[i].min = v[i].max = v[i].value;
    if (c->world == 1) return;
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) comm_die(c, "agreement AllReduce", "cannot create a stream");
    int64_t* h = NULL;  // pinned: the copy back returns at once, and comm_wait waits for it with the watchdog
    if (cudaMallocHost((void**)&h, 2 * n * sizeof(int64_t)) != cudaSuccess)
        comm_die(c, "agreement AllReduce", "cannot allocate %d pinned values", n);
    int64_t* d = NULL;
    for (int i = 0; i < n; i++) h[i] = v[i].value, h[n + i] = v[i].value == INT64_MIN ? INT64_MAX : -v[i].value;
    if (cudaMalloc((void**)&d, 2 * n * sizeof(int64_t)) != cudaSuccess ||
        cudaMemcpyAsync(d, h, 2 * n * sizeof(int64_t), cudaMemcpyHostToDevice, s) != cudaSuccess)
        comm_die(c, "agreement AllReduce", "cannot stage %d values on the device", n);
    comm_check(c, ncclAllReduce(d, d, 2 * (size_t)n, ncclInt64, ncclMax, c->nccl, s), "agreement AllReduce");
    comm_count(c, COMM_ALLREDUCE, 2 * (size_t)n * sizeof(int64_t), 0);
    if (cudaMemcpyAsync(h, d, 2 * n * sizeof(int64_t), cudaMemcpyDeviceToHost, s) != cudaSuccess)
        comm_die(c, "agreement AllReduce", "cannot read the values back");
    comm_wait(c, s, "agreement AllReduce");
    for (int i = 0; i < n; i++) v[i].max = h[i], v[i].min = -h[n + i];
    cudaFree(d);
    cudaStreamDestroy(s);
    cudaFreeHost(h);
}

// comm_agree_flags: comm_agree of the n flags of a table (v: n values, min and max filled), then one line
// on stderr for each flag the ranks do not agree on, naming it with this rank's value and the others' (an
// integer or a fingerprint: the range over the ranks; a real number: another rank's value). Gives how many
// differ: the same on every rank, so that all stop together.
static inline int comm_agree_flags(Comm* c, const CommFlag* f, int n, CommValue* v) {
    for (int i = 0; i < n; i++) v[i].name = f[i].name, v[i].value = f[i].value;
    comm_agree(c, v, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].min == v[i].max || f[i].kind == COMM_SMALLEST) continue;
        bad++;
        fprintf(stderr, "trainer: rank %d of %d: the ranks disagree on %s: ", c->rank, c->world, f[i].name);
        if (f[i].kind == COMM_REAL) {  // min and max are the bits of two ranks' values (not their numeric order)
            int64_t other = v[i].value == v[i].min ? v[i].max : v[i].min;
            char a[32], b[32];
            fprintf(stderr, "%s here, %s on another rank\n", comm_fmt_real(a, sizeof a, comm_real_of(v[i].value)),
                    comm_fmt_real(b, sizeof b, comm_real_of(other)));
        } else if (f[i].kind == COMM_FINGERPRINT) {
            fprintf(stderr,
                    "fingerprint %016llx here, from %016llx to %016llx over the ranks: every rank must run the same "
                    "command on the same files\n",
                    (unsigned long long)v[i].value, (unsigned long long)v[i].min, (unsigned long long)v[i].max);
        } else {
            fprintf(stderr, "%lld here, from %lld to %lld over the ranks\n", (long long)v[i].value, (long long)v[i].min,
                    (long long)v[i].max);
        }
    }
    return bad;
}

// comm_free: a non-blocking communicator is finalized (ncclCommFinalize, polled to completion with the
// watchdog), then destroyed.
static inline void comm_free(Comm* c) {
    if (!c->nccl) return;
    comm_check(c, ncclCommFinalize(c->nccl), "ncclCommFinalize");
    ncclCommDestroy(c->nccl);
    c->nccl = NULL;
}

// ---------------------------------------------------------------------------------------------
// Gradient reduction and ZeRO-1
//
// Buckets. On the last micro-step of a step the gradients are reduced in buckets, on a communication
// stream, while the backward goes on: bert_backward records grad_ready[k] on the compute stream as the
// gradients [bert_grad_ready_lo(k), n_decay) of the slab's matrix region become final (the head, then
// layers L-1 .. 0: the matrix region from its end down), and everything at k = L+1. A bucket is a
// contiguous range of the slab; it waits for its event on the communication stream (cudaStreamWaitEvent),
// then its collective runs there; the compute stream waits only for what is left when the backward ends
// (an event recorded after the last bucket), before the gradient norm and AdamW.
// Launch order: buckets of --bucket-mb from the matrix region's end down, each as soon as the backward
// has made it; at the end the vector region (biases, LayerNorm: final only after the backward's last
// kernel), then what is left of the matrix region (the embeddings, whose word-embedding gradient the
// tied decoder wrote first and the embedding backward writes last).
//
// fp32 (default): ncclAllReduce (ncclAvg) of the bucket in place. bf16 (--grad-reduce bf16): a kernel on
// the communication stream casts the bucket into a bf16 staging buffer, the ranks sum it in bf16 (half
// the bytes on the wire), and a kernel casts the sum back to fp32 times 1/world. One staging buffer of
// the largest bucket suffices: the cast, the collective and the cast back of one bucket are in order
// on the communication stream before the next bucket's cast.
//
// ZeRO-1 (--zero 1): each bucket is split into world equal pieces of `piece` elements (a multiple of 4);
// rank r owns piece r of every bucket: it holds the fp32 master weights and AdamW m, v of those
// elements only (its shard: the sum of the pieces, 1/world of the slab plus padding). The gradients
// are reduce-scattered (ncclReduceScatter, in place: rank r gets the average of piece r), each rank
// updates its pieces, and ncclAllGather gives every rank all the new floatX weights. Sharding each
// bucket (rather than cutting the flat slab into world ranges) keeps every collective a plain
// ReduceScatter of one bucket, so the reduction overlaps the backward as above. Every bucket's size is
// a multiple of 4 * world except the topmost one (the slab's end), whose padding reaches into `slack`
// elements allocated after the gradients and the floatX weights: in-place collectives never touch a
// neighbour bucket. The gradient norm for clipping is global: each rank sums the squares of its
// pieces, and the step's one all-reduce adds them up.
//
// Checkpoints keep the full format: the shards are gathered (copied into place in a full-size buffer,
// then one in-place AllGather per bucket) into the gradient buffer, which is free between steps, and
// --resume copies each rank's pieces out of the full arrays, whatever world size or --zero wrote them.

#include "kernels.cuh"  // grad_to_bf16, grad_from_bf16, grad_norm_partial, accumulate_sum, launch

typedef struct {
    size_t lo, n;      // the bucket: the slab's elements [lo, lo + n)
    size_t piece;      // ZeRO-1: elements per rank (the bucket padded to world * piece); rank r's at lo + r * piece
    size_t state_off;  // ZeRO-1: where this rank's piece starts in its shard of master weights and AdamW state
    int event;         // the bucket is final once the backward recorded grad_ready[event]
} GradBucket;

typedef struct {
    Comm* comm;
    int zero, bf16;         // --zero 1; --grad-reduce bf16
    int n;                  // buckets, in launch order
    GradBucket* b;          // (n)
    size_t numel, slack;    // the slab's elements; ZeRO-1: elements after it that the topmost bucket's padding uses
    size_t state_numel;     // elements of master weights and AdamW m, v this rank holds (numel without ZeRO-1)
    size_t stage_elems;     // --grad-reduce bf16 with world > 1: elements of the bf16 staging buffer; else 0
    size_t onebit_bytes;    // --comm onebit: device bytes of its state (compress.h; the trainer sets it); else 0
    struct OneBit* onebit;  // --comm onebit: its state (compress.h; the trainer sets it); else NULL
    // the device side (grad_reduce_start)
    cudaStream_t stream;  // the communication stream
    cudaEvent_t* ready;   // (n_events) the events bert_backward records (BertModel.grad_ready)
    int n_events;
    cudaEvent_t done;      // recorded on the communication stream after the last bucket
    __nv_bfloat16* stage;  // (stage_elems)
} GradReduce;

// grad_reduce_layout: the buckets for a slab of numel elements whose matrix region ends at top, when
// after event k < n_events - 1 the range [ready_lo[k], top) is final and after the last event everything
// is. bucket_elems: the target bucket size. Host only; the same on every rank.
static inline void grad_reduce_layout(GradReduce* g, Comm* c, size_t numel, size_t top, const size_t* ready_lo,
                                      int n_events, size_t bucket_elems, int zero, int bf16) {
    memset(g, 0, sizeof *g);
    g->comm = c, g->zero = zero, g->bf16 = bf16, g->numel = numel, g->n_events = n_events;
    size_t W = (size_t)c->world, A = 4 * W;  // every bucket but the topmost: a multiple of A elements
    size_t S = bucket_elems / A * A;
    if (S < 2 * A) S = 2 * A;
    size_t cap = numel / S + (size_t)n_events + 4;
    g->b = (GradBucket*)calloc(cap, sizeof(GradBucket));
    if (!g->b) {
        fprintf(stderr, "comm: out of host memory for %zu gradient buckets\n", cap);
        exit(1);
    }
#define GR_EMIT(lo_, n_, ev_) (g->b[g->n].lo = (lo_), g->b[g->n].n = (n_), g->b[g->n].event = (ev_), g->n++)
    size_t v_lo = top / A * A, hi = v_lo;  // the tail [v_lo, numel): the vector region and < A matrix elements
    for (int k = 0; k + 1 < n_events; k++)
        while (hi >= S && hi - S >= ready_lo[k]) GR_EMIT(hi - S, S, k), hi -= S;
    for (size_t t = v_lo; t < numel; t += S) GR_EMIT(t, numel - t < S ? numel - t : S, n_events - 1);
    for (; hi > 0; hi -= hi < S ? hi : S) GR_EMIT(hi - (hi < S ? hi : S), hi < S ? hi : S, n_events - 1);
#undef GR_EMIT
    size_t off = 0;
    for (int i = 0; i < g->n; i++) {
        GradBucket* b = &g->b[i];
        b->piece = ((b->n + W - 1) / W + 3) / 4 * 4;
        b->state_off = off;
        off += b->piece;
        if (zero && b->lo + W * b->piece > numel + g->slack) g->slack = b->lo + W * b->piece - numel;
        size_t staged = zero ? W * b->piece : b->n;
        if (bf16 && W > 1 && staged > g->stage_elems) g->stage_elems = staged;
    }
    g->state_numel = zero ? off : numel;
}

// grad_reduce_piece: rank r's piece of bucket b: the slab's elements [*off, *off + *n) (*n may be 0).
static inline void grad_reduce_piece(const GradReduce* g, const GradBucket* b, int r, size_t* off, size_t* n) {
    size_t start = (size_t)r * b->piece;
    *off = b->lo + start;
    *n = b->n > start ? (b->n - start < b->piece ? b->n - start : b->piece) : 0;
}

// grad_reduce_start: the communication stream, the events and the bf16 staging buffer (stage_elems).
static inline void grad_reduce_start(GradReduce* g) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    g->ready = (cudaEvent_t*)malloc(g->n_events * sizeof(cudaEvent_t));
    for (int k = 0; k < g->n_events; k++) CUDA_CHECK(cudaEventCreateWithFlags(&g->ready[k], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
    if (g->stage_elems) CUDA_CHECK(cudaMalloc((void**)&g->stage, g->stage_elems * sizeof(__nv_bfloat16)));
}

static inline void grad_reduce_free(GradReduce* g) {
    if (g->ready) {
        for (int k = 0; k < g->n_events; k++) cudaEventDestroy(g->ready[k]);
        cudaEventDestroy(g->done);
        cudaStreamDestroy(g->stream);
        cudaFree(g->stage);
    }
    free(g->ready);
    free(g->b);
    memset(g, 0, sizeof *g);
}

static inline dim3 gr_grid(size_t n) {
    size_t b = (n + 255) / 256;
    return dim3((unsigned)(b < 1 ? 1 : b > (size_t)launch_grid_cap() ? (size_t)launch_grid_cap() : b));
}

// grad_reduce_launch: enqueues every bucket's reduction of grad on the communication stream, each after
// its event (nothing when world == 1). Call it after the last micro-step's bert_backward was enqueued with
// BertModel.grad_ready = g->ready (the device is then still running that backward, and the buckets start
// as their events pass); then grad_reduce_wait before anything reads the gradients.
static inline void grad_reduce_launch(GradReduce* g, float* grad) {
    Comm* c = g->comm;
    if (c->world == 1) return;
    float inv_world = 1.f / (float)c->world;
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        float* x = grad + b->lo;
        size_t mine = (size_t)c->rank * b->piece, off, n;
        CUDA_CHECK(cudaStreamWaitEvent(g->stream, g->ready[b->event], 0));
        if (!g->bf16 && g->zero) {
            comm_check(c, ncclReduceScatter(x, x + mine, b->piece, ncclFloat32, ncclAvg, c->nccl, g->stream),
                       "gradient ReduceScatter");
            comm_count(c, COMM_REDUCESCATTER, b->piece * sizeof(float), 0);
        } else if (!g->bf16) {
            comm_check(c, ncclAllReduce(x, x, b->n, ncclFloat32, ncclAvg, c->nccl, g->stream), "gradient AllReduce");
            comm_count(c, COMM_ALLREDUCE, b->n * sizeof(float), 0);
        } else if (g->zero) {
            size_t padded = (size_t)c->world * b->piece;
            launch(grad_to_bf16, gr_grid(padded), dim3(256), 0, g->stream, g->stage, (const float*)x, b->n, padded);
            comm_check(
                c, ncclReduceScatter(g->stage, g->stage + mine, b->piece, ncclBfloat16, ncclSum, c->nccl, g->stream),
                "gradient ReduceScatter (bf16)");
            comm_count(c, COMM_REDUCESCATTER, b->piece * sizeof(__nv_bfloat16), 0);
            grad_reduce_piece(g, b, c->rank, &off, &n);
            if (n)
                launch(grad_from_bf16, gr_grid(n), dim3(256), 0, g->stream, grad + off,
                       (const __nv_bfloat16*)g->stage + mine, n, inv_world);
        } else {
            launch(grad_to_bf16, gr_grid(b->n), dim3(256), 0, g->stream, g->stage, (const float*)x, b->n, b->n);
            comm_check(c, ncclAllReduce(g->stage, g->stage, b->n, ncclBfloat16, ncclSum, c->nccl, g->stream),
                       "gradient AllReduce (bf16)");
            comm_count(c, COMM_ALLREDUCE, b->n * sizeof(__nv_bfloat16), 0);
            launch(grad_from_bf16, gr_grid(b->n), dim3(256), 0, g->stream, x, (const __nv_bfloat16*)g->stage, b->n,
                   inv_world);
        }
    }
    CUDA_CHECK(cudaEventRecord(g->done, g->stream));
}

// grad_reduce_wait: the compute stream waits for the last bucket (the part of the reduction that the
// backward did not hide).
static inline void grad_reduce_wait(GradReduce* g, cudaStream_t compute) {
    if (g->comm->world > 1) CUDA_CHECK(cudaStreamWaitEvent(compute, g->done, 0));
}

// zero_grad_sumsq: acc[0] += the sum of squares of this rank's reduced gradient pieces (partial: the
// grad-norm scratch of launch_grid_cap() floats). The step's all-reduce then sums acc over ranks.
static inline void zero_grad_sumsq(const GradReduce* g, const float* grad, float* partial, float* acc, cudaStream_t s) {
    for (int i = 0; i < g->n; i++) {
        size_t off, n;
        grad_reduce_piece(g, &g->b[i], g->comm->rank, &off, &n);
        if (!n) continue;
        int blocks = (int)((n + 1023) / 1024 < (size_t)launch_grid_cap() ? (n + 1023) / 1024 : launch_grid_cap());
        launch(grad_norm_partial, dim3(blocks), dim3(256), 0, s, partial, grad + off, n);
        launch(accumulate_sum, dim3(1), dim3(256), 0, s, acc, (const float*)partial, blocks);
    }
}

// zero_allgather: every rank's updated pieces of the floatX weights w to every rank (in place).
static inline void zero_allgather(const GradReduce* g, floatX* w, cudaStream_t s) {
    Comm* c = g->comm;
    if (c->world == 1) return;
    ncclDataType_t t = sizeof(floatX) == 2 ? ncclBfloat16 : ncclFloat32;
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        comm_check(c, ncclAllGather(w + b->lo + (size_t)c->rank * b->piece, w + b->lo, b->piece, t, c->nccl, s),
                   "weight AllGather (ZeRO-1)");
        comm_count(c, COMM_ALLGATHER, b->piece * sizeof(floatX), 0);
    }
}

// zero_gather: the full array (numel + slack fp32 elements) from every rank's shard of it (in full's
// place on every rank). Synchronizes s.
static inline void zero_gather(const GradReduce* g, const float* shard, float* full, cudaStream_t s) {
    Comm* c = g->comm;
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        size_t off, n;
        grad_reduce_piece(g, b, c->rank, &off, &n);
        if (n)
            CUDA_CHECK(
                cudaMemcpyAsync(full + off, shard + b->state_off, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
        if (c->world > 1) {
            comm_check(c, ncclAllGather(full + off, full + b->lo, b->piece, ncclFloat32, c->nccl, s),
                       "checkpoint AllGather (ZeRO-1)");
            comm_count(c, COMM_ALLGATHER, b->piece * sizeof(float), 0);
        }
    }
    comm_wait(c, s, "checkpoint AllGather (ZeRO-1)");
}

// zero_scatter: this rank's shard out of a full array (numel fp32 elements). No communication.
static inline void zero_scatter(const GradReduce* g, const float* full, float* shard, cudaStream_t s) {
    for (int i = 0; i < g->n; i++) {
        const GradBucket* b = &g->b[i];
        size_t off, n;
        grad_reduce_piece(g, b, g->comm->rank, &off, &n);
        if (n)
            CUDA_CHECK(
                cudaMemcpyAsync(shard + b->state_off, full + off, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
    }
    comm_wait(g->comm, s, "ZeRO-1 scatter");  // s may still hold collectives: through the watchdog
}
