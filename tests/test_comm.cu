// tests/test_comm.cu: comm.h's launch and bootstrap pieces, without a trainer.
// Covered: the first host of Slurm host lists (ranges, zero padding, suffixes, several groups, bad
// lists); the device rule (a task that sees all of its node's GPUs, or only its own, or too few);
// the port (MASTER_PORT, else from the launch tag, in [20000, 40000)); the launch tag (job, step,
// restart count, --out); the TCP bootstrap between processes: rank 0 serves the id to the other ranks,
// refuses a stranger (another launch's tag), a rank whose rank 0 never comes gives up at its deadline
// naming the address, and one whose rank 0 is black-holed (SYNs dropped) gives up at its deadline too;
// the listen backlog holds world-1 simultaneous connections; the file bootstrap: a file of another launch
// or a stale one of this launch (never rewritten, however young) is never used, rank 0's live one is,
// at once; comm_agree's minimum and maximum over ranks (one rank); the agreement's messages.
#include <cuda_runtime.h>

#include "../comm.h"

#include <signal.h>
#include <sys/wait.h>

#include "testing.h"

static void first_host(const char* list, const char* want) {
    char out[64] = "";
    int r = comm_first_host(list, out, sizeof out);
    if (want)
        CHECK(r == 0 && !strcmp(out, want), "first host of '%s': got %d '%s', want '%s'", list, r, out, want);
    else
        CHECK(r == -1, "first host of '%s': got '%s', want an error", list, out);
}

static void test_hostlists(void) {
    first_host("localhost", "localhost");
    first_host("node01", "node01");
    first_host("node[01-03,07]", "node01");
    first_host("node[7,1-3]", "node7");
    first_host("gpu-a[003-010],gpu-b[1-2]", "gpu-a003");
    first_host("a,b,c", "a");
    first_host("rack[1-2]-n[3-4]", "rack1-n3");
    first_host("n[12]", "n12");
    first_host("node[01-", NULL);
    first_host("node[]", NULL);
    first_host("node[x]", NULL);
    first_host("node]1", NULL);
    first_host("", NULL);
    first_host(",a", NULL);
    char small[4];
    CHECK(comm_first_host("node01", small, sizeof small) == -1, "a name longer than the buffer must be an error");
}

static void test_devices(void) {
    char err[512] = "";
    CHECK(comm_device(0, 4, err, sizeof err) == 0 && comm_device(3, 4, err, sizeof err) == 3,
          "a task that sees the node's 4 GPUs uses its local rank");
    CHECK(comm_device(0, 1, err, sizeof err) == 0 && comm_device(3, 1, err, sizeof err) == 0,
          "a task that sees one GPU (its own) uses device 0, whatever its local rank");
    CHECK(comm_device(1, 2, err, sizeof err) == 1, "local rank 1 of 2 GPUs");
    err[0] = 0;
    CHECK(comm_device(2, 2, err, sizeof err) == -1 && strstr(err, "local rank 2 but this process sees 2 GPU(s)"),
          "local rank 2 with 2 GPUs must be an error naming both: '%s'", err);
    CHECK(comm_device(0, 0, err, sizeof err) == -1, "no GPU at all must be an error");
}

