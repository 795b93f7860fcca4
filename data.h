// data.h: token shards on disk, and the loader that turns them into packed, masked micro-batches
// on the GPU. Included once by trainer.cu (and by the tests); everything is static.
//
// The pipeline, top to bottom:
//   1. tools/prepare.py tokenizes a corpus once, offline, into shards (format below and in README.md).
//   2. dataloader_init() mmaps every shard and validates it (header, offsets, checksum, token ids)
//      before training starts: bad input is one clear error naming the file.
//   3. Each epoch has a plan: a deterministic shuffle of all samples (seed, epoch), packed into
//      rows of T tokens. The plan is the same on every rank; rank r of W takes rows
//      [r*B, (r+1)*B) of every global micro-batch of W*B rows.
//   4. N loader threads fill a ring of K pinned host slots, one whole micro-batch per slot,
//      doing the MLM masking as they copy the tokens.
//   5. dataloader_next() takes the slots in order, copies each to the device on its own copy
//      stream, and makes the compute stream wait for that copy with an event.
//
// Only libc, pthreads and the CUDA runtime API. Little-endian hosts only (x86-64, ARM64).
#pragma once
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "files.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "data.h reads little-endian shards in place: a big-endian host would need byte swaps"
#endif

#define DATA_ERR_LEN 512  // every error message fits in this

static inline int data_err(char* err, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int data_err(char* err, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, DATA_ERR_LEN, fmt, ap);
    va_end(ap);
    return -1;
}

static inline double data_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// ----------------------------------------------------------------------------
// CRC-32 (the zlib/PNG polynomial, so Python's zlib.crc32 gives the same value), slicing-by-8:
// eight table lookups per 8 bytes, about 1.5 GB/s per core, fast enough to verify every shard
// at startup and while staging.
static uint32_t crc32_table[8][256];
static pthread_once_t crc32_once = PTHREAD_ONCE_INIT;
static inline void crc32_make_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
        crc32_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc32_table[t][i] = (crc32_table[t - 1][i] >> 8) ^ crc32_table[0][crc32_table[t - 1][i] & 0xFF];
}
// crc32_update(crc, p, n): continue a CRC over n more bytes; start with crc = 0 (as zlib.crc32).
static inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    pthread_once(&crc32_once, crc32_make_tables);
    const uint8_t* p = (const uint8_t*)data;
    crc = ~crc;
    for (; n && ((uintptr_t)p & 7); n--) crc = (crc >> 8) ^ crc32_table[0][(crc ^ *p++) & 0xFF];
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = crc32_table[7][lo & 0xFF] ^ crc32_table[6][(lo >> 8) & 0xFF] ^ crc32_table[5][(lo >> 16) & 0xFF] ^
              crc32_table[4][lo >> 24] ^ crc32_table[3][hi & 0xFF] ^ crc32_table[2][(hi >> 8) & 0xFF] ^
              crc32_table[1][(hi >> 16) & 0xFF] ^ crc32_table[0][hi >> 24];
    }
    while (n--) crc = (crc >> 8) ^ crc32_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

// ----------------------------------------------------------------------------
// The shard format (version 1; README.md has the full description). One file:
//
//   [header: 128 bytes][tokens: num_tokens x token_bytes][zeros up to a multiple of 8][offsets: (num_samples+1) x u64]
//
// Header fields (little-endian):
//   0  char[8] magic "MLMSHARD"       44 i32 pad_id
//   8  u32 version (1)                48 i32 cls_id
//  12  u32 header_bytes (128)         52 i32 sep_id
//  16  u32 vocab_size                 56 i32 mask_id
//  20  u32 token_bytes (2 or 4)       60 i32 unk_id (-1: the vocabulary has none)
//  24  u64 num_samples                64 u32 data_crc: CRC-32 of every byte after the header
//  32  u64 num_tokens                 68 u32 header_crc: CRC-32 of the 128 header bytes, this field zeroed
//  40  u32 max_len (longest sample)   72..127 zero
//
// Sample i is tokens[offsets[i] .. offsets[i+1]): O(1) random access. Samples are stored exactly as
// the model sees them ([CLS] ... [SEP] for text), each at most max_len tokens; no padding or
// attention masks are stored: packing and masking happen in the loader.
#define SHARD_MAGIC "MLMSHARD"
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 128
#define SHARD_NUM_SPECIAL 5  // pad, cls, sep, mask, unk

typedef struct {
    uint32_t vocab_size, token_bytes, max_len;
    int32_t pad_id, cls_id, sep_id, mask_id, unk_id;
    uint64_t num_samples, num_tokens;
    uint32_t data_crc;
} ShardHeader;

static inline uint64_t shard_offsets_pos(uint64_t num_tokens, uint32_t token_bytes) {
    return (SHARD_HEADER_BYTES + num_tokens * token_bytes + 7) & ~(uint64_t)7;
}

// The 128 header bytes for h (header_crc filled in).
static inline void shard_header_encode(const ShardHeader* h, uint8_t out[SHARD_HEADER_BYTES]) {
    memset(out, 0, SHARD_HEADER_BYTES);
    uint32_t version = SHARD_VERSION, header_bytes = SHARD_HEADER_BYTES;
    memcpy(out, SHARD_MAGIC, 8);
    memcpy(out + 8, &version, 4);
    memcpy(out + 12, &header_bytes, 4);
    memcpy(out + 16, &h->vocab_size, 4);
    memcpy(out + 20, &h->token_bytes, 4);
    memcpy(out + 24, &h->num_samples, 8);
    memcpy(out + 32, &h->num_tokens, 8);
    memcpy(out + 40, &h->max_len, 4);
    memcpy(out + 44, &h->pad_id, 4);
    memcpy(out + 48, &h->cls_id, 4);
    memcpy(out + 52, &h->sep_id, 4);
    memcpy(out + 56, &h->mask_id, 4);
    memcpy(out + 60, &h->unk_id, 4);
    memcpy(out + 64, &h->data_crc, 4);
    uint32_t hcrc = crc32_update(0, out, SHARD_HEADER_BYTES);
    memcpy(out + 68, &hcrc, 4);
}

// shard_check_header: validates the 128 header bytes at buf, and that the file size agrees with
// them. Reads nothing past the header. On failure returns -1 with one message naming `name` and
// what was expected.
static inline int shard_check_header(const uint8_t* buf, size_t size, const char* name, ShardHeader* h, char* err) {
    if (memcmp(buf, SHARD_MAGIC, 8) != 0) {
        char got[9];
        for (int i = 0; i < 8; i++) got[i] = (buf[i] >= 32 && buf[i] < 127) ? (char)buf[i] : '?';
        got[8] = 0;
        return data_err(err, "data: %s: wrong magic \"%s\" (expected \"%s\": not a shard written by tools/prepare.py)",
                        name, got, SHARD_MAGIC);
    }
    uint32_t version, header_bytes, hcrc;
    memcpy(&version, buf + 8, 4);
    memcpy(&header_bytes, buf + 12, 4);
    if (version != SHARD_VERSION)
        return data_err(err, "data: %s: shard format version %u (this build reads version %d; re-run tools/prepare.py)",
                        name, version, SHARD_VERSION);
    if (header_bytes != SHARD_HEADER_BYTES)
        return data_err(err, "data: %s: header size %u (expected %d)", name, header_bytes, SHARD_HEADER_BYTES);
    uint8_t tmp[SHARD_HEADER_BYTES];
    memcpy(tmp, buf, SHARD_HEADER_BYTES);
    memcpy(&hcrc, buf + 68, 4);
    memset(tmp + 68, 0, 4);
    if (crc32_update(0, tmp, SHARD_HEADER_BYTES) != hcrc)
        return data_err(err, "data: %s: header checksum mismatch (the header is corrupt)", name);
    for (int i = 72; i < SHARD_HEADER_BYTES; i++)
        if (buf[i]) return data_err(err, "data: %s: reserved header byte %d is %d (expected 0)", name, i, buf[i]);
    memcpy(&h->vocab_size, buf + 16, 4);
    memcpy(&h->token_bytes, buf + 20, 4);
    memcpy(&h->num_samples, buf + 24, 8);
    memcpy(&h->num_tokens, buf + 32, 8);
    memcpy(&h->max_len, buf + 40, 4);
    memcpy(&h->pad_id, buf + 44, 4);
    memcpy(&h->cls_id, buf + 48, 4);
    memcpy(&h->sep_id, buf + 52, 4);
    memcpy(&h->mask_id, buf + 56, 4);
    memcpy(&h->unk_id, buf + 60, 4);
    memcpy(&h->data_crc, buf + 64, 4);
    if (h->token_bytes != 2 && h->token_bytes != 4)
        return data_err(err, "data: %s: token width %u bytes (expected 2 or 4)", name, h->token_bytes);
    if (h->vocab_size < 2 || (h->token_bytes == 2 && h->vocab_size > 65536) || h->vocab_size > (1u << 31))
        return data_err(err, "data: %s: vocab size %u does not fit (expected 2..%u for %u-byte tokens)", name,
                        h->vocab_size, h->token_bytes == 2 ? 65536u : (1u << 31), h->token_bytes);
    const int32_t ids[SHARD_NUM_SPECIAL] = {h->pad_id, h->cls_id, h->sep_id, h->mask_id, h->unk_id};
    const char* names[SHARD_NUM_SPECIAL] = {"pad_id", "cls_id", "sep_id", "mask_id", "unk_id"};
    for (int i = 0; i < SHARD_NUM_SPECIAL; i++) {
        int optional = (i == 4);  // a byte-level vocabulary has no [UNK]
        if (ids[i] >= (int64_t)h->vocab_size || ids[i] < (optional ? -1 : 0))
            return data_err(err, "data: %s: %s %d is outside the vocabulary (expected 0..%u%s)", name, names[i], ids[i],
                            h->vocab_size - 1, optional ? ", or -1 for none" : "");
        for (int j = 0; j < i; j++)
            if (ids[i] >= 0 && ids[i] == ids[j])
                return data_err(err, "data: %s: %s and %s are both %d (expected distinct special tokens)", name,
                                names[j], names[i], ids[i]);
    }
    if (h->vocab_size <= SHARD_NUM_SPECIAL)
        return data_err(err, "data: %s: vocab size %u leaves no ordinary tokens", name, h->vocab_size);
    if (h->max_len < 1 || h->max_len > (1u << 24))
        return data_err(err, "data: %s: max_len %u (expected 1..%u)", name, h->max_len, 1u << 24);
    if (h->num_samples == 0) return data_err(err, "data: %s: the shard holds no samples", name);
    // Sizes, compared before they are multiplied so that a huge count cannot overflow.
    if (h->num_tokens > size / h->token_bytes || h->num_samples > size / 8)
        return data_err(
            err, "data: %s: header claims %llu tokens and %llu samples, more than a %zu-byte file holds (truncated?)",
            name, (unsigned long long)h->num_tokens, (unsigned long long)h->num_samples, size);
    uint64_t off_pos = shard_offsets_pos(h->num_tokens, h->token_bytes);
    uint64_t want = off_pos + 8 * (h->num_samples + 1);
    if (want != size)
        return data_err(err, "data: %s: file is %zu bytes, the header implies %llu (%s)", name, size,
                        (unsigned long long)want, size < want ? "truncated" : "trailing bytes");
    return 0;
}

