#!/usr/bin/env python3
"""prepare.py: turn a corpus into mlm.c token shards, once, ahead of training.

The seed paper's first recommendation: tokenize everything ahead of training and store only what
training needs. A shard holds the token ids of its samples back to back and an offsets table; no
padding and no attention masks (the loader in data.h packs and masks). The format is documented in
README.md ("Token shards") and in data.h.

Two kinds of corpus:

  text   WordPiece through Hugging Face `tokenizers`: load a tokenizer.json or a BERT vocab.txt,
         or train a new vocabulary on the corpus (--train-vocab N).
           python3 tools/prepare.py text --input corpus/ --train-vocab 30522 --out data/wiki --seq-len 512
         It reads UTF-8 text (a document per paragraph, line or file: --doc-per), JSON Lines (.jsonl, .ndjson,
         .json: a record's string field --text-field, default text) and Parquet (.parquet: the column
         --text-field), each of them also compressed as .gz, .zst, .bz2 or .xz (not Parquet), streaming.
         Directories are read recursively, every file by its name (names starting with '.' are not read).
         What cannot be read (a binary file, a bad JSON line, a record without the field, a damaged .gz...)
         is skipped and counted by reason, the count printed at the end and kept in meta.json; --strict
         makes the first such input an error naming it. A file named on --input itself must open as its
         format (checked before anything is written).
  bytes  binary code, the seed paper's domain: one token per byte (256 byte ids + [PAD] [CLS] [SEP]
         [MASK]) over raw files; with --elf-functions every ELF file is split into one sample per
         function using its symbol table (pyelftools), so any Linux machine's /usr/lib is a corpus.
           python3 tools/prepare.py bytes --input /usr/lib --elf-functions --out data/usrlib --seq-len 512

A bounded corpus: --max-files N reads at most N input files, --max-tokens N stops after N document
tokens; under either bound the files are taken in a random order (seeded by --seed), a sample of
the whole input (./train.sh prepares its data this way from /usr/lib and /usr/bin).

Samples longer than --seq-len are split into several samples (never truncated). A fraction of the
documents (--val-fraction) goes to the validation split. Output: DIR/train_00000.bin ...,
DIR/val_00000.bin ..., DIR/tokenizer.json (text) and DIR/meta.json (the summary).
Check shards with:  python3 tools/prepare.py check DIR/train_*.bin
"""
import argparse
import codecs
import glob
import gzip
import io
import itertools
import json
import lzma
import os
import random
import re
import struct
import sys
import time
import zlib

import numpy as np

try:
    from tqdm import tqdm
except ImportError:  # the progress bar is a nicety
    tqdm = None

MAGIC = b"MLMSHARD"
VERSION = 1
HEADER_BYTES = 128
# magic, version, header_bytes, vocab_size, token_bytes, num_samples, num_tokens, max_len,
# pad_id, cls_id, sep_id, mask_id, unk_id, data_crc, header_crc  (72 bytes, then zeros to 128)
HEADER_STRUCT = struct.Struct("<8sIIIIQQIiiiiiII")
SPECIAL_NAMES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def die(msg):
    print(f"prepare.py: {msg}", file=sys.stderr)
    sys.exit(1)


def plural(n, word):
    """'1 file', '2 files', '1,024 files'."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def first_line(e):
    """An exception as one line of text."""
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


# ----------------------------------------------------------------------------
# Writing. Every file goes through a temporary name; a write that fails (a full disk: ENOSPC carries no file
# name) raises WriteError naming the file, and main() removes every temporary and every shard of the run
# before its one-line message, so a failed run leaves no .tmp and no partial set of shards.
class WriteError(Exception):
    """A file that could not be written (not an OSError: the readers' `except OSError` must not swallow it)."""

    def __init__(self, path, e):
        super().__init__(f"cannot write {path}: {e.strerror or first_line(e)}")


TEMPORARIES = {}  # temporary path -> its open file (or None), until renamed
WRITTEN = []  # the shards this run completed (removed again if the run fails)


def write_guard(path, fn, *a):
    """fn(*a), with an OSError turned into a WriteError naming path."""
    try:
        return fn(*a)
    except OSError as e:
        raise WriteError(path, e) from None


def remove_partial_output():
    """After a failure: closes and removes every temporary file and the shards written so far. Gives their count."""
    n = 0
    for tmp, f in list(TEMPORARIES.items()) + [(p, None) for p in WRITTEN]:
        try:
            if f is not None:
                f.close()
        except OSError:
            pass  # its buffer could not be written either: the file goes anyway
        try:
            os.remove(tmp)
            n += 1
        except OSError:
            pass
    TEMPORARIES.clear()
    WRITTEN.clear()
    return n


def write_atomic(path, data):
    """Writes bytes to path through path.tmp: flushed to disk, then renamed (a crash leaves the old file or none)."""
    tmp = path + ".tmp"
    TEMPORARIES[tmp] = None
    f = write_guard(tmp, open, tmp, "wb")
    TEMPORARIES[tmp] = f
    write_guard(tmp, f.write, data)
    write_guard(tmp, f.flush)
    write_guard(tmp, os.fsync, f.fileno())
    TEMPORARIES[tmp] = None
    write_guard(tmp, f.close)
    write_guard(path, os.replace, tmp, path)
    del TEMPORARIES[tmp]


# ----------------------------------------------------------------------------
# The shard format.
def encode_header(vocab_size, token_bytes, num_samples, num_tokens, max_len, special, data_crc):
    fields = [MAGIC, VERSION, HEADER_BYTES, vocab_size, token_bytes, num_samples, num_tokens, max_len,
              special["pad"], special["cls"], special["sep"], special["mask"], special["unk"], data_crc, 0]
    raw = HEADER_STRUCT.pack(*fields).ljust(HEADER_BYTES, b"\0")
    fields[-1] = zlib.crc32(raw)  # the header CRC is taken with its own field zero
    return HEADER_STRUCT.pack(*fields).ljust(HEADER_BYTES, b"\0")


class ShardWriter:
    """Writes one shard: samples appended one at a time, header and offsets written at close()."""

    def __init__(self, path, vocab_size, special, max_len):
        self.path, self.vocab_size, self.special, self.max_len = path, vocab_size, special, max_len
        self.dtype = np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")
        self.tmp = path + ".tmp"
        TEMPORARIES[self.tmp] = None
        self.f = write_guard(self.tmp, open, self.tmp, "wb")
        TEMPORARIES[self.tmp] = self.f
        write_guard(self.tmp, self.f.write, b"\0" * HEADER_BYTES)  # placeholder until the checksum is known
        self.crc, self.num_tokens, self.lengths, self.pending, self.pending_tokens = 0, 0, [], [], 0

    def add(self, ids):
        n = len(ids)
        if not 1 <= n <= self.max_len:
            raise ValueError(f"sample of {n} tokens (expected 1..{self.max_len})")
        if int(ids.max()) >= self.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"token id {int(ids.max())} outside the vocabulary of {self.vocab_size}")
        self.pending.append(ids.astype(self.dtype, copy=False))
        self.lengths.append(n)
        self.num_tokens += n
        self.pending_tokens += n
        if self.pending_tokens >= 1 << 22:
            self._flush()

    def add_many(self, tokens, lengths):
        """Appends len(lengths) samples whose ids lie back to back in tokens: what add() does for each, at once."""
        if len(lengths) == 0:
            return
        if int(lengths.min()) < 1 or int(lengths.max()) > self.max_len:
            raise ValueError(f"sample of {int(lengths.max())} tokens (expected 1..{self.max_len})")
        if int(tokens.max()) >= self.vocab_size or int(tokens.min()) < 0:
            raise ValueError(f"token id {int(tokens.max())} outside the vocabulary of {self.vocab_size}")
        n = int(tokens.size)
        self.pending.append(tokens.astype(self.dtype))
        self.lengths.extend(lengths.tolist())
        self.num_tokens += n
        self.pending_tokens += n
        if self.pending_tokens >= 1 << 22:
            self._flush()

    def _flush(self):
        if self.pending:
            data = np.concatenate(self.pending).tobytes()
            self.crc = zlib.crc32(data, self.crc)
            write_guard(self.tmp, self.f.write, data)
        self.pending, self.pending_tokens = [], 0

    def close(self):
        self._flush()
        pad = b"\0" * (-(self.num_tokens * self.dtype.itemsize) % 8)
        offsets = np.zeros(len(self.lengths) + 1, dtype="<u8")
        np.cumsum(np.asarray(self.lengths, dtype=np.uint64), out=offsets[1:])
        tail = pad + offsets.tobytes()
        self.crc = zlib.crc32(tail, self.crc)
        write_guard(self.tmp, self.f.write, tail)
        write_guard(self.tmp, self.f.seek, 0)
        write_guard(self.tmp, self.f.write, encode_header(self.vocab_size, self.dtype.itemsize, len(self.lengths),
                                                          self.num_tokens, self.max_len, self.special, self.crc))
        write_guard(self.tmp, self.f.flush)
        write_guard(self.tmp, os.fsync, self.f.fileno())
        TEMPORARIES[self.tmp] = None
        write_guard(self.tmp, self.f.close)
        write_guard(self.path, os.replace, self.tmp, self.path)
        del TEMPORARIES[self.tmp]
        WRITTEN.append(self.path)
        return os.path.getsize(self.path)