static void test_ports_and_tags(void) {
    Comm c;
    memset(&c, 0, sizeof c);
    c.world = 2;
    unsetenv("MASTER_PORT");
    setenv("SLURM_JOB_ID", "41", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_RESTART_COUNT", "0", 1);
    uint64_t t0 = comm_launch_tag(&c, "/runs/a");
    setenv("SLURM_RESTART_COUNT", "1", 1);  // the same job, requeued
    uint64_t t1 = comm_launch_tag(&c, "/runs/a");
    setenv("SLURM_STEP_ID", "1", 1);  // another step
    uint64_t t2 = comm_launch_tag(&c, "/runs/a");
    uint64_t t3 = comm_launch_tag(&c, "/runs/b");  // another --out
    c.world = 4;
    uint64_t t4 = comm_launch_tag(&c, "/runs/b");
    CHECK(t0 != t1 && t1 != t2 && t2 != t3 && t3 != t4, "launch tags must differ by restart, step, --out and world");
    c.world = 4;
    CHECK(comm_launch_tag(&c, "/runs/b") == t4, "the launch tag must be a function of the environment");
    char err[256] = "";
    int seen_low = 0, seen_high = 0, distinct = 0, last = -1;
    for (int i = 0; i < 200; i++) {
        char out[32];
        snprintf(out, sizeof out, "/runs/%d", i);
        int p = comm_port(comm_launch_tag(&c, out), err, sizeof err);
        CHECK(p >= 20000 && p < 40000, "port %d outside [20000, 40000)", p);
        seen_low |= p < 30000, seen_high |= p >= 30000, distinct += p != last, last = p;
    }
    CHECK(seen_low && seen_high && distinct > 190, "ports from tags should spread over the range");
    setenv("MASTER_PORT", "29500", 1);
    CHECK(comm_port(t0, err, sizeof err) == 29500, "MASTER_PORT wins");
    setenv("MASTER_PORT", "0", 1);
    CHECK(comm_port(t0, err, sizeof err) == -1 && strstr(err, "MASTER_PORT=0"), "MASTER_PORT=0 must be an error: %s",
          err);
    unsetenv("MASTER_PORT");
    char host[64], e2[256];
    setenv("SLURM_STEP_NODELIST", "gpu[17-20]", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[01-40]", 1);
    CHECK(comm_master_addr(host, sizeof host, e2, sizeof e2) == 0 && !strcmp(host, "gpu17"),
          "the step's node list comes first: %s", host);
    setenv("MASTER_ADDR", "10.0.0.5", 1);
    CHECK(comm_master_addr(host, sizeof host, e2, sizeof e2) == 0 && !strcmp(host, "10.0.0.5"), "MASTER_ADDR wins");
    unsetenv("MASTER_ADDR");
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_JOB_NODELIST");
    CHECK(comm_master_addr(host, sizeof host, e2, sizeof e2) == 0 && !strcmp(host, "127.0.0.1"),
          "no Slurm, no MASTER_ADDR: 127.0.0.1");
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_STEP_ID");
    unsetenv("SLURM_RESTART_COUNT");
}

// ---------------------------------------------------------------------------------------------
// The TCP bootstrap, between processes. Each child reports 1 byte: 1 = as expected.

static ncclUniqueId some_id(int salt) {
    ncclUniqueId id;
    for (int i = 0; i < (int)sizeof id.internal; i++) id.internal[i] = (char)(i * 7 + salt);
    return id;
}

static int child_exit(int ok) {
    fflush(stdout);
    _exit(ok ? 0 : 1);
}

// free_port: a TCP port nobody listens on now (the kernel's choice for port 0).
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 20000 + (int)(getpid() % 20000);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET, a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd >= 0 && bind(fd, (struct sockaddr*)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr*)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static void test_tcp(void) {
    const int world = 3;
    int port = free_port();
    uint64_t tag = 0x1234567, stranger_tag = 0x7654321;
    ncclUniqueId id = some_id(3);
    pid_t pids[4];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            Comm c;
            memset(&c, 0, sizeof c);
            c.rank = r, c.world = world, c.timeout_s = 10;
            char err[4096] = "";
            double deadline = comm_now_s() + 10;
            if (r == 0) {
                comm_sleep_s(0.3);  // the others (and the stranger) try before rank 0 listens
                int ok = comm_serve_id(&c, port, tag, &id, deadline, err, sizeof err) == 0;
                if (!ok) fprintf(stderr, "rank 0: %s\n", err);
                child_exit(ok);
            }
            comm_sleep_s(1.0);  // meanwhile the stranger tries, alone
            ncclUniqueId got;
            memset(&got, 0, sizeof got);
            int ok = comm_fetch_id(&c, "127.0.0.1", port, tag, &got, deadline, err, sizeof err) == 0 &&
                     !memcmp(&got, &id, sizeof id);
            if (!ok) fprintf(stderr, "rank %d: %s\n", r, err);
            child_exit(ok);
        }
    }
    // A stranger: another launch's rank 1 on the same port. It must be refused (never get the id) and
    // give up at its deadline saying so; rank 0 still serves its own ranks.
    pids[3] = fork();
    if (pids[3] == 0) {
        Comm c;
        memset(&c, 0, sizeof c);
        c.rank = 1, c.world = world, c.timeout_s = 2;
        char err[4096] = "";
        ncclUniqueId got;
        int r = comm_fetch_id(&c, "127.0.0.1", port, stranger_tag, &got, comm_now_s() + 2, err, sizeof err);
        int ok = r == -1 && strstr(err, "127.0.0.1") && strstr(err, "refused this launch's tag");
        if (!ok) fprintf(stderr, "stranger: %d, %s\n", r, err);
        child_exit(ok);
    }
    for (int i = 0; i < 4; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "TCP bootstrap: %s %d failed (status 0x%x)",
              i < 3 ? "rank" : "the stranger", i, st);
    }
    // A rank whose rank 0 never listens gives up at its deadline, naming the address and port.
    Comm c;
    memset(&c, 0, sizeof c);
    c.rank = 2, c.world = world, c.timeout_s = 0.5;
    char err[4096] = "";
    ncclUniqueId got;
    double t0 = comm_now_s();
    int r = comm_fetch_id(&c, "127.0.0.1", port, tag, &got, t0 + 0.5, err, sizeof err);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", port);
    CHECK(r == -1 && comm_now_s() - t0 < 3 && strstr(err, where), "no rank 0: %d after %.1f s: %s", r,
          comm_now_s() - t0, err);
}