// shard_check_layout: validates a shard held in memory (buf, size): the header, the file size it
// implies, and the offsets table. Never reads outside [buf, buf+size); buf must be 8-byte aligned
// (mmap gives page alignment). This, and shard_check_data, are what tests/fuzz_shard.cu fuzzes.
static inline int shard_check_layout(const uint8_t* buf, size_t size, const char* name, ShardHeader* h, char* err) {
    if (size < SHARD_HEADER_BYTES)
        return data_err(err, "data: %s: truncated: %zu bytes, smaller than the %d-byte shard header", name, size,
                        SHARD_HEADER_BYTES);
    if (shard_check_header(buf, size, name, h, err)) return -1;
    const uint64_t* off = (const uint64_t*)(buf + shard_offsets_pos(h->num_tokens, h->token_bytes));
    if (off[0] != 0)
        return data_err(err, "data: %s: offsets[0] is %llu (expected 0)", name, (unsigned long long)off[0]);
    for (uint64_t i = 0; i < h->num_samples; i++) {
        // off[i] <= num_tokens holds here (induction), so off[i] + max_len cannot overflow.
        if (off[i + 1] <= off[i] || off[i + 1] > off[i] + h->max_len || off[i + 1] > h->num_tokens)
            return data_err(err,
                            "data: %s: offsets[%llu..%llu] = %llu..%llu out of range (expected increasing, samples of "
                            "1..%u tokens, within %llu tokens)",
                            name, (unsigned long long)i, (unsigned long long)i + 1, (unsigned long long)off[i],
                            (unsigned long long)off[i + 1], h->max_len, (unsigned long long)h->num_tokens);
    }
    if (off[h->num_samples] != h->num_tokens)
        return data_err(err, "data: %s: the last offset is %llu (expected num_tokens = %llu)", name,
                        (unsigned long long)off[h->num_samples], (unsigned long long)h->num_tokens);
    return 0;
}

// shard_check_data: the checksum of everything after the header, and every token id < vocab_size.
// Reads the whole file once, in 1 MiB chunks (both checks on a chunk while it is in cache).
static inline int shard_check_data(const uint8_t* buf, size_t size, const char* name, const ShardHeader* h, char* err) {
    uint32_t crc = 0, max_tok = 0;
    uint64_t tok_end = SHARD_HEADER_BYTES + h->num_tokens * h->token_bytes, bad_at = UINT64_MAX;
    const size_t CHUNK = 1 << 20;
    for (size_t pos = SHARD_HEADER_BYTES; pos < size; pos += CHUNK) {
        size_t n = size - pos < CHUNK ? size - pos : CHUNK;
        crc = crc32_update(crc, buf + pos, n);
        if (pos < tok_end && bad_at == UINT64_MAX) {
            size_t m = (tok_end - pos < n ? tok_end - pos : n) / h->token_bytes;  // chunks hold whole tokens
            uint32_t mx = 0;
            if (h->token_bytes == 2) {
                const uint16_t* t = (const uint16_t*)(buf + pos);
                for (size_t i = 0; i < m; i++) mx = t[i] > mx ? t[i] : mx;
            } else {
                const uint32_t* t = (const uint32_t*)(buf + pos);
                for (size_t i = 0; i < m; i++) mx = t[i] > mx ? t[i] : mx;
            }
            if (mx >= h->vocab_size) {  // find the first bad token, for the message
                for (size_t i = 0; i < m; i++) {
                    uint32_t t =
                        h->token_bytes == 2 ? ((const uint16_t*)(buf + pos))[i] : ((const uint32_t*)(buf + pos))[i];
                    if (t >= h->vocab_size) {
                        bad_at = (pos - SHARD_HEADER_BYTES) / h->token_bytes + i;
                        max_tok = t;
                        break;
                    }
                }
            }
        }
    }
    if (crc != h->data_crc)
        return data_err(err, "data: %s: data checksum 0x%08x, the header says 0x%08x (the file is corrupt)", name, crc,
                        h->data_crc);
    if (bad_at != UINT64_MAX)  // only reachable when the writer itself wrote a bad id (checksum matched)
        return data_err(err, "data: %s: token %llu has id %u, outside the vocabulary (expected < %u)", name,
                        (unsigned long long)bad_at, max_tok, h->vocab_size);
    return 0;
}