def read_shard(path, check=True):
    """Reads a shard (memory-mapped): returns (header dict, tokens array, offsets array).
    With check, validates it as data.h does and raises ValueError naming the file."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"{path}: truncated: {size} bytes, smaller than the {HEADER_BYTES}-byte header")
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    (magic, version, header_bytes, vocab, tb, ns, nt, max_len, pad, cls, sep, mask, unk, data_crc,
     header_crc) = HEADER_STRUCT.unpack_from(raw)
    h = dict(version=version, vocab_size=vocab, token_bytes=tb, num_samples=ns, num_tokens=nt, max_len=max_len,
             pad_id=pad, cls_id=cls, sep_id=sep, mask_id=mask, unk_id=unk, data_crc=data_crc)
    if check:
        if magic != MAGIC:
            raise ValueError(f"{path}: wrong magic {magic!r} (expected {MAGIC!r})")
        if version != VERSION or header_bytes != HEADER_BYTES:
            raise ValueError(f"{path}: version {version}, header {header_bytes} bytes (expected {VERSION}, {HEADER_BYTES})")
        if zlib.crc32(raw[:68] + b"\0\0\0\0" + raw[72:]) != header_crc:
            raise ValueError(f"{path}: header checksum mismatch")
        if tb not in (2, 4):
            raise ValueError(f"{path}: token width {tb} (expected 2 or 4)")
        want = (HEADER_BYTES + nt * tb + 7) // 8 * 8 + 8 * (ns + 1)
        if want != size:
            raise ValueError(f"{path}: file is {size} bytes, the header implies {want}")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    off_pos = (HEADER_BYTES + nt * tb + 7) // 8 * 8
    tokens = mm[HEADER_BYTES:HEADER_BYTES + nt * tb].view("<u2" if tb == 2 else "<u4")
    offsets = mm[off_pos:off_pos + 8 * (ns + 1)].view("<u8")
    if check:
        crc = 0
        for pos in range(HEADER_BYTES, size, 1 << 24):
            crc = zlib.crc32(mm[pos:min(size, pos + (1 << 24))], crc)
        if crc != data_crc:
            raise ValueError(f"{path}: data checksum 0x{crc:08x}, the header says 0x{data_crc:08x}")
        lengths = np.diff(offsets.astype(np.int64))
        if ns == 0 or offsets[0] != 0 or offsets[-1] != nt or lengths.min() < 1 or lengths.max() > max_len:
            raise ValueError(f"{path}: offsets out of range")
        if nt and int(tokens.max()) >= vocab:
            raise ValueError(f"{path}: token id {int(tokens.max())} outside the vocabulary of {vocab}")
    return h, tokens, offsets


# ----------------------------------------------------------------------------
# Splits: documents go to train or val; each split is a series of shards with a summary.
class Split:
    def __init__(self, name, out_dir, vocab_size, special, seq_len, shard_tokens):
        self.name, self.out_dir, self.vocab_size, self.special = name, out_dir, vocab_size, special
        self.seq_len, self.shard_tokens = seq_len, shard_tokens
        self.writer, self.shards, self.bytes = None, 0, 0
        self.documents = self.samples = self.tokens = self.split_documents = 0

    def add_document(self, content):
        """content: the document's token ids (no [CLS]/[SEP]). Split into samples of at most
        seq_len tokens, each [CLS] piece [SEP], never truncated."""
        room = self.seq_len - 2
        self.documents += 1
        if len(content) > room:
            self.split_documents += 1
        for i in range(0, len(content), room):
            piece = content[i:i + room]
            sample = np.empty(len(piece) + 2, dtype=np.int64)
            sample[0], sample[-1] = self.special["cls"], self.special["sep"]
            sample[1:-1] = piece
            if self.writer is None:
                path = os.path.join(self.out_dir, f"{self.name}_{self.shards:05d}.bin")
                self.writer = ShardWriter(path, self.vocab_size, self.special, self.seq_len)
            self.writer.add(sample)
            self.samples += 1
            self.tokens += len(sample)
            if self.writer.num_tokens >= self.shard_tokens:
                self.close_shard()

    def add_documents(self, flat, lengths):
        """What add_document does for each of several documents, at once: flat holds their token ids back to back,
        lengths their lengths (each at least 1). The shards come out the same, byte for byte."""
        if len(lengths) == 0:
            return
        room = self.seq_len - 2
        pieces = (lengths + room - 1) // room
        self.documents += len(lengths)
        self.split_documents += int((lengths > room).sum())
        n_pieces = int(pieces.sum())
        piece_len = np.full(n_pieces, room, dtype=np.int64)
        piece_len[np.cumsum(pieces) - 1] = lengths - room * (pieces - 1)  # each document's last piece
        ends = np.cumsum(piece_len + 2)  # the samples, [CLS] piece [SEP], back to back
        starts = ends - (piece_len + 2)
        samples = np.empty(int(ends[-1]), dtype=np.int64)
        samples[starts] = self.special["cls"]
        samples[ends - 1] = self.special["sep"]
        samples[np.arange(flat.size) + 2 * np.repeat(np.arange(n_pieces), piece_len) + 1] = flat
        i = 0
        while i < n_pieces:
            if self.writer is None:
                path = os.path.join(self.out_dir, f"{self.name}_{self.shards:05d}.bin")
                self.writer = ShardWriter(path, self.vocab_size, self.special, self.seq_len)
            # the shard closes after the sample that brings it to shard_tokens, as add_document closes it
            j = int(np.searchsorted(ends, starts[i] + self.shard_tokens - self.writer.num_tokens))
            j = min(j, n_pieces - 1)
            self.writer.add_many(samples[starts[i]:ends[j]], piece_len[i:j + 1] + 2)
            self.samples += j + 1 - i
            self.tokens += int(ends[j] - starts[i])
            if self.writer.num_tokens >= self.shard_tokens:
                self.close_shard()
            i = j + 1

    def close_shard(self):
        if self.writer is not None:
            self.bytes += self.writer.close()
            self.shards += 1
            self.writer = None

    def summary(self):
        padded = self.samples * self.seq_len  # what one padded row per sample would have stored
        return dict(split=self.name, documents=self.documents, samples=self.samples, tokens=self.tokens,
                    split_documents=self.split_documents, shards=self.shards, bytes_on_disk=self.bytes,
                    padding_avoided_tokens=padded - self.tokens,
                    padding_avoided_percent=round(100.0 * (padded - self.tokens) / padded, 2) if padded else 0.0)


def make_out_dir(out):
    """--out created (with its parents) and proven writable, or one line naming it and an exit."""
    if os.path.exists(out) and not os.path.isdir(out):
        die(f"--out {out}: exists and is not a directory")
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, f".write_test.{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.remove(probe)
    except OSError as e:
        die(f"--out {out}: cannot create or write the directory: {e.strerror or first_line(e)}")


class Output:
    def __init__(self, args, vocab_size, special):
        make_out_dir(args.out)
        for old in glob.glob(os.path.join(args.out, "train_*.bin")) + glob.glob(os.path.join(args.out, "val_*.bin")):
            os.remove(old)  # a re-run must not leave shards of an earlier run behind
        if os.path.exists(os.path.join(args.out, "meta.json")):
            os.remove(os.path.join(args.out, "meta.json"))  # it described those shards
        self.splits = {n: Split(n, args.out, vocab_size, special, args.seq_len, args.shard_tokens) for n in ("train", "val")}
        self.rng = random.Random(args.seed)
        self.val_fraction, self.args, self.vocab_size, self.special = args.val_fraction, args, vocab_size, special
        self.max_tokens, self.taken = args.max_tokens, 0  # the --max-tokens budget: document tokens taken so far

    @property
    def full(self):
        """True once --max-tokens document tokens have been taken: the caller stops reading."""
        return self.max_tokens is not None and self.taken >= self.max_tokens

    def add_document(self, content):
        if self.max_tokens is not None:  # the document that reaches the budget is cut there
            content = content[:max(0, self.max_tokens - self.taken)]
            self.taken += len(content)
        if len(content) == 0:
            return
        split = "val" if self.rng.random() < self.val_fraction else "train"
        self.splits[split].add_document(content)

    def add_documents(self, flat, lengths):
        """What add_document does for each of several documents (none empty), at once: flat holds their token ids
        back to back, lengths their lengths. The same budget, the same draws, the same shards."""
        if self.max_tokens is not None:
            left = max(0, self.max_tokens - self.taken)
            ends = np.cumsum(lengths)
            k = int(np.searchsorted(ends, left))  # the document that reaches the budget, cut there; none after it
            if k < len(lengths):
                lengths = lengths[:k + 1].copy()
                lengths[k] = left - (int(ends[k - 1]) if k else 0)
                if lengths[k] == 0:
                    lengths = lengths[:k]
                flat = flat[:int(lengths.sum())]
            self.taken += int(lengths.sum())
        if len(lengths) == 0:
            return
        rnd = self.rng.random
        val = np.fromiter((rnd() < self.val_fraction for _ in range(len(lengths))), dtype=bool, count=len(lengths))
        if not val.any():
            self.splits["train"].add_documents(flat, lengths)
            return
        per_token = np.repeat(val, lengths)
        self.splits["train"].add_documents(flat[~per_token], lengths[~val])
        self.splits["val"].add_documents(flat[per_token], lengths[val])

    def finish(self, extra, report=()):
        for s in self.splits.values():
            s.close_shard()
        rows = [s.summary() for s in self.splits.values()]
        meta = dict(format_version=VERSION, kind=self.args.cmd, vocab_size=self.vocab_size, seq_len=self.args.seq_len,
                    special_ids=self.special, splits=rows, command=" ".join(sys.argv), **extra)
        write_atomic(os.path.join(self.args.out, "meta.json"), json.dumps(meta, indent=2).encode())
        print(f"\n{'split':6} {'documents':>10} {'samples':>11} {'tokens':>14} {'split docs':>10} "
              f"{'padding avoided':>24} {'shards':>6} {'bytes on disk':>15}")
        for r in rows:
            pad = f"{r['padding_avoided_tokens']:,} ({r['padding_avoided_percent']}%)"
            print(f"{r['split']:6} {r['documents']:>10,} {r['samples']:>11,} {r['tokens']:>14,} {r['split_documents']:>10,} "
                  f"{pad:>24} {r['shards']:>6} {r['bytes_on_disk']:>15,}")
        for k, v in extra.items():
            if not isinstance(v, dict):
                print(f"{k}: {v}")
        for line in report:  # what was skipped, and why
            print(line)
        if self.splits["train"].samples == 0:
            die("the train split is empty: no document had any tokens")
        return rows


def progress(total, unit, desc=None):
    """A progress bar on stderr (tqdm), or None: quiet when stderr is not a terminal (unless PREPARE_PROGRESS=1).
    On a terminal it appears once a run has lasted a second; PREPARE_PROGRESS=1 shows it at once."""
    forced = os.environ.get("PREPARE_PROGRESS") == "1"
    if tqdm is None or not sys.stderr.isatty() and not forced:
        return None
    return tqdm(total=total, unit=unit, unit_scale=True, dynamic_ncols=True, desc=desc, delay=0 if forced else 1.0,
                file=sys.stderr)


def bounded(files, args):
    """The files to read. With a bound (--max-files N, --max-tokens N) they are taken in a random order
    seeded by --seed, so that a bounded corpus samples the whole input instead of its first directories;
    --max-files keeps the first N of that order. Without a bound: every file, in sorted order."""
    if args.max_files is None and args.max_tokens is None:
        return files
    files = list(files)
    random.Random(args.seed).shuffle(files)
    return files[:args.max_files] if args.max_files is not None else files


def bound_summary(args, read, out):
    """meta.json's record of the bounds: what was asked and whether the token budget stopped the reading."""
    if args.max_files is None and args.max_tokens is None:
        return {}
    return dict(max_files=args.max_files, max_tokens=args.max_tokens, files_read=read, max_tokens_reached=out.full)