// ---------------------------------------------------------------------------------------------
// The file bootstrap

static void write_id_file(const char* path, uint64_t tag, double created, uint64_t beat, ncclUniqueId id) {
    CommIdFile f;
    memset(&f, 0, sizeof f);
    memcpy(f.magic, COMM_FILE_MAGIC, 8);
    f.tag = tag, f.created = created, f.beat = beat, f.id = id;
    CHECK(comm_write_id_file(path, &f) == 0, "cannot write %s", path);
}

static void test_file(void) {
    char dir[] = "/tmp/mlm_comm_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_STEP_ID");
    unsetenv("SLURM_RESTART_COUNT");
    char path[4096];
    comm_id_path(path, sizeof path, dir);
    char want[4096];
    snprintf(want, sizeof want, "%s/nccl_id.local.0.0", dir);
    CHECK(!strcmp(path, want), "id file name %s", path);
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_STEP_ID", "2", 1);
    setenv("SLURM_RESTART_COUNT", "1", 1);
    comm_id_path(path, sizeof path, dir);
    snprintf(want, sizeof want, "%s/nccl_id.77.2.1", dir);
    CHECK(!strcmp(path, want), "id file name under Slurm %s (want the job, step and restart count)", path);
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_STEP_ID");
    unsetenv("SLURM_RESTART_COUNT");
    comm_id_path(path, sizeof path, dir);

    Comm c;
    memset(&c, 0, sizeof c);
    c.rank = 1, c.world = 2, c.timeout_s = 0.5;
    uint64_t tag = 99;
    double now = comm_realtime_s();
    char err[4096] = "";
    ncclUniqueId got, id = some_id(5), old_id = some_id(6);
    // another launch's file
    write_id_file(path, 98, now, 0, id);
    CHECK(comm_file_id(&c, dir, tag, &got, comm_now_s() + 0.5, err, sizeof err) == -1 &&
              strstr(err, "from another launch") && strstr(err, path),
          "a file with another launch's tag must not be used: %s", err);
    // a stale file of this launch's tag, written just now (an earlier run by hand that died at once): its
    // beat never changes, so it is never used, however young
    write_id_file(path, tag, now, 3, old_id);
    CHECK(comm_file_id(&c, dir, tag, &got, comm_now_s() + 0.5, err, sizeof err) == -1 && strstr(err, "stale"),
          "a stale file of this launch's tag, written just now, must not be used: %s", err);
    // rank 0 comes 0.3 s after rank 1 started waiting over the stale file: rank 1 takes rank 0's id as soon
    // as it has seen it beat, long before its deadline
    pid_t pid = fork();
    if (pid == 0) {
        comm_sleep_s(0.3);
        Comm c0 = c;
        c0.rank = 0;
        char e0[4096] = "";
        int ok = comm_file_id(&c0, dir, tag, &id, comm_now_s() + 5, e0, sizeof e0) == 0;
        if (!ok) fprintf(stderr, "rank 0: %s\n", e0);
        comm_sleep_s(1.5);  // until rank 1 has read it
        comm_beat_stop();
        struct stat st;
        if (stat(path, &st) == 0) ok = 0, fprintf(stderr, "rank 0: comm_beat_stop left %s\n", path);
        child_exit(ok);
    }
    memset(&got, 0, sizeof got);
    double t0 = comm_now_s();
    int r = comm_file_id(&c, dir, tag, &got, t0 + 10, err, sizeof err);
    double took = comm_now_s() - t0;
    CHECK(r == 0 && !memcmp(&got, &id, sizeof id) && took < 1.5,
          "rank 1 over a stale file must read rank 0's fresh id soon after rank 0 writes it: %d after %.2f s: %s", r,
          took, err);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "file bootstrap: rank 0 failed (status 0x%x)", st);
    printf(
        "file bootstrap over a stale id file: rank 1 had the fresh id %.2f s after it began (rank 0 came at "
        "0.3 s)\n",
        took);
    unlink(path);
    rmdir(dir);
}

