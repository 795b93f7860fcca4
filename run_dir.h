// run_dir.h: the run directory (--out): made and checked at the start, one run at a time (DIR/lock), the earlier
// run's files kept or cleared, the schedule recorded (run.json). Part of trainer.cu (one translation unit).
#include <ftw.h>
#include <pthread.h>

// make_out_dir: --out and its missing parents created, and a file written and removed there, so a
// directory the run could not write fails now, not at the first checkpoint. Gives 1, or 0 after an error.
#define OUT_MAX_LEN 4000  // --out's length: the run's file names (at most 64 characters) go under it, within PATH_MAX
static int make_out_dir(const char* dir) {
    char p[4096];
    if (strlen(dir) > OUT_MAX_LEN || !*dir) {
        fprintf(stderr,
                "trainer: --out '%.64s%s': expected a directory path of 1 to %d characters (this one has %zu)\n", dir,
                strlen(dir) > 64 ? "..." : "", OUT_MAX_LEN, strlen(dir));
        return 0;
    }
    snprintf(p, sizeof p, "%s", dir);
    for (char* s = p + 1;; s++) {  // mkdir -p
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "trainer: --out %s: cannot create the directory %s: %s\n", dir, p, strerror(errno));
            return 0;
        }
        *s = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "trainer: --out %s: exists and is not a directory\n", dir);
        return 0;
    }
    // the test file's name is as long as the longest the run writes (64 characters), so a path too long fails now
    snprintf(p, sizeof p, "%s/.write_test.%010d.%.41s", dir, (int)getpid(),
             "0123456789012345678901234567890123456789x");
    int fd = create_fresh(p);
    int ok = fd >= 0 && write_all(fd, "ok\n", 3) && fsync(fd) == 0, why = errno;
    if (fd >= 0) close(fd), unlink(p);
    if (!ok) fprintf(stderr, "trainer: --out %s: cannot write there: %s\n", dir, strerror(why));
    return ok;
}

// ----------------------------------------------------------------------------
// The run directory: one run per --out, and nothing of a finished run lost by a new one.
// - DIR/lock: every rank of a training run holds an fcntl write lock on one byte of it (rank r: byte r)
//   for the process's life, taken before the NCCL bootstrap; rank 0 writes "HOST PID JOB" into it. A second
//   launch into the same --out finds its bytes taken and stops with one line naming the holder, before it
//   could join the first launch's communicator (its ranks see the same launch tag); of two launches at once, the
//   one whose rank 0 gets byte 0 runs (run_lock: the launch marks). fcntl locks end with their process, so a lock
//   left by a dead run blocks nothing. (Written in place, as metrics.jsonl is appended to: replacing it would lose
//   the lock; a symbolic link there is refused.) --eval, --bench and --plan-only take no lock: they do not write a
//   run's files (--eval --out appends one whole record to metrics.jsonl).
// - A new run (no --resume) into a directory that holds another run's checkpoints or export is refused unless
//   --overwrite, which deletes them once the new run is ready to write (run_dir_clear); the records of a run
//   that left no checkpoint are kept as metrics.jsonl.prev (run_dir_keep_metrics).
// - Every file the run will write must be a regular file or absent: a directory named checkpoint.bin fails at
//   the start, not after training.
// - DIR/run.json records the run's schedule; a resume that changes it says so in one line (run_schedule).
#define EXPORT_STAGING ".export.tmp"  // the export is written here whole, then renamed into --out (export_run)
static const char* const run_files[] = {"checkpoint.bin",        "checkpoint.bin.tmp",
                                        "metrics.jsonl",         "metrics.jsonl.tmp",
                                        "metrics.jsonl.prev",    "model.safetensors",
                                        "config.json",           "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json",
                                        "byte_tokenizer.json",   "run.json",
                                        "run.json.tmp",          "lock"};
#define RUN_NUM_FILES ((int)(sizeof run_files / sizeof run_files[0]))
// A run's results: a new run is refused where any is (or a checkpoint-STEP.bin). A metrics.jsonl alone (a run
// that never made a checkpoint: a requeued job starts again without --resume) is kept as metrics.jsonl.prev.
static const char* const run_results[] = {"checkpoint.bin", "model.safetensors", "config.json"};