def inside(path, directory):
    """True when the real path `path` is the real path `directory` or lies under it."""
    return path == directory or os.path.commonpath([path, directory]) == directory


def refuse_input_in_out(inputs, out):
    """An --input that is --out itself or lies inside it is refused before anything is removed: a run starts by
    removing the earlier shards and meta.json in --out (and it would read what it writes)."""
    real_out = os.path.realpath(out)
    for inp in inputs:
        if os.path.lexists(inp) and inside(os.path.realpath(inp), real_out):
            what = "is --out itself" if os.path.realpath(inp) == real_out else f"lies inside --out {out}"
            die(f"--input {inp} {what}: a run replaces the shards and meta.json in --out and must not read "
                f"them; choose an --out that does not hold the input (nothing was removed)")


class Listing:
    """The files under the inputs, sorted, and what the listing left out."""

    def __init__(self):
        self.files = []
        self.named = set()  # the files named on --input themselves (not found in a directory)
        self.hidden = 0  # names starting with '.' not read (text): files, and directories not descended into
        self.in_out = 0  # files inside --out, never read (an --out inside an --input directory)
        self.bad_dirs = []  # (directory, why) for directories that could not be listed


def list_files(inputs, out=None, hidden=True):
    """Every regular file under the inputs (directories recursively), each real file once, sorted, as a Listing.
    Nothing inside --out is taken (an --out inside an input directory is not read); with hidden False, names that
    start with '.' inside a directory are left out too (a .git directory, editors' files)."""
    real_out = os.path.realpath(out) if out else None
    seen, listing = set(), Listing()

    def unlisted(e):
        listing.bad_dirs.append((e.filename, e.strerror or first_line(e)))

    for inp in inputs:
        if not os.path.exists(inp):
            die(f"--input {inp}: no such file or directory")
        if not os.path.isfile(inp) and not os.path.isdir(inp):
            die(f"--input {inp}: not a regular file or a directory (a device, FIFO or socket is not a corpus)")
        walk = [(inp, [], [""])] if os.path.isfile(inp) else os.walk(inp, onerror=unlisted)
        for root, dirs, names in walk:
            keep = []
            for n in dirs:
                if not hidden and n.startswith("."):
                    listing.hidden += 1
                elif real_out is not None and inside(os.path.realpath(os.path.join(root, n)), real_out):
                    listing.in_out += 1
                else:
                    keep.append(n)
            dirs[:] = keep
            for n in sorted(names):
                p = os.path.join(root, n) if n else root
                if n and not hidden and n.startswith("."):
                    listing.hidden += 1
                    continue
                try:
                    real = os.path.realpath(p)
                    if real in seen or not os.path.isfile(real):
                        continue
                    if real_out is not None and inside(real, real_out):
                        listing.in_out += 1
                        continue
                    seen.add(real)
                    listing.files.append(p)
                    if not n:
                        listing.named.add(p)
                except OSError:
                    continue
    listing.files.sort()
    return listing