// A black-holed rank 0: a listening socket on 127.0.0.1 whose accept queue is full (nobody accepts), so
// the kernel drops further SYNs and a blocking connect would wait for its SYN retries (minutes). The
// fetch must give up at its deadline, saying the connection got no answer.
static void test_black_hole(void) {
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET, a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    CHECK(ls >= 0 && bind(ls, (struct sockaddr*)&a, sizeof a) == 0 && listen(ls, 0) == 0 &&
              getsockname(ls, (struct sockaddr*)&a, &len) == 0,
          "black hole: cannot listen on 127.0.0.1");
    int fill[4], nfill = 0;
    for (int i = 0; i < 4; i++) {  // fill the accept queue (backlog 0 holds one or two)
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        connect(fd, (struct sockaddr*)&a, sizeof a);
        fill[nfill++] = fd;
        comm_sleep_s(0.05);
    }
    Comm c;
    memset(&c, 0, sizeof c);
    c.rank = 1, c.world = 2, c.timeout_s = 1;
    char err[4096] = "";
    ncclUniqueId got;
    double t0 = comm_now_s();
    int r = comm_fetch_id(&c, "127.0.0.1", ntohs(a.sin_port), 1, &got, t0 + 1, err, sizeof err);
    double took = comm_now_s() - t0;
    CHECK(r == -1 && took < 2.5 && strstr(err, "no answer to the connection"),
          "a black-holed rank 0 with a 1 s deadline: %d after %.2f s: %s", r, took, err);
    printf("black-holed rank 0, deadline 1 s: gave up after %.2f s\n", took);
    for (int i = 0; i < nfill; i++) close(fill[i]);
    close(ls);
}