// shard_write: writes a shard (tests and the benchmark use this; tools/prepare.py writes the same
// bytes). tokens: (h->num_tokens) ids; offsets: (h->num_samples + 1). Fills in h->data_crc. Atomic: written
// to PATH.tmp, then renamed.
static inline int shard_write(const char* path, ShardHeader* h, const uint32_t* tokens, const uint64_t* offsets,
                              char* err) {
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return data_err(err, "data: %.200s...: path too long (at most %zu characters)", path, sizeof tmp - 5);
    int fd = create_fresh(tmp);
    FILE* f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return data_err(err, "data: %s: cannot create: %s", tmp, strerror(errno));
    }
    uint8_t header[SHARD_HEADER_BYTES] = {0};
    fwrite(header, 1, SHARD_HEADER_BYTES, f);  // placeholder until the checksum is known
    uint32_t crc = 0;
    enum { CHUNK = 1 << 14 };
    uint8_t buf[CHUNK * 4];
    for (uint64_t i = 0; i < h->num_tokens; i += CHUNK) {
        size_t n = h->num_tokens - i < (uint64_t)CHUNK ? (size_t)(h->num_tokens - i) : (size_t)CHUNK;
        for (size_t j = 0; j < n; j++) {
            if (h->token_bytes == 2) {
                uint16_t t = (uint16_t)tokens[i + j];
                memcpy(buf + 2 * j, &t, 2);
            } else {
                memcpy(buf + 4 * j, &tokens[i + j], 4);
            }
        }
        crc = crc32_update(crc, buf, n * h->token_bytes);
        fwrite(buf, 1, n * h->token_bytes, f);
    }
    size_t pad = shard_offsets_pos(h->num_tokens, h->token_bytes) - SHARD_HEADER_BYTES - h->num_tokens * h->token_bytes;
    uint8_t zeros[8] = {0};
    crc = crc32_update(crc, zeros, pad);
    fwrite(zeros, 1, pad, f);
    crc = crc32_update(crc, offsets, 8 * (h->num_samples + 1));
    fwrite(offsets, 8, h->num_samples + 1, f);
    h->data_crc = crc;
    shard_header_encode(h, header);
    fseek(f, 0, SEEK_SET);
    fwrite(header, 1, SHARD_HEADER_BYTES, f);
    if (ferror(f) | fclose(f) || rename(tmp, path) != 0) {
        data_err(err, "data: %s: write failed: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Opening shards: mmap (the data set may exceed RAM: the page cache holds what is in use).
typedef struct {
    char* path;
    uint8_t* map;
    size_t bytes;
    ShardHeader h;
    const uint8_t* tokens;    // num_tokens x token_bytes
    const uint64_t* offsets;  // num_samples + 1
    uint64_t first;           // global index of this shard's sample 0
} Shard;

// shard_open: maps a shard and validates its layout; with header_only, reads and checks just the
// header (for the ranks that wait while another one stages the data: they need only the checksums).
static inline int shard_open(const char* path, Shard* s, int header_only, char* err) {
    memset(s, 0, sizeof(*s));
    s->path = strdup(path);
    char why[FILES_ERR_LEN];
    long long size = 0;
    int fd = open_regular(path, "a shard written by tools/prepare.py", FILE_MAX_SHARD, &size, why);
    if (fd < 0) return data_err(err, "data: %s: %s", path, why);
    if (size < SHARD_HEADER_BYTES) {
        close(fd);
        return data_err(err, "data: %s: truncated: %lld bytes, smaller than the %d-byte shard header", path, size,
                        SHARD_HEADER_BYTES);
    }
    if (header_only) {
        uint8_t hdr[SHARD_HEADER_BYTES];
        int got = read_fd(fd, hdr, SHARD_HEADER_BYTES, 0);
        close(fd);
        if (!got) return data_err(err, "data: %s: cannot read the header", path);
        return shard_check_header(hdr, (size_t)size, path, &s->h, err);
    }
    void* m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);  // the mapping keeps the file
    if (m == MAP_FAILED) return data_err(err, "data: %s: mmap failed: %s", path, strerror(errno));
    s->map = (uint8_t*)m;
    s->bytes = (size_t)size;
    if (shard_check_layout(s->map, s->bytes, path, &s->h, err)) return -1;
    s->tokens = s->map + SHARD_HEADER_BYTES;
    s->offsets = (const uint64_t*)(s->map + shard_offsets_pos(s->h.num_tokens, s->h.token_bytes));
    return 0;
}

static inline void shard_close(Shard* s) {
    if (s->map) munmap(s->map, s->bytes);
    free(s->path);
    memset(s, 0, sizeof(*s));
}

// A 64-bit fingerprint of a set of shards (their order, sizes and data checksums): checkpoints
// record it so that a resume on different data is refused, and staging names its marker after it.
static inline uint64_t mix64(uint64_t z) {  // splitmix64's finalizer: a good 64-bit bijective hash
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t shards_fingerprint(const Shard* shards, int n) {
    uint64_t f = 0x6D6C6D2E63ull;  // "mlm.c"
    for (int i = 0; i < n; i++) {
        const ShardHeader* h = &shards[i].h;
        f = mix64(f ^ h->data_crc);
        f = mix64(f ^ h->num_samples);
        f = mix64(f ^ h->num_tokens);
        f = mix64(f ^ ((uint64_t)h->vocab_size << 8 | h->token_bytes));
    }
    return f;
}

// Opens every file matching `pattern` (a glob, e.g. "data/wiki/train_*.bin"), in name order.
static inline int shards_open_all(const char* pattern, Shard** out, int* n_out, int header_only, char* err) {
    *out = NULL;
    *n_out = 0;
    struct stat st;
    if (stat(pattern, &st) == 0 && S_ISDIR(st.st_mode))
        return data_err(err, "data: %s: is a directory (expected a pattern of shard files, e.g. %s/train_*.bin)",
                        pattern, pattern);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        if (rc == 0) globfree(&g);
        return data_err(err,
                        "data: %s: no shard files match (an empty split, or a wrong path? expected files written by "
                        "tools/prepare.py, e.g. DIR/train_*.bin)",
                        pattern);
    }
    if (rc != 0)
        return data_err(err, "data: %s: cannot list the shard files (glob error %d: unreadable directory?)", pattern,
                        rc);
    Shard* s = (Shard*)calloc(g.gl_pathc, sizeof(Shard));
    *out = s;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        (*n_out)++;
        if (shard_open(g.gl_pathv[i], &s[i], header_only, err)) {
            globfree(&g);
            return -1;
        }
    }
    globfree(&g);
    return 0;
}

// Full verification (checksums and token ids) of every shard, on `threads` threads; the error
// reported is that of the first bad shard in name order, whatever the thread timing.
typedef struct {
    Shard* shards;
    int n, next, bad;
    char* err;
    pthread_mutex_t lock;
} VerifyJob;
static inline void* verify_worker(void* arg) {
    VerifyJob* v = (VerifyJob*)arg;
    char err[DATA_ERR_LEN];
    for (;;) {
        pthread_mutex_lock(&v->lock);
        int i = v->next++;
        pthread_mutex_unlock(&v->lock);
        if (i >= v->n) return NULL;
        Shard* s = &v->shards[i];
        madvise(s->map, s->bytes, MADV_SEQUENTIAL);
        int rc = shard_check_data(s->map, s->bytes, s->path, &s->h, err);
        madvise(s->map, s->bytes, MADV_RANDOM);  // training reads samples in shuffled order
        if (rc) {
            pthread_mutex_lock(&v->lock);
            if (i < v->bad) {
                v->bad = i;
                memcpy(v->err, err, DATA_ERR_LEN);
            }
            pthread_mutex_unlock(&v->lock);
        }
    }
}
static inline int shards_verify(Shard* shards, int n, int threads, char* err) {
    VerifyJob v = {shards, n, 0, n, err, PTHREAD_MUTEX_INITIALIZER};
    if (threads > n) threads = n;
    pthread_t* t = (pthread_t*)malloc(sizeof(pthread_t) * threads);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, verify_worker, &v);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    free(t);
    return v.bad < n ? -1 : 0;
}

// ----------------------------------------------------------------------------
// Random numbers. Everything random is a pure function of (seed, epoch, sample), never of which
// thread or rank did the work, so any thread count and any world size give the same batches.
static inline uint64_t rng_next(uint64_t* s) {  // splitmix64: a counter through mix64
    *s += 0x9E3779B97F4A7C15ull;
    return mix64(*s);
}
static inline uint32_t rng_below(uint64_t r, uint32_t n) { return (uint32_t)(((r & 0xFFFFFFFFull) * n) >> 32); }

// perm_index: position i of a pseudo-random permutation of [0, n) keyed by `key`, in O(1) time
// and memory: a 4-round Feistel network on the smallest 2h-bit domain >= n, "cycle-walking"
// (re-applying it) until the value falls inside [0, n). The domain is < 4n, so about 2 rounds
// of walking on average. No N-sized shuffle array is ever stored.
static inline uint64_t perm_index(uint64_t i, uint64_t n, uint64_t key) {
    int h = 1;
    while (h < 32 && (1ull << (2 * h)) < n) h++;
    uint64_t mask = (1ull << h) - 1;
    do {
        uint64_t L = i >> h, R = i & mask;
        for (uint64_t r = 0; r < 4; r++) {
            uint64_t F = mix64(R ^ key ^ (r << 56)) & mask;
            uint64_t t = L ^ F;
            L = R;
            R = t;
        }
        i = (L << h) | R;
    } while (i >= n);
    return i;
}

// ----------------------------------------------------------------------------
// The batch. One micro-batch of one rank is B rows of T tokens, all int32, in one contiguous block
// (the same layout in a pinned host slot and on the device, so one copy moves it):
//
//   header[64]           counts: [0] num_segments [1] num_masked [2] num_real_tokens [3] num_samples
//   input_ids[B*T]       the model's input: the tokens with the MLM substitutions applied; pad_id in padding
//   segment_ids[B*T]     index s of the segment each position belongs to (flat over the batch)
//   position_ids[B*T]    position inside its segment: 0 at each sample's first token ([CLS])
//   cu_seqlens[B*T+1]    segment s covers flat positions [cu_seqlens[s], cu_seqlens[s+1]); segments tile
//                        the B*T grid in order, never cross a row, and cu_seqlens[num_segments] = B*T
//   mask_pos[B*T]        flat positions (b*T + t) of the masked tokens, ascending; num_masked of them
//   mask_target[B*T]     the original token id at each masked position: the MLM labels
//
// A segment is one sample, or the padding at the end of a row (at most one per row, input_ids all
// pad_id). Attention runs within a segment only, so no sample ever sees another sample or padding
// (padding sees only padding, and nothing reads its output). The head computes only the
// num_masked rows listed in mask_pos. Each array starts at a multiple of 64 int32 (256 bytes).
// Rows with no sample at all (only in the last micro-batch of an epoch, so that every sample is
// seen exactly once) are one padding segment.
#define BATCH_HEADER_INTS 64
typedef struct {
    size_t stride;  // int32 elements between arrays: B*T+1 rounded up to 64
    size_t input_ids, segment_ids, position_ids, cu_seqlens, mask_pos, mask_target;  // offsets, in int32 elements
    size_t ints;  // total int32 elements of one batch
} BatchLayout;
static inline BatchLayout batch_layout(int B, int T) {
    BatchLayout L;
    L.stride = ((size_t)B * T + 1 + 63) & ~(size_t)63;
    L.input_ids = BATCH_HEADER_INTS;
    L.segment_ids = L.input_ids + L.stride;
    L.position_ids = L.segment_ids + L.stride;
    L.cu_seqlens = L.position_ids + L.stride;
    L.mask_pos = L.cu_seqlens + L.stride;
    L.mask_target = L.mask_pos + L.stride;
    L.ints = L.mask_target + L.stride;
    return L;
}
// Bytes of one batch; the loader allocates 2 of these on the device and ring_slots in pinned host memory.
static inline size_t dataloader_batch_bytes(int B, int T) { return batch_layout(B, T).ints * sizeof(int32_t); }
static inline size_t dataloader_device_bytes(int B, int T) { return 2 * dataloader_batch_bytes(B, T); }