# ----------------------------------------------------------------------------
# Text inputs. The format of a file comes from its name: .parquet is Parquet (a string column, --text-field);
# .jsonl, .ndjson and .json are JSON Lines (one object per line, its string field --text-field); anything else is
# text, read as UTF-8 (--doc-per). A .gz, .zst, .bz2 or .xz suffix is decompressed first, as a stream
# (foo.jsonl.zst is compressed JSON Lines). Every reader streams: a document at most --max-doc-chars characters,
# a batch of documents at a time in memory, never a whole file (but for --doc-per file) nor the corpus.
#
# What cannot be read is skipped and counted by reason, and the count is printed at the end and kept in meta.json:
# a whole file (unreadable, not UTF-8 text, not JSON Lines, no text column, damaged or truncated, an archive) or
# one document (not UTF-8, not a JSON object, no text field, not a string, too long, empty). With --strict the
# first of these (an empty document excepted) is an error naming the file, the line and what was expected. A file
# named on --input itself (not found in a directory) is checked before anything is written: one that does not
# open as its format is an error, as if --strict.
COMPRESSIONS = ((".gz", "gzip"), (".zst", "zstd"), (".zstd", "zstd"), (".bz2", "bz2"), (".xz", "xz"))
ARCHIVES = (".tar", ".tgz", ".tbz", ".tbz2", ".txz", ".zip", ".7z", ".rar")
JSON_LINES = (".jsonl", ".ndjson", ".json")
FORMAT_NAMES = {"text": "text", "jsonl": "JSON Lines", "parquet": "Parquet", None: "other"}
COMPRESSION_NAMES = {"gzip": ".gz", "zstd": ".zst", "bz2": ".bz2", "xz": ".xz"}
CHUNK_BYTES = 1 << 20  # a text file is read and decoded a chunk at a time
SNIFF_BYTES = 1 << 16  # a text file's first 64 KiB decide whether it is text
BATCH_DOCS, BATCH_CHARS = 2048, 1 << 23  # documents per encode_batch call: whichever comes first

FILE_SKIPS = {  # reason: what the summary says
    "unreadable": "unreadable",
    "empty": "empty",
    "not_text": "not UTF-8 text",
    "not_jsonl": "not JSON Lines",
    "no_column": "without a string column {field!r}",
    "damaged": "damaged or truncated",
    "unsupported": "in an unsupported format",
}
DOC_SKIPS = {
    "undecodable": "not UTF-8",
    "bad_json": "not a JSON object",
    "missing_field": "without the field {field!r} (or null)",
    "not_string": "whose field {field!r} is not a string",
    "too_long": "longer than --max-doc-chars ({cap:,} characters)",
    "empty": "empty (no text, or no tokens)",
}
_SURROGATE = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of a byte that is not UTF-8
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # what JSON's \\ud800 escape without its pair makes
LONE_SURROGATE = "a lone surrogate: a \\ud800-\\udfff escape without its pair"


class InputError(Exception):
    """A bad input that ends the run: under --strict, or a file named on --input that is not in its format."""


