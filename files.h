// files.h: the one way the trainer opens a file. Every file it reads (shards, checkpoints, model.safetensors,
// config.json, tokenizer.json, run.json, metrics.jsonl, the NCCL id file, the staging marker) goes through
// open_regular or read_whole_file: a regular file only (a FIFO, a device or a directory is refused, and a FIFO
// never blocks: O_NONBLOCK), of at most a size given per use (the message names it). What it writes goes through
// create_fresh (a temporary file, created new: a symbolic link left in its place is never written through) or,
// for the two files written in place (DIR/lock, DIR/metrics.jsonl), open_in_place (a symbolic link is refused).
// Included by hf.h, data.h and comm.h, so by everything that reads a file.
#pragma once
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILES_ERR_LEN 512  // every message of this file fits in this

// The bounds, per use. A checkpoint: 2e10 parameters (model.h's limit) x 14 bytes, and the 1-bit Adam errors of up to
// 50 ranks.
#define FILE_MAX_JSON (1ll << 20)         // config.json, run.json: a few hundred bytes written
#define FILE_MAX_TOKENIZER (256ll << 20)  // a tokenizer.json (a large multilingual one is about 35 MB)
#define FILE_MAX_SHARD (1ll << 40)        // a shard
#define FILE_MAX_CHECKPOINT (1ll << 42)   // a checkpoint
#define FILE_MAX_METRICS (1ll << 40)      // metrics.jsonl: 2^30 steps of records of about 300 bytes
#define FILE_MAX_SMALL 4096               // a marker, an id file

// file_size_str: n bytes as the bound is said ("256 MiB").
static inline const char* file_size_str(long long n, char* buf, size_t cap) {
    const char* unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && n >= 1024 && n % 1024 == 0) n /= 1024, u++;
    snprintf(buf, cap, "%lld %s", n, unit[u]);
    return buf;
}

// file_kind: what a file that is not a regular one is, for messages.
static inline const char* file_kind(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "a special file";
}

// open_regular: path opened for reading (O_NONBLOCK: a FIFO named like the file must not block; O_CLOEXEC), if it is
// a regular file of at most max_bytes; `what` names what it should be ("a checkpoint"). Gives the descriptor and its
// size in *size, or -1 with what is wrong in err (FILES_ERR_LEN; without the path: the caller names it) and errno set
// (EISDIR, EINVAL: another kind of file, EFBIG: larger).
static inline int open_regular(const char* path, const char* what, long long max_bytes, long long* size, char* err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), e = errno;  // e: errno to leave
    if (fd < 0) {
        snprintf(err, FILES_ERR_LEN, "cannot open: %s (expected %s)", strerror(e), what);
        errno = e;
        return -1;
    }
    struct stat st;
    char b[32];
    if (fstat(fd, &st) != 0) {
        e = errno;
        snprintf(err, FILES_ERR_LEN, "cannot stat: %s", strerror(e));
    } else if (!S_ISREG(st.st_mode)) {
        e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        snprintf(err, FILES_ERR_LEN, "not a regular file but %s (expected %s)", file_kind(st.st_mode), what);
    } else if (st.st_size > max_bytes) {
        e = EFBIG;
        snprintf(err, FILES_ERR_LEN, "%lld bytes, more than the %s (%lld bytes) %s may have", (long long)st.st_size,
                 file_size_str(max_bytes, b, sizeof b), max_bytes, what);
    } else {
        *size = (long long)st.st_size;
        return fd;
    }
    close(fd);
    errno = e;
    return -1;
}

// read_fd: n bytes of fd from offset at into buf. 1, or 0 with errno set (0: shorter than n, the file changed).
static inline int read_fd(int fd, void* buf, size_t n, long long at) {
    char* c = (char*)buf;
    while (n) {
        ssize_t r = pread(fd, c, n, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return 0;
        }
        c += r, n -= (size_t)r, at += r;
    }
    return 1;
}

// read_whole_file: the whole of a regular file of at most max_bytes (open_regular), malloc'd with a 0 after it (not
// counted in *size); NULL with what is wrong in err.
static inline char* read_whole_file(const char* path, const char* what, long long max_bytes, size_t* size, char* err) {
    long long n = 0;
    int fd = open_regular(path, what, max_bytes, &n, err);
    if (fd < 0) return NULL;
    char* buf = (char*)malloc((size_t)n + 1);
    if (!buf)
        snprintf(err, FILES_ERR_LEN, "out of host memory for its %lld bytes", n);
    else if (!read_fd(fd, buf, (size_t)n, 0)) {
        snprintf(err, FILES_ERR_LEN, "cannot read its %lld bytes: %s", n,
                 errno ? strerror(errno) : "shorter than its size (changed while read?)");
        free(buf);
        buf = NULL;
    }
    close(fd);
    if (!buf) return NULL;
    buf[n] = 0;
    *size = (size_t)n;
    return buf;
}

// create_fresh: a temporary file the caller fills and renames into place, created new (O_EXCL, O_NOFOLLOW) after
// removing one a crash left, so that a symbolic link or a hard link left in its place is never written through.
// Gives the descriptor (write only), or -1 with errno set.
static inline int create_fresh(const char* path) {
    if (unlink(path) != 0 && errno != ENOENT && errno != EISDIR) return -1;  // (a directory: EEXIST below)
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

// open_in_place: a file written in place (flags: O_RDWR, O_APPEND, O_CREAT ...), refused when it is a symbolic link
// (writing through it would change the file it points to) or not a regular file. The descriptor, or -1 with what is
// wrong in err (without the path).
static inline int open_in_place(const char* path, int flags, char* err) {
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    struct stat st;
    memset(&st, 0, sizeof st);
    if (fd < 0 && errno == ELOOP)
        snprintf(err, FILES_ERR_LEN,
                 "is a symbolic link: refused (the run writes this file in place, so it would write into what the "
                 "link points to; remove the link)");
    else if (fd < 0)
        snprintf(err, FILES_ERR_LEN, "cannot open: %s", strerror(errno));
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        snprintf(err, FILES_ERR_LEN, "not a regular file but %s (the run writes a file there; remove it)",
                 file_kind(st.st_mode));
    else
        return fd;
    if (fd >= 0) close(fd);
    return -1;
}