// What dataloader_next() hands the trainer. The device pointers stay valid for the work the
// trainer enqueues on its compute stream until it calls dataloader_next() again.
typedef struct {
    const int32_t *input_ids, *segment_ids, *position_ids, *cu_seqlens, *mask_pos,
        *mask_target;                                            // device, layout above
    const int32_t* device_base;                                  // the whole batch block on the device (header first)
    int num_segments, num_masked, num_real_tokens, num_samples;  // host copies of the counts (launch sizes)
    int64_t epoch, row;  // where this batch starts in the global row stream (the same on every rank)
    double wait_ms;      // host time dataloader_next() waited for the loader threads: the data stall
} Batch;

// ----------------------------------------------------------------------------
// The loader.
typedef struct {
    const char* pattern;  // glob of the shards of one split, e.g. "data/wiki/train_*.bin"
    int B, T;             // rows per micro-batch on this rank, tokens per row
    int rank, world;      // this process's slice of each global micro-batch of B*world rows
    int num_threads;      // loader threads filling the ring (>= 1)
    int max_threads;      // threads dataloader_set_threads may start (their buffers are made at init; 0: num_threads)
    int ring_slots;       // micro-batches buffered in pinned host memory (>= 2)
    uint64_t seed;        // shuffle and masking seed
    int shuffle;          // 1: a new shuffle each epoch (training); 0: file order (validation)
    float mask_prob;      // fraction of non-special tokens chosen for MLM (0.15)
    int vocab_size;       // the model's vocabulary size; the shards must agree (0: don't check)
    int verify;           // 1: check every shard's checksum and token ids at init (default); 0: layout only
    int verbose;          // 1: print a summary line at init
} DataLoaderConfig;

static inline DataLoaderConfig dataloader_default_config(const char* pattern, int B, int T) {
    DataLoaderConfig c;
    memset(&c, 0, sizeof(c));
    c.pattern = pattern;
    c.B = B;
    c.T = T;
    c.world = 1;
    c.num_threads = 2;
    c.ring_slots = 4;
    c.seed = 1337;
    c.shuffle = 1;
    c.mask_prob = 0.15f;
    c.verify = 1;
    return c;
}

// The checkpointed part: a plain struct the trainer writes as bytes. The position is the next
// batch's first row in the global row stream, which does not depend on the rank or world size,
// so a run may resume on a different number of GPUs (with the same global batch B*world to get
// exactly the same batches); everything random derives from seed and position.
#define DATA_STATE_VERSION 1
typedef struct {
    uint64_t version;  // DATA_STATE_VERSION
    uint64_t seed;
    uint64_t epoch, row;   // the next batch: epoch, first global row of it
    uint64_t num_samples;  // the data set the position refers to
    uint64_t fingerprint;
    uint32_t T;
    uint32_t mask_prob_ppm;  // mask_prob in parts per million
    uint32_t shuffle;
    uint32_t reserved;
} DataLoaderState;

#define DATA_OPEN_ROWS 16  // rows being packed at once (best fit among these)

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_COPYING };
typedef struct {
    int32_t* host;  // pinned, batch_layout ints
    int state;
    int64_t seq;  // which micro-batch it holds
    int64_t epoch, row, next_epoch, next_row;
    cudaEvent_t copied;  // recorded on the copy stream after this slot's host-to-device copy
} Slot;

// What a loader thread needs to fill one batch, copied out of the plan under the lock.
typedef struct {
    int64_t seq, epoch, row, next_epoch, next_row;
    int rows;          // rows with samples (< B only at the end of an epoch)
    int* row_count;    // (B) samples in each row
    uint32_t* sample;  // (B*T) global sample ids, row after row
    uint64_t* bits;    // ((T+63)/64) scratch of the masking
} Job;

// One epoch's plan: row r holds the samples order[row_start[r] .. row_start[r+1]).
typedef struct {
    int64_t epoch;  // -1: none
    uint64_t num_rows;
    uint32_t *order, *row_start;  // (N), (N+1)
    double fill;                  // real tokens / (rows * T)
} EpochPlan;

typedef struct DataLoader DataLoader;
typedef struct {
    DataLoader* dl;
    pthread_t thread;
    Job job;
    double fill_s;  // seconds this thread spent filling batches (fill_batch), and how many it filled
    int64_t fills;
} Worker;

struct DataLoader {
    DataLoaderConfig cfg;
    char* pattern;
    Shard* shards;
    int num_shards;
    uint64_t num_samples, num_tokens, fingerprint;
    ShardHeader h;                        // the fields all shards share (vocab, special ids)
    uint32_t special[SHARD_NUM_SPECIAL];  // special ids never chosen for masking (unk -1 becomes UINT32_MAX)
    BatchLayout L;

    // The current epoch's plan, and the next epoch's, which a planner thread builds in the background
    // while this one is consumed (at the paper's 202 M samples a plan takes about a minute).
    EpochPlan plan, next_plan;
    uint64_t epoch0_rows;  // rows of epoch 0's plan (dataloader_epoch0_rows)
    pthread_t planner;
    int planner_running;
    int64_t planner_epoch;                                 // the epoch the planner builds
    uint32_t* open_sample;                                 // (DATA_OPEN_ROWS * T) rows being packed: the builder's
    int open_len[DATA_OPEN_ROWS], open_n[DATA_OPEN_ROWS];  // scratch (one build at a time)

    // The ring. Producers claim micro-batches in order (prod_*) under `lock`; the consumer takes them in order.
    pthread_mutex_t lock;
    pthread_cond_t cv_ready, cv_free;
    Slot* slots;
    Worker* workers;
    int num_workers;  // workers[] made at init: max(num_threads, max_threads)
    int64_t filled;   // batches the loader threads have filled since init
    int running, stop, failed;
    int64_t prod_seq, prod_epoch, prod_row;
    int64_t cons_seq, next_epoch, next_row;
    char error[DATA_ERR_LEN];

    // Device side: two batch buffers, so that the copy of batch m+1 overlaps compute on batch m.
    int32_t* dev[2];
    cudaEvent_t dev_free[2];  // recorded on the compute stream when the trainer asks for the batch after
    int dev_free_recorded[2];
    cudaStream_t copy_stream;
    int device;  // the caller's current device at init; the loader threads make it theirs
    double wait_ms_total;
};

static inline int shard_of(const DataLoader* dl, uint64_t g) {  // binary search on the shards' first sample
    int lo = 0, hi = dl->num_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (dl->shards[mid].first <= g)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}
static inline uint32_t sample_len(const DataLoader* dl, uint64_t g) {
    const Shard* s = &dl->shards[shard_of(dl, g)];
    uint64_t i = g - s->first;
    return (uint32_t)(s->offsets[i + 1] - s->offsets[i]);
}

// ----------------------------------------------------------------------------
// Packing. Decision: pack, rather than batch by length. Rows always hold T positions, so every
// batch has the same shape (static buffers, no recompiles of launch sizes), and a row holds as many
// whole samples as fit, so little compute goes to padding; cu_seqlens keeps samples apart.
// Length-bucketing would instead need per-bucket shapes and bias which samples share a batch.
//
// The plan for an epoch walks the shuffled order and places each sample in the fullest of
// DATA_OPEN_ROWS open rows that still has room (best fit); when none has room, the fullest open row
// is closed (emitted) and a new one opened. A row is emitted as soon as it is full. This keeps rows
// >97% full on mixed lengths where plain "next fit" wastes a sample's worth per row, at 16
// comparisons per sample. The plan is global and deterministic: every rank builds the same one.
// Memory: 8 bytes per sample (order + row_start); the build is O(N) once per epoch.
static inline void plan_emit_row(DataLoader* dl, EpochPlan* p, int k, uint64_t* pos) {
    int T = dl->cfg.T;
    memcpy(p->order + *pos, dl->open_sample + (size_t)k * T, sizeof(uint32_t) * dl->open_n[k]);
    *pos += dl->open_n[k];
    p->row_start[++p->num_rows] = (uint32_t)*pos;
}
// plan_build: the plan of an epoch into p, using the loader's packing scratch (one build at a time).
static inline void plan_build(DataLoader* dl, EpochPlan* p, int64_t epoch) {
    int T = dl->cfg.T, nopen = 0;
    uint64_t N = dl->num_samples, pos = 0;
    uint64_t key = mix64(dl->cfg.seed ^ mix64((uint64_t)epoch + 0x5EED));
    p->num_rows = 0;
    p->row_start[0] = 0;
    for (uint64_t i = 0; i < N; i++) {
        uint64_t g = dl->cfg.shuffle ? perm_index(i, N, key) : i;
        int len = (int)sample_len(dl, g), best = -1;
        for (int k = 0; k < nopen; k++)
            if (T - dl->open_len[k] >= len && (best < 0 || dl->open_len[k] > dl->open_len[best])) best = k;
        if (best < 0) {
            if (nopen == DATA_OPEN_ROWS) {  // no room anywhere: close the fullest row
                int full = 0;
                for (int k = 1; k < nopen; k++)
                    if (dl->open_len[k] > dl->open_len[full]) full = k;
                plan_emit_row(dl, p, full, &pos);
                best = full;
            } else {
                best = nopen++;
            }
            dl->open_len[best] = 0;
            dl->open_n[best] = 0;
        }
        dl->open_sample[(size_t)best * T + dl->open_n[best]++] = (uint32_t)g;
        dl->open_len[best] += len;
        if (dl->open_len[best] == T) {  // full: emit it, and move the last open row into its place
            plan_emit_row(dl, p, best, &pos);
            nopen--;
            if (best != nopen) {
                memcpy(dl->open_sample + (size_t)best * T, dl->open_sample + (size_t)nopen * T,
                       sizeof(uint32_t) * dl->open_n[nopen]);
                dl->open_len[best] = dl->open_len[nopen];
                dl->open_n[best] = dl->open_n[nopen];
            }
        }
    }
    for (int k = 0; k < nopen; k++) plan_emit_row(dl, p, k, &pos);
    p->fill = (double)dl->num_tokens / ((double)p->num_rows * T);
    p->epoch = epoch;
}