class Skip(Exception):
    """A file (the rest of it) that cannot be read: reason (a FILE_SKIPS key) and detail."""

    def __init__(self, reason, detail=""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def read_errors():
    """The exceptions that mean a file is damaged or unreadable, from the readers in use."""
    errs = [OSError, EOFError, zlib.error, lzma.LZMAError]
    for mod, name in (("zstandard", "ZstdError"), ("pyarrow", "ArrowException")):
        m = sys.modules.get(mod)
        if m is not None:
            errs.append(getattr(m, name))
    return tuple(errs)


def json_type(v):
    """The JSON name of a parsed value's type."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(v), type(v).__name__)


def read_skip(e):
    """The Skip for an exception of a reader: an OSError with an errno (EACCES, EIO) is an unreadable file, anything
    else (a bad gzip header, a stream that ends too early, a Parquet file without its footer) a damaged one."""
    if isinstance(e, OSError) and e.errno:
        return Skip("unreadable", e.strerror or first_line(e))
    return Skip("damaged", first_line(e))


def classify(path):
    """(format, compression) from a file's name: format "text", "jsonl" or "parquet", compression None, "gzip",
    "zstd", "bz2" or "xz"; or (None, why) for a format prepare.py does not read."""
    name = os.path.basename(path).lower()
    comp = None
    for ext, c in COMPRESSIONS:
        if name.endswith(ext):
            comp, name = c, name[:-len(ext)]
            break
    if name.endswith(ARCHIVES):
        return None, "an archive: unpack it first"
    if name.endswith(".parquet"):
        return ("parquet", None) if comp is None else (None, "a compressed Parquet file: decompress it "
                                                             "(Parquet compresses its own pages)")
    return ("jsonl" if name.endswith(JSON_LINES) else "text"), comp


def decode_lines(part, universal):
    """The lines of `part` (bytes, no final newline) as (lines, bad): bad None, or {index: "undecodable"} for the
    lines that are not UTF-8 (their text replaced by ""). With universal, \\r\\n and \\r end lines too."""
    try:
        text, bad = part.decode("utf-8"), None
    except UnicodeDecodeError:
        text, bad = part.decode("utf-8", "surrogateescape"), {}
    if universal and "\r" in text:
        if text.endswith("\r"):  # the \r of the \r\n that ended this part
            text = text[:-1]
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if bad is not None:
        for i, line in enumerate(lines):
            if _SURROGATE.search(line):
                bad[i], lines[i] = "undecodable", ""
    return lines, bad


def line_chunks(stream, guard, universal=True):
    """The lines of a binary stream, decoded a chunk at a time: yields (lines, bad) as decode_lines does, where bad
    also marks "too_long" a line of more than `guard` bytes (never held in memory: read past)."""
    pending, pending_bytes, dropping = [], 0, False
    read = stream.read
    while True:
        block = read(CHUNK_BYTES)
        if not block:
            if dropping:
                yield [""], {0: "too_long"}
            elif pending:
                yield decode_lines(b"".join(pending), universal)
            return
        if dropping:
            nl = block.find(b"\n")
            if nl < 0:
                continue
            yield [""], {0: "too_long"}
            dropping, block = False, block[nl + 1:]
        end = block.rfind(b"\n")
        if end < 0:
            pending.append(block)
            pending_bytes += len(block)
            if pending_bytes > guard:
                pending, pending_bytes, dropping = [], 0, True
            continue
        part = b"".join(pending + [block[:end]]) if pending else block[:end]
        rest = block[end + 1:]
        pending, pending_bytes = ([rest], len(rest)) if rest else ([], 0)
        yield decode_lines(part, universal)


class Source:
    """One input file of `prepare.py text`: checked (check()), then its documents (documents(skips))."""

    def __init__(self, path, args):
        self.path, self.args = path, args
        self.fmt, self.comp = classify(path)
        self.why = self.comp if self.fmt is None else None  # why a format is not read
        self.field, self.cap, self.doc_per = args.text_field, args.max_doc_chars, args.doc_per
        self.guard = 8 * self.cap + 1024  # bytes: a line longer than this is too long before it is decoded
        self.raw, self.pf, self.rows, self.rows_done = None, None, 0, 0
        try:
            self.size = os.path.getsize(path)
        except OSError:
            self.size = 0

    @property
    def expected(self):
        if self.fmt == "parquet":
            return f"a Parquet file with a string column {self.field!r} (--text-field)"
        if self.fmt == "jsonl":
            return f"JSON Lines: one JSON object per line with a string field {self.field!r} (--text-field)"
        if self.fmt == "text":
            return "UTF-8 text"
        return "text, JSON Lines (.jsonl, .json), Parquet (.parquet), optionally .gz, .zst, .bz2 or .xz"

    def where(self, n):
        """The place of document n: "path line n", "path row n" (Parquet) or "path"."""
        if n is None:
            return self.path
        return f"{self.path} {'row' if self.fmt == 'parquet' else 'line'} {n:,}"

    def position(self):
        """Bytes of the file read so far (the compressed bytes of a compressed file), for the progress bar."""
        if self.fmt == "parquet":
            return self.size * self.rows_done // max(1, self.rows)
        try:
            return self.raw.tell() if self.raw is not None and not self.raw.closed else self.size
        except (OSError, ValueError):
            return 0

    def _open(self):
        """The file's decompressed byte stream (self.raw is the file itself). Raises Skip."""
        try:
            raw = open(self.path, "rb")
        except OSError as e:
            raise read_skip(e) from None
        self.raw = raw
        try:
            if self.comp is None:
                return raw
            if self.comp == "gzip":
                return gzip.GzipFile(fileobj=raw, mode="rb")
            if self.comp == "zstd":
                import zstandard
                return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True),
                                         CHUNK_BYTES)
            if self.comp == "bz2":
                import bz2
                return bz2.BZ2File(raw)
            return lzma.LZMAFile(raw)
        except read_errors() as e:
            raw.close()
            raise read_skip(e) from None

    def _close(self, stream):
        for f in (stream, self.raw):
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a damaged stream may raise anything its reader raises
                pass

    def check(self):
        """Raises Skip when the file does not open as its format (it reads the head of the file only)."""
        if self.fmt is None:
            raise Skip("unsupported", self.why)
        if self.fmt == "parquet":
            return self._open_parquet()
        stream = self._open()
        try:
            if self.fmt == "text":
                head = stream.read(SNIFF_BYTES)
                if not head:
                    raise Skip("empty", "no bytes" if self.comp is None else "no bytes once decompressed")
                if b"\0" in head:
                    raise Skip("not_text", "a NUL byte in its first 64 KiB: binary")
                lines = head.split(b"\n")
                if len(head) == SNIFF_BYTES and len(lines) > 1:
                    lines.pop()  # the last line may be cut
                lines = [ln for ln in lines if ln.strip()]
                bad = 0
                for ln in lines:
                    try:
                        codecs.utf_8_decode(ln, "strict", False)  # (a character cut at the end of the head is not bad)
                    except UnicodeDecodeError:
                        bad += 1
                if bad * 2 > len(lines):
                    raise Skip("not_text", f"{bad} of its first {len(lines)} lines are not UTF-8")
            else:  # JSON Lines: one of the first 10 lines that are not blank is an object (one bad record is not
                # the end of a file; a pretty-printed JSON document has no such line)
                base, tried, first = 0, 0, None
                for lines, bad in line_chunks(stream, self.guard, universal=False):
                    for i, line in enumerate(lines):
                        n = base + i + 1
                        if bad is not None and i in bad:
                            why = f"line {n:,} is " + DOC_SKIPS[bad[i]].format(cap=self.cap, field=self.field)
                        elif not line or line.isspace():
                            continue
                        else:
                            try:
                                rec = json.loads(line)
                            except ValueError as e:
                                why = f"line {n:,}: {first_line(e)}"
                            else:
                                if isinstance(rec, dict):
                                    return
                                why = f"line {n:,} is a JSON {json_type(rec)}, not an object"
                        first, tried = first or why, tried + 1
                        if tried == 10:
                            raise Skip("not_jsonl", first)
                    base += len(lines)
                if first is not None:
                    raise Skip("not_jsonl", first)
                raise Skip("empty", "no JSON object")
        except read_errors() as e:
            raise read_skip(e) from None
        finally:
            self._close(stream)

    def _open_parquet(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(self.path)
        except OSError as e:
            raise read_skip(e) from None
        except read_errors() as e:
            raise Skip("damaged", f"not a readable Parquet file: {first_line(e)}") from None
        schema = pf.schema_arrow
        i = schema.get_field_index(self.field)
        if i < 0:
            names = ", ".join(schema.names[:12]) + (", ..." if len(schema.names) > 12 else "")
            raise Skip("no_column", f"its columns: {names}")
        t = schema.field(i).type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or getattr(pa.types, "is_string_view", lambda _: False)(t)):
            raise Skip("no_column", f"the column {self.field!r} is {t}, not strings")
        self.pf, self.rows = pf, pf.metadata.num_rows

    def documents(self, skips):
        """Yields (text, n) for each document (n its line or row, or None), reporting the documents it skips to
        skips.doc(reason, self, n, detail); raises Skip when the file cannot be read (any further)."""
        self.check()
        if self.fmt == "parquet":
            gen = self._parquet_documents(skips)
        else:
            stream = self._open()
            gen = (self._jsonl_documents if self.fmt == "jsonl" else self._text_documents)(stream, skips)
        try:
            yield from gen
        except read_errors() as e:
            raise read_skip(e) from None
        finally:
            gen.close()
            if self.fmt == "parquet":
                getattr(self.pf, "close", lambda: None)()
                self.pf = None
            else:
                self._close(stream)

    def _text_documents(self, stream, skips):
        cap, mode = self.cap, self.doc_per
        if mode == "file":
            data = stream.read(self.guard + 1)
            if len(data) > self.guard:
                skips.doc("too_long", self, None, f"more than {self.guard:,} bytes")
                return
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                skips.doc("undecodable", self, None, f"byte {e.start:,}")
                return
            if "\r" in text:  # universal newlines, as text mode reads a file
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            if len(text) > cap:
                skips.doc("too_long", self, None, f"{len(text):,} characters")
            elif not text or text.isspace():
                skips.doc("empty", self, None)
            else:
                yield text, None
            return
        base = 0
        if mode == "line":
            for lines, bad in line_chunks(stream, self.guard):
                for i, line in enumerate(lines):
                    if bad is not None and i in bad:
                        skips.doc(bad[i], self, base + i + 1)
                        continue
                    s = line.strip()
                    if s:
                        if len(s) > cap:
                            skips.doc("too_long", self, base + i + 1, f"{len(s):,} characters")
                        else:
                            yield s, base + i + 1
                base += len(lines)
            return
        # blank-line separated paragraphs: each line stripped, the lines joined by a space
        para, size, start, spoiled = [], 0, 0, None
        for lines, bad in line_chunks(stream, self.guard):
            for i, line in enumerate(lines):
                if bad is not None and i in bad:
                    if not para and spoiled is None:
                        start = base + i + 1
                    spoiled = spoiled or bad[i]
                    para, size = [], 0
                    continue
                s = line.strip()
                if s:
                    if spoiled is not None:
                        continue
                    if not para:
                        start = base + i + 1
                    size += len(s) + 1
                    if size > cap + 1:
                        spoiled, para = "too_long", []
                        continue
                    para.append(s)
                elif spoiled is not None:
                    skips.doc(spoiled, self, start)
                    spoiled, size = None, 0
                elif para:
                    yield " ".join(para), start
                    para, size = [], 0
            base += len(lines)
        if spoiled is not None:
            skips.doc(spoiled, self, start)
        elif para:
            yield " ".join(para), start

    def _jsonl_documents(self, stream, skips):
        field, cap, loads = self.field, self.cap, json.loads
        base = 0
        for lines, bad in line_chunks(stream, self.guard, universal=False):
            for i, line in enumerate(lines):
                if bad is not None and i in bad:
                    skips.doc(bad[i], self, base + i + 1)
                    continue
                if not line or line.isspace():
                    continue
                try:
                    rec = loads(line)
                except ValueError as e:
                    skips.doc("bad_json", self, base + i + 1, first_line(e))
                    continue
                if type(rec) is not dict:
                    skips.doc("bad_json", self, base + i + 1, f"a JSON {json_type(rec)}")
                    continue
                v = rec.get(field)
                if type(v) is not str:
                    if v is None:
                        keys = ", ".join(list(rec)[:12])
                        skips.doc("missing_field", self, base + i + 1, f"its fields: {keys}" if field not in rec
                                  else "null")
                    else:
                        skips.doc("not_string", self, base + i + 1, f"a JSON {json_type(v)}")
                elif len(v) > cap:
                    skips.doc("too_long", self, base + i + 1, f"{len(v):,} characters")
                elif not v or v.isspace():
                    skips.doc("empty", self, base + i + 1)
                elif "\\u" in line and _LONE_SURROGATE.search(v):  # (no tokenizer takes it)
                    skips.doc("undecodable", self, base + i + 1, LONE_SURROGATE)
                else:
                    yield v, base + i + 1
            base += len(lines)

    def _parquet_documents(self, skips):
        cap, row = self.cap, 0
        for batch in self.pf.iter_batches(batch_size=BATCH_DOCS, columns=[self.field]):
            for v in batch.column(0).to_pylist():
                row += 1
                if type(v) is not str:
                    if v is None:
                        skips.doc("missing_field", self, row, "null")
                        continue
                    try:
                        v = v.decode("utf-8")  # a binary column
                    except UnicodeDecodeError as e:
                        skips.doc("undecodable", self, row, f"byte {e.start:,}")
                        continue
                if len(v) > cap:
                    skips.doc("too_long", self, row, f"{len(v):,} characters")
                elif not v or v.isspace():
                    skips.doc("empty", self, row)
                else:
                    yield v, row
            self.rows_done = row


