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
import glob
import json
import os
import random
import struct
import sys
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

    def finish(self, extra):
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
            print(f"{k}: {v}")
        if self.splits["train"].samples == 0:
            die("the train split is empty: no document had any tokens")
        return rows


def progress(total, unit):
    if tqdm is None or not sys.stderr.isatty() and os.environ.get("PREPARE_PROGRESS") != "1":
        return None
    return tqdm(total=total, unit=unit, unit_scale=True, dynamic_ncols=True)


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


def list_files(inputs):
    """Every regular file under the inputs (directories recursively), each real file once, sorted."""
    seen, files = set(), []
    for inp in inputs:
        if not os.path.exists(inp):
            die(f"--input {inp}: no such file or directory")
        if not os.path.isfile(inp) and not os.path.isdir(inp):
            die(f"--input {inp}: not a regular file or a directory (a device, FIFO or socket is not a corpus)")
        walk = [(inp, [], [""])] if os.path.isfile(inp) else os.walk(inp)
        for root, _, names in walk:
            for n in sorted(names):
                p = os.path.join(root, n) if n else root
                try:
                    real = os.path.realpath(p)
                    if real in seen or not os.path.isfile(real):
                        continue
                    seen.add(real)
                    files.append(p)
                except OSError:
                    continue
    return sorted(files)


# ----------------------------------------------------------------------------
# Text: WordPiece through Hugging Face tokenizers.
def load_tokenizer(args, files):
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
        print(f"training a WordPiece vocabulary of {args.train_vocab} on {len(files)} files")
        try:
            tok.train(files, vocab_size=args.train_vocab, min_frequency=2, special_tokens=list(SPECIAL_NAMES),
                      show_progress=False)
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions, without the file's name
            for path in files:
                try:
                    with open(path, "rb") as f:
                        f.read().decode("utf-8")
                except UnicodeDecodeError as u:
                    die(f"{path}: not UTF-8 text (byte {u.start}); --train-vocab reads UTF-8 files")
            die(f"--train-vocab: training the vocabulary failed: {first_line(e)}")
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
    return tok, tok.get_vocab_size(), special


def read_documents(path, mode):
    """Yields the documents of one text file: lines, blank-line separated paragraphs, or the whole file."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        if mode == "file":
            yield f.read()
            return
        para = []
        for line in f:
            line = line.strip()
            if mode == "line":
                if line:
                    yield line
            elif line:
                para.append(line)
            elif para:
                yield " ".join(para)
                para = []
        if para:
            yield " ".join(para)


def prepare_text(args):
    files = bounded(list_files(args.input), args)
    if not files:
        die("--input: no input files")
    make_out_dir(args.out)
    tok, vocab_size, special = load_tokenizer(args, files)
    out = Output(args, vocab_size, special)
    bar = progress(sum(os.path.getsize(f) for f in files), "B")
    batch = []

    def flush():
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            out.add_document(np.asarray(enc.ids, dtype=np.int64))
        batch.clear()

    read = 0
    for path in files:
        if out.full:
            break
        read += 1
        for doc in read_documents(path, args.doc_per):
            batch.append(doc)
            if len(batch) >= 2048:
                flush()
                if out.full:
                    break
        if bar:
            bar.update(os.path.getsize(path))
    flush()
    if bar:
        bar.close()
    return out.finish(dict(input_files=len(files), tokenizer="tokenizer.json", **bound_summary(args, read, out)))


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
    files = bounded(list_files(args.input), args)
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
        s.add_argument("--input", nargs="+", required=True, help="files or directories (recursively)")
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
                           help="a document is a line, a blank-line separated paragraph (default), or a file")
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
    if args.cmd == "text" and args.train_vocab is not None and not len(SPECIAL_NAMES) < args.train_vocab <= 1 << 24:
        die(f"--train-vocab {args.train_vocab} (expected more than the {len(SPECIAL_NAMES)} special tokens, at most 2^24)")
    TEMPORARIES.clear()  # (main may run more than once in a process: the tests)
    WRITTEN.clear()
    try:
        (prepare_text if args.cmd == "text" else prepare_bytes)(args)
    except (WriteError, OSError) as e:  # a file that could not be written, or vanished, or could not be read
        n = remove_partial_output()
        what = f" (removed this run's {n} temporary and shard files)" if n else ""
        if isinstance(e, WriteError):
            die(f"{e}{what}")
        die(f"{str(e.filename) + ': ' if e.filename else ''}{e.strerror or first_line(e)}{what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
