// progress.h: what a run reports as it goes: the log line of each step and validation, and DIR/metrics.jsonl
// (one JSON record a line, appended whole). Part of trainer.cu (one translation unit).

// ----------------------------------------------------------------------------
// Progress and DIR/metrics.jsonl. Rank 0 appends one JSON object per line, flushed after each line;
// a number that is not finite is written as null. Records:
//   {"kind":"train","step":S,"tokens":N,"epoch":E,"elapsed_s":X,"loss":X,"lr":X,"grad_norm":X,
//    "tokens_per_s":X,"mfu":X|null,"data_wait_ms":X}                            every logged step
//   {"kind":"val","step":S,"tokens":N,"elapsed_s":X,"val_loss":X,"val_accuracy":X,"val_masked":M,
//    "val_sequences":K,"val_split":Z}
//   {"kind":"eval","step":S,"source":"PATH","val_loss":X,"val_accuracy":X,"val_masked":M,"val_sequences":K,
//    "val_split":Z}                                                                 --eval --out
// val_sequences: the validation sequences evaluated; val_split: those in the split (equal: all of them, once).
// tokens: real tokens trained on by all ranks so far (the checkpoint keeps the count); epoch: tokens /
// the tokens in the training shards; elapsed_s: wall clock since the run started, continued across
// resumes; mfu: a fraction, null when the device's peak is unknown (the CPU).
// DIR/metrics.jsonl, appended one whole record at a time (metrics_append).
typedef struct {
    int fd;             // opened for appending; -1: none (not rank 0)
    int broken;         // a failed write could not be cut off: nothing more is appended
    int failing_since;  // the step of the first record lost since the last one written; 0: none
    long long lost;     // records lost to write errors in this process
    int fail_hook[2];   // test hook MLM_TEST_METRICS_FAIL=FIRST[:COUNT]: those steps' writes fail halfway (ENOSPC)
    char path[4200];
} MetricsFile;

typedef struct {
    MetricsFile* f;             // DIR/metrics.jsonl (rank 0), or NULL
    double t_start, t_loop;     // this process's start, and its training loop's
    double elapsed0;            // elapsed_s of the runs this one resumes
    int first_step, last_step;  // this process's first step and last one
    long long tokens;           // real tokens trained on by all ranks
    double epoch_tokens;        // real tokens in the training shards: one epoch
} RunLog;