class Skips:
    """What was skipped, by reason: counts and the first example of each. Under strict, a skip is an InputError."""

    def __init__(self, args):
        self.strict, self.field, self.cap = args.strict, args.text_field, args.max_doc_chars
        self.files, self.docs, self.first = {}, {}, {}

    def _what(self, table, reason):
        return table[reason].format(field=self.field, cap=self.cap)

    def file(self, reason, src, detail="", named=False):
        if (self.strict or named) and reason != "empty":
            why = " (--strict)" if self.strict else (
                " (a file named on --input must be readable as its format; one found in a directory named on --input "
                "is skipped and counted)")
            raise InputError(f"{src.path}: {self._what(FILE_SKIPS, reason).split(' (')[0]}"
                             f"{f' ({detail})' if detail else ''}; expected {src.expected}{why}")
        self.files[reason] = self.files.get(reason, 0) + 1
        self.first.setdefault(("file", reason), f"{src.path}{f': {detail}' if detail else ''}")

    def unlisted(self, directory, why):
        """A directory under an --input that could not be listed."""
        if self.strict:
            raise InputError(f"{directory}: cannot list the directory ({why}) (--strict)")
        self.files["unreadable"] = self.files.get("unreadable", 0) + 1
        self.first.setdefault(("file", "unreadable"), f"{directory}: a directory: {why}")

    def doc(self, reason, src, n, detail=""):
        if self.strict and reason != "empty":
            raise InputError(f"{src.where(n)}: {self._what(DOC_SKIPS, reason)}{f' ({detail})' if detail else ''}; "
                             f"expected {src.expected} (--strict)")
        self.docs[reason] = self.docs.get(reason, 0) + 1
        self.first.setdefault(("doc", reason), f"{src.where(n)}{f': {detail}' if detail else ''}")

    def summary(self, n_files):
        """The lines that say what was skipped and why."""
        lines = []
        for kind, table, counts, of in (("file", FILE_SKIPS, self.files, f" of {plural(n_files, 'file')}"),
                                        ("doc", DOC_SKIPS, self.docs, None)):
            if counts:
                n = sum(counts.values())
                lines.append(f"skipped {f'{n:,}{of}' if of else plural(n, 'document')}:")
                for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
                    lines.append(f"  {n:,} {self._what(table, reason)} (first: {self.first[(kind, reason)]})")
        return lines

    def short(self):
        """One line's worth: the reasons and counts, and an example."""
        parts = [f"{n:,} {self._what(FILE_SKIPS, r).split(' (')[0]}" for r, n in self.files.items()]
        parts += [f"{plural(n, 'document')} {self._what(DOC_SKIPS, r).split(' (')[0]}" for r, n in self.docs.items()]
        first = next(iter(self.first.values()), None)
        return ", ".join(parts) + (f"; first: {first}" if first else "")


def need_modules(sources):
    """The packages the inputs' formats need are importable, or one line saying which and an exit."""
    for want, mod, what in ((lambda s: s.fmt == "parquet", "pyarrow.parquet", "Parquet inputs need pyarrow"),
                            (lambda s: s.comp == "zstd", "zstandard", ".zst inputs need zstandard")):
        first = next((s for s in sources if want(s)), None)
        if first is not None:
            try:
                __import__(mod)
            except ImportError:
                die(f"{first.path}: {what}: python3 -m pip install -r tools/requirements.txt")


class Corpus:
    """The documents of the sources in order. A file that cannot be read is skipped and counted (an error under
    --strict, and when a file named on --input does not open as its format)."""

    def __init__(self, sources, skips, named):
        self.sources, self.skips, self.named = sources, skips, named
        self.files_read, self.done_bytes, self.current = 0, 0, None

    def documents(self, stop=None):
        """Yields (text, source, n); stop(), asked before each file, ends it when True."""
        for src in self.sources:
            if stop is not None and stop():
                break
            self.files_read += 1
            self.current = src
            try:
                for text, n in src.documents(self.skips):
                    yield text, src, n
            except Skip as k:  # (a named file was checked before the run: damage found later is counted)
                self.skips.file(k.reason, src, k.detail,
                                named=src.path in self.named and k.reason not in ("damaged", "empty"))
            self.done_bytes += src.size
        self.current = None

    def position(self):
        """Bytes read so far, for the progress bar."""
        return self.done_bytes + (self.current.position() if self.current is not None else 0)


# ----------------------------------------------------------------------------
# Text: WordPiece through Hugging Face tokenizers.
def load_tokenizer(args, sources, named):
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    if args.tokenizer:
        if not os.path.isfile(args.tokenizer):
            die(f"--tokenizer {args.tokenizer}: no such file (expected a tokenizer.json or a BERT vocab.txt)")
        try:
            if args.tokenizer.endswith(".json"):
                tok = Tokenizer.from_file(args.tokenizer)
            else:  # a BERT vocab.txt: one UTF-8 token per line
                with open(args.tokenizer, "rb") as f:
                    f.read().decode("utf-8")
                tok = BertWordPieceTokenizer(args.tokenizer, lowercase=args.lowercase)
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions
            die(f"--tokenizer {args.tokenizer}: not a tokenizer.json or a UTF-8 BERT vocab.txt ({first_line(e)})")
    else:
        tok = BertWordPieceTokenizer(lowercase=args.lowercase)
        print(f"training a WordPiece vocabulary of {args.train_vocab} on {len(sources)} files")
        skips, count = Skips(args), [0]  # this pass's skips are counted again by the tokenizing pass
        corpus = Corpus(sources, skips, named)
        bar = progress(sum(s.size for s in sources), "B", "vocabulary")

        def batches():
            batch = []
            for text, _, _ in corpus.documents():
                batch.append(text)
                if len(batch) >= 1000:
                    count[0] += len(batch)
                    if bar is not None:
                        bar.update(corpus.position() - bar.n)
                    yield batch
                    batch = []
            count[0] += len(batch)
            if batch:
                yield batch

        try:
            tok.train_from_iterator(batches(), vocab_size=args.train_vocab, min_frequency=2,
                                    special_tokens=list(SPECIAL_NAMES), show_progress=False)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions
            die(f"--train-vocab: training the vocabulary failed: {first_line(e)}")
        finally:
            if bar:
                bar.close()
        if count[0] == 0:
            nothing_to_tokenize(skips, len(sources))
    special = {}
    for key, name in zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_NAMES):
        i = tok.token_to_id(name)
        if i is None:
            die(f"the vocabulary has no {name} token (mlm.c needs {', '.join(SPECIAL_NAMES)})")
        special[key] = i
    if tok.post_processor is None:
        # [CLS] text [SEP], as the shards' samples are: what Hugging Face's tokenizer (AutoTokenizer, the fill-mask
        # pipeline) adds to an input from the export's copy of this file. The shards are encoded without it.
        from tokenizers import processors

        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", special["cls"]), ("[SEP]", special["sep"])])
    path = os.path.join(args.out, "tokenizer.json")
    TEMPORARIES[path + ".tmp"] = None
    write_guard(path + ".tmp", tok.save, path + ".tmp")
    write_atomic(path, open(path + ".tmp", "rb").read())
    WRITTEN.append(path)  # removed again if the run fails
    return tok, tok.get_vocab_size(), special