static inline void* planner_main(void* arg) {
    DataLoader* dl = (DataLoader*)arg;
    plan_build(dl, &dl->next_plan, dl->planner_epoch);
    return NULL;
}
static inline void planner_join(DataLoader* dl) {
    if (!dl->planner_running) return;
    pthread_join(dl->planner, NULL);
    dl->planner_running = 0;
}

// plan_ready: makes dl->plan the plan of `epoch` (under the lock, or with the loader threads stopped):
// the one the planner prepared, or a new one; then starts the planner on the epoch after it.
static inline void plan_ready(DataLoader* dl, int64_t epoch) {
    if (dl->plan.epoch != epoch) {
        planner_join(dl);
        if (dl->next_plan.epoch == epoch) {
            EpochPlan t = dl->plan;
            dl->plan = dl->next_plan;
            dl->next_plan = t;
        } else {
            plan_build(dl, &dl->plan, epoch);
        }
    }
    if (!dl->planner_running && dl->next_plan.epoch != epoch + 1) {
        dl->next_plan.epoch = -1;
        dl->planner_epoch = epoch + 1;
        dl->planner_running = pthread_create(&dl->planner, NULL, planner_main, dl) == 0;  // else: built when needed
    }
}

// Under the lock: the next micro-batch of this rank, as a job; then advance the position.
static inline void claim_job(DataLoader* dl, Job* job) {
    plan_ready(dl, dl->prod_epoch);
    int B = dl->cfg.B;
    job->seq = dl->prod_seq++;
    job->epoch = dl->prod_epoch;
    job->row = dl->prod_row;
    uint64_t first = (uint64_t)dl->prod_row + (uint64_t)dl->cfg.rank * B;
    uint64_t num_rows = dl->plan.num_rows;
    job->rows = first >= num_rows ? 0 : (int)(num_rows - first < (uint64_t)B ? num_rows - first : B);
    size_t n = 0;
    for (int b = 0; b < job->rows; b++) {
        uint32_t s0 = dl->plan.row_start[first + b], s1 = dl->plan.row_start[first + b + 1];
        job->row_count[b] = (int)(s1 - s0);
        memcpy(job->sample + n, dl->plan.order + s0, sizeof(uint32_t) * (s1 - s0));
        n += s1 - s0;
    }
    dl->prod_row += (int64_t)B * dl->cfg.world;
    if ((uint64_t)dl->prod_row >= num_rows) {  // the global micro-batch reached the epoch's end
        dl->prod_epoch++;
        dl->prod_row = 0;
    }
    job->next_epoch = dl->prod_epoch;
    job->next_row = dl->prod_row;
}

// ----------------------------------------------------------------------------
// Filling a slot: copy each sample's tokens into its place and apply MLM masking as we go.
//
// Masking, per sample, from an RNG seeded by (seed, epoch, sample): of the sample's n non-special
// tokens, exactly k = floor(mask_prob * n + u) are chosen (u uniform in [0,1): unbiased, so the
// rate is mask_prob on average even for short samples), as a uniform random subset: positions are
// drawn uniformly and redrawn when special or already taken, marked in a bitmap, and read back in
// ascending order (k draws, not one per token: masking costs little beside the copy).
// Each chosen token becomes [MASK] with probability 0.8,
// a random ordinary (non-special) token with 0.1, and stays unchanged with 0.1; its original id is
// the label. Special tokens ([CLS], [SEP], [PAD], [MASK], [UNK]) are never chosen.
static inline int is_special(const uint32_t* sp, uint32_t t) {
    return (t == sp[0]) | (t == sp[1]) | (t == sp[2]) | (t == sp[3]) | (t == sp[4]);
}

// Returns -1 (with dl->error) if a token id is outside the vocabulary: possible only when the
// shards were opened without verify and are bad.
// bits: scratch of (T+63)/64 words.
static inline int fill_sample(DataLoader* dl, uint64_t g, int64_t epoch, int32_t* slot, size_t at, int seg,
                              int* num_masked, uint64_t* bits) {
    const BatchLayout* L = &dl->L;
    const Shard* s = &dl->shards[shard_of(dl, g)];
    uint64_t i = g - s->first, o0 = s->offsets[i];
    int len = (int)(s->offsets[i + 1] - o0);
    int32_t* ids = slot + L->input_ids + at;
    int32_t* segid = slot + L->segment_ids + at;
    int32_t* posid = slot + L->position_ids + at;
    const uint32_t* sp = dl->special;
    uint32_t vocab = dl->h.vocab_size, bad = 0;
    int n_special = 0;
    if (s->h.token_bytes == 2) {
        const uint16_t* src = (const uint16_t*)s->tokens + o0;
        for (int j = 0; j < len; j++) {
            uint32_t t = src[j];
            ids[j] = (int32_t)t;
            n_special += is_special(sp, t);
            bad |= (t >= vocab);
        }
    } else {
        const uint32_t* src = (const uint32_t*)s->tokens + o0;
        for (int j = 0; j < len; j++) {
            uint32_t t = src[j];
            ids[j] = (int32_t)t;
            n_special += is_special(sp, t);
            bad |= (t >= vocab);
        }
    }
    if (bad) {
        pthread_mutex_lock(&dl->lock);
        if (!dl->failed)
            data_err(
                dl->error,
                "data: %s: sample %llu holds a token id >= the vocab size %u (a corrupt shard: run with verify on)",
                s->path, (unsigned long long)i, vocab);
        dl->failed = 1;
        pthread_mutex_unlock(&dl->lock);
        return -1;
    }
    for (int j = 0; j < len; j++) {
        segid[j] = seg;
        posid[j] = j;
    }
    // Masking.
    uint64_t rng = mix64(mix64(dl->cfg.seed ^ 0x4D41534Bull) ^ mix64((uint64_t)epoch) ^ (g * 0xD1B54A32D192ED03ull));
    int cand = len - n_special;
    int need = (int)floor((double)dl->cfg.mask_prob * cand + (double)(rng_next(&rng) >> 11) * 0x1.0p-53);
    if (need > cand) need = cand;
    if (need == 0) return len;
    int words = (len + 63) / 64;
    memset(bits, 0, sizeof(uint64_t) * words);
    for (int taken = 0; taken < need;) {
        int j = (int)rng_below(rng_next(&rng), (uint32_t)len);
        if (is_special(sp, (uint32_t)ids[j]) || (bits[j >> 6] >> (j & 63) & 1)) continue;
        bits[j >> 6] |= 1ull << (j & 63);
        taken++;
    }
    int32_t* mpos = slot + L->mask_pos;
    int32_t* mtgt = slot + L->mask_target;
    int nm = *num_masked;
    for (int w = 0; w < words; w++) {
        for (uint64_t b = bits[w]; b; b &= b - 1) {
            int j = w * 64 + __builtin_ctzll(b);
            mpos[nm] = (int32_t)(at + j);
            mtgt[nm] = ids[j];
            nm++;
            uint64_t r = rng_next(&rng);
            uint32_t kind = rng_below(r, 10);  // 0..9
            if (kind < 8) {
                ids[j] = dl->h.mask_id;
            } else if (kind == 8) {
                uint32_t x = rng_below(r >> 32, vocab);  // the other half of r; redrawn while special
                while (is_special(sp, x)) x = rng_below(rng_next(&rng), vocab);
                ids[j] = (int32_t)x;
            }  // kind 9: unchanged
        }
    }
    *num_masked = nm;
    return len;
}

static inline int fill_batch(DataLoader* dl, const Job* job, int32_t* slot) {
    const BatchLayout* L = &dl->L;
    int B = dl->cfg.B, T = dl->cfg.T, seg = 0, nm = 0, real = 0, nsamples = 0;
    int32_t* cu = slot + L->cu_seqlens;
    size_t k = 0;
    for (int b = 0; b < B; b++) {
        size_t at = (size_t)b * T, end = at + T;
        int count = b < job->rows ? job->row_count[b] : 0;
        for (int j = 0; j < count; j++, k++) {
            cu[seg] = (int32_t)at;
            int len = fill_sample(dl, job->sample[k], job->epoch, slot, at, seg, &nm, job->bits);
            if (len < 0) return -1;
            at += len;
            real += len;
            seg++;
        }
        nsamples += count;
        if (at < end) {  // the rest of the row: one padding segment
            cu[seg] = (int32_t)at;
            for (size_t p = at; p < end; p++) {
                slot[L->input_ids + p] = dl->h.pad_id;
                slot[L->segment_ids + p] = seg;
                slot[L->position_ids + p] = (int32_t)(p - at);
            }
            seg++;
        }
    }
    cu[seg] = B * T;
    slot[0] = seg;
    slot[1] = nm;
    slot[2] = real;
    slot[3] = nsamples;
    return 0;
}

