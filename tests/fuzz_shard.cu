// tests/fuzz_shard.cu: a libFuzzer target for the shard parser in data.h (shard_check_layout,
// the header and offsets table, and shard_check_data, the checksum and token ids). Not part of
// the normal test run.
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -Icpu/include -I/usr/local/cuda/include
//       -pthread -x c++ tests/fuzz_shard.cu -o build/fuzz_shard          (one line)
//   build/fuzz_shard -make_seeds=build/fuzz_corpus      # writes a few valid shards as the seed corpus
//   build/fuzz_shard -max_total_time=300 build/fuzz_corpus
//
// Each input is checked twice: as it is, and with its two CRC fields recomputed, so that mutations
// get past the checksums and reach the size and offsets checks behind them. A shard the parser
// accepts is then read sample by sample, as the loader would; AddressSanitizer reports any read
// outside the input.
#include "../data.h"

static void check_one(const uint8_t* buf, size_t size) {
    ShardHeader h;
    char err[DATA_ERR_LEN];
    if (shard_check_layout(buf, size, "fuzz", &h, err) != 0) {
        if (strncmp(err, "data: fuzz: ", 12) != 0) abort();  // every error names the file
        return;
    }
    if (shard_check_data(buf, size, "fuzz", &h, err) != 0) return;
    // Accepted: every sample must lie inside the token array and every id inside the vocabulary.
    const uint64_t* off = (const uint64_t*)(buf + shard_offsets_pos(h.num_tokens, h.token_bytes));
    for (uint64_t i = 0; i < h.num_samples; i++) {
        for (uint64_t j = off[i]; j < off[i + 1]; j++) {
            uint32_t t = h.token_bytes == 2 ? ((const uint16_t*)(buf + SHARD_HEADER_BYTES))[j]
                                            : ((const uint32_t*)(buf + SHARD_HEADER_BYTES))[j];
            if (t >= h.vocab_size || off[i + 1] - off[i] > h.max_len) abort();
        }
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // An exact-size heap copy (malloc is 16-byte aligned, as mmap is page aligned): overreads are caught.
    uint8_t* buf = (uint8_t*)malloc(size ? size : 1);
    memcpy(buf, data, size);
    check_one(buf, size);
    if (size >= SHARD_HEADER_BYTES) {  // the same bytes with both checksums made right
        uint32_t dcrc = crc32_update(0, buf + SHARD_HEADER_BYTES, size - SHARD_HEADER_BYTES), zero = 0, hcrc;
        memcpy(buf + 64, &dcrc, 4);
        memcpy(buf + 68, &zero, 4);
        hcrc = crc32_update(0, buf, SHARD_HEADER_BYTES);
        memcpy(buf + 68, &hcrc, 4);
        check_one(buf, size);
    }
    free(buf);
    return 0;
}

// -make_seeds=DIR: write a few valid shards to start from, and exit (handled before libFuzzer
// starts, so it never sees the flag).
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    for (int i = 1; i < *argc; i++) {
        if (strncmp((*argv)[i], "-make_seeds=", 12) != 0) continue;
        const char* dir = (*argv)[i] + 12;
        mkdir(dir, 0755);
        char path[512], err[DATA_ERR_LEN];
        uint32_t toks[12] = {2, 10, 11, 3, 2, 12, 3, 2, 13, 14, 15, 3};
        uint64_t offs[4] = {0, 4, 7, 12};
        for (int k = 0; k < 3; k++) {
            ShardHeader h;
            memset(&h, 0, sizeof(h));
            h.vocab_size = k == 2 ? 100000 : 30522;
            h.token_bytes = k == 2 ? 4 : 2;
            h.max_len = 8;
            h.pad_id = 0;
            h.unk_id = k == 1 ? -1 : 100;
            h.cls_id = 2;
            h.sep_id = 3;
            h.mask_id = 103;
            h.num_samples = k == 0 ? 2 : 3;
            h.num_tokens = offs[h.num_samples];
            snprintf(path, sizeof(path), "%s/seed%d.bin", dir, k);
            if (shard_write(path, &h, toks, offs, err)) fprintf(stderr, "%s\n", err);
        }
        fprintf(stderr, "wrote 3 seed shards to %s\n", dir);
        exit(0);
    }
    return 0;
}