def nothing_to_tokenize(skips, n_files):
    remove_partial_output()
    die(f"nothing to tokenize: no document in the {plural(n_files, 'input file')} had any text "
        f"({skips.short() or 'every file is empty'})")


class Tokenize:
    """Documents in, through the tokenizer's batch encoding, token ids out to the Output. The encoding of a batch
    (tokenizers' threads, without the GIL) runs in a worker thread while this one reads the next batch and writes
    the one before: the documents still reach the Output in their order, the same shards as one at a time."""

    def __init__(self, tok, out, skips, corpus, bar):
        from concurrent.futures import ThreadPoolExecutor

        tok = getattr(tok, "_tokenizer", tok)  # the Tokenizer inside tokenizers' BertWordPieceTokenizer
        # encode_batch_fast (tokenizers >= 0.20): encode_batch without the character offsets, which are not kept
        self.encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        self.out, self.skips, self.corpus, self.bar = out, skips, corpus, bar
        self.texts, self.places, self.chars = [], [], 0
        self.tokens = 0
        self.pool, self.pending = ThreadPoolExecutor(1), None
        self.t0 = time.monotonic()

    def add(self, text, src, n):
        self.texts.append(text)
        self.places.append((src, n))
        self.chars += len(text)
        if len(self.texts) >= BATCH_DOCS or self.chars >= BATCH_CHARS:
            self.flush()

    def flush(self, last=False):
        """Sends the batch to be encoded and writes the one before it; with last, waits for everything."""
        if self.texts:
            job = self.pool.submit(self._encode, self.texts), self.places
            self.texts, self.places, self.chars = [], [], 0
        else:
            job = None
        if self.pending is not None and not self.out.full:
            self._write(*self.pending)
        self.pending = job
        if last and job is not None:
            self.flush(last=True)

    def close(self):
        self.pool.shutdown(wait=False)

    def _encode(self, texts):
        """(encodings, refused): refused holds (index, error) of the texts the tokenizer did not take."""
        try:
            return self.encode(texts, add_special_tokens=False), []
        except Exception:  # noqa: BLE001 - a text the tokenizer refuses (a lone surrogate from a JSON escape)
            encodings, refused = [], []
            for i, text in enumerate(texts):
                try:
                    encodings.append(self.encode([text], add_special_tokens=False)[0])
                except Exception as e:  # noqa: BLE001
                    encodings.append(None)
                    refused.append((i, LONE_SURROGATE if _LONE_SURROGATE.search(text) else first_line(e)))
            return encodings, refused

    def _write(self, job, places):
        encodings, refused = job.result()
        for i, why in refused:
            self.skips.doc("undecodable", *places[i], why)
        ids = [enc.ids if enc is not None else () for enc in encodings]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        if not lengths.all():
            refused = {i for i, _ in refused}
            for k in np.flatnonzero(lengths == 0):
                if k not in refused:
                    self.skips.doc("empty", *places[k], "no tokens")
            ids = [x for x in ids if x]
            lengths = lengths[lengths > 0]
        tokens = int(lengths.sum())
        self.out.add_documents(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=tokens), lengths)
        self.tokens += tokens
        if self.bar is not None:
            rate = self.tokens / max(1e-9, time.monotonic() - self.t0)
            self.bar.set_postfix_str(f"{rate / 1e6:.2f} M tokens/s, {self.tokens:,} tokens", refresh=False)
            self.bar.update(max(0, min(self.bar.total, self.corpus.position()) - self.bar.n))


def prepare_text(args):
    refuse_input_in_out(args.input, args.out)
    listing = list_files(args.input, args.out, hidden=False)
    files = bounded(listing.files, args)
    if not files:
        die("--input: no input files")
    sources = [Source(p, args) for p in files]
    need_modules(sources)
    skips = Skips(args)
    for directory, why in listing.bad_dirs:
        skips.unlisted(directory, why)
    # A file named on --input that does not open as its format is an error before anything is written; so is any file
    # under --strict (each one's head is read: the records are checked as they are read).
    for src in sources:
        if src.path in listing.named or args.strict:
            try:
                src.check()
            except Skip as k:
                if k.reason != "empty":  # (an empty file is counted when it is read)
                    skips.file(k.reason, src, k.detail, named=True)
    kinds = {}
    for s in sources:
        k = FORMAT_NAMES[s.fmt] + (f" {COMPRESSION_NAMES[s.comp]}" if s.fmt and s.comp else "")
        kinds[k] = kinds.get(k, 0) + 1
    print(f"{plural(len(sources), 'input file')}: " +
          ", ".join(f"{n:,} {k}" for k, n in sorted(kinds.items())) +
          (f" ({listing.hidden:,} hidden names not read)" if listing.hidden else "") +
          (f" ({listing.in_out:,} inside --out not read)" if listing.in_out else ""))
    make_out_dir(args.out)
    tok, vocab_size, special = load_tokenizer(args, sources, listing.named)
    out = Output(args, vocab_size, special)
    corpus = Corpus(sources, skips, listing.named)
    bar = progress(sum(s.size for s in sources), "B", "tokenizing")
    work = Tokenize(tok, out, skips, corpus, bar)
    try:
        for text, src, n in corpus.documents(stop=lambda: out.full):
            work.add(text, src, n)
            if out.full:
                break
        work.flush(last=True)
    finally:
        work.close()
    if bar is not None:
        bar.update(bar.total - bar.n)
        bar.close()
    if out.splits["train"].documents + out.splits["val"].documents == 0:
        nothing_to_tokenize(skips, len(sources))
    extra = dict(input_files=len(files), tokenizer="tokenizer.json", text_field=args.text_field,
                 input_formats=kinds, skipped_files=dict(skips.files), skipped_documents=dict(skips.docs),
                 not_read=dict(hidden=listing.hidden, inside_out=listing.in_out))
    extra.update(bound_summary(args, corpus.files_read, out))
    return out.finish(extra, skips.summary(len(files)))


# ----------------------------------------------------------------------------
# Bytes: one token per byte; ELF files optionally split into functions.
BYTE_SPECIAL = dict(pad=256, cls=257, sep=258, mask=259, unk=-1)
BYTE_VOCAB = 260