// A loader thread: claim the next micro-batch, wait for its slot to be free (taken by the
// consumer, and its previous copy to the device finished), fill it, mark it ready.
static inline void* loader_thread(void* arg) {
    Worker* w = (Worker*)arg;
    DataLoader* dl = w->dl;
    int K = dl->cfg.ring_slots;
    // A new host thread's current device is 0: without this, the event waits below would create a
    // context on GPU 0 from every rank's loader threads.
    cudaSetDevice(dl->device);
    pthread_mutex_lock(&dl->lock);
    while (!dl->stop && !dl->failed) {
        claim_job(dl, &w->job);
        Slot* s = &dl->slots[w->job.seq % K];
        // The slot's previous batch (seq - K) must have been taken by the consumer; then the slot is
        // FREE or COPYING, and no other thread wants it (the next one to, seq + K, waits for seq).
        while (!dl->stop && dl->cons_seq <= w->job.seq - K) pthread_cond_wait(&dl->cv_free, &dl->lock);
        if (dl->stop) break;
        int was_copying = s->state == SLOT_COPYING;
        s->state = SLOT_FILLING;
        pthread_mutex_unlock(&dl->lock);
        if (was_copying) cudaEventSynchronize(s->copied);  // its host-to-device copy must be done
        double t0 = data_now();
        int rc = fill_batch(dl, &w->job, s->host);
        double dt = data_now() - t0;
        pthread_mutex_lock(&dl->lock);
        if (rc) break;
        w->fill_s += dt, w->fills++, dl->filled++;
        s->seq = w->job.seq;
        s->epoch = w->job.epoch;
        s->row = w->job.row;
        s->next_epoch = w->job.next_epoch;
        s->next_row = w->job.next_row;
        s->state = SLOT_READY;
        pthread_cond_broadcast(&dl->cv_ready);
    }
    pthread_cond_broadcast(&dl->cv_ready);  // a consumer waiting on a failed loader must wake up
    pthread_mutex_unlock(&dl->lock);
    return NULL;
}

static inline void loader_start(DataLoader* dl) {
    dl->stop = 0;
    dl->prod_seq = dl->cons_seq;
    dl->prod_epoch = dl->next_epoch;
    dl->prod_row = dl->next_row;
    for (int i = 0; i < dl->cfg.ring_slots; i++) dl->slots[i].state = SLOT_FREE;
    for (int i = 0; i < dl->cfg.num_threads; i++)
        pthread_create(&dl->workers[i].thread, NULL, loader_thread, &dl->workers[i]);
    dl->running = 1;
}

static inline void loader_stop(DataLoader* dl) {
    if (!dl->running) return;
    pthread_mutex_lock(&dl->lock);
    dl->stop = 1;
    pthread_cond_broadcast(&dl->cv_free);
    pthread_mutex_unlock(&dl->lock);
    for (int i = 0; i < dl->cfg.num_threads; i++) pthread_join(dl->workers[i].thread, NULL);
    cudaStreamSynchronize(dl->copy_stream);  // no copy may still read a pinned slot
    dl->running = 0;
}

// ----------------------------------------------------------------------------
// The API.
static inline void dataloader_free(DataLoader* dl);

// dataloader_init: opens and validates the shards, allocates everything (2 device batches, the
// pinned ring, the plan), and starts the loader threads. Returns 0, or -1 with dl->error set
// (one line naming the file and what is wrong); on error everything is already freed.
static inline int dataloader_init(DataLoader* dl, const DataLoaderConfig* cfg) {
    memset(dl, 0, sizeof(*dl));
    dl->cfg = *cfg;
    pthread_mutex_init(&dl->lock, NULL);
    pthread_cond_init(&dl->cv_ready, NULL);
    pthread_cond_init(&dl->cv_free, NULL);
    char* err = dl->error;
    if (!cfg->pattern) {
        data_err(err, "data: no shard pattern given");
        goto fail;
    }
    dl->pattern = strdup(cfg->pattern);
    dl->cfg.pattern = dl->pattern;
    if (cfg->B < 1 || cfg->T < 2 || (int64_t)cfg->B * cfg->T > (1 << 26) || cfg->world < 1 || cfg->rank < 0 ||
        cfg->rank >= cfg->world || cfg->num_threads < 1 || cfg->num_threads > 256 || cfg->max_threads < 0 ||
        cfg->max_threads > 256 || cfg->ring_slots < 2 || !(cfg->mask_prob >= 0 && cfg->mask_prob < 1)) {
        data_err(err,
                 "data: %s: bad loader settings B=%d T=%d rank=%d world=%d threads=%d slots=%d mask_prob=%g (expected "
                 "B>=1, T>=2, B*T<=2^26, 0<=rank<world, 1..256 threads, >=2 slots, 0<=mask_prob<1)",
                 cfg->pattern, cfg->B, cfg->T, cfg->rank, cfg->world, cfg->num_threads, cfg->ring_slots,
                 cfg->mask_prob);
        goto fail;
    }
    if (shards_open_all(cfg->pattern, &dl->shards, &dl->num_shards, 0, err)) goto fail;
    dl->h = dl->shards[0].h;
    for (int i = 0; i < dl->num_shards; i++) {
        Shard* s = &dl->shards[i];
        const ShardHeader *a = &dl->h, *b = &s->h;
        if (a->vocab_size != b->vocab_size || a->pad_id != b->pad_id || a->cls_id != b->cls_id ||
            a->sep_id != b->sep_id || a->mask_id != b->mask_id || a->unk_id != b->unk_id) {
            data_err(err,
                     "data: %s: vocabulary (size %u, special ids %d %d %d %d %d) differs from %s's (size %u, %d %d %d "
                     "%d %d)",
                     s->path, b->vocab_size, b->pad_id, b->cls_id, b->sep_id, b->mask_id, b->unk_id, dl->shards[0].path,
                     a->vocab_size, a->pad_id, a->cls_id, a->sep_id, a->mask_id, a->unk_id);
            goto fail;
        }
        if (b->max_len > (uint32_t)cfg->T) {
            data_err(err, "data: %s: samples of up to %u tokens do not fit rows of T=%d (prepare it with --seq-len %d)",
                     s->path, b->max_len, cfg->T, cfg->T);
            goto fail;
        }
        s->first = dl->num_samples;
        dl->num_samples += b->num_samples;
        dl->num_tokens += b->num_tokens;
    }
    if (cfg->vocab_size && (uint32_t)cfg->vocab_size != dl->h.vocab_size) {
        data_err(err, "data: %s: vocab size %u, but the model has %d (data prepared with another vocabulary?)",
                 dl->shards[0].path, dl->h.vocab_size, cfg->vocab_size);
        goto fail;
    }
    if (dl->num_samples > UINT32_MAX - 1) {
        data_err(err, "data: %s: %llu samples: the plan indexes samples with 32 bits (expected < 2^32)", cfg->pattern,
                 (unsigned long long)dl->num_samples);
        goto fail;
    }
    dl->num_workers = cfg->max_threads > cfg->num_threads ? cfg->max_threads : cfg->num_threads;
    if (cfg->verify && shards_verify(dl->shards, dl->num_shards, dl->num_workers, err)) goto fail;
    dl->fingerprint = shards_fingerprint(dl->shards, dl->num_shards);
    dl->special[0] = (uint32_t)dl->h.pad_id;
    dl->special[1] = (uint32_t)dl->h.cls_id;
    dl->special[2] = (uint32_t)dl->h.sep_id;
    dl->special[3] = (uint32_t)dl->h.mask_id;
    dl->special[4] = (uint32_t)dl->h.unk_id;  // -1 becomes UINT32_MAX, which no token equals

    // Allocations: all of them here, none in the loop.
    {
        int B = cfg->B, T = cfg->T, K = cfg->ring_slots;
        dl->L = batch_layout(B, T);
        size_t bytes = dataloader_batch_bytes(B, T);
        for (EpochPlan* p = &dl->plan; p <= &dl->next_plan; p++) {
            p->order = (uint32_t*)malloc(sizeof(uint32_t) * dl->num_samples);
            p->row_start = (uint32_t*)malloc(sizeof(uint32_t) * (dl->num_samples + 1));
            p->epoch = -1;
        }
        dl->open_sample = (uint32_t*)malloc(sizeof(uint32_t) * DATA_OPEN_ROWS * T);
        dl->slots = (Slot*)calloc(K, sizeof(Slot));
        dl->workers = (Worker*)calloc(dl->num_workers, sizeof(Worker));
        if (!dl->plan.order || !dl->plan.row_start || !dl->next_plan.order || !dl->next_plan.row_start ||
            !dl->open_sample || !dl->slots || !dl->workers) {
            data_err(err, "data: %s: out of host memory for the plan of %llu samples", cfg->pattern,
                     (unsigned long long)dl->num_samples);
            goto fail;
        }
        for (int i = 0; i < dl->num_workers; i++) {
            Worker* w = &dl->workers[i];
            w->dl = dl;
            w->job.row_count = (int*)malloc(sizeof(int) * B);
            w->job.sample = (uint32_t*)malloc(sizeof(uint32_t) * B * T);
            w->job.bits = (uint64_t*)malloc(sizeof(uint64_t) * ((T + 63) / 64));
            if (!w->job.row_count || !w->job.sample || !w->job.bits) {
                data_err(err, "data: out of host memory");
                goto fail;
            }
        }
        cudaError_t ce = cudaGetDevice(&dl->device);
        if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&dl->copy_stream, cudaStreamNonBlocking);
        for (int i = 0; i < K && ce == cudaSuccess; i++) {
            ce = cudaMallocHost((void**)&dl->slots[i].host, bytes);
            if (ce == cudaSuccess) memset(dl->slots[i].host, 0, bytes);  // past the counts, arrays hold stale values
            if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&dl->slots[i].copied, cudaEventDisableTiming);
        }
        for (int i = 0; i < 2 && ce == cudaSuccess; i++) {
            ce = cudaMalloc((void**)&dl->dev[i], bytes);
            if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&dl->dev_free[i], cudaEventDisableTiming);
        }
        if (ce != cudaSuccess) {
            data_err(
                err,
                "data: %s: CUDA allocation of the loader's buffers (%d pinned slots + 2 device batches of %zu bytes) "
                "failed: %s",
                cfg->pattern, K, bytes, cudaGetErrorString(ce));
            goto fail;
        }
    }
    plan_ready(dl, 0);  // (the first batch needs it anyway)
    dl->epoch0_rows = dl->plan.num_rows;
    if (cfg->verbose) {
        printf(
            "data: %s: %d shards, %llu samples, %llu tokens, vocab %u; epoch 0: %llu rows of %d (%.1f%% real tokens), "
            "rank %d/%d takes %d rows per micro-batch\n",
            cfg->pattern, dl->num_shards, (unsigned long long)dl->num_samples, (unsigned long long)dl->num_tokens,
            dl->h.vocab_size, (unsigned long long)dl->plan.num_rows, cfg->T, 100 * dl->plan.fill, cfg->rank, cfg->world,
            cfg->B);
    }
    loader_start(dl);
    return 0;
