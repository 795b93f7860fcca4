// cpu/nccl.cpp: NCCL for the CPU build. It implements, from the real <nccl.h>, the calls mlm.c uses,
// between processes (or threads) on one machine, through one POSIX shared-memory segment per
// communicator. Link with -lrt -pthread.
//
// How it works
//   ncclGetUniqueId writes a fresh shared-memory name and a random nonce into the 128-byte id.
//   ncclCommInitRank: the first rank to arrive creates the segment (shm_open with O_EXCL), the
//   others attach to it; each rank claims its slot and waits for all the others. The last rank to
//   join unlinks the name, so /dev/shm is clean as soon as the communicator is up (the mappings
//   stay valid until munmap).
//   Segment layout: Header | Slot[nranks] | data: nranks buffers of chunk_bytes each.
//   A collective moves the data through those buffers one chunk at a time. Between the steps the
//   ranks meet in a barrier: barrier number k means "rank r stores k in its slot's seq, then waits
//   until every slot's seq >= k". The barrier numbers are counted by every rank the same way, so
//   no reset is ever needed.
//   Reductions follow NCCL's ring (see "The ring's order and rounding" below): each piece is summed
//   rank after rank around the ring, rounded to the datatype at every hop (bf16 included), and
//   every rank copies the same result bytes, so all ranks get bitwise the same answer, whatever
//   the order in which they arrived.
//
// Failures never hang
//   While it waits, a rank checks every 10 ms whether the ranks it waits for are still there:
//   kill(pid, 0) and /proc/<pid>/stat (a zombie, i.e. a process that exited but was not reaped
//   yet, counts as dead), and whether one of them left (ncclCommDestroy) or aborted. Without any
//   of that, it gives up after NCCL_EMU_TIMEOUT_S seconds without progress (default 300).
//   The first rank that sees a failure writes it into the header; every other rank's current and
//   later calls then fail at once with the same message. Errors are sticky: the communicator
//   stays failed, ncclCommGetAsyncError reports it, and ncclCommAbort (or Destroy) frees it.
//   Only waits look for dead peers: on an idle communicator ncclCommGetAsyncError reports the
//   failures already seen (here or published by a peer), not a peer that exited after its last
//   collective (ranks that finish, or stop on an error of their own, one after the other).
//
// Semantics decisions
//   Streams: a collective on a stream runs on that stream's worker (cpu/runtime.cpp), in stream
//   order, as NCCL's kernel does, and the call returns once it is enqueued (both kinds of
//   communicator: "blocking" is about init and enqueueing, as in NCCL). Its errors are the
//   communicator's, sticky: ncclCommGetAsyncError reports them and later calls return them; a
//   collective that was queued before ncclCommAbort fails at once when its turn comes, and Abort
//   waits for it. A collective on a stream that failed keeps its stream busy until ncclCommAbort
//   (or ncclCommDestroy of the failed communicator), as NCCL's kernel spins until the abort flag
//   stops it: cudaStreamQuery says cudaErrorNotReady meanwhile (hold_until_abort).
//   On the legacy default stream (NULL) a call runs when it is called (blocking) or
//   in the communicator's thread (non-blocking, below). Buffers are plain host memory.
//   Non-blocking communicators (ncclCommInitRankConfig with config.blocking = 0), as NCCL's user
//   guide describes them ("Creating a communicator with options", "Fault tolerance"): init
//   returns ncclInProgress at once and completes in a thread of the communicator;
//   ncclCommGetAsyncError says ncclInProgress until it has, then ncclSuccess or the error. Every
//   later call on the communicator (a collective, or a group's calls at ncclGroupEnd) is queued
//   to that thread, runs there in order, and returns ncclInProgress; ncclCommGetAsyncError says
//   ncclInProgress while anything is queued or running. So the caller polls, with a deadline of
//   its own, and a peer that stops (SIGSTOP) without dying cannot hang it: ncclCommAbort from
//   the polling thread stops the queued work. Results may be read once the poll says ncclSuccess.
//   Groups: calls between ncclGroupStart and ncclGroupEnd are queued and run, in order, at the
//   outermost ncclGroupEnd, which returns the first error. ncclCommInitRank inside a group runs at
//   once. A thread can drive only one rank of a communicator: a group with calls for two ranks of
//   the same communicator returns ncclInvalidUsage (real NCCL allows that).
//   ncclAvg is, as in NCCL, each term times 1/nranks summed around the ring (floating types), or the
//   sum divided by nranks (integers: truncating division).
//   Every collective first checks that all ranks called the same thing (kind, count, type, op,
//   root); if not, every rank gets ncclInvalidUsage instead of garbage.
//   ncclSend/ncclRecv: the sends and receives of one communicator in a group run as one exchange
//   that every rank of the communicator joins (see "Point to point" below).
//
// Environment
//   NCCL_EMU_TIMEOUT_S    seconds a rank waits for the others without progress (default 300;
//                         0 or less: no timeout, dead peers are still noticed within ~10 ms)
//   NCCL_EMU_CHUNK_BYTES  bytes of one rank's buffer (default 4 MiB; the rank that creates the
//                         segment decides, the others read it from the header)
//   NCCL_EMU_GBPS         an emulated network: every collective takes at least NCCL_EMU_LATENCY_US
//   NCCL_EMU_LATENCY_US   + the bytes a rank sends / NCCL_EMU_GBPS Gbit/s ("Emulated network" below)
//   NCCL_DEBUG            WARN, INFO or TRACE: print every error to stderr
//   NCCL_EMU_STATS        PATH: ncclCommDestroy writes the bytes this rank sent (NCCL's ring model) to
//                         PATH.RANK (see "Bytes sent" below)
#include <nccl.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <type_traits>
#include "emu_stream.h"

// ---------------------------------------------------------------------------------------------
// Shared memory layout

#define ID_MAGIC "MLMNCCL1"
#define SEGMENT_MAGIC 0x314c43434e4d4c4dull  // "MLMNCCL1" as a little-endian number
#define DEFAULT_CHUNK_BYTES ((size_t)4 << 20)
#define MAX_RANKS 1024
#define CHECK_INTERVAL_S 0.01  // how often a waiting rank looks for dead peers and timeouts
#define SPINS 200              // busy polls before a waiting rank yields the CPU ...
#define YIELDS 50              // ... and sched_yield() calls before it sleeps on the futex

namespace {  // the types of this file stay private to it (other files may use the same names)

// What ncclGetUniqueId puts into the 128 bytes of ncclUniqueId.
struct IdInfo {
    char magic[8];   // ID_MAGIC
    uint64_t nonce;  // random; the segment header repeats it
    char name[96];   // the shm_open name
};
static_assert(sizeof(IdInfo) <= NCCL_UNIQUE_ID_BYTES, "IdInfo must fit into ncclUniqueId");

enum { SLOT_EMPTY = 0, SLOT_JOINED = 1, SLOT_LEFT = 2 };

// Which collective a rank is running: every rank compares all of them before moving data.
struct OpDesc {
    int32_t kind, dtype, op, root;
    uint64_t count, serial;
};

// One per rank. Written by its rank, read by all; aligned so that ranks do not share cache lines.
struct alignas(128) Slot {
    int32_t claimed;  // set once by the rank that takes this slot (catches a rank joining twice)
    int32_t state;    // SLOT_*; JOINED is stored after pid, pid_ns and start_time
    int32_t pid;
    int32_t pad;
    uint64_t pid_ns;      // inode of /proc/self/ns/pid (0: unknown); pids only compare within one
    uint64_t start_time;  // field 22 of /proc/<pid>/stat, to notice a recycled pid
    uint64_t seq;         // the last barrier this rank reached
    OpDesc desc[2];       // this rank's current collective, by parity of its serial number
};

struct Header {
    uint64_t magic;  // SEGMENT_MAGIC, stored last by the creator
    uint64_t nonce;
    int32_t nranks;
    int32_t attached;  // ranks that joined so far
    uint64_t chunk_bytes, data_offset, total_bytes;
    uint32_t wake;       // futex word: bumped at every barrier arrival and failure
    int32_t waiters;     // ranks sleeping on the futex
    int32_t fail_claim;  // the first rank to see a failure sets this, then writes fail_msg ...
    int32_t fail_code;   // ... and then this (an ncclResult_t; 0 while all is well)
    char fail_msg[200];
};

}  // namespace

namespace {
struct Call;  // one collective call (below)
}  // namespace

// The opaque ncclComm_t of <nccl.h>: one rank's view of the communicator.
struct ncclComm {
    int rank, nranks;
    Header* hdr;
    Slot* slots;
    char* data;  // nranks buffers of chunk_bytes each
    size_t chunk_bytes, map_bytes;
    uint64_t nonce;
    uint64_t bar;      // barriers this rank has entered so far
    uint64_t serial;   // collectives this rank has started so far
    double timeout_s;  // <= 0: no timeout
    pid_t my_pid;
    uint64_t my_ns;
    int have_proc;       // /proc/<pid>/stat can be read (else only kill(pid, 0) is used)
    const char* cur_op;  // the API call running now, for error messages
    int error;           // sticky ncclResult_t (0 = none)
    int aborting;        // set by ncclCommAbort, seen by a thread that waits inside a call
    int busy;            // threads inside a call on this communicator
    int on_streams;      // collectives enqueued on a stream and not finished yet (atomic)
    char last_error[256];
    // Non-blocking communicators only (blocking == 0): the thread that runs init and then the
    // queued calls, in order. pending counts init and the calls not finished yet.
    int blocking;
    int init_done;  // init succeeded: hdr and slots are valid
    int pending;
    int stop;  // the thread exits once the queue is empty (Destroy), or at once (Abort empties it)
    pthread_t worker;
    int have_worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    Call* queue;  // a ring of q_cap calls, q_n of them from q_head
    int q_head, q_n, q_cap;
    IdInfo id;                        // for the init that runs in the thread
    uint64_t stat_bytes, stat_calls;  // bytes this rank sent and calls that succeeded (NCCL_EMU_STATS, below)
};

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