// The lock's marks: besides its byte, rank r holds the byte lock_mark(tag, r) past the ranks' bytes (tag: comm.h's
// comm_launch_tag, the same on the ranks of one launch, another for another --out, world size, job or MASTER_PORT).
// Taken before the rank's byte, and kept: a rank > 0 tells by rank 0's mark whether byte 0 is its own rank 0's.
#define LOCK_MARKS (1ll << 40)
#define LOCK_WAIT_S 10.0  // how long a rank > 0 waits for a byte that another launch's rank lets go of
static off_t lock_mark(uint64_t tag, int rank) {
    return (off_t)(LOCK_MARKS + (long long)(tag % (1u << 24) << 24) + rank);
}
// lock_try: a write lock on the byte at `at`; 0, or errno (EAGAIN, EACCES: held by another process).
static int lock_try(int fd, off_t at) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK, fl.l_whence = SEEK_SET, fl.l_start = at, fl.l_len = 1;
    return fcntl(fd, F_SETLK, &fl) == 0 ? 0 : errno;
}
// lock_held: the pid holding the byte at `at` (0: unknown, a process on another host), -1: free, -2: cannot tell.
static int lock_held(int fd, off_t at) {
    struct flock who;
    memset(&who, 0, sizeof who);
    who.l_type = F_WRLCK, who.l_whence = SEEK_SET, who.l_start = at, who.l_len = 1;
    if (fcntl(fd, F_GETLK, &who) != 0) return -2;
    return who.l_type != F_UNLCK ? (who.l_pid > 0 ? (int)who.l_pid : 0) : -1;
}
static int lock_no_locks(int e) { return e == ENOLCK || e == EOPNOTSUPP || e == EINVAL || e == ENOSYS; }
// lock_zero: whose byte 0 is: 0 free, 1 this launch's rank 0 (its mark is held, or cannot tell), -1 another run's.
static int lock_zero(int fd, uint64_t tag) {
    if (lock_held(fd, 0) < 0) return 0;
    return lock_held(fd, lock_mark(tag, 0)) == -1 ? -1 : 1;
}

// lock_refused: the line naming the run that holds byte `at` of DIR/lock (byte 0's holder, a run's rank 0, wrote
// "HOST PID JOB" at its start; another byte's is known by its pid); gives -1.
static int lock_refused(const char* dir, const char* path, int fd, off_t at) {
    char line[512] = "", host[256] = "?", job[128] = "?";
    int pid = lock_held(fd, at), hpid = 0;
    if (at != 0 || pid == -1) {  // (byte 0 free: its line is an earlier run's)
        char who[64] = "another process";
        if (pid > 0) snprintf(who, sizeof who, "pid %d", pid);
        fprintf(stderr,
                "trainer: --out %s: another run is using it: %s is held by %s (the byte of rank %lld; that run's rank "
                "0 did not get byte 0, or the same launch was started twice); wait for it to end or stop it, or give "
                "another --out\n",
                dir, path, who, (long long)at);
        return -1;
    }
    ssize_t n = pread(fd, line, sizeof line - 1, 0);
    line[n > 0 ? n : 0] = 0;
    line[strcspn(line, "\n")] = 0;
    if (sscanf(line, "%255s %d %127s", host, &hpid, job) != 3)
        snprintf(host, sizeof host, "?"), hpid = pid > 0 ? pid : 0;
    fprintf(stderr,
            "trainer: --out %s: another run is using it: %s is held by pid %d on host %s (job %s); wait for it to end "
            "or stop it, or give another --out\n",
            dir, path, hpid, host, job);
    return -1;
}

// The watch: a rank > 0 that has its byte waits in the bootstrap for its rank 0; when another run takes byte 0
// meanwhile, its rank 0 was refused: it says so and exits at once, rather than wait out --nccl-timeout. Runs from
// run_lock until the communicator is formed (lock_watch_stop).
typedef struct {
    char dir[4096], path[4200];
    int fd, running;
    uint64_t tag;
    volatile int stop;
    pthread_t thread;
} LockWatch;
static LockWatch lock_watch;
static void* lock_watch_main(void* arg) {
    LockWatch* w = (LockWatch*)arg;
    while (!w->stop) {
        if (lock_zero(w->fd, w->tag) < 0) {
            lock_refused(w->dir, w->path, w->fd, 0);
            _exit(1);  // (the main thread is in the bootstrap's wait)
        }
        comm_sleep_s(0.25);
    }
    return NULL;
}
static void lock_watch_stop(void) {
    if (!lock_watch.running) return;
    lock_watch.stop = 1;
    pthread_join(lock_watch.thread, NULL);
    lock_watch.running = 0;
}