// connected_by: did the non-blocking connect of fd complete (writable, no error) before the deadline?
static int connected_by(int fd, double deadline) {
    for (;;) {
        double left = deadline - comm_now_s();
        struct pollfd p = {fd, POLLOUT, 0};
        int pr = poll(&p, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) return 0;
        int e = 0;
        socklen_t el = sizeof e;
        return getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0;
    }
}

// The backlog: world-1 ranks connecting at once all complete their connection before rank 0 accepts
// any (with a backlog of 128, only 129 would: the others' SYNs are dropped and retried a second later).
static void test_backlog(void) {
    const int world = 300;
    int somaxconn = 0;
    FILE* f = fopen("/proc/sys/net/core/somaxconn", "r");
    if (f) {
        if (fscanf(f, "%d", &somaxconn) != 1) somaxconn = 0;
        fclose(f);
    }
    CHECK(comm_backlog(world) >= world && comm_backlog(2) >= 128, "comm_backlog(%d) = %d", world, comm_backlog(world));
    if (somaxconn < world) {
        printf("skipped: the backlog of %d connections (net.core.somaxconn is %d here)\n", world, somaxconn);
        return;
    }
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET, a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    CHECK(ls >= 0 && bind(ls, (struct sockaddr*)&a, sizeof a) == 0 && listen(ls, comm_backlog(world)) == 0 &&
              getsockname(ls, (struct sockaddr*)&a, &len) == 0,
          "backlog: cannot listen");
    int fds[world], done = 0;
    double deadline = comm_now_s() + 0.7;  // before the kernel's first SYN retry (1 s)
    for (int i = 0; i < world - 1; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[i] >= 0 && fcntl(fds[i], F_SETFL, O_NONBLOCK) == 0) connect(fds[i], (struct sockaddr*)&a, sizeof a);
    }
    for (int i = 0; i < world - 1; i++) done += fds[i] >= 0 && connected_by(fds[i], deadline);
    CHECK(done == world - 1, "backlog: %d of %d connections completed before rank 0 accepted any", done, world - 1);
    for (int i = 0; i < world - 1; i++)
        if (fds[i] >= 0) close(fds[i]);
    close(ls);
}

static void test_agree_one_rank(void) {
    Comm c;
    memset(&c, 0, sizeof c);
    c.world = 1;
    CommValue v[2] = {{"a", 5, 0, 0}, {"b", -3, 0, 0}};
    comm_agree(&c, v, 2);
    CHECK(v[0].min == 5 && v[0].max == 5 && v[1].min == -3 && v[1].max == -3, "one rank: min = max = value");
    // a table: one rank agrees with itself; the real numbers keep their bits
    CommFlag f[3] = {comm_flag_int("--steps", 7), comm_flag_real("--lr", (float)5e-3),
                     comm_flag_smallest("micro-batch", 12)};
    CommValue w[3];
    CHECK(comm_agree_flags(&c, f, 3, w) == 0 && w[2].min == 12 && comm_real_of(w[1].value) == (double)(float)5e-3,
          "one rank's table must agree with itself");
    // the messages show real numbers with the fewest digits that read back (as a float when they are one)
    char b[32];
    CHECK(!strcmp(comm_fmt_real(b, sizeof b, (double)(float)5e-3), "0.005"), "--lr 5e-3 (a float): '%s'", b);
    CHECK(!strcmp(comm_fmt_real(b, sizeof b, 0.1), "0.1"), "0.1: '%s'", b);
    CHECK(!strcmp(comm_fmt_real(b, sizeof b, 1.0 / 3.0), "0.3333333333333333"), "1/3 (a double): '%s'", b);
    CHECK(!strcmp(comm_fmt_real(b, sizeof b, 1e-12), "1e-12"), "1e-12: '%s'", b);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    test_hostlists();
    test_devices();
    test_ports_and_tags();
    test_tcp();
    test_file();
    test_black_hole();
    test_backlog();
    test_agree_one_rank();
    return test_summary();
}