static void json_num(FILE* f, const char* key, double x) {
    if (isfinite(x))
        fprintf(f, ",\"%s\":%.9g", key, x);
    else
        fprintf(f, ",\"%s\":null", key);
}
static void json_str(FILE* f, const char* key, const char* v) {  // a JSON string, escaped
    fprintf(f, ",\"%s\":\"", key);
    for (const unsigned char* c = (const unsigned char*)v; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}
static void json_end(FILE* f) {
    fputs("}\n", f);
    fflush(f);
}

// metrics_cut_partial: a last line without its newline (a writer killed in the middle of a record) is cut off,
// so that the next record does not continue it: the file holds whole lines only.
static void metrics_cut_partial(const MetricsFile* mf) {
    struct stat st;
    char buf[4096];
    if (fstat(mf->fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return;
    off_t at = st.st_size, keep = 0;  // keep: the length up to and with the last newline
    while (at > 0 && keep == 0) {
        size_t n = at < (off_t)sizeof buf ? (size_t)at : sizeof buf;
        at -= (off_t)n;
        if (pread(mf->fd, buf, n, at) != (ssize_t)n) return;
        for (size_t i = n; i-- > 0 && keep == 0;)
            if (buf[i] == '\n') keep = at + (off_t)i + 1;
    }
    if (keep == st.st_size) return;
    if (ftruncate(mf->fd, keep) == 0)
        printf("note: %s ended in a partial record (%lld bytes: its writer stopped in the middle): cut off\n", mf->path,
               (long long)(st.st_size - keep));
}

// metrics_open: opens DIR/metrics.jsonl for appending. With rewrite, first rewrites the file (a temporary
// file, flushed, renamed) without the records of steps after keep_step and without a partial last line:
// a resumed run (keep_step = its checkpoint's step) never repeats a step, and a new run (-1) starts a new
// log. elapsed0 gets the last kept training record's elapsed_s. Gives 1, or 0 with a message, on failure.
static int metrics_open(MetricsFile* mf, const char* dir, int rewrite, int keep_step, double* elapsed0) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    *elapsed0 = 0;
    char err[FILES_ERR_LEN];
    long long size = 0;  // (files.h: not a FIFO, which would block; a directory there is refused by run_dir_check)
    int ofd = rewrite ? open_regular(path, "a metrics.jsonl", FILE_MAX_METRICS, &size, err) : -1;
    if (rewrite && ofd < 0 && errno != ENOENT) {
        fprintf(stderr, "trainer: %s: %s\n", path, err);
        return 0;
    }
    FILE* old = ofd >= 0 ? fdopen(ofd, "r") : NULL;
    if (ofd >= 0 && !old) close(ofd);
    if (old) {
        int tfd = create_fresh(tmp);
        FILE* out = tfd >= 0 ? fdopen(tfd, "w") : NULL;
        if (tfd >= 0 && !out) close(tfd);
        int ok = out != NULL;
        char* line = NULL;
        size_t cap = 0;
        ssize_t len;
        while (ok && (len = getline(&line, &cap, old)) > 0) {
            const char *st = strstr(line, "\"step\":"), *el = strstr(line, "\"elapsed_s\":");
            if (line[len - 1] != '\n' || !st || atoll(st + 7) > keep_step) continue;
            if (el && strstr(line, "\"kind\":\"train\"")) *elapsed0 = atof(el + 12);
            ok = fwrite(line, 1, (size_t)len, out) == (size_t)len;
        }
        free(line);
        fclose(old);
        ok = ok && fflush(out) == 0 && fsync(fileno(out)) == 0;
        if (out && fclose(out) != 0) ok = 0;
        if (!ok || rename(tmp, path) != 0) {
            fprintf(stderr, "trainer: cannot rewrite %s (through %s): %s\n", path, tmp, strerror(errno));
            unlink(tmp);
            return 0;
        }
    }
    memset(mf, 0, sizeof *mf);
    snprintf(mf->path, sizeof mf->path, "%s", path);
    test_hook_env("MLM_TEST_METRICS_FAIL", mf->fail_hook);
    mf->fd = open_in_place(path, O_RDWR | O_APPEND | O_CREAT, err);  // (files.h: a symbolic link is refused)
    if (mf->fd < 0) fprintf(stderr, "trainer: cannot append to %s: %s\n", path, err);
    if (mf->fd >= 0) metrics_cut_partial(mf);
    return mf->fd >= 0;
}

// metrics_record: a memory stream to build one record in (NULL when out of memory); metrics_append writes it.
static FILE* metrics_record(char** buf, size_t* len) {
    *buf = NULL, *len = 0;
    return open_memstream(buf, len);
}

// metrics_append: the record built in rec appended with one write. A failed write (a full disk, a file size
// limit) is cut off again (the file back to its length before), so the file never holds a torn line in the
// middle; the first failure is reported in one line, the run goes on, later records are tried again, and when
// one can be written again the log says which steps are missing. Gives 1 when the record was written.
static int metrics_append(MetricsFile* mf, FILE* rec, char** buf, size_t* len, int step) {
    int ok = rec != NULL && fclose(rec) == 0, why = ENOMEM;
    if (mf->broken) {
        free(*buf);
        return 0;
    }
    off_t end = lseek(mf->fd, 0, SEEK_END);
    if (ok && test_hook_on(mf->fail_hook, step)) {  // the test hook: half the record, then a full disk
        ssize_t half = write(mf->fd, *buf, *len / 2);
        (void)half;
        ok = 0, why = ENOSPC;
    } else if (ok && !write_all(mf->fd, *buf, *len)) {
        ok = 0, why = errno;
    }
    free(*buf);
    *buf = NULL;
    if (ok) {
        if (mf->failing_since)
            fprintf(stderr,
                    "trainer: step %d: %s is written again; the records of steps %d to %d are missing from it\n", step,
                    mf->path, mf->failing_since, step - 1);
        mf->failing_since = 0;
        return 1;
    }
    mf->lost++;
    if (end < 0 || ftruncate(mf->fd, end) != 0) {
        mf->broken = 1;
        fprintf(stderr,
                "trainer: step %d: cannot append to %s (%s), nor cut the partial record off (%s): no more records are "
                "written there; the run goes on\n",
                step, mf->path, strerror(why), strerror(errno));
        return 0;
    }
    if (!mf->failing_since)
        fprintf(stderr,
                "trainer: step %d: cannot append to %s: %s; the record is left out whole and the run goes on "
                "(the next records are tried again)\n",
                step, mf->path, strerror(why));
    if (!mf->failing_since) mf->failing_since = step;
    return 0;
}

// fmt_duration: "42s", "12m05s", "3h07m"
static const char* fmt_duration(char* buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e8)
        snprintf(buf, n, "?");
    else if (s < 60)
        snprintf(buf, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
    return buf;
}

// log_step: the step's line (every --log-every steps, the first and the last) and its metrics.jsonl record,
// a note when masked positions were left out, and the warning for a skipped step (bad_steps: skipped ones in
// a row). Rank 0. The ETA is to this run's last step, at this run's mean time per step so far.
static void log_step(const Options* o, const StepResult* r, int step, int bad_steps, double dt, int world,
                     double flops_token, double peak_tflops, BatchMaker* bm, const RunLog* lg) {
    if (r->skipped)
        fprintf(stderr, "trainer: step %d: loss %g, gradient norm %g: not finite; update skipped (%d in a row)\n", step,
                r->loss, r->norm, bad_steps);
    if (step % o->log_every == 0 || step == 1 || step == o->steps) {
        double tps = r->all_tokens / dt, now = now_s(), elapsed = lg->elapsed0 + now - lg->t_start;
        double eta = (now - lg->t_loop) / (step - lg->first_step + 1) * (lg->last_step - step);
        double epoch = lg->epoch_tokens > 0 ? lg->tokens / lg->epoch_tokens : 0;
        char mfu[64] = "", comm[48] = "", el[32], et[32];  // (MFU where the device's peak is known; the bytes
        if (peak_tflops > 0) {                             // sent where there is another process)
            mfu[0] = ' ', mfu[1] = '|', mfu[2] = ' ';
            mfu_text(mfu + 3, sizeof mfu - 3, tps / world * flops_token, peak_tflops);
        }
        if (world > 1) snprintf(comm, sizeof comm, " | comm_bytes %llu", (unsigned long long)r->comm_bytes);
        printf(
            "step %6d/%d | loss %.4f | lr %.3e | norm %.3f | %.0f ms | %.0f tok/s%s | data wait %.1f ms%s | "
            "epoch %.3f | elapsed %s | ETA %s\n",
            step, o->steps, r->loss, lr_at(o, step), r->norm, dt * 1e3, tps, mfu, r->wait_ms, comm, epoch,
            fmt_duration(el, sizeof el, elapsed), fmt_duration(et, sizeof et, eta));
        fflush(stdout);
        char* buf;
        size_t len;
        FILE* f = lg->f ? metrics_record(&buf, &len) : NULL;
        if (f) {
            fprintf(f, "{\"kind\":\"train\",\"step\":%d,\"tokens\":%lld", step, lg->tokens);
            json_num(f, "epoch", epoch);
            json_num(f, "elapsed_s", elapsed);
            json_num(f, "loss", r->loss);
            json_num(f, "lr", lr_at(o, step));
            json_num(f, "grad_norm", r->norm);
            json_num(f, "tokens_per_s", tps);
            json_num(f, "mfu", peak_tflops > 0 ? tps / world * flops_token / (peak_tflops * 1e12) : NAN);
            json_num(f, "data_wait_ms", r->wait_ms);
            fprintf(f, ",\"comm_bytes\":%llu", (unsigned long long)r->comm_bytes);
            json_end(f);
        }
        if (lg->f) metrics_append(lg->f, f, &buf, &len, step);
    }
    if (bm->dropped) {
        printf("note: %lld masked positions above the cap M=%d were left out of the loss\n", bm->dropped, bm->M);
        bm->dropped = 0;
    }
}
// log_validation: the validation line and its metrics.jsonl record. Rank 0.
static void log_validation(const RunLog* lg, int step, const EvalResult* e) {
    char cov[160];
    printf("step %6d | val loss %.4f | accuracy %.4f | %lld masked tokens in %lld sequences (%s)\n", step, e->loss,
           e->accuracy, e->masked, e->samples, validation_coverage(e, cov, sizeof cov));
    fflush(stdout);
    if (!lg->f) return;
    char* buf;
    size_t len;
    FILE* f = metrics_record(&buf, &len);
    if (f) {
        fprintf(f, "{\"kind\":\"val\",\"step\":%d,\"tokens\":%lld", step, lg->tokens);
        json_num(f, "elapsed_s", lg->elapsed0 + now_s() - lg->t_start);
        json_num(f, "val_loss", e->loss);
        json_num(f, "val_accuracy", e->accuracy);
        fprintf(f, ",\"val_masked\":%lld,\"val_sequences\":%lld,\"val_split\":%lld", e->masked, e->samples, e->split);
        json_end(f);
    }
    metrics_append(lg->f, f, &buf, &len, step);
}