def elf_functions(path):
    """The bytes of every function in an ELF file with a symbol table (.symtab, or .dynsym of a
    stripped library), each (address, size) once; None if the file is not ELF or has no symbols."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return None
        f.seek(0)
        try:
            elf = ELFFile(f)
            tables = [s for s in elf.iter_sections() if isinstance(s, SymbolTableSection)]
            tables = [t for t in tables if t.name == ".symtab"] or tables
            if not tables:
                return None
            sections = list(elf.iter_sections())
            data = np.fromfile(path, dtype=np.uint8)
            funcs, seen = [], set()
            for table in tables:
                for sym in table.iter_symbols():
                    e = sym.entry
                    if e.st_info.type != "STT_FUNC" or e.st_size == 0 or not isinstance(e.st_shndx, int):
                        continue
                    if e.st_shndx >= len(sections) or (e.st_value, e.st_size) in seen:
                        continue
                    sec = sections[e.st_shndx]
                    if sec["sh_type"] != "SHT_PROGBITS" or not sec["sh_flags"] & 0x4:  # SHF_EXECINSTR
                        continue
                    start = e.st_value - sec["sh_addr"]
                    if start < 0 or start + e.st_size > sec["sh_size"]:
                        continue
                    seen.add((e.st_value, e.st_size))
                    at = sec["sh_offset"] + start
                    funcs.append((e.st_value, data[at:at + e.st_size]))
            funcs.sort(key=lambda x: x[0])  # address order: deterministic whatever the table order
            return [b for _, b in funcs]
        except (ELFError, ValueError, KeyError, IndexError, struct.error, AssertionError) as e:
            print(f"prepare.py: {path}: skipped, not a readable ELF file ({e})", file=sys.stderr)
            return None


def clear_other_kind(out):
    """Byte shards go into a directory without a tokenizer.json (the trainer exports the tokenizer.json it finds
    beside the shards, which would give the byte model a WordPiece tokenizer). One that an earlier text run of
    prepare.py wrote (its meta.json says so) is removed, with a note; any other is refused."""
    tok = os.path.join(out, "tokenizer.json")
    if not os.path.lexists(tok):
        return
    try:
        with open(os.path.join(out, "meta.json"), "rb") as f:
            meta = json.loads(f.read())
        ours = isinstance(meta, dict) and meta.get("tokenizer") == "tokenizer.json"
    except (OSError, ValueError):
        ours = False
    if not ours:
        die(f"--out {out}: holds a tokenizer.json that no text run of prepare.py wrote there; byte shards beside "
            f"it would be exported with it: remove it or choose another --out")
    os.remove(tok)
    print(f"removed {tok}: an earlier text run's tokenizer, not for these byte shards")


def prepare_bytes(args):
    refuse_input_in_out(args.input, args.out)
    files = bounded(list_files(args.input, args.out).files, args)
    if not files:
        die("--input: no input files")
    make_out_dir(args.out)
    clear_other_kind(args.out)
    out = Output(args, BYTE_VOCAB, dict(BYTE_SPECIAL))
    bar = progress(len(files), "file")
    skipped = unreadable = functions = read = 0
    for path in files:
        if out.full:
            break
        read += 1
        try:
            if args.elf_functions:
                funcs = elf_functions(path)
                if funcs is None:
                    skipped += 1
                else:
                    functions += len(funcs)
                    for b in funcs:
                        out.add_document(b.astype(np.int64))
            else:
                out.add_document(np.fromfile(path, dtype=np.uint8).astype(np.int64))
        except OSError:
            unreadable += 1
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    extra = dict(input_files=len(files), unreadable_files=unreadable)
    if args.elf_functions:
        extra.update(elf_functions=functions, files_without_functions=skipped)
    extra.update(bound_summary(args, read, out))
    return out.finish(extra)


def check(args):
    """Validates every shard the arguments name; a pattern or file that names none is an error too."""
    bad = 0
    total_s = total_t = 0
    paths = []
    for pat in args.shards:
        found = sorted(glob.glob(pat))
        if not found:
            bad += 1
            print(f"BAD  {pat}: no such file (or no file matches the pattern)")
        paths += found
    for path in sorted(set(paths)):
        try:
            if not os.path.isfile(path):
                raise ValueError(f"{path}: not a regular file")
            h, _, _ = read_shard(path)
            total_s += h["num_samples"]
            total_t += h["num_tokens"]
            print(f"ok   {path}: {h['num_samples']:,} samples, {h['num_tokens']:,} tokens, vocab {h['vocab_size']}")
        except (ValueError, OSError) as e:
            bad += 1
            print(f"BAD  {e if isinstance(e, ValueError) else f'{path}: {e.strerror or first_line(e)}'}")
    print(f"{total_s:,} samples, {total_t:,} tokens; {bad} bad")
    if not paths:
        print("prepare.py: check: nothing to check (no shard matched)", file=sys.stderr)
    return 1 if bad or not paths else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("text", "bytes"):
        s = sub.add_parser(name)
        s.add_argument("--input", nargs="+", required=True,
                       help="files or directories (recursively)" if name == "bytes" else
                       "files or directories (recursively): UTF-8 text, JSON Lines (.jsonl, .ndjson, .json), Parquet "
                       "(.parquet); .gz, .zst, .bz2, .xz decompressed")
        s.add_argument("--out", required=True, help="output directory")
        s.add_argument("--seq-len", type=int, default=512, help="longest sample; longer documents are split")
        s.add_argument("--val-fraction", type=float, default=0.01, help="fraction of documents in the val split")
        s.add_argument("--shard-tokens", type=int, default=1 << 27, help="tokens per shard (about)")
        s.add_argument("--seed", type=int, default=0, help="seed of the train/val assignment (and of the files' order under a bound)")
        s.add_argument("--max-files", type=int, help="a bounded corpus: at most N input files, a random sample (seeded by --seed)")
        s.add_argument("--max-tokens", type=int,
                       help="a bounded corpus: stop after N document tokens (bytes, for bytes; [CLS]/[SEP] not counted), "
                            "the files taken in a random order (seeded by --seed)")
        if name == "text":
            g = s.add_mutually_exclusive_group(required=True)
            g.add_argument("--tokenizer", help="a tokenizer.json, or a BERT vocab.txt")
            g.add_argument("--train-vocab", type=int, help="train a WordPiece vocabulary of this size on the corpus")
            s.add_argument("--lowercase", action="store_true", help="lowercase (for vocab.txt or a trained vocabulary)")
            s.add_argument("--doc-per", choices=("line", "blank", "file"), default="blank",
                           help="in text files, a document is a line, a blank-line separated paragraph (default), or "
                                "the whole file (a JSON Lines record or a Parquet row is always one document)")
            s.add_argument("--text-field", default="text",
                           help="the field of a JSON Lines record, or the Parquet column, holding the text "
                                "(default: text)")
            s.add_argument("--max-doc-chars", type=int, default=1 << 24,
                           help="a longer document is skipped and counted (default 16777216); it bounds the memory")
            s.add_argument("--strict", action="store_true",
                           help="the first input that cannot be read (a file, a line, a record) is an error naming "
                                "it, instead of being skipped and counted")
        else:
            s.add_argument("--elf-functions", action="store_true", help="one sample per ELF function (symbol tables)")
    c = sub.add_parser("check", help="validate shards")
    c.add_argument("shards", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "check":
        return check(args)
    if args.seq_len < 3:
        die(f"--seq-len {args.seq_len} (expected at least 3: [CLS] a token [SEP])")
    if args.seq_len > 1 << 24:
        die(f"--seq-len {args.seq_len} (expected at most 16777216 = 2^24 tokens per sample)")
    if not 0 <= args.val_fraction < 1:
        die(f"--val-fraction {args.val_fraction} (expected 0 <= f < 1)")
    if args.shard_tokens < 1:
        die(f"--shard-tokens {args.shard_tokens} (expected at least 1)")
    for flag, v in (("--max-files", args.max_files), ("--max-tokens", args.max_tokens)):
        if v is not None and v < 1:
            die(f"{flag} {v} (expected at least 1)")
    if args.cmd == "text" and args.max_doc_chars < 1:
        die(f"--max-doc-chars {args.max_doc_chars} (expected at least 1)")
    if args.cmd == "text" and args.train_vocab is not None and not len(SPECIAL_NAMES) < args.train_vocab <= 1 << 24:
        die(f"--train-vocab {args.train_vocab} (expected more than the {len(SPECIAL_NAMES)} special tokens, at most 2^24)")
    TEMPORARIES.clear()  # (main may run more than once in a process: the tests)
    WRITTEN.clear()
    try:
        (prepare_text if args.cmd == "text" else prepare_bytes)(args)
    except InputError as e:  # --strict, or a file named on --input that is not in its format
        n = remove_partial_output()
        die(f"{e}" + (f" (removed this run's {n} temporary and shard files)" if n else ""))
    except (WriteError, OSError) as e:  # a file that could not be written, or vanished, or could not be read
        n = remove_partial_output()
        what = f" (removed this run's {n} temporary and shard files)" if n else ""
        if isinstance(e, WriteError):
            die(f"{e}{what}")
        die(f"{str(e.filename) + ': ' if e.filename else ''}{e.strerror or first_line(e)}{what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