fail : {
    char saved[DATA_ERR_LEN];
    memcpy(saved, dl->error, DATA_ERR_LEN);
    dataloader_free(dl);
    memcpy(dl->error, saved, DATA_ERR_LEN);
}
    return -1;
}

// dataloader_next: the next micro-batch of this rank, on the device. Blocks until a loader thread
// has filled it (that wait is Batch.wait_ms: log it per step). Enqueues its host-to-device copy on
// the loader's copy stream and makes `stream` (the compute stream; always the same one) wait for
// that copy. Contract: the trainer has enqueued all its work on the previous batch before it
// asks for the next one (the natural loop); the buffer of batch m is rewritten by batch m+2's
// copy only after the compute stream has passed that point.
// Returns 0, or -1 with dl->error if a loader thread failed.
static inline int dataloader_next(DataLoader* dl, cudaStream_t stream, Batch* out) {
    int64_t m = dl->cons_seq;
    Slot* s = &dl->slots[m % dl->cfg.ring_slots];
    double t0 = data_now();
    pthread_mutex_lock(&dl->lock);
    while (!dl->failed && !(s->state == SLOT_READY && s->seq == m)) pthread_cond_wait(&dl->cv_ready, &dl->lock);
    int failed = dl->failed;
    pthread_mutex_unlock(&dl->lock);
    if (failed) return -1;
    double wait_ms = 1e3 * (data_now() - t0);
    dl->wait_ms_total += wait_ms;

    int d = (int)(m & 1), prev = d ^ 1;
    // Everything enqueued on the compute stream so far covers the previous batch (buffer prev).
    if (m > 0) {
        cudaEventRecord(dl->dev_free[prev], stream);
        dl->dev_free_recorded[prev] = 1;
    }
    if (dl->dev_free_recorded[d]) cudaStreamWaitEvent(dl->copy_stream, dl->dev_free[d], 0);  // batch m-2 is done
    cudaError_t ce =
        cudaMemcpyAsync(dl->dev[d], s->host, dl->L.ints * sizeof(int32_t), cudaMemcpyHostToDevice, dl->copy_stream);
    if (ce == cudaSuccess) ce = cudaEventRecord(s->copied, dl->copy_stream);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(stream, s->copied, 0);
    if (ce != cudaSuccess) {
        data_err(dl->error, "data: copying a batch to the device failed: %s", cudaGetErrorString(ce));
        return -1;
    }
    const int32_t* base = dl->dev[d];
    const BatchLayout* L = &dl->L;
    out->device_base = base;
    out->input_ids = base + L->input_ids;
    out->segment_ids = base + L->segment_ids;
    out->position_ids = base + L->position_ids;
    out->cu_seqlens = base + L->cu_seqlens;
    out->mask_pos = base + L->mask_pos;
    out->mask_target = base + L->mask_target;
    out->num_segments = s->host[0];
    out->num_masked = s->host[1];
    out->num_real_tokens = s->host[2];
    out->num_samples = s->host[3];
    out->epoch = s->epoch;
    out->row = s->row;
    out->wait_ms = wait_ms;
    dl->next_epoch = s->next_epoch;
    dl->next_row = s->next_row;
    pthread_mutex_lock(&dl->lock);
    dl->cons_seq++;
    s->state = SLOT_COPYING;  // refillable once `copied` has completed
    pthread_cond_broadcast(&dl->cv_free);
    pthread_mutex_unlock(&dl->lock);
    return 0;
}

// dataloader_fill_ms: the mean time one loader thread took to fill a batch, once n batches have been filled
// since init (waits for them; n at most ring_slots, so that the loader needs no consumer); -1 if a loader
// thread failed (dl->error says why).
static inline double dataloader_fill_ms(DataLoader* dl, int n) {
    if (n > dl->cfg.ring_slots) n = dl->cfg.ring_slots;
    pthread_mutex_lock(&dl->lock);
    while (!dl->failed && dl->filled < n) pthread_cond_wait(&dl->cv_ready, &dl->lock);
    double s = 0;
    int64_t k = 0;
    for (int i = 0; i < dl->num_workers; i++) s += dl->workers[i].fill_s, k += dl->workers[i].fills;
    int failed = dl->failed;
    pthread_mutex_unlock(&dl->lock);
    return failed || k == 0 ? -1 : 1e3 * s / (double)k;
}

// dataloader_set_threads: from now on n loader threads (1 .. the num_workers made at init) fill the ring. The
// ring restarts from the consumer's position: a batch is the same whichever thread fills it, and however many.
static inline void dataloader_set_threads(DataLoader* dl, int n) {
    if (n < 1 || n > dl->num_workers || n == dl->cfg.num_threads) return;
    loader_stop(dl);
    dl->cfg.num_threads = n;
    loader_start(dl);
}

// dataloader_epoch0_rows: the global rows of epoch 0, all ranks together: ceil(rows / B) micro-batches of B rows
// cover every sample once, the last one partial (its rows past the end are padding: no sample, nothing masked).
// Validation (shuffle 0: file order, the same plan every epoch) reads exactly these from the start.
static inline uint64_t dataloader_epoch0_rows(const DataLoader* dl) { return dl->epoch0_rows; }

// The position for a checkpoint: the batch the next dataloader_next() call would return.
static inline DataLoaderState dataloader_state(const DataLoader* dl) {
    DataLoaderState st;
    memset(&st, 0, sizeof(st));
    st.version = DATA_STATE_VERSION;
    st.seed = dl->cfg.seed;
    st.epoch = (uint64_t)dl->next_epoch;
    st.row = (uint64_t)dl->next_row;
    st.num_samples = dl->num_samples;
    st.fingerprint = dl->fingerprint;
    st.T = (uint32_t)dl->cfg.T;
    st.mask_prob_ppm = (uint32_t)lrint(dl->cfg.mask_prob * 1e6);
    st.shuffle = (uint32_t)dl->cfg.shuffle;
    return st;
}

// dataloader_restore: continue from a checkpointed position (also works to rewind a validation
// loader: restore the state taken right after init). The seed comes from the checkpoint.
// Returns 0, or -1 with dl->error if the checkpoint belongs to other data or settings.
static inline int dataloader_restore(DataLoader* dl, const DataLoaderState* st) {
    if (st->version != DATA_STATE_VERSION)
        return data_err(dl->error, "data: checkpoint loader state version %llu (expected %d)",
                        (unsigned long long)st->version, DATA_STATE_VERSION);
    if (st->num_samples != dl->num_samples || st->fingerprint != dl->fingerprint)
        return data_err(dl->error,
                        "data: %s: the checkpoint was made on other data (%llu samples, fingerprint %016llx; "
                        "these shards: %llu samples, %016llx)",
                        dl->pattern, (unsigned long long)st->num_samples, (unsigned long long)st->fingerprint,
                        (unsigned long long)dl->num_samples, (unsigned long long)dl->fingerprint);
    DataLoaderState mine = dataloader_state(dl);
    if (st->T != mine.T || st->mask_prob_ppm != mine.mask_prob_ppm || st->shuffle != mine.shuffle)
        return data_err(dl->error,
                        "data: the checkpoint's loader used T=%u mask_prob=%g shuffle=%u; this run has T=%u "
                        "mask_prob=%g shuffle=%u (expected the same)",
                        st->T, st->mask_prob_ppm * 1e-6, st->shuffle, mine.T, mine.mask_prob_ppm * 1e-6, mine.shuffle);
    if (st->epoch > (1ull << 40) || st->row >= st->num_samples)  // a row holds at least one sample
        return data_err(
            dl->error, "data: the checkpoint's position (epoch %llu, row %llu) is not in an epoch of %llu samples",
            (unsigned long long)st->epoch, (unsigned long long)st->row, (unsigned long long)st->num_samples);
    loader_stop(dl);
    planner_join(dl);
    uint64_t seed = dl->cfg.seed;
    dl->cfg.seed = st->seed;
    if (st->seed != seed) dl->plan.epoch = dl->next_plan.epoch = -1;  // the plans were of the other seed
    plan_ready(dl, (int64_t)st->epoch);
    if (st->row >= dl->plan.num_rows) {  // the position must be a row of its epoch's plan
        planner_join(dl);
        dl->cfg.seed = seed;
        dl->plan.epoch = dl->next_plan.epoch = -1;
        loader_start(dl);
        return data_err(
            dl->error, "data: the checkpoint's position, row %llu of epoch %llu, is past the epoch's %llu rows",
            (unsigned long long)st->row, (unsigned long long)st->epoch, (unsigned long long)dl->plan.num_rows);
    }
    dl->next_epoch = (int64_t)st->epoch;
    dl->next_row = (int64_t)st->row;
    dl->failed = 0;
    loader_start(dl);
    return 0;
}