// run_lock: this rank's byte of DIR/lock (see above), and rank 0 removes what an export that crashed left. Gives the
// open descriptor (kept open: closing any descriptor of the file would drop the lock), or -1 after a message naming
// the holder. Two launches into one --out at once: the one whose rank 0 gets byte 0 runs; the other's ranks stop
// at once (their rank 0 is refused; the others see byte 0 taken by another run, before or during the bootstrap,
// and let go of their bytes, which the first launch's ranks wait for, up to LOCK_WAIT_S).
static int remove_staging(const char* dir);
static int run_lock(const char* dir, const Comm* c) {
    char path[4200], line[512] = "", err[FILES_ERR_LEN];
    snprintf(path, sizeof path, "%s/lock", dir);
    int fd = open_in_place(path, O_RDWR | O_CREAT, err);  // (files.h: a symbolic link is refused, never truncated)
    if (fd < 0) {
        fprintf(stderr, "trainer: --out %s: %s: %s\n", dir, path, err);
        return -1;
    }
    int rank = c->rank, e;
    uint64_t tag = comm_launch_tag(c, dir);
    int marks = (e = lock_try(fd, lock_mark(tag, rank))) == 0;           // (an error: no marks, as before them)
    off_t refused = !marks && (e == EAGAIN || e == EACCES) ? rank : -1;  // held: the same launch started twice
    for (double until = comm_now_s() + LOCK_WAIT_S; refused < 0;) {
        if (marks && rank > 0 && lock_zero(fd, tag) < 0) {  // another run's rank 0 has byte 0
            refused = 0;
            break;
        }
        if ((e = lock_try(fd, rank)) == 0) break;
        if (lock_no_locks(e)) {
            if (rank == 0)
                printf("note: cannot lock %s (%s): a second run into this --out would not be stopped\n", path,
                       strerror(e));
            return fd;
        }
        // byte 0 is free or this launch's: this rank's byte is held by another launch's rank, which lets go of it
        if (rank == 0 || !marks || comm_now_s() > until)
            refused = rank;
        else
            comm_sleep_s(0.05);
    }
    if (refused >= 0) {
        lock_refused(dir, path, fd, refused);
        close(fd);
        return -1;
    }
    if (marks && rank > 0 && c->world > 1) {
        snprintf(lock_watch.dir, sizeof lock_watch.dir, "%s", dir);
        snprintf(lock_watch.path, sizeof lock_watch.path, "%s", path);
        lock_watch.fd = fd, lock_watch.tag = tag;
        lock_watch.running = pthread_create(&lock_watch.thread, NULL, lock_watch_main, &lock_watch) == 0;
    }
    if (rank == 0) {
        char host[256] = "?", job[128] = "-";
        gethostname(host, sizeof host - 1);
        host[strcspn(host, " \n")] = 0;
        const char *id = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
        if (id && *id) snprintf(job, sizeof job, "%.60s%s%.60s", id, step && *step ? "." : "", step ? step : "");
        int k = snprintf(line, sizeof line, "%s %d %s\n", host, (int)getpid(), job);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)k, 0) != k)
            printf("note: cannot write the holder into %s: %s\n", path, strerror(errno));
        // the export's staging directory that a crash left, removed now: one that cannot be fails before step 1
        snprintf(path, sizeof path, "%s/%s", dir, EXPORT_STAGING);
        if ((e = remove_staging(path)) != 0) {
            fprintf(stderr, "trainer: --out %s: cannot remove %s, left by an earlier export: %s (remove it)\n", dir,
                    path, strerror(e));
            close(fd);
            return -1;
        }
    }
    return fd;
}

// run_dir_check: every file the run writes is a regular file or absent, and (without --resume or --overwrite)
// no other run's results are there. Every rank checks (they see the same directory). 1, or 0 after a message.
static int run_dir_check(const char* dir, const Options* o) {
    char path[4200], found[1024] = "";
    struct stat st;
    for (int i = 0; i < RUN_NUM_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, run_files[i]);
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            fprintf(stderr,
                    "trainer: --out %s: %s is %s, not a file: the run could not write it (remove or rename it)\n", dir,
                    path, S_ISDIR(st.st_mode) ? "a directory" : "a special file");
            return 0;
        }
    }
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, run_results[i]);
        if (stat(path, &st) == 0)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", *found ? ", " : "", run_results[i]);
    }
    int numbered = 0;
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
        int s, len;
        numbered += sscanf(e->d_name, "checkpoint-%d.bin%n", &s, &len) == 1 && e->d_name[len] == 0;
    }
    if (d) closedir(d);
    if (numbered && strlen(found) < 900)
        snprintf(found + strlen(found), sizeof found - strlen(found), "%s%d checkpoint-STEP.bin", *found ? ", " : "",
                 numbered);
    if (*found && !o->resume && !o->overwrite) {
        fprintf(stderr,
                "trainer: --out %s holds another run (%s): --resume continues it, --overwrite replaces it (deleting "
                "those files), or give another --out\n",
                dir, found);
        return 0;
    }
    return 1;
}