// ---------------------------------------------------------------------------------------------
// Small helpers: time, errors, futex, liveness of a peer

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

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static thread_local char tls_last_error[256];

static int debug_enabled(void) {
    const char* d = getenv("NCCL_DEBUG");
    return d && (!strcasecmp(d, "WARN") || !strcasecmp(d, "INFO") || !strcasecmp(d, "TRACE"));
}

// vrecord_error: remember a message for ncclGetLastError (and print it under NCCL_DEBUG).
static ncclResult_t vrecord_error(ncclComm* c, ncclResult_t code, const char* fmt, va_list ap) {
    vsnprintf(tls_last_error, sizeof tls_last_error, fmt, ap);
    if (c) memcpy(c->last_error, tls_last_error, sizeof c->last_error);
    if (debug_enabled()) {
        if (c)
            fprintf(stderr, "NCCL-EMU WARN rank %d/%d: %s\n", c->rank, c->nranks, tls_last_error);
        else
            fprintf(stderr, "NCCL-EMU WARN: %s\n", tls_last_error);
    }
    return code;
}

// record_error: an error of one call; returns code.
static ncclResult_t record_error(ncclComm* c, ncclResult_t code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclResult_t record_error(ncclComm* c, ncclResult_t code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrecord_error(c, code, fmt, ap);
    va_end(ap);
    return code;
}

// comm_fail: the communicator is broken for good: keep its first error (sticky); returns code.
static ncclResult_t comm_fail(ncclComm* c, ncclResult_t code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
// The message is written before the error is published: a thread that polls ncclCommGetAsyncError and
// then ncclGetLastError (the trainer's watchdog) must never see the error without its message.
static ncclResult_t comm_fail(ncclComm* c, ncclResult_t code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrecord_error(c, code, fmt, ap);
    va_end(ap);
    int none = 0;
    __atomic_compare_exchange_n(&c->error, &none, (int)code, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return code;
}

static void futex_wait(uint32_t* addr, uint32_t seen, double timeout_s) {
    struct timespec ts;
    ts.tv_sec = (time_t)timeout_s;
    ts.tv_nsec = (long)((timeout_s - (double)ts.tv_sec) * 1e9);
    // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
    syscall(SYS_futex, addr, FUTEX_WAIT, seen, &ts, NULL, 0);
}

// wake_all: tell every rank sleeping on the header's futex to look again.
static void wake_all(Header* h) {
    __atomic_fetch_add(&h->wake, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->waiters, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &h->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

// publish_failure: write the first failure of the communicator into the header, so that every
// rank's current and later calls fail with it. Later failures keep the first message.
static void publish_failure(ncclComm* c, ncclResult_t code, const char* msg) {
    Header* h = c->hdr;
    if (__atomic_exchange_n(&h->fail_claim, 1, __ATOMIC_SEQ_CST) == 0) {
        snprintf(h->fail_msg, sizeof h->fail_msg, "%s", msg);
        STORE(&h->fail_code, (int32_t)code);
    }
    wake_all(h);
}

// fail_from_header: this rank's call fails because of a failure some rank published.
static ncclResult_t fail_from_header(ncclComm* c) {
    Header* h = c->hdr;
    ncclResult_t code = (ncclResult_t)LOAD(&h->fail_code);
    return comm_fail(c, code, "%s (seen by rank %d in %s)", h->fail_msg, c->rank, c->cur_op);
}

// read_proc_stat: the state letter and start time (clock ticks since boot) of a process.
// Returns 0, or -1 when there is no such process, or -2 when /proc could not tell.
static int read_proc_stat(pid_t pid, char* state, uint64_t* start_time) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE* f = fopen(path, "r");
    if (!f) return errno == ENOENT || errno == ESRCH ? -1 : -2;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so start after the last ')'.
    char* p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return -2;
    p += 2;
    *state = *p;
    // The state is field 3; the start time is field 22.
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return -2;
        p++;
    }
    *start_time = strtoull(p, NULL, 10);
    return 0;
}

static uint64_t my_pid_namespace(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

// peer_alive: 0 when rank q's process is known to be gone (exited, killed, zombie, pid reused).
// Ranks in this same process (threads), or in another pid namespace, count as alive: for them
// only the timeout helps.
static int peer_alive(const ncclComm* c, int q) {
    const Slot* s = &c->slots[q];
    pid_t pid = s->pid;
    if (pid == c->my_pid || s->pid_ns == 0 || s->pid_ns != c->my_ns) return 1;
    if (kill(pid, 0) != 0) return errno == ESRCH ? 0 : 1;  // EPERM: another user's process, can't tell
    if (!c->have_proc) return 1;
    // kill() still succeeds on a zombie (exited, not yet reaped by its parent): ask /proc.
    char state;
    uint64_t start;
    int r = read_proc_stat(pid, &state, &start);
    if (r != 0) return r == -1 ? 0 : 1;
    if (state == 'Z' || state == 'X' || state == 'x') return 0;
    if (s->start_time && start != s->start_time) return 0;
    return 1;
}

// ---------------------------------------------------------------------------------------------
// Waiting: barriers with failure detection

// ready: has rank q reached barrier k? (k = 0: has it joined the communicator?)
static int ready(const ncclComm* c, int q, uint64_t k) {
    if (k == 0) return LOAD(&c->slots[q].state) != SLOT_EMPTY;
    return LOAD(&c->slots[q].seq) >= k;
}

static int first_unready(const ncclComm* c, uint64_t k) {
    for (int q = 0; q < c->nranks; q++)
        if (!ready(c, q, k)) return q;
    return -1;
}

// check_peers: did a rank that has not reached barrier k leave or die? (k = 0, during init:
// did a rank that joined already leave or die?)
static ncclResult_t check_peers(ncclComm* c, uint64_t k) {
    char msg[200];
    for (int q = 0; q < c->nranks; q++) {
        if (k > 0 && ready(c, q, k)) continue;
        int state = LOAD(&c->slots[q].state);
        if (state == SLOT_LEFT)
            snprintf(msg, sizeof msg,
                     "rank %d left the communicator (ncclCommDestroy/Abort) while rank %d waited in %s", q, c->rank,
                     c->cur_op);
        else if (state == SLOT_JOINED && q != c->rank && !peer_alive(c, q))
            snprintf(msg, sizeof msg, "rank %d (pid %d) died while rank %d waited for it in %s", q, c->slots[q].pid,
                     c->rank, c->cur_op);
        else
            continue;
        publish_failure(c, ncclRemoteError, msg);
        return comm_fail(c, ncclRemoteError, "%s", msg);
    }
    return ncclSuccess;
}

// wait_all: wait until every rank has reached barrier k (k = 0: has joined). Spins briefly, then
// sleeps on the futex; every CHECK_INTERVAL_S it checks for dead peers and for the timeout.
static ncclResult_t wait_all(ncclComm* c, uint64_t k) {
    Header* h = c->hdr;
    double start = -1, next_check = 0;
    for (long spin = 0;; spin++) {
        int q = first_unready(c, k);
        if (q < 0) return ncclSuccess;
        if (LOAD(&h->fail_code)) return fail_from_header(c);
        if (LOAD(&c->aborting))
            return comm_fail(c, ncclSystemError, "rank %d: communicator aborted (ncclCommAbort) during %s", c->rank,
                             c->cur_op);
        if (spin < SPINS) {
            cpu_relax();
            continue;
        }
        double t = now_s();
        if (start < 0) start = next_check = t;
        if (t >= next_check) {
            next_check = t + CHECK_INTERVAL_S;
            ncclResult_t r = check_peers(c, k);
            if (r != ncclSuccess) return r;
            if (c->timeout_s > 0 && t - start > c->timeout_s) {
                char msg[200];
                snprintf(msg, sizeof msg, "timeout: rank %d waited %.1f s in %s for rank %d (NCCL_EMU_TIMEOUT_S=%g)",
                         c->rank, t - start, c->cur_op, q, c->timeout_s);
                publish_failure(c, ncclRemoteError, msg);
                return comm_fail(c, ncclRemoteError, "%s", msg);
            }
        }
        // More ranks than cores: let the one we wait for run. Then sleep until some rank arrives
        // (it bumps h->wake) or the next check is due.
        if (spin < SPINS + YIELDS) {
            sched_yield();
            continue;
        }
        __atomic_fetch_add(&h->waiters, 1, __ATOMIC_SEQ_CST);
        uint32_t seen = __atomic_load_n(&h->wake, __ATOMIC_SEQ_CST);
        if (first_unready(c, k) >= 0 && !LOAD(&h->fail_code) && !LOAD(&c->aborting))
            futex_wait(&h->wake, seen, CHECK_INTERVAL_S);
        __atomic_fetch_sub(&h->waiters, 1, __ATOMIC_SEQ_CST);
    }
}

// barrier: arrive at the next barrier and wait for all ranks to arrive too.
static ncclResult_t barrier(ncclComm* c) {
    uint64_t k = ++c->bar;
    __atomic_store_n(&c->slots[c->rank].seq, k, __ATOMIC_SEQ_CST);
    wake_all(c->hdr);
    return wait_all(c, k);
}

// ---------------------------------------------------------------------------------------------
// Data types and reductions

namespace {
struct bf16_t {
    uint16_t bits;
};
}  // namespace

static inline float load_acc(bf16_t x) {
    uint32_t u = (uint32_t)x.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
template <typename T>
static inline T load_acc(T x) {
    return x;
}

// float -> bf16, rounding to nearest even (like __float2bfloat16); NaN stays a (quiet) NaN.
static inline void store_acc(bf16_t* d, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        d->bits = (uint16_t)((u >> 16) | 0x40);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1);
    d->bits = (uint16_t)(u >> 16);
}
template <typename T>
static inline void store_acc(T* d, T a) {
    *d = a;
}

// Integer sums and products wrap around (done in unsigned arithmetic: no undefined overflow).
template <typename A>
static inline A add(A a, A b) {
    if constexpr (std::is_integral<A>::value) {
        typedef typename std::make_unsigned<A>::type U;
        return (A)(U)((U)a + (U)b);
    } else {
        return a + b;
    }
}
template <typename A>
static inline A mul(A a, A b) {
    if constexpr (std::is_integral<A>::value) {
        typedef typename std::make_unsigned<A>::type U;
        return (A)(U)((U)a * (U)b);
    } else {
        return a * b;
    }
}

// The ring's order and rounding. NCCL's ring AllReduce (src/device/all_reduce.h, runRing) cuts the
// data into nranks pieces; piece c is sent first by the rank after c in the ring (step 0: "push data to
// next GPU", chunk ringIx - 1), then each next rank adds its own piece c to what it received and sends
// the sum on (recvReduceSend, nranks - 2 steps), and rank c adds the last term (recvReduceCopySend); the
// ReduceScatter ring (src/device/reduce_scatter.h) sums rank r's block in the same order, ending at r.
// Every hop's add is one FuncSum<T> of two values of the datatype, whose result is stored in the
// datatype (src/device/reduce_kernel.h: Apply_Reduce<FuncSum<T>> is T(a + b), for bf16 __hadd2 on sm_80+:
// the sum rounded to bf16), so a bf16 sum is rounded at every hop, not accumulated in fp32. Here the
// ring is the ranks in order 0, 1, ..., N-1 (NCCL orders it by topology); the piece a rank reduces (its
// slice of the chunk, or its ReduceScatter block) is its ring piece, so piece r is summed
// x_{r+1} + x_{r+2} + ... + x_r (indices mod N), rounding to T after every add. ncclAvg follows NCCL's
// enqueue.cc (hostToDevRedOp): for floating types it is a PreMulSum, each rank's term multiplied by the
// scalar float(1.0 / N) stored in T (a double: 1.0 / N) and rounded to T, then summed as above; for
// integers the sum divided by N (SumPostDiv).

// narrow: a round trip through the datatype: the value a hop stores (bf16: rounded to nearest even).
template <typename T, typename A>
static inline A narrow(A a) {
    T t;
    store_acc(&t, a);
    return load_acc(t);
}

// reduce_typed: dst[i] = src_f[i] op src_{f+1}[i] op ... op src_{f-1}[i] (indices mod nsrc), for i < n,
// where src_q = src + q * stride (bytes) and f = first: folds left in ring order from `first`, rounding
// each partial sum or product to T (the ring's hops; see above); dst may be src_0.
template <typename T, typename A>
static void reduce_typed(char* dst, const char* src, size_t stride, int nsrc, int first, size_t n, int op) {
    enum { BLOCK = 1024 };
    A acc[BLOCK];
    // ncclAvg of floating types: each term times 1/N (float(1.0 / N) stored in T; a double's 1.0 / N), then
    // summed; of integers: the sum divided by N (truncating)
    const bool premul = op == ncclAvg && !std::is_integral<A>::value;
    A scale = std::is_same<A, double>::value ? (A)(1.0 / nsrc) : narrow<T, A>((A)(float)(1.0 / nsrc));
    for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
        size_t m = n - i0 < (size_t)BLOCK ? n - i0 : (size_t)BLOCK;
        const T* s = (const T*)(src + (size_t)first * stride) + i0;
        for (size_t j = 0; j < m; j++) acc[j] = premul ? narrow<T, A>(load_acc(s[j]) * scale) : load_acc(s[j]);
        for (int hop = 1; hop < nsrc; hop++) {
            int q = (first + hop) % nsrc;
            s = (const T*)(src + (size_t)q * stride) + i0;
            switch (op) {
                case ncclSum:
                    for (size_t j = 0; j < m; j++) acc[j] = narrow<T, A>(add<A>(acc[j], load_acc(s[j])));
                    break;
                case ncclAvg:
                    if (premul)
                        for (size_t j = 0; j < m; j++)
                            acc[j] = narrow<T, A>(acc[j] + narrow<T, A>(load_acc(s[j]) * scale));
                    else
                        for (size_t j = 0; j < m; j++) acc[j] = add<A>(acc[j], load_acc(s[j]));
                    break;
                case ncclProd:
                    for (size_t j = 0; j < m; j++) acc[j] = narrow<T, A>(mul<A>(acc[j], load_acc(s[j])));
                    break;
                case ncclMax:
                    for (size_t j = 0; j < m; j++) {
                        A b = load_acc(s[j]);
                        if (b > acc[j]) acc[j] = b;
                    }
                    break;
                case ncclMin:
                    for (size_t j = 0; j < m; j++) {
                        A b = load_acc(s[j]);
                        if (b < acc[j]) acc[j] = b;
                    }
                    break;
            }
        }
        if (op == ncclAvg && !premul)
            for (size_t j = 0; j < m; j++) acc[j] = (A)(acc[j] / (A)nsrc);
        T* d = (T*)dst + i0;
        for (size_t j = 0; j < m; j++) store_acc(&d[j], acc[j]);
    }
}

// dtype_size: bytes per element; 0 for a type this file does not know.
static size_t dtype_size(int dt) {
    switch (dt) {
        case ncclInt8:
        case ncclUint8:
        case ncclFloat8e4m3:
        case ncclFloat8e5m2:
            return 1;
        case ncclFloat16:
        case ncclBfloat16:
            return 2;
        case ncclInt32:
        case ncclUint32:
        case ncclFloat32:
            return 4;
        case ncclInt64:
        case ncclUint64:
        case ncclFloat64:
            return 8;
        default:
            return 0;
    }
}

// can_reduce: the types reduce() handles (fp16 and fp8 can only be moved, not reduced, here).
static int can_reduce(int dt) {
    return dtype_size(dt) != 0 && dt != ncclFloat16 && dt != ncclFloat8e4m3 && dt != ncclFloat8e5m2;
}

// reduce: reduce_typed for datatype dt, in ring order from source `first`.
static void reduce(int dt, int op, char* dst, const char* src, size_t stride, int nsrc, int first, size_t n) {
    switch (dt) {
        case ncclInt8:
            reduce_typed<int8_t, int8_t>(dst, src, stride, nsrc, first, n, op);
            break;
        case ncclUint8:
            reduce_typed<uint8_t, uint8_t>(dst, src, stride, nsrc, first, n, op);
            break;
        case ncclInt32:
            reduce_typed<int32_t, int32_t>(dst, src, stride, nsrc, first, n, op);
            break;
        case ncclUint32:
            reduce_typed<uint32_t, uint32_t>(dst, src, stride, nsrc, first, n, op);
            break;
        case ncclInt64:
            reduce_typed<int64_t, int64_t>(dst, src, stride, nsrc, first, n, op);
            break;
        case ncclUint64:
            reduce_typed<uint64_t, uint64_t>(dst, src, stride, nsrc, first, n, op);
            break;
        case ncclFloat32:
            reduce_typed<float, float>(dst, src, stride, nsrc, first, n, op);
            break;
        case ncclFloat64:
            reduce_typed<double, double>(dst, src, stride, nsrc, first, n, op);
            break;
        case ncclBfloat16:
            reduce_typed<bf16_t, float>(dst, src, stride, nsrc, first, n, op);
            break;
    }
}

// ---------------------------------------------------------------------------------------------
// The collectives. Each runs after begin_op's barrier; rank r's buffer is buf(c, r).

enum { OP_ALLREDUCE, OP_REDUCE, OP_BROADCAST, OP_ALLGATHER, OP_REDUCESCATTER, OP_SEND, OP_RECV, OP_P2P };
static const char* const op_names[] = {"ncclAllReduce",     "ncclReduce", "ncclBroadcast", "ncclAllGather",
                                       "ncclReduceScatter", "ncclSend",   "ncclRecv",      "ncclSend/ncclRecv"};

namespace {
// One collective call, as given by the user (queued as is inside a group).
struct Call {
    int kind;
    const char* send;
    char* recv;
    size_t count;         // AllReduce/Reduce/Broadcast: elements; AllGather: sendcount; ReduceScatter: recvcount
    int dtype, op, root;  // op and root are -1 where the call has none
    ncclComm* comm;
    cudaStream_t stream;  // NULL: the legacy default stream
    int peer = -1;        // OP_SEND, OP_RECV: the other rank
    Call* p2p = nullptr;  // OP_P2P: the sends and receives of one group (malloc'ed; run_call frees it)
    int n_p2p = 0;
};
}  // namespace

static char* buf(ncclComm* c, int q) { return c->data + (size_t)q * c->chunk_bytes; }

#define TRY(x)                            \
    do {                                  \
        ncclResult_t r_ = (x);            \
        if (r_ != ncclSuccess) return r_; \
    } while (0)

// AllReduce (root < 0) or Reduce (to root). Per chunk: every rank copies its part of the input
// into its buffer; rank r reduces the r-th slice of the chunk over all buffers into buffer 0;
// then everyone (or the root) copies buffer 0 out.
static ncclResult_t run_allreduce(ncclComm* c, const Call* k) {
    size_t es = dtype_size(k->dtype), per = c->chunk_bytes / es;
    int n_ranks = c->nranks, me = c->rank;
    for (size_t off = 0; off < k->count; off += per) {
        size_t n = k->count - off < per ? k->count - off : per;
        memcpy(buf(c, me), k->send + off * es, n * es);
        TRY(barrier(c));
        size_t lo = n * me / n_ranks, hi = n * (me + 1) / n_ranks;
        if (hi > lo)
            reduce(k->dtype, k->op, buf(c, 0) + lo * es, buf(c, 0) + lo * es, c->chunk_bytes, n_ranks,
                   (me + 1) % n_ranks, hi - lo);  // slice `me` is ring piece `me`: from rank me + 1 to rank me
        TRY(barrier(c));
        if (k->root < 0 || k->root == me) memcpy(k->recv + off * es, buf(c, 0), n * es);
        TRY(barrier(c));  // buffer 0 is read by all before the next chunk overwrites it
    }
    return ncclSuccess;
}

// ReduceScatter: rank r gets block r (recvcount elements) of the reduction. Per step, every rank
// puts the same piece of all its blocks into its buffer, block b at b * per; rank r reduces the
// pieces of block r over all buffers straight into its recvbuff.
// In place (recvbuff == sendbuff + rank * recvcount) works: a piece is copied before it is overwritten.
static ncclResult_t run_reducescatter(ncclComm* c, const Call* k) {
    size_t es = dtype_size(k->dtype), per = c->chunk_bytes / es / c->nranks;
    int me = c->rank;
    for (size_t off = 0; off < k->count; off += per) {
        size_t n = k->count - off < per ? k->count - off : per;
        for (int b = 0; b < c->nranks; b++)
            memcpy(buf(c, me) + b * per * es, k->send + ((size_t)b * k->count + off) * es, n * es);
        TRY(barrier(c));
        reduce(k->dtype, k->op, k->recv + off * es, buf(c, 0) + me * per * es, c->chunk_bytes, c->nranks,
               (me + 1) % c->nranks, n);  // block `me`: from rank me + 1 around the ring to rank me
        TRY(barrier(c));
    }
    return ncclSuccess;
}

// AllGather: recvbuff gets rank q's sendcount elements at q * sendcount, in rank order.
// In place (sendbuff == recvbuff + rank * sendcount): this rank's own block is simply not copied.
static ncclResult_t run_allgather(ncclComm* c, const Call* k) {
    size_t es = dtype_size(k->dtype), per = c->chunk_bytes / es;
    for (size_t off = 0; off < k->count; off += per) {
        size_t n = k->count - off < per ? k->count - off : per;
        memcpy(buf(c, c->rank), k->send + off * es, n * es);
        TRY(barrier(c));
        for (int q = 0; q < c->nranks; q++) {
            char* dst = k->recv + ((size_t)q * k->count + off) * es;
            if (dst != k->send + off * es) memcpy(dst, buf(c, q), n * es);
        }
        TRY(barrier(c));
    }
    return ncclSuccess;
}

// Broadcast: the root's sendbuff goes to everyone's recvbuff, through all buffers at once.
static ncclResult_t run_broadcast(ncclComm* c, const Call* k) {
    size_t es = dtype_size(k->dtype), per = c->chunk_bytes * c->nranks / es;
    int is_root = c->rank == k->root;
    for (size_t off = 0; off < k->count; off += per) {
        size_t n = k->count - off < per ? k->count - off : per;
        if (is_root) memcpy(c->data, k->send + off * es, n * es);
        TRY(barrier(c));
        if (!is_root) memcpy(k->recv + off * es, c->data, n * es);
        TRY(barrier(c));
    }
    if (is_root && k->recv != k->send && k->count) memmove(k->recv, k->send, k->count * es);
    return ncclSuccess;
}

// ---------------------------------------------------------------------------------------------
// Point to point: ncclSend / ncclRecv. NCCL matches the sends from rank a to rank b with b's receives
// from a in call order, each pair with the same count and type, and a group of them completes as a
// whole (so an all-to-all is one group of sends and receives). Here the sends and receives of one
// communicator in one group (or a lone call outside a group) are fused into one OP_P2P call, which
// every rank of the communicator runs: a limitation of this emulation (NCCL needs only the two ranks
// of each pair): a rank that is elsewhere at that moment is reported as a mismatched call, never a hang.
// The OP_P2P: every rank publishes how many bytes it sends to each peer, and the counts must match
// what each receiver expects (else ncclInvalidUsage on every rank); then in rounds s = 0 .. n-1 rank r
// sends its stream of bytes to r + s and receives r - s's (mod n), chunk_bytes at a time through its
// buffer: the stream to a peer is the concatenation of the sends to it, in call order.

// p2p_bytes: the bytes this rank's calls in k send to (dir OP_SEND) or receive from (OP_RECV) rank q.
static uint64_t p2p_bytes(const Call* k, int dir, int q) {
    uint64_t n = 0;
    for (int i = 0; i < k->n_p2p; i++)
        if (k->p2p[i].kind == dir && k->p2p[i].peer == q) n += k->p2p[i].count * dtype_size(k->p2p[i].dtype);
    return n;
}

// p2p_copy: bytes [off, off + len) of this rank's stream to or from rank q (the calls of kind dir with
// that peer, concatenated) copied out of (dir OP_SEND) or into (OP_RECV) the staging buffer b.
static void p2p_copy(const Call* k, int dir, int q, uint64_t off, uint64_t len, char* b) {
    uint64_t pos = 0;  // where the current call's bytes start in the stream
    for (int i = 0; i < k->n_p2p && len; i++) {
        const Call* x = &k->p2p[i];
        if (x->kind != dir || x->peer != q) continue;
        uint64_t n = x->count * dtype_size(x->dtype);
        if (off < pos + n) {
            uint64_t from = off - pos, take = n - from < len ? n - from : len;
            if (dir == OP_SEND)
                memcpy(b, x->send + from, take);
            else
                memcpy(x->recv + from, b, take);
            b += take, off += take, len -= take;
        }
        pos += n;
    }
}

static ncclResult_t run_p2p(ncclComm* c, const Call* k) {
    int n = c->nranks, me = c->rank;
    size_t row = 2 * (size_t)n * sizeof(uint64_t);  // a rank's bytes to each peer, then from each peer
    if (row > c->chunk_bytes)
        return comm_fail(c, ncclInternalError, "ncclSend/ncclRecv: %d ranks need %zu bytes of buffer, have %zu", n, row,
                         c->chunk_bytes);
    uint64_t* all = (uint64_t*)malloc((size_t)n * row);  // all[a * 2n + b]: a -> b; all[a * 2n + n + b]: a <- b
    if (!all) return comm_fail(c, ncclSystemError, "ncclSend/ncclRecv: out of memory");
    uint64_t* mine = (uint64_t*)buf(c, me);
    for (int q = 0; q < n; q++) mine[q] = p2p_bytes(k, OP_SEND, q), mine[n + q] = p2p_bytes(k, OP_RECV, q);
    ncclResult_t r = barrier(c);
    for (int a = 0; r == ncclSuccess && a < n; a++) memcpy(all + (size_t)a * 2 * n, buf(c, a), row);
    if (r == ncclSuccess) r = barrier(c);
    // every rank checks every pair, in the same order: all of them fail together, with the same message
    for (int a = 0; r == ncclSuccess && a < n; a++)
        for (int b = 0; r == ncclSuccess && b < n; b++) {
            uint64_t sent = all[(size_t)a * 2 * n + b], want = all[(size_t)b * 2 * n + n + a];
            if (sent != want)
                r = comm_fail(c, ncclInvalidUsage,
                              "ncclSend/ncclRecv: rank %d sends %llu bytes to rank %d, which receives %llu from it", a,
                              (unsigned long long)sent, b, (unsigned long long)want);
        }
    uint64_t* sends = all;  // sends[a * 2n + b]
    for (int s = 0; r == ncclSuccess && s < n; s++) {
        int to = (me + s) % n, from = (me - s + n) % n;
        uint64_t rounds = 0;  // the same on every rank: the longest stream of this shift, in chunks
        for (int a = 0; a < n; a++) {
            uint64_t b = sends[(size_t)a * 2 * n + (a + s) % n], t = (b + c->chunk_bytes - 1) / c->chunk_bytes;
            if (t > rounds) rounds = t;
        }
        uint64_t out = sends[(size_t)me * 2 * n + to], in = sends[(size_t)from * 2 * n + me];
        for (uint64_t t = 0; r == ncclSuccess && t < rounds; t++) {
            uint64_t off = t * c->chunk_bytes;
            if (off < out)
                p2p_copy(k, OP_SEND, to, off, out - off < c->chunk_bytes ? out - off : c->chunk_bytes, buf(c, me));
            r = barrier(c);
            if (r == ncclSuccess && off < in)
                p2p_copy(k, OP_RECV, from, off, in - off < c->chunk_bytes ? in - off : c->chunk_bytes, buf(c, from));
            if (r == ncclSuccess) r = barrier(c);
        }
    }
    free(all);
    return r;
}

// ---------------------------------------------------------------------------------------------
// Bytes sent: each rank counts what it sends, by the algorithm model NCCL's ring collectives follow
// (P ranks, B bytes of the call's buffer): AllReduce 2 (P-1) B / P (reduce-scatter then all-gather of
// B / P pieces; integer division); ReduceScatter and AllGather (P-1) x the per-rank block; Broadcast
// B from every rank but the one before the root in the ring; Reduce B from every rank but the root;
// ncclSend its bytes to another rank (to itself: nothing). With NCCL_EMU_STATS=PATH, ncclCommDestroy
// writes PATH.RANK (temporary file + rename): "nccl-emu-stats rank R nranks P calls N bytes_sent B".
// The trainer counts its own collectives the same way (comm.h), and tests compare the two.

// sent_bytes: what this rank sends in call k, by NCCL's algorithms (the model above).
static uint64_t sent_bytes(const ncclComm* c, const Call* k) {
    uint64_t P = (uint64_t)c->nranks, me = (uint64_t)c->rank, B = (uint64_t)k->count * dtype_size(k->dtype), n = 0;
    switch (k->kind) {
        case OP_ALLREDUCE:
            n = 2 * (P - 1) * B / P;
            break;
        case OP_REDUCESCATTER:
        case OP_ALLGATHER:
            n = (P - 1) * B;
            break;
        case OP_BROADCAST:
            n = me == ((uint64_t)k->root + P - 1) % P ? 0 : B;
            break;
        case OP_REDUCE:
            n = me == (uint64_t)k->root ? 0 : B;
            break;
        case OP_P2P:
            for (uint64_t q = 0; q < P; q++)
                if (q != me) n += p2p_bytes(k, OP_SEND, (int)q);
            break;
    }
    return n;
}

static void count_sent(ncclComm* c, const Call* k) {
    uint64_t n = sent_bytes(c, k);
    __atomic_fetch_add(&c->stat_bytes, n, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&c->stat_calls, 1, __ATOMIC_SEQ_CST);
}

static void write_stats(const ncclComm* c) {
    const char* path = getenv("NCCL_EMU_STATS");
    if (!path || !*path) return;
    char final_path[4200], tmp[4300];
    snprintf(final_path, sizeof final_path, "%s.%d", path, c->rank);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", final_path, (int)getpid());
    FILE* f = fopen(tmp, "w");
    int ok = f && fprintf(f, "nccl-emu-stats rank %d nranks %d calls %llu bytes_sent %llu\n", c->rank, c->nranks,
                          (unsigned long long)c->stat_calls, (unsigned long long)c->stat_bytes) > 0;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, final_path) == 0) return;
    fprintf(stderr, "NCCL (CPU emulation): NCCL_EMU_STATS: cannot write %s: %s\n", final_path, strerror(errno));
    unlink(tmp);
}

// begin_op: publish what this rank is about to run, meet the others, and check that all ranks
// run the same collective (a mismatch would otherwise move garbage or desynchronize barriers).
static ncclResult_t begin_op(ncclComm* c, const Call* k) {
    OpDesc d;
    memset(&d, 0, sizeof d);
    d.kind = k->kind;
    d.dtype = k->dtype;
    d.op = k->op;
    d.root = k->root;
    d.count = k->count;
    d.serial = ++c->serial;
    // Two entries, by parity: a fast rank writing its next description cannot overwrite the one a
    // slow rank is still comparing, since the next barrier needs the slow rank.
    c->slots[c->rank].desc[d.serial & 1] = d;
    TRY(barrier(c));
    for (int q = 0; q < c->nranks; q++) {
        const OpDesc* o = &c->slots[q].desc[d.serial & 1];
        if (memcmp(o, &d, sizeof d) != 0)
            return comm_fail(c, ncclInvalidUsage,
                             "mismatched collectives: rank %d called %s(count %llu, dtype %d, op %d, root %d) but rank "
                             "%d called %s(count %llu, dtype %d, op %d, root %d)",
                             c->rank, op_names[d.kind], (unsigned long long)d.count, d.dtype, d.op, d.root, q,
                             (o->kind >= 0 && o->kind <= OP_P2P) ? op_names[o->kind] : "?",
                             (unsigned long long)o->count, o->dtype, o->op, o->root);
    }
    return ncclSuccess;
}

// ---------------------------------------------------------------------------------------------
// Emulated network: NCCL_EMU_GBPS (Gbit/s one way per rank) and NCCL_EMU_LATENCY_US (per collective) make
// every collective of more than one rank take at least
//     latency + bytes this rank sends / bandwidth
// from the moment all ranks are in it (after begin_op), by the byte model of NCCL's ring algorithms that
// scaling.h and the trainer's comm_bytes use: AllReduce 2 (P-1)/P x bytes, ReduceScatter and AllGather
// (P-1)/P x the whole buffer, Broadcast and Reduce the buffer once. The rank waits inside the collective,
// as a rank whose data is still on the wire would; with the trainer's communication stream running
// asynchronously that time overlaps the backward, as on a real network. Unset (or 0): no throttle.

static double emu_gbps = -1, emu_latency_s;  // -1: not read yet; 0: no throttle

static double emu_env_number(const char* name) {
    const char* s = getenv(name);
    if (!s || !*s) return 0;
    char* end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 0) || v > 1e9) {
        fprintf(stderr, "cpu nccl: %s=%s: expected a number >= 0 (%s)\n", name, s,
                !strcmp(name, "NCCL_EMU_GBPS") ? "Gbit/s one way; 0 or unset: no throttle" : "microseconds");
        exit(1);  // 1: bad input (2 is the trainer's divergence code)
    }
    return v;
}

