// run_dir.h: the run directory (--out): made and checked at the start, one run at a time (DIR/lock), the earlier
// run's files kept or cleared, the schedule recorded (run.json). Part of trainer.cu (one translation unit).

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
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
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
//   could join the first launch's communicator (its ranks see the same launch tag). fcntl locks end with
//   their process, so a lock left by a dead run blocks nothing. (The one file written in place: replacing
//   it would lose the lock.) --eval, --bench and --plan-only take no lock: they do not write a run's files
//   (--eval --out appends one whole record to metrics.jsonl).
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

// run_lock: this rank's byte of DIR/lock (see above). Gives the open descriptor (kept open: closing any
// descriptor of the file would drop the lock), or -1 after a message naming the holder.
static int run_lock(const char* dir, int rank) {
    char path[4200], line[512] = "";
    snprintf(path, sizeof path, "%s/lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "trainer: --out %s: cannot open %s: %s\n", dir, path, strerror(errno));
        return -1;
    }
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK, fl.l_whence = SEEK_SET, fl.l_start = rank, fl.l_len = 1;
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        if (errno == ENOLCK || errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS) {  // no locks there
            if (rank == 0)
                printf("note: cannot lock %s (%s): a second run into this --out would not be stopped\n", path,
                       strerror(errno));
            return fd;
        }
        struct flock who = fl;
        int pid = fcntl(fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK ? (int)who.l_pid : 0;
        ssize_t n = pread(fd, line, sizeof line - 1, 0);
        line[n > 0 ? n : 0] = 0;
        line[strcspn(line, "\n")] = 0;
        char host[256] = "?", job[128] = "?";
        int hpid = 0;
        if (sscanf(line, "%255s %d %127s", host, &hpid, job) != 3) snprintf(host, sizeof host, "?"), hpid = pid;
        fprintf(stderr,
                "trainer: --out %s: another run is using it: %s is held by pid %d on host %s (job %s); wait for it "
                "to end or stop it, or give another --out\n",
                dir, path, hpid, host, job);
        close(fd);
        return -1;
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

// remove_staging: the files in dir, then dir itself (the export's staging directory holds files only).
static void remove_staging(const char* dir) {
    DIR* d = opendir(dir);
    struct dirent* e;
    char p[4608];
    while (d && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
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
        char* old = bert_read_file(path, &n);
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