// remove_staging: the export's staging directory dir, whole (a crash may leave anything there: subdirectories too),
// without following a symbolic link. 0, or the errno of what could not be removed.
static int staging_remove(const char* p, const struct stat* st, int kind, struct FTW* f) {
    return remove(p) != 0 && errno != ENOENT ? -1 : 0;
}
static int remove_staging(const char* dir) {
    return nftw(dir, staging_remove, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT ? errno : 0;
}

// run_dir_keep_metrics: a new run (no --resume, no --overwrite) in a directory whose metrics.jsonl holds records
// of a run that left no checkpoint keeps them as metrics.jsonl.prev (replacing an older one), and says so.
static void run_dir_keep_metrics(const char* dir) {
    char path[4200], prev[4300];
    struct stat st;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(prev, sizeof prev, "%s.prev", path);
    if (stat(path, &st) != 0 || st.st_size == 0) return;
    if (rename(path, prev) == 0)
        printf("note: %s held %lld bytes of records of an earlier run without a checkpoint: kept as %s\n", path,
               (long long)st.st_size, prev);
    else
        printf("note: cannot keep %s as %s (%s): a new log starts there\n", path, prev, strerror(errno));
}

// run_dir_clear: --overwrite: the earlier run's files deleted (rank 0, once the new run is ready to write).
static void run_dir_clear(const char* dir) {
    char path[4300];
    int n = 0;
    for (int i = 0; i < RUN_NUM_FILES; i++) {
        if (!strcmp(run_files[i], "lock")) continue;  // ours now
        snprintf(path, sizeof path, "%s/%s", dir, run_files[i]);
        n += unlink(path) == 0;
    }
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
        int s, len;
        if (sscanf(e->d_name, "checkpoint-%d.bin%n", &s, &len) == 1 && e->d_name[len] == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            n += unlink(path) == 0;
        }
    }
    if (d) closedir(d);
    snprintf(path, sizeof path, "%s/%s", dir, EXPORT_STAGING);
    remove_staging(path);
    fsync_dir(dir);
    if (n) printf("--overwrite: removed %d file(s) of the earlier run in %s\n", n, dir);
}

// run_schedule: writes DIR/run.json (atomically) with this run's schedule; on --resume first compares it with
// the one there and says in one line what this resume changes (the learning rate follows the new schedule).
// Rank 0.
static void json_str(FILE* f, const char* key, const char* v);
static void run_schedule(const char* dir, const Options* o, int world, int B, int vocab, int from_step) {
    char path[4200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    long long gb = (long long)world * o->grad_accum * B;
    if (o->resume) {
        size_t n = 0;
        char* old = bert_read_file(path, "a run.json", FILE_MAX_JSON, &n);
        const char* keys[] = {"steps", "warmup", "lr", "global_batch"};
        double now[] = {(double)o->steps, (double)o->warmup, (double)o->lr, (double)gb};
        const char* names[] = {"--steps", "--warmup", "--lr", "the global batch (sequences)"};
        char what[512] = "";
        for (int i = 0; old && i < 4; i++) {
            char key[64];
            snprintf(key, sizeof key, "\"%s\": ", keys[i]);
            const char* at = strstr(old, key);
            double was = at ? atof(at + strlen(key)) : now[i];
            if (fabs(was - now[i]) > 1e-6 * fabs(now[i]) && strlen(what) < 400)
                snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s %g -> %g", *what ? ", " : "", names[i],
                         was, now[i]);
        }
        if (*what) printf("note: this resume changes the schedule from step %d on: %s\n", from_step + 1, what);
        free(old);
    }
    // (and what the run trains, for tools/plot.py's title: the preset or --init-from, the shards, the vocabulary)
    char* buf = NULL;
    size_t k = 0;
    FILE* f = open_memstream(&buf, &k);
    if (!f) return;
    fprintf(f,
            "{\"steps\": %d, \"warmup\": %d, \"lr\": %.9g, \"global_batch\": %lld, \"world\": %d, "
            "\"grad_accum\": %d, \"batch\": %d, \"seq\": %d, \"vocab_size\": %d",
            o->steps, o->warmup, o->lr, gb, world, o->grad_accum, B, o->T, vocab);
    json_str(f, "preset", o->init_from ? o->init_from : o->preset);
    json_str(f, "data", o->data);
    fprintf(f, "}\n");
    fclose(f);
    if (!bert_write_file(path, buf, k, NULL, 0)) printf("note: %s not written (see above)\n", path);
    free(buf);
}