static void emu_read_env(void) {
    if (emu_gbps >= 0) return;
    emu_latency_s = emu_env_number("NCCL_EMU_LATENCY_US") * 1e-6;
    emu_gbps = emu_env_number("NCCL_EMU_GBPS");
}

// emu_network_wait: returns once call k, started at t0, has taken the emulated network's time (at once
// without a throttle or with one rank). Waits in slices, so ncclCommAbort stops it.
static ncclResult_t emu_network_wait(ncclComm* c, const Call* k, double t0) {
    if (emu_gbps <= 0 && emu_latency_s <= 0) return ncclSuccess;
    if (c->nranks < 2) return ncclSuccess;
    double end = t0 + emu_latency_s + (emu_gbps > 0 ? (double)sent_bytes(c, k) * 8 / (emu_gbps * 1e9) : 0);
    for (double t = now_s(); t < end; t = now_s()) {
        if (LOAD(&c->aborting))
            return comm_fail(c, ncclSystemError, "rank %d: communicator aborted (ncclCommAbort) during %s", c->rank,
                             c->cur_op);
        sleep_s(end - t < CHECK_INTERVAL_S ? end - t : CHECK_INTERVAL_S);
    }
    return ncclSuccess;
}

static ncclResult_t run_call(const Call* k) {
    ncclComm* c = k->comm;
    __atomic_fetch_add(&c->busy, 1, __ATOMIC_SEQ_CST);
    c->cur_op = op_names[k->kind];
    ncclResult_t r = (ncclResult_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
    if (r == ncclSuccess && LOAD(&c->aborting))  // queued on a stream before the abort
        r = comm_fail(c, ncclSystemError, "rank %d: communicator aborted (ncclCommAbort) before %s ran", c->rank,
                      op_names[k->kind]);
    if (r != ncclSuccess) {
        memcpy(tls_last_error, c->last_error, sizeof tls_last_error);  // the communicator failed before
    } else {
        r = begin_op(c, k);
        double t0 = now_s();  // every rank is in the collective: the emulated network's clock starts
        if (r == ncclSuccess) {
            switch (k->kind) {
                case OP_ALLREDUCE:
                case OP_REDUCE:
                    r = run_allreduce(c, k);
                    break;
                case OP_BROADCAST:
                    r = run_broadcast(c, k);
                    break;
                case OP_ALLGATHER:
                    r = run_allgather(c, k);
                    break;
                case OP_REDUCESCATTER:
                    r = run_reducescatter(c, k);
                    break;
                case OP_P2P:
                    r = run_p2p(c, k);
                    break;
            }
        }
        if (r == ncclSuccess) r = emu_network_wait(c, k, t0);
        if (r == ncclSuccess) count_sent(c, k);
    }
    if (k->kind == OP_P2P) free(k->p2p);
    __atomic_fetch_sub(&c->busy, 1, __ATOMIC_SEQ_CST);
    return r;
}

// ---------------------------------------------------------------------------------------------
// Groups: calls are queued per thread and run at the outermost ncclGroupEnd.

static thread_local int group_depth;
static thread_local Call* group_calls;
static thread_local int group_n, group_cap;

// enqueue: hand a call of a non-blocking communicator to its thread; ncclInProgress, or the
// communicator's error when it has one already.
static ncclResult_t enqueue(const Call* k) {
    ncclComm* c = k->comm;
    ncclResult_t e = (ncclResult_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
    if (e != ncclSuccess) {
        memcpy(tls_last_error, c->last_error, sizeof tls_last_error);
        return e;
    }
    pthread_mutex_lock(&c->mu);
    if (c->stop) {
        pthread_mutex_unlock(&c->mu);
        return record_error(c, ncclInvalidUsage, "%s on a communicator being destroyed or aborted", op_names[k->kind]);
    }
    if (c->q_n == c->q_cap) {
        int cap = c->q_cap ? 2 * c->q_cap : 16;
        Call* p = (Call*)malloc((size_t)cap * sizeof(Call));
        if (!p) {
            pthread_mutex_unlock(&c->mu);
            return record_error(c, ncclSystemError, "%s: out of memory queueing a call", op_names[k->kind]);
        }
        for (int i = 0; i < c->q_n; i++) p[i] = c->queue[(c->q_head + i) % c->q_cap];
        free(c->queue);
        c->queue = p, c->q_head = 0, c->q_cap = cap;
    }
    c->queue[(c->q_head + c->q_n) % c->q_cap] = *k;
    c->q_n++;
    c->pending++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return ncclInProgress;
}

// hold_until_abort: a collective on a stream that failed (a peer died, left, timed out or called something
// else; or the communicator had failed before its turn) keeps its stream busy until ncclCommAbort, as NCCL's
// kernel spins for data that never comes until the abort flag stops it: cudaStreamQuery says
// cudaErrorNotReady and the synchronizing calls block, so no host code reads a sum that never happened,
// while ncclCommGetAsyncError reports the error. ncclCommDestroy of the failed communicator ends it too.
static void hold_until_abort(ncclComm* c) {
    while (!LOAD(&c->aborting)) sleep_s(0.001);
}

// stream_enqueue: a collective on a stream (not the legacy one) runs on the stream's worker, in stream
// order, as NCCL's kernel runs on its stream: the call returns once it is enqueued. Its errors are the
// communicator's (sticky): ncclCommGetAsyncError reports them, and later calls fail with them.
static ncclResult_t stream_enqueue(const Call* k) {
    ncclComm* c = k->comm;
    ncclResult_t e = (ncclResult_t)__atomic_load_n(&c->error, __ATOMIC_SEQ_CST);
    if (e != ncclSuccess) {
        memcpy(tls_last_error, c->last_error, sizeof tls_last_error);
        return e;
    }
    if (!__atomic_load_n(&c->init_done, __ATOMIC_SEQ_CST) || LOAD(&c->aborting))
        return record_error(c, ncclInvalidUsage, "%s before the communicator's init completed, or after its abort",
                            op_names[k->kind]);
    __atomic_fetch_add(&c->on_streams, 1, __ATOMIC_SEQ_CST);
    Call copy = *k;
    emu_stream_enqueue(k->stream, 0, [copy] {
        if (run_call(&copy) != ncclSuccess) hold_until_abort(copy.comm);
        __atomic_fetch_sub(&copy.comm->on_streams, 1, __ATOMIC_SEQ_CST);
    });
    return ncclSuccess;
}

// dispatch: run a call now (blocking communicator, legacy stream), queue it to the communicator's
// thread (non-blocking, legacy stream) or enqueue it on its stream.
static ncclResult_t dispatch(const Call* k) {
    if (k->stream) return stream_enqueue(k);
    return k->comm->blocking ? run_call(k) : enqueue(k);
}

// submit: check the arguments (errors come back at once, as in NCCL), then run or queue the call.
static ncclResult_t submit(const Call* k) {
    const char* fn = op_names[k->kind];
    ncclComm* c = k->comm;
    if (!c) return record_error(NULL, ncclInvalidArgument, "%s: comm is NULL", fn);
    if (dtype_size(k->dtype) == 0) return record_error(c, ncclInvalidArgument, "%s: unknown datatype %d", fn, k->dtype);
    if (k->op != -1) {
        if (k->op < 0 || k->op >= ncclNumOps)
            return record_error(c, ncclInvalidArgument, "%s: unsupported reduction op %d", fn, k->op);
        if (!can_reduce(k->dtype))
            return record_error(c, ncclInvalidArgument, "%s: reductions of datatype %d are not implemented here", fn,
                                k->dtype);
    }
    if ((k->kind == OP_REDUCE || k->kind == OP_BROADCAST) && (k->root < 0 || k->root >= c->nranks))
        return record_error(c, ncclInvalidArgument, "%s: root %d out of range (nranks %d)", fn, k->root, c->nranks);
    if ((k->kind == OP_SEND || k->kind == OP_RECV) && (k->peer < 0 || k->peer >= c->nranks))
        return record_error(c, ncclInvalidArgument, "%s: peer %d out of range (nranks %d)", fn, k->peer, c->nranks);
    if (k->count) {
        int is_root = c->rank == k->root;
        int need_send = (k->kind != OP_BROADCAST || is_root) && k->kind != OP_RECV;
        int need_recv = (k->kind != OP_REDUCE || is_root) && k->kind != OP_SEND;
        if ((need_send && !k->send) || (need_recv && !k->recv))
            return record_error(c, ncclInvalidArgument, "%s: NULL buffer", fn);
    }
    if (group_depth == 0 && (k->kind == OP_SEND || k->kind == OP_RECV)) {  // a lone send or receive: a P2P of one
        Call p = *k;
        p.kind = OP_P2P, p.op = -1, p.n_p2p = 1;
        if (!(p.p2p = (Call*)malloc(sizeof(Call)))) return record_error(c, ncclSystemError, "%s: out of memory", fn);
        p.p2p[0] = *k;
        ncclResult_t r = dispatch(&p);
        if (r != ncclSuccess && r != ncclInProgress && !(c->blocking && !p.stream)) free(p.p2p);  // not queued
        return r;
    }
    if (group_depth == 0) return dispatch(k);
    if (group_n == group_cap) {
        int cap = group_cap ? 2 * group_cap : 16;
        Call* p = (Call*)realloc(group_calls, (size_t)cap * sizeof(Call));
        if (!p) return record_error(c, ncclSystemError, "%s: out of memory queueing a grouped call", fn);
        group_calls = p;
        group_cap = cap;
    }
    group_calls[group_n++] = *k;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    group_depth++;
    return ncclSuccess;
}

// fuse_p2p: the group's sends and receives of each communicator become one OP_P2P call at the place of
// the first of them (the others are marked kind -1).
static ncclResult_t fuse_p2p(void) {
    for (int i = 0; i < group_n; i++) {
        Call* k = &group_calls[i];
        if (k->kind != OP_SEND && k->kind != OP_RECV) continue;
        int n = 0;
        for (int j = i; j < group_n; j++)
            n += group_calls[j].comm == k->comm && (group_calls[j].kind == OP_SEND || group_calls[j].kind == OP_RECV);
        Call* list = (Call*)malloc((size_t)n * sizeof(Call));
        if (!list) return record_error(k->comm, ncclSystemError, "ncclGroupEnd: out of memory");
        n = 0;
        for (int j = i; j < group_n; j++) {
            Call* x = &group_calls[j];
            if (x->comm != k->comm || (x->kind != OP_SEND && x->kind != OP_RECV)) continue;
            list[n++] = *x;
            if (j > i) x->kind = -1;
        }
        k->kind = OP_P2P, k->op = -1, k->root = -1, k->count = 0, k->dtype = ncclUint8;
        k->p2p = list, k->n_p2p = n;
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (group_depth <= 0) return record_error(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t first = ncclSuccess;
    // One thread, two ranks of one communicator: the first call would wait forever for the second.
    // (Non-blocking communicators run their calls in their own threads: no conflict.)
    int conflict = 0;
    for (int i = 0; i < group_n && !conflict; i++)
        for (int j = i + 1; j < group_n && !conflict; j++)
            if (group_calls[i].comm != group_calls[j].comm && group_calls[i].comm->blocking &&
                group_calls[j].comm->blocking && group_calls[i].comm->nonce == group_calls[j].comm->nonce) {
                first = record_error(NULL, ncclInvalidUsage,
                                     "ncclGroupEnd: one thread drives ranks %d and %d of the same communicator; the "
                                     "CPU emulation needs one thread (or process) per rank",
                                     group_calls[i].comm->rank, group_calls[j].comm->rank);
                conflict = 1;
            }
    if (!conflict && first == ncclSuccess) first = fuse_p2p();
    // Run all calls even after one failed, so that the other communicators stay in step.
    // Calls on non-blocking communicators go to their threads: then the group is ncclInProgress.
    int queued = 0;
    for (int i = 0; i < group_n && !conflict; i++) {
        if (group_calls[i].kind < 0) continue;  // a send or receive fused into its communicator's OP_P2P
        ncclResult_t r = dispatch(&group_calls[i]);
        if (r != ncclSuccess && r != ncclInProgress && group_calls[i].kind == OP_P2P &&
            !(group_calls[i].comm->blocking && !group_calls[i].stream))
            free(group_calls[i].p2p);  // not queued
        if (r == ncclInProgress) queued = 1, r = ncclSuccess;
        if (first == ncclSuccess) first = r;
    }
    if (first == ncclSuccess && queued) first = ncclInProgress;
    free(group_calls);
    group_calls = NULL;
    group_n = group_cap = 0;
    return first;
}

// ---------------------------------------------------------------------------------------------
// The collective API

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    Call k = {OP_ALLREDUCE, (const char*)sendbuff, (char*)recvbuff, count, datatype, op, -1, comm, stream};
    return submit(&k);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    Call k = {OP_REDUCE, (const char*)sendbuff, (char*)recvbuff, count, datatype, op, root, comm, stream};
    return submit(&k);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    Call k = {OP_REDUCESCATTER, (const char*)sendbuff, (char*)recvbuff, recvcount, datatype, op, -1, comm, stream};
    return submit(&k);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    Call k = {OP_ALLGATHER, (const char*)sendbuff, (char*)recvbuff, sendcount, datatype, -1, -1, comm, stream};
    return submit(&k);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    Call k = {OP_BROADCAST, (const char*)sendbuff, (char*)recvbuff, count, datatype, -1, root, comm, stream};
    return submit(&k);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    Call k = {OP_SEND, (const char*)sendbuff, NULL, count, datatype, -1, -1, comm, stream, peer, NULL, 0};
    return submit(&k);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    Call k = {OP_RECV, NULL, (char*)recvbuff, count, datatype, -1, -1, comm, stream, peer, NULL, 0};
    return submit(&k);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

// ---------------------------------------------------------------------------------------------
// Ids and communicators

ncclResult_t ncclGetVersion(int* version) {
    if (!version) return record_error(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;  // the version of the <nccl.h> this file implements
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    static int counter;
    if (!uniqueId) return record_error(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    IdInfo info;
    memset(&info, 0, sizeof info);
    memcpy(info.magic, ID_MAGIC, sizeof info.magic);
    if (getrandom(&info.nonce, sizeof info.nonce, 0) != (ssize_t)sizeof info.nonce) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        info.nonce = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    }
    int n = __atomic_fetch_add(&counter, 1, __ATOMIC_SEQ_CST);
    snprintf(info.name, sizeof info.name, "/mlmnccl.%d.%d.%016llx", (int)getpid(), n, (unsigned long long)info.nonce);
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &info, sizeof info);
    return ncclSuccess;
}

static double env_timeout_s(void) {
    const char* s = getenv("NCCL_EMU_TIMEOUT_S");
    if (!s || !*s) return 300.0;  // only for a live peer that stops coming: dead ones are seen in ~10 ms
    char* end;
    double v = strtod(s, &end);
    if (end == s || *end) {
        fprintf(stderr, "cpu nccl: NCCL_EMU_TIMEOUT_S=%s is not a number of seconds: expected 0 (no timeout) to 1e9\n",
                s);
        exit(1);  // a configuration error (exit code 2 is the trainer's divergence)
    }
    if (!(v >= 0 && v <= 1e9)) {  // NaN and the infinities too (a NaN deadline never expires)
        fprintf(stderr, "cpu nccl: NCCL_EMU_TIMEOUT_S=%s is out of range: expected 0 (no timeout) to 1e9 seconds\n", s);
        exit(1);
    }
    return v;
}

static size_t env_chunk_bytes(int nranks) {
    size_t chunk = DEFAULT_CHUNK_BYTES;
    const char* s = getenv("NCCL_EMU_CHUNK_BYTES");
    if (s && *s) {
        char* end;
        unsigned long long v = strtoull(s, &end, 10);
        // (the top keeps the rounding up to 64 bytes below from wrapping)
        if (end == s || *end || v == 0 || s[0] == '-' || v > (1ULL << 30)) {
            fprintf(stderr, "cpu nccl: NCCL_EMU_CHUNK_BYTES=%s is not a positive number of bytes: expected 1 to 2^30\n",
                    s);
            exit(1);
        }
        chunk = (size_t)v;
    }
    size_t min_chunk =
        8 * (size_t)nranks > 1024 ? 8 * (size_t)nranks : 1024;  // ReduceScatter needs >= 1 element of each block
    if (chunk < min_chunk) chunk = min_chunk;
    return (chunk + 63) & ~(size_t)63;
}

static size_t header_bytes(int nranks) {
    size_t b = sizeof(Header) + 127;
    b = (b & ~(size_t)127) + (size_t)nranks * sizeof(Slot);
    return (b + 4095) & ~(size_t)4095;
}

// set_pointers: fill the communicator's view of a mapped segment.
static void set_pointers(ncclComm* c, void* base, size_t map_bytes) {
    c->hdr = (Header*)base;
    c->slots = (Slot*)((char*)base + ((sizeof(Header) + 127) & ~(size_t)127));
    c->data = (char*)base + c->hdr->data_offset;
    c->chunk_bytes = c->hdr->chunk_bytes;
    c->map_bytes = map_bytes;
}

// create_segment: this rank came first: size, reserve and initialize the segment.
static ncclResult_t create_segment(ncclComm* c, int fd, const IdInfo* id) {
    size_t chunk = env_chunk_bytes(c->nranks), hdr_bytes = header_bytes(c->nranks);
    size_t total = hdr_bytes + (size_t)c->nranks * chunk;
    int err = 0;
    if (ftruncate(fd, (off_t)total) != 0) err = errno;
    // Reserve the pages now: when /dev/shm is too small we get ENOSPC here instead of SIGBUS later.
    if (!err) {
        int e = posix_fallocate(fd, 0, (off_t)total);
        if (e == ENOSPC || e == EFBIG || e == ENOMEM) err = e;
    }
    void* base = err ? MAP_FAILED : mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!err && base == MAP_FAILED) err = errno;
    close(fd);
    if (err) {
        shm_unlink(id->name);
        return record_error(NULL, ncclSystemError,
                            "ncclCommInitRank: cannot create %zu bytes of shared memory %s: %s (try a smaller "
                            "NCCL_EMU_CHUNK_BYTES)",
                            total, id->name, strerror(err));
    }
    Header* h = (Header*)base;  // the pages are zero already
    h->nonce = id->nonce;
    h->nranks = c->nranks;
    h->chunk_bytes = chunk;
    h->data_offset = hdr_bytes;
    h->total_bytes = total;
    STORE(&h->magic, (uint64_t)SEGMENT_MAGIC);
    set_pointers(c, base, total);
    return ncclSuccess;
}

// open_segment: another rank created the segment: map it once it is sized and initialized.
static ncclResult_t open_segment(ncclComm* c, int fd, const IdInfo* id, double deadline) {
    struct stat st;
    for (;;) {
        if (fstat(fd, &st) != 0) {
            int e = errno;
            close(fd);
            return record_error(NULL, ncclSystemError, "ncclCommInitRank: fstat(%s): %s", id->name, strerror(e));
        }
        if (st.st_size > 0) break;
        if (now_s() > deadline || LOAD(&c->aborting)) {
            close(fd);
            return record_error(NULL, ncclRemoteError, "ncclCommInitRank: timeout: segment %s was never sized",
                                id->name);
        }
        sleep_s(0.001);
    }
    size_t size = (size_t)st.st_size;
    void* base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (base == MAP_FAILED)
        return record_error(NULL, ncclSystemError, "ncclCommInitRank: mmap(%s): %s", id->name, strerror(e));
    Header* h = (Header*)base;
    while (LOAD(&h->magic) != SEGMENT_MAGIC) {
        if (now_s() > deadline || LOAD(&c->aborting)) {
            munmap(base, size);
            return record_error(NULL, ncclRemoteError,
                                "ncclCommInitRank: timeout: segment %s was never initialized (its creator died?)",
                                id->name);
        }
        sleep_s(0.001);
    }
    const char* why = NULL;
    if (h->nonce != id->nonce)
        why = "it belongs to another unique id";
    else if (h->total_bytes != size)
        why = "its size is wrong";
    else if (h->nranks != c->nranks)
        why = "the ranks disagree on nranks";
    if (why) {
        int their_nranks = h->nranks;
        munmap(base, size);
        return record_error(NULL, ncclInvalidUsage,
                            "ncclCommInitRank: rank %d (nranks %d) cannot use segment %s (nranks %d): %s", c->rank,
                            c->nranks, id->name, their_nranks, why);
    }
    set_pointers(c, base, size);
    return ncclSuccess;
}

// attach_segment: create the segment, or open it if another rank was first.
static ncclResult_t attach_segment(ncclComm* c, const IdInfo* id, double deadline) {
    for (;;) {
        int fd = shm_open(id->name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) return create_segment(c, fd, id);
        if (errno != EEXIST)
            return record_error(NULL, ncclSystemError, "ncclCommInitRank: shm_open(%s): %s", id->name, strerror(errno));
        fd = shm_open(id->name, O_RDWR, 0600);
        if (fd >= 0) return open_segment(c, fd, id, deadline);
        if (errno != ENOENT)
            return record_error(NULL, ncclSystemError, "ncclCommInitRank: shm_open(%s): %s", id->name, strerror(errno));
        // It was unlinked between our two calls (a failed init cleaning up): try again.
        if (now_s() > deadline || LOAD(&c->aborting))
            return record_error(NULL, ncclRemoteError, "ncclCommInitRank: timeout attaching to %s", id->name);
        sleep_s(0.001);
    }
}

// comm_new: check the arguments of an init and allocate the communicator (nothing attached yet).
static ncclResult_t comm_new(int nranks, ncclUniqueId commId, int rank, const char* fn, ncclComm** out) {
    *out = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return record_error(NULL, ncclInvalidArgument, "%s: bad rank %d / nranks %d (at most %d ranks)", fn, rank,
                            nranks, MAX_RANKS);
    IdInfo id;
    memcpy(&id, commId.internal, sizeof id);
    id.name[sizeof id.name - 1] = 0;
    if (memcmp(id.magic, ID_MAGIC, sizeof id.magic) != 0 || id.name[0] != '/')
        return record_error(NULL, ncclInvalidArgument, "%s: the id does not come from ncclGetUniqueId", fn);
    ncclComm* c = (ncclComm*)calloc(1, sizeof *c);
    if (!c) return record_error(NULL, ncclSystemError, "%s: out of memory", fn);
    c->rank = rank;
    c->nranks = nranks;
    c->nonce = id.nonce;
    c->id = id;
    c->blocking = 1;
    c->timeout_s = env_timeout_s();
    emu_read_env();  // a bad NCCL_EMU_GBPS or NCCL_EMU_LATENCY_US stops the process here, saying why
    c->my_pid = getpid();
    c->my_ns = my_pid_namespace();
    c->cur_op = "ncclCommInitRank";
    *out = c;
    return ncclSuccess;
}

// init_body: attach to the segment, claim this rank's slot and wait for every rank to join.
// On failure nothing stays attached (c->hdr is NULL) and the error is returned.
static ncclResult_t init_body(ncclComm* c) {
    const IdInfo* id = &c->id;
    char state;
    uint64_t start_time = 0;
    c->have_proc = read_proc_stat(c->my_pid, &state, &start_time) == 0;
    double deadline = c->timeout_s > 0 ? now_s() + c->timeout_s : 1e300;
    ncclResult_t r = attach_segment(c, id, deadline);
    if (r != ncclSuccess) {
        c->hdr = NULL;
        return r;
    }
    Header* h = c->hdr;
    Slot* s = &c->slots[c->rank];
    if (__atomic_exchange_n(&s->claimed, 1, __ATOMIC_SEQ_CST) != 0) {
        char msg[200];
        snprintf(msg, sizeof msg, "ncclCommInitRank: rank %d joined twice (pid %d)", c->rank, (int)c->my_pid);
        publish_failure(c, ncclInvalidUsage, msg);
        r = record_error(c, ncclInvalidUsage, "%s", msg);
    } else {
        s->pid = (int32_t)c->my_pid;
        s->pid_ns = c->my_ns;
        s->start_time = start_time;
        STORE(&s->state, (int32_t)SLOT_JOINED);
        // The last rank to join removes the name: the segment lives on while it is mapped.
        if (__atomic_add_fetch(&h->attached, 1, __ATOMIC_SEQ_CST) == c->nranks) shm_unlink(id->name);
        wake_all(h);
        r = wait_all(c, 0);
        if (r != ncclSuccess) STORE(&s->state, (int32_t)SLOT_LEFT);
    }
    if (r != ncclSuccess) {
        shm_unlink(id->name);  // a late rank then finds no segment, makes its own and times out
        wake_all(h);
        munmap(h, c->map_bytes);
        c->hdr = NULL;
        return r;
    }
    c->cur_op = "(no call)";
    return ncclSuccess;
}

static void comm_free_memory(ncclComm* c) {
    if (!c->blocking) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c->queue);
    }
    free(c);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    if (!comm) return record_error(NULL, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    ncclComm* c;
    ncclResult_t r = comm_new(nranks, commId, rank, "ncclCommInitRank", &c);
    if (r != ncclSuccess) return r;
    r = init_body(c);
    if (r != ncclSuccess) {
        comm_free_memory(c);
        return r;
    }
    c->init_done = 1;
    *comm = c;
    return ncclSuccess;
}

// worker: the thread of a non-blocking communicator: init, then the queued calls in order.
// busy was raised for the init by ncclCommInitRankConfig; each call raises it under the lock, so
// ncclCommAbort, once it has emptied the queue under the lock, only waits for busy to reach 0.
static void* worker(void* arg) {
    ncclComm* c = (ncclComm*)arg;
    ncclResult_t r = init_body(c);
    if (r != ncclSuccess)
        comm_fail(c, r, "%s", tls_last_error);
    else
        __atomic_store_n(&c->init_done, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&c->mu);
    c->pending--;
    __atomic_fetch_sub(&c->busy, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        while (c->q_n == 0 && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        if (c->q_n == 0) break;
        Call k = c->queue[c->q_head];
        c->q_head = (c->q_head + 1) % c->q_cap;
        c->q_n--;
        __atomic_fetch_add(&c->busy, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&c->mu);
        if (c->hdr) run_call(&k);  // after a failed init: every call fails (the error is sticky)
        pthread_mutex_lock(&c->mu);
        __atomic_fetch_sub(&c->busy, 1, __ATOMIC_SEQ_CST);
        c->pending--;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
    // Of the options only blocking applies here (the others tune GPU resources). Unset, NCCL takes
    // NCCL_COMM_BLOCKING from the environment, else 1.
    if (!comm) return record_error(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    if (config && config->magic != 0xcafebeef)
        return record_error(NULL, ncclInvalidArgument,
                            "ncclCommInitRankConfig: config was not set up with NCCL_CONFIG_INITIALIZER");
    int blocking = config ? config->blocking : NCCL_CONFIG_UNDEF_INT;
    if (blocking == NCCL_CONFIG_UNDEF_INT) {
        const char* e = getenv("NCCL_COMM_BLOCKING");
        blocking = e && *e ? atoi(e) != 0 : 1;
    }
    if (blocking) return ncclCommInitRank(comm, nranks, commId, rank);
    *comm = NULL;
    ncclComm* c;
    ncclResult_t r = comm_new(nranks, commId, rank, "ncclCommInitRankConfig", &c);
    if (r != ncclSuccess) return r;
    c->blocking = 0;
    c->pending = 1;  // the init
    c->busy = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->worker, NULL, worker, c) != 0) {
        comm_free_memory(c);
        return record_error(NULL, ncclSystemError, "ncclCommInitRankConfig: cannot start a thread: %s",
                            strerror(errno));
    }
    c->have_worker = 1;
    *comm = c;  // valid now; ncclCommGetAsyncError tells when it is ready
    return ncclInProgress;
}

// ncclCommFinalize: every operation has completed when its call returned (blocking), or when
// ncclCommGetAsyncError stops saying ncclInProgress (non-blocking); nothing else to flush.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm) return record_error(NULL, ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    ncclResult_t e = (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_SEQ_CST);
    if (e == ncclSuccess && !comm->blocking &&
        (__atomic_load_n(&comm->pending, __ATOMIC_SEQ_CST) > 0 ||
         __atomic_load_n(&comm->on_streams, __ATOMIC_SEQ_CST) > 0))
        return ncclInProgress;
    // (a failed collective holds its stream until the abort: the error is the answer, not a wait)
    while (comm->blocking && __atomic_load_n(&comm->on_streams, __ATOMIC_SEQ_CST) > 0 &&
           !__atomic_load_n(&comm->error, __ATOMIC_SEQ_CST))
        sleep_s(0.001);
    return (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_SEQ_CST);
}

// stop_worker: let the thread of a non-blocking communicator finish what is queued (drop = 0) or
// drop it (drop = 1), and exit.
static void stop_worker(ncclComm* c, int drop) {
    pthread_mutex_lock(&c->mu);
    if (drop) {
        c->pending -= c->q_n;
        c->q_n = 0;
    }
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

// release: this rank leaves: mark its slot (peers waiting for it then fail at once), unmap, free.
static void release(ncclComm* c) {
    if (c->hdr) {
        STORE(&c->slots[c->rank].state, (int32_t)SLOT_LEFT);
        wake_all(c->hdr);
        munmap(c->hdr, c->map_bytes);
    }
    comm_free_memory(c);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    // Blocking: when a collective returns, no rank needs this rank's memory any more. Non-blocking:
    // the queued calls run first (they end, in success or error, since their waits are bounded).
    if (comm->have_worker) {
        stop_worker(comm, 0);
        pthread_join(comm->worker, NULL);
    }
    // Their waits are bounded too; but a collective that failed holds its stream until an abort
    // (hold_until_abort): on a failed communicator Destroy ends them as ncclCommAbort does, where NCCL
    // would wait for them forever.
    while (__atomic_load_n(&comm->on_streams, __ATOMIC_SEQ_CST) > 0) {
        if (__atomic_load_n(&comm->error, __ATOMIC_SEQ_CST)) __atomic_store_n(&comm->aborting, 1, __ATOMIC_SEQ_CST);
        sleep_s(0.001);
    }
    if (comm->hdr) write_stats(comm);
    release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    char msg[200];
    snprintf(msg, sizeof msg, "rank %d aborted the communicator (ncclCommAbort)", comm->rank);
    __atomic_store_n(&comm->aborting, 1, __ATOMIC_SEQ_CST);
    if (comm->have_worker) stop_worker(comm, 1);
    // Peers fail now rather than wait for us. (During a non-blocking init, the init itself fails
    // on `aborting` and marks this rank's slot as left, which the peers see.)
    if (__atomic_load_n(&comm->init_done, __ATOMIC_SEQ_CST)) publish_failure(comm, ncclRemoteError, msg);
    // A thread blocked in a call (or in a non-blocking init) on this communicator notices within
    // CHECK_INTERVAL_S; wait for it to leave before unmapping (if it does not, leak the mapping
    // rather than pull it away).
    double give_up = now_s() + 5.0;
    // Collectives still queued on streams fail at once when they run (aborting): wait for them too.
    while ((__atomic_load_n(&comm->busy, __ATOMIC_SEQ_CST) > 0 ||
            __atomic_load_n(&comm->on_streams, __ATOMIC_SEQ_CST) > 0) &&
           now_s() < give_up)
        sleep_s(0.001);
    if (__atomic_load_n(&comm->busy, __ATOMIC_SEQ_CST) > 0 ||
        __atomic_load_n(&comm->on_streams, __ATOMIC_SEQ_CST) > 0) {
        if (__atomic_load_n(&comm->init_done, __ATOMIC_SEQ_CST))
            STORE(&comm->slots[comm->rank].state, (int32_t)SLOT_LEFT);
        return ncclSuccess;
    }
    if (comm->have_worker) pthread_join(comm->worker, NULL);
    release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    if (!comm || !asyncError) return record_error(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    ncclResult_t e = (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_SEQ_CST);
    if (e == ncclSuccess && !comm->blocking && __atomic_load_n(&comm->pending, __ATOMIC_SEQ_CST) > 0) {
        *asyncError = ncclInProgress;  // init or a queued call still running: its thread watches the peers
        return ncclSuccess;
    }
    if (e == ncclSuccess && !comm->hdr) {  // a non-blocking init that failed has its error set; not here
        *asyncError = ncclSuccess;
        return ncclSuccess;
    }
    if (!comm->error && LOAD(&comm->hdr->fail_code)) {
        const char* saved = comm->cur_op;
        comm->cur_op = "ncclCommGetAsyncError";
        fail_from_header(comm);
        comm->cur_op = saved;
    }
    // An idle communicator does not watch its peers (as in NCCL, where errors are found by the
    // operations in flight): a peer that exits after the last collective that needed it is no error.
    *asyncError = (ncclResult_t)__atomic_load_n(&comm->error, __ATOMIC_SEQ_CST);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    if (!comm || !count) return record_error(NULL, ncclInvalidArgument, "ncclCommCount: NULL argument");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    if (!comm || !rank) return record_error(NULL, ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    *rank = comm->rank;
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess:
            return "no error";
        case ncclUnhandledCudaError:
            return "unhandled cuda error";
        case ncclSystemError:
            return "unhandled system error (shared memory or the communicator was aborted)";
        case ncclInternalError:
            return "internal error";
        case ncclInvalidArgument:
            return "invalid argument";
        case ncclInvalidUsage:
            return "invalid usage";
        case ncclRemoteError:
            return "remote process exited, aborted or timed out";
        case ncclInProgress:
            return "NCCL operation in progress";
        default:
            return "unknown result code";
    }
}

// ncclGetLastError: the message of the last error (this communicator's, else this thread's).
const char* ncclGetLastError(ncclComm_t comm) {
    if (comm && comm->last_error[0]) return comm->last_error;
    return tls_last_error;
}