static inline void dataloader_free(DataLoader* dl) {
    loader_stop(dl);
    planner_join(dl);
    if (dl->slots) {
        for (int i = 0; i < dl->cfg.ring_slots; i++) {
            if (dl->slots[i].host) cudaFreeHost(dl->slots[i].host);
            if (dl->slots[i].copied) cudaEventDestroy(dl->slots[i].copied);
        }
        free(dl->slots);
    }
    for (int i = 0; i < 2; i++) {
        if (dl->dev[i]) cudaFree(dl->dev[i]);
        if (dl->dev_free[i]) cudaEventDestroy(dl->dev_free[i]);
    }
    if (dl->copy_stream) cudaStreamDestroy(dl->copy_stream);
    if (dl->workers) {
        for (int i = 0; i < dl->num_workers; i++) {
            free(dl->workers[i].job.row_count);
            free(dl->workers[i].job.sample);
            free(dl->workers[i].job.bits);
        }
        free(dl->workers);
    }
    for (int i = 0; i < dl->num_shards; i++) shard_close(&dl->shards[i]);
    free(dl->shards);
    free(dl->plan.order);
    free(dl->plan.row_start);
    free(dl->next_plan.order);
    free(dl->next_plan.row_start);
    free(dl->open_sample);
    free(dl->pattern);
    pthread_mutex_destroy(&dl->lock);
    pthread_cond_destroy(&dl->cv_ready);
    pthread_cond_destroy(&dl->cv_free);
    memset(dl, 0, sizeof(*dl));
}

// ----------------------------------------------------------------------------
// Node-local staging (the seed paper's second recommendation): copy the shards from a shared
// path to a node-local disk once per node, then train from the local copy, so that hundreds of
// ranks do not contend for the network file system all through training.
//
// dataloader_stage(pattern, local_dir, local_rank, timeout_s, local_pattern, cap, err):
// local rank 0 copies every file matching `pattern` into local_dir, checking each file's CRC as
// it copies (a copy that does not match its header is an error naming the source file), removes
// stale files matching the same pattern there, and then writes the marker
// local_dir/.staged-<file pattern> holding the data set's fingerprint. The other local ranks wait
// (polling, up to timeout_s) until the marker holds the fingerprint of the source shards. A later
// run that finds the marker up to date copies nothing. On success local_pattern receives the
// pattern to give dataloader_init (local_dir/<the file pattern>). Returns 0 or -1 with err set.
static inline const char* data_basename(const char* path) {
    const char* b = strrchr(path, '/');
    return b ? b + 1 : path;
}

static inline int data_mkdirs(const char* dir, char* err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s", dir);
    for (char* p = path + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return data_err(err, "data: %s: cannot create the staging directory: %s", path, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return 0;
}

// data_read_marker: the fingerprint in a staging marker; 0 when there is none (or not a regular file: a FIFO named
// like it must not block the ranks, it is replaced).
static inline int data_read_marker(const char* path, uint64_t* fp) {
    char buf[FILE_MAX_SMALL + 1], why[FILES_ERR_LEN];
    long long n = 0;
    int fd = open_regular(path, "a staging marker", FILE_MAX_SMALL, &n, why);
    if (fd < 0) return 0;
    int got = read_fd(fd, buf, (size_t)n, 0);
    close(fd);
    buf[got ? n : 0] = 0;
    unsigned long long v = 0;
    int ok = got && sscanf(buf, "%llx", &v) == 1;
    *fp = v;
    return ok;
}

static inline int stage_copy(const Shard* s, const char* dst, const char* tmp, char* err) {
    int fd = create_fresh(tmp);
    if (fd < 0) return data_err(err, "data: %s: cannot create: %s", tmp, strerror(errno));
    uint32_t crc = 0;
    const size_t CHUNK = 4 << 20;
    for (size_t pos = 0; pos < s->bytes;) {
        size_t n = s->bytes - pos < CHUNK ? s->bytes - pos : CHUNK;
        size_t from = pos < SHARD_HEADER_BYTES ? SHARD_HEADER_BYTES : pos;  // the CRC covers what follows the header
        if (from < pos + n) crc = crc32_update(crc, s->map + from, pos + n - from);
        for (size_t done = 0; done < n;) {
            ssize_t w = write(fd, s->map + pos + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                data_err(err, "data: %s: write failed: %s", tmp, w < 0 ? strerror(errno) : "no space?");
                close(fd);
                unlink(tmp);
                return -1;
            }
            done += (size_t)w;
        }
        pos += n;
    }
    if (close(fd) != 0) {
        unlink(tmp);
        return data_err(err, "data: %s: write failed: %s", tmp, strerror(errno));
    }
    if (crc != s->h.data_crc) {
        unlink(tmp);
        return data_err(err,
                        "data: %s: data checksum 0x%08x, the header says 0x%08x (the shared copy is corrupt; nothing "
                        "was staged)",
                        s->path, crc, s->h.data_crc);
    }
    if (rename(tmp, dst) != 0) {
        unlink(tmp);
        return data_err(err, "data: %s: cannot rename into place: %s", dst, strerror(errno));
    }
    return 0;
}

static inline int dataloader_stage(const char* pattern, const char* local_dir, int local_rank, double timeout_s,
                                   char* local_pattern, size_t cap, char* err) {
    const char* base = data_basename(pattern);
    if (snprintf(local_pattern, cap, "%s/%s", local_dir, base) >= (int)cap)
        return data_err(err, "data: staging directory of %zu characters too long (at most %zu here): %.256s...",
                        strlen(local_dir), cap - 2 - strlen(base), local_dir);
    char marker[4096], tmp[4096 + 8], dst[4096];
    snprintf(marker, sizeof(marker), "%s/.staged-%s", local_dir, base);
    Shard* shards = NULL;
    int n = 0, rc = -1;
    // Local rank 0 maps the shards to copy them; the others only read the headers (checksums).
    if (shards_open_all(pattern, &shards, &n, local_rank != 0, err)) goto done;
    {
        uint64_t want = shards_fingerprint(shards, n), have = 0;
        if (local_rank != 0) {  // wait for local rank 0
            double t0 = data_now();
            while (!(data_read_marker(marker, &have) && have == want)) {
                if (data_now() - t0 > timeout_s) {
                    data_err(err, "data: %s: gave up after %.0f s waiting for local rank 0 to stage %s (see its error)",
                             local_dir, timeout_s, pattern);
                    goto done;
                }
                struct timespec ts = {0, 50 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            rc = 0;
            goto done;
        }
        if (data_mkdirs(local_dir, err)) goto done;
        if (data_read_marker(marker, &have) && have == want) {
            rc = 0;  // staged by an earlier run
            goto done;
        }
        unlink(marker);
        for (int i = 0; i < n; i++) {  // two source directories may not hold the same file name
            for (int j = 0; j < i; j++) {
                if (!strcmp(data_basename(shards[i].path), data_basename(shards[j].path))) {
                    data_err(err, "data: %s and %s: same file name, cannot both be staged into %s", shards[j].path,
                             shards[i].path, local_dir);
                    goto done;
                }
            }
        }
        glob_t g;  // remove stale local files of this pattern that the source no longer has
        if (glob(local_pattern, 0, NULL, &g) == 0) {
            for (size_t k = 0; k < g.gl_pathc; k++) {
                int keep = 0;
                for (int i = 0; i < n && !keep; i++)
                    keep = !strcmp(data_basename(g.gl_pathv[k]), data_basename(shards[i].path));
                if (!keep) unlink(g.gl_pathv[k]);
            }
            globfree(&g);
        }
        for (int i = 0; i < n; i++) {
            snprintf(dst, sizeof(dst), "%s/%s", local_dir, data_basename(shards[i].path));
            snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", local_dir, data_basename(shards[i].path));
            if (stage_copy(&shards[i], dst, tmp, err)) goto done;
        }
        snprintf(tmp, sizeof(tmp), "%s.tmp", marker);
        int mfd = create_fresh(tmp);
        FILE* f = mfd >= 0 ? fdopen(mfd, "w") : NULL;
        if (!f && mfd >= 0) close(mfd);
        int bad = !f;
        if (f) {
            bad = fprintf(f, "%016llx\n", (unsigned long long)want) < 0;
            if (fclose(f) != 0) bad = 1;
        }
        if (bad || rename(tmp, marker) != 0) {
            data_err(err, "data: %s: cannot write the staging marker: %s", marker, strerror(errno));
            goto done;
        }
        rc = 0;
    }
done:
    for (int i = 0; i < n; i++) shard_close(&shards[i]);
    free(shards);
    return rc;
}
