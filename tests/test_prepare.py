#!/usr/bin/env python3
"""tests/test_prepare.py: tests of tools/prepare.py (needs tools/requirements.txt).

    python3 tests/test_prepare.py          # prints "N passed, N failed" last; exit code 1 on failure
    python3 -m pytest tests/test_prepare.py

The shard bytes are pinned against data.h's writer by the golden shard (the same file CRC is
checked in tests/test_data.cu).
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import prepare  # noqa: E402

WORDS = ("alpha beta gamma delta epsilon zeta theta kernel tensor shard token mask loader binary function "
         "compile symbol section offset header checksum").split()


def read_split(out, split):
    """All samples of a split, in order, as lists of ids; and the shards' headers."""
    samples, headers = [], []
    for path in sorted(p for p in os.listdir(out) if p.startswith(split + "_")):
        h, tokens, offsets = prepare.read_shard(os.path.join(out, path))
        headers.append(h)
        for i in range(h["num_samples"]):
            samples.append([int(t) for t in tokens[offsets[i]:offsets[i + 1]]])
    return samples, headers


def expected_samples(docs_ids, seq_len, cls, sep):
    out = []
    for ids in docs_ids:
        for i in range(0, len(ids), seq_len - 2):
            out.append([cls] + list(ids[i:i + seq_len - 2]) + [sep])
    return out


def assign(n_docs, seed, fraction):
    """The documented split rule: the k-th non-empty document goes to val when the k-th draw of Random(seed) < fraction."""
    rng = random.Random(seed)
    return ["val" if rng.random() < fraction else "train" for _ in range(n_docs)]


def test_golden_shard():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "golden.bin")
        w = prepare.ShardWriter(path, 30522, dict(pad=0, unk=100, cls=2, sep=3, mask=103), 8)
        w.add(np.array([2, 10, 11, 3]))
        w.add(np.array([2, 12, 3]))
        w.close()
        data = open(path, "rb").read()
        assert len(data) == 168, len(data)
        assert zlib.crc32(data) == 0x7E341EE9, hex(zlib.crc32(data))  # the same bytes as data.h's shard_write
        h, tokens, offsets = prepare.read_shard(path)
        assert h["num_samples"] == 2 and h["num_tokens"] == 7 and list(offsets) == [0, 4, 7]
        assert list(tokens) == [2, 10, 11, 3, 2, 12, 3]


def test_text_trained_vocab():
    rng = random.Random(5)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))) for _ in range(120)]
    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "corpus.txt")
        with open(corpus, "w") as f:
            f.write("\n\n".join(docs) + "\n")
        out = os.path.join(d, "out")
        assert prepare.main(["text", "--input", corpus, "--train-vocab", "300", "--out", out, "--seq-len", "24",
                             "--val-fraction", "0.25", "--seed", "3", "--shard-tokens", "500"]) == 0
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        ids = [tok.encode(doc, add_special_tokens=False).ids for doc in docs]
        where = assign(len(docs), 3, 0.25)
        meta = json.load(open(os.path.join(out, "meta.json")))
        for split in ("train", "val"):
            got, headers = read_split(out, split)
            want = expected_samples([i for i, w in zip(ids, where) if w == split], 24, cls, sep)
            assert got == want, f"{split}: the shards hold exactly the tokenized documents, split at 22 tokens"
            assert all(h["vocab_size"] == tok.get_vocab_size() and h["max_len"] == 24 for h in headers)
            row = [r for r in meta["splits"] if r["split"] == split][0]
            n_tok = sum(len(s) for s in got)
            assert row["samples"] == len(got) and row["tokens"] == n_tok
            assert row["padding_avoided_tokens"] == 24 * len(got) - n_tok
        assert len(read_split(out, "train")[1]) > 1, "several shards at --shard-tokens 500"
        # The tokens decode back to the text.
        sample = read_split(out, "train")[0][0]
        assert tok.decode(sample[1:-1]).split() == docs[where.index("train")].split()[:len(tok.decode(sample[1:-1]).split())]


def test_text_vocab_txt_and_long_documents():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "token", "##s", "mask"]
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "vocab.txt"), "w") as f:
            f.write("\n".join(vocab) + "\n")
        os.makedirs(os.path.join(d, "corpus"))
        with open(os.path.join(d, "corpus", "a.txt"), "w") as f:
            f.write("Hello world tokens\nmask\n\n" + " ".join(["hello"] * 40) + "\n")
        out = os.path.join(d, "out")
        prepare.main(["text", "--input", os.path.join(d, "corpus"), "--tokenizer", os.path.join(d, "vocab.txt"), "--lowercase", "--out", out,
                      "--seq-len", "16", "--val-fraction", "0"])
        got, headers = read_split(out, "train")
        assert headers[0]["vocab_size"] == 10 and headers[0]["cls_id"] == 2 and headers[0]["mask_id"] == 4
        assert headers[0]["unk_id"] == 1 and headers[0]["pad_id"] == 0
        assert got[0] == [2, 5, 6, 7, 8, 9, 3], got[0]  # [CLS] hello world token ##s mask [SEP]
        # 40 tokens at --seq-len 16: 14 + 14 + 12, nothing truncated
        assert [len(s) for s in got[1:]] == [16, 16, 14] and sum(s.count(5) for s in got[1:]) == 40
        meta = json.load(open(os.path.join(out, "meta.json")))
        assert meta["splits"][0]["split_documents"] == 1
        assert not [p for p in os.listdir(out) if p.startswith("val_")], "--val-fraction 0: no val shards"


def test_bytes_files():
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        os.makedirs(os.path.join(src, "sub"))
        a = bytes(range(256)) * 3
        b = b"\x00\x01\xff"
        open(os.path.join(src, "a.bin"), "wb").write(a)
        open(os.path.join(src, "sub", "b.bin"), "wb").write(b)
        os.symlink(os.path.join(src, "a.bin"), os.path.join(src, "link.bin"))  # the same file, counted once
        out = os.path.join(d, "out")
        prepare.main(["bytes", "--input", src, "--out", out, "--seq-len", "100", "--val-fraction", "0"])
        got, headers = read_split(out, "train")
        h = headers[0]
        assert h["vocab_size"] == 260 and h["token_bytes"] == 2 and h["unk_id"] == -1
        assert (h["pad_id"], h["cls_id"], h["sep_id"], h["mask_id"]) == (256, 257, 258, 259)
        want = expected_samples([list(a), list(b)], 100, 257, 258)
        assert got == want, "one document per file, split at 98 bytes, each byte its own token"


def test_bounded_corpus():
    """--max-files and --max-tokens bound the corpus; the files are then a seeded random sample of the input."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        os.makedirs(src)
        content = {}
        for i in range(20):
            data = bytes((i * 7 + j) % 256 for j in range(50 + 10 * i))
            content[data] = f"f{i:02d}.bin"
            open(os.path.join(src, f"f{i:02d}.bin"), "wb").write(data)

        def run(out, *flags):
            assert prepare.main(["bytes", "--input", src, "--out", out, "--seq-len", "1000", "--val-fraction", "0",
                                 *flags]) == 0
            return [bytes(s[1:-1]) for s in read_split(out, "train")[0]], json.load(open(os.path.join(out, "meta.json")))

        # --max-files 5: five whole files, not the first five names, the same five for the same seed
        got, meta = run(os.path.join(d, "f5"), "--max-files", "5", "--seed", "4")
        assert len(got) == 5 and all(g in content for g in got), "five files, each one whole document"
        assert meta["files_read"] == 5 and meta["max_files"] == 5 and not meta["max_tokens_reached"]
        assert sorted(content[g] for g in got) != [f"f{i:02d}.bin" for i in range(5)], "a sample, not the first names"
        again, _ = run(os.path.join(d, "f5b"), "--max-files", "5", "--seed", "4")
        assert again == got, "the same seed takes the same files"
        other, _ = run(os.path.join(d, "f5c"), "--max-files", "5", "--seed", "5")
        assert other != got, "another seed, another sample"

        # --max-tokens 1000: exactly 1000 document bytes; the last document is cut, the rest are whole files
        got, meta = run(os.path.join(d, "t"), "--max-tokens", "1000", "--seed", "4")
        assert sum(len(g) for g in got) == 1000 and meta["max_tokens_reached"], [len(g) for g in got]
        assert all(g in content for g in got[:-1]) and got[-1] not in content
        assert any(c.startswith(got[-1]) for c in content), "the last document is a prefix of a file"
        assert meta["files_read"] == len(got)
        # a budget larger than the corpus takes everything
        got, meta = run(os.path.join(d, "all"), "--max-tokens", "1000000")
        assert sorted(got) == sorted(content) and not meta["max_tokens_reached"] and meta["files_read"] == 20
        # without a bound: every file, in sorted order, as before
        got, meta = run(os.path.join(d, "none"))
        assert [content[g] for g in got] == sorted(content.values()) and "max_files" not in meta


def test_elf_functions():
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc or not shutil.which("nm") or not shutil.which("readelf"):
        print("skip test_elf_functions: no gcc/nm/readelf")
        return
    src = ("__attribute__((noinline)) int add3(int a, int b, int c) { return a + b + c; }\n"
           "__attribute__((noinline)) long mul(long a, long b) { return a * b + 7; }\n"
           "int main(int argc, char** argv) { return add3(argc, 2, 3) + (int)mul(argc, 5); }\n")
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "p.c"), "w").write(src)
        prog = os.path.join(d, "bin", "prog")
        os.makedirs(os.path.dirname(prog))
        subprocess.run([cc, "-O1", "-o", prog, os.path.join(d, "p.c")], check=True)
        open(os.path.join(d, "bin", "notes.txt"), "w").write("not an ELF file")
        out = os.path.join(d, "out")
        prepare.main(["bytes", "--input", os.path.join(d, "bin"), "--elf-functions", "--out", out, "--seq-len", "512",
                      "--val-fraction", "0"])
        got, _ = read_split(out, "train")
        content = [bytes(s[1:-1]) for s in got]
        # The bytes of add3 and mul, found independently with nm (address, size) and readelf (.text).
        data = open(prog, "rb").read()
        sec = re.search(r"\.text\s+PROGBITS\s+([0-9a-f]+)\s+([0-9a-f]+)", subprocess.run(
            ["readelf", "-SW", prog], capture_output=True, text=True).stdout)
        text_addr, text_off = int(sec.group(1), 16), int(sec.group(2), 16)
        syms = {}
        for line in subprocess.run(["nm", "-S", "--defined-only", prog], capture_output=True, text=True).stdout.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[2] in "Tt":
                syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
        for name in ("add3", "mul", "main"):
            addr, size = syms[name]
            fn = data[text_off + addr - text_addr:text_off + addr - text_addr + size]
            assert fn in content, f"the function {name} ({size} bytes) is a sample"
        meta = json.load(open(os.path.join(out, "meta.json")))
        assert meta["files_without_functions"] == 1, "notes.txt is not ELF: skipped and counted"
        assert meta["elf_functions"] == len(got)


def test_check_and_errors():
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "a.bin"), "wb").write(bytes(range(200)))
        out = os.path.join(d, "out")
        prepare.main(["bytes", "--input", os.path.join(d, "a.bin"), "--out", out, "--seq-len", "64",
                      "--val-fraction", "0"])
        shard = os.path.join(out, "train_00000.bin")
        assert prepare.main(["check", shard]) == 0
        raw = bytearray(open(shard, "rb").read())
        raw[130] ^= 0xFF
        open(shard, "wb").write(raw)
        try:
            prepare.read_shard(shard)
            assert False, "a corrupt shard must be refused"
        except ValueError as e:
            assert shard in str(e) and "checksum" in str(e)
        assert prepare.main(["check", shard]) == 1
        # A re-run replaces the earlier shards (none left behind).
        prepare.main(["bytes", "--input", os.path.join(d, "a.bin"), "--out", out, "--seq-len", "64",
                      "--val-fraction", "0", "--shard-tokens", "10"])
        n = len([p for p in os.listdir(out) if p.startswith("train_")])
        prepare.main(["bytes", "--input", os.path.join(d, "a.bin"), "--out", out, "--seq-len", "64",
                      "--val-fraction", "0"])
        assert n > 1 and [p for p in os.listdir(out) if p.startswith("train_")] == ["train_00000.bin"]
        # An empty corpus is an error, not empty shards.
        open(os.path.join(d, "empty.txt"), "w").close()
        try:
            prepare.main(["bytes", "--input", os.path.join(d, "empty.txt"), "--out", os.path.join(d, "o2")])
            assert False, "an empty corpus must fail"
        except SystemExit as e:
            assert e.code == 1



def test_failed_writes_and_other_kinds():
    """A write that fails (a full disk: a 64 KiB tmpfs when root; a file size limit, EFBIG, always) names the file,
    exits 1 and leaves no temporary file and no shard; byte shards never sit beside a text run's tokenizer.json;
    inputs that are not files or directories (a device, a FIFO) are named at once, never read or waited on."""
    import resource
    import signal
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "prepare.py")
    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "in")
        os.makedirs(corpus)
        with open(os.path.join(corpus, "a.bin"), "wb") as f:
            f.write(bytes(random.Random(1).getrandbits(8) for _ in range(400000)))

        def run(args, **kw):
            r = subprocess.run([sys.executable, tool] + args, capture_output=True, text=True, timeout=60, **kw)
            return r.returncode, r.stdout + r.stderr

        def limit_file_size():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))

        targets = [("a file size limit", os.path.join(d, "lim"), "File too large", dict(preexec_fn=limit_file_size))]
        mnt = os.path.join(d, "mnt")
        os.makedirs(mnt)
        mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt],
                                                       capture_output=True).returncode == 0
        if mounted:
            targets.append(("a full disk", os.path.join(mnt, "out"), "No space left on device", {}))
        else:
            print("  (full disk: a tmpfs needs root; the file size limit case stands in)")
        try:
            for what, out, err, kw in targets:
                rc, text = run(["bytes", "--input", corpus, "--out", out, "--seq-len", "64", "--val-fraction", "0.2",
                                "--shard-tokens", "100000"], **kw)
                assert rc == 1, f"{what}: exit {rc}: {text}"
                assert re.search(r"prepare\.py: cannot write " + re.escape(out) + r"/(train|val)_\d+\.bin\.tmp: " + err +
                                 r" \(removed this run's \d+ temporary and shard files\)", text), f"{what}: {text!r}"
                assert "Traceback" not in text, f"{what}: {text}"
                left = [n for n in os.listdir(out) if n.endswith(".tmp") or n.endswith(".bin")]
                assert left == [], f"{what}: left {left}"
        finally:
            if mounted:
                subprocess.run(["umount", mnt])

        # a text run's tokenizer.json goes when byte shards replace its shards; another one is refused
        text_in = os.path.join(d, "text")
        os.makedirs(text_in)
        with open(os.path.join(text_in, "a.txt"), "w") as f:
            f.write("\n\n".join(" ".join(WORDS[(i * k) % len(WORDS)] for k in range(9)) for i in range(60)))
        out = os.path.join(d, "kinds")
        assert prepare.main(["text", "--input", text_in, "--train-vocab", "120", "--out", out, "--seq-len", "32"]) == 0
        assert os.path.exists(os.path.join(out, "tokenizer.json"))
        assert prepare.main(["bytes", "--input", text_in, "--out", out, "--seq-len", "32"]) == 0
        assert not os.path.exists(os.path.join(out, "tokenizer.json")), "the text run's tokenizer.json was left"
        assert json.load(open(os.path.join(out, "meta.json")))["kind"] == "bytes"
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            f.write("{}")  # someone else's
        rc, text = run(["bytes", "--input", text_in, "--out", out, "--seq-len", "32"])
        assert rc == 1 and f"--out {out}: holds a tokenizer.json that no text run of prepare.py wrote" in text, text
        assert open(os.path.join(out, "tokenizer.json")).read() == "{}", "a tokenizer.json not ours was touched"

        # not a file or a directory: named at once (a FIFO would block a reader forever)
        fifo = os.path.join(d, "train_00000.bin")
        os.mkfifo(fifo)
        cases = [(["bytes", "--input", "/dev/zero", "--out", os.path.join(d, "z")],
                  "--input /dev/zero: not a regular file or a directory"),
                 (["bytes", "--input", fifo, "--out", os.path.join(d, "z")],
                  f"--input {fifo}: not a regular file or a directory"),
                 (["check", fifo], f"BAD  {fifo}: not a regular file"),
                 (["bytes", "--input", corpus, "--out", os.path.join(d, "z"), "--seq-len", str(1 << 40)],
                  f"--seq-len {1 << 40} (expected at most 16777216 = 2^24")]
        for args, want in cases:
            rc, text = run(args)
            assert rc == 1 and want in text and "Traceback" not in text, f"{args}: exit {rc}: {text!r}"


def test_bad_inputs_one_line():
    """Every bad input: a non-zero exit and one line naming the file or flag, never a traceback."""
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "prepare.py")
    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "in")
        os.makedirs(corpus)
        with open(os.path.join(corpus, "a.txt"), "w") as f:
            f.write("alpha beta gamma\n" * 20)
        with open(os.path.join(d, "latin1.txt"), "wb") as f:
            f.write(b"caf\xe9 \xff\xfe\n")
        regular = os.path.join(d, "file")
        open(regular, "w").close()
        cases = [
            (["check", os.path.join(d, "none.bin")], "none.bin: no such file"),
            (["check", os.path.join(d, "*.zzz")], "no file matches"),
            (["check", d], "not a regular file"),
            (["bytes", "--input", corpus, "--out", regular], f"--out {regular}: exists and is not a directory"),
            (["bytes", "--input", corpus, "--out", os.path.join(regular, "x")], "cannot create or write"),
            (["bytes", "--input", os.path.join(d, "missing"), "--out", os.path.join(d, "o")], "--input"),
            (["text", "--input", corpus, "--out", os.path.join(d, "o"), "--train-vocab", "0"], "--train-vocab 0"),
            (["bytes", "--input", corpus, "--out", os.path.join(d, "o"), "--max-files", "0"], "--max-files 0 (expected at least 1)"),
            (["bytes", "--input", corpus, "--out", os.path.join(d, "o"), "--max-tokens", "-5"], "--max-tokens -5 (expected"),
            (["text", "--input", corpus, "--out", os.path.join(d, "o"), "--tokenizer", os.path.join(d, "no.txt")],
             "--tokenizer"),
            (["text", "--input", corpus, "--out", os.path.join(d, "o"), "--tokenizer",
              os.path.join(d, "latin1.txt")], "not a tokenizer.json or a UTF-8 BERT vocab.txt"),
            (["text", "--input", corpus, os.path.join(d, "latin1.txt"), "--out", os.path.join(d, "o"),
              "--train-vocab", "100"], "latin1.txt: not UTF-8 text"),
        ]
        for args, want in cases:
            r = subprocess.run([sys.executable, tool] + args, capture_output=True, text=True)
            out = r.stdout + r.stderr
            assert r.returncode != 0, f"{args}: exit 0"
            assert want in out, f"{args}: {out!r} does not say {want!r}"
            assert "Traceback" not in out, f"{args}: a traceback"
            assert len([ln for ln in r.stderr.splitlines() if ln.startswith("prepare.py:")]) <= 1, f"{args}: {r.stderr}"



# ----------------------------------------------------------------------------
# Corpus formats: JSON Lines, Parquet, compressed text; what is skipped, and why; --strict; --input and --out.
TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "prepare.py")
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS  # every word of WORDS is one token


def run_tool(args, env=None):
    """prepare.py in a process of its own: (exit code, stdout, stderr)."""
    r = subprocess.run([sys.executable, TOOL] + args, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **(env or {})))
    return r.returncode, r.stdout, r.stderr


def vocab_file(d):
    path = os.path.join(d, "vocab.txt")
    with open(path, "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    return path


def word_docs(rng, n, lo=1, hi=40):
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def ids_of(doc):
    return [VOCAB.index(w) for w in doc.split()]


def write_parquet(path, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table(columns), path, row_group_size=7)  # several row groups


def prepare_ok(args):
    """prepare.main in this process; its meta.json and the train split's samples (as lists of ids)."""
    try:
        assert prepare.main(args) == 0
    except SystemExit as e:  # a failure of this test, not the end of the others
        raise AssertionError(f"prepare.py {' '.join(args)}: exit {e.code}") from None
    out = args[args.index("--out") + 1]
    return json.load(open(os.path.join(out, "meta.json"))), read_split(out, "train")[0]


def test_mixed_corpus_skips_and_counts():
    """One command over JSON Lines, Parquet, gzipped and plain text with bad files and bad records among them:
    the good documents, in file order, with exact token counts; what was skipped counted by reason, not a stop."""
    import gzip
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as d:
        c = os.path.join(d, "corpus")
        os.makedirs(os.path.join(c, "sub"))
        os.makedirs(os.path.join(c, ".git"))
        # a.jsonl: 6 good records among a bad JSON line, a missing field, a null, a number, an empty text, a lone
        # surrogate (\ud800, which no UTF-8 text holds), a blank line
        a = word_docs(rng, 6)
        with open(os.path.join(c, "a.jsonl"), "w") as f:
            f.write(json.dumps({"text": a[0], "id": 1}) + "\n")
            f.write('{"text": "alpha beta\n')  # bad JSON
            f.write(json.dumps({"title": "no text here"}) + "\n")  # missing field
            f.write(json.dumps({"text": a[1]}) + "\n\n")  # and a blank line (ignored)
            f.write(json.dumps({"text": None}) + "\n")  # null
            f.write(json.dumps({"text": 42}) + "\n")  # not a string
            f.write(json.dumps({"text": "  "}) + "\n")  # empty
            f.write(json.dumps({"text": "alpha \ud800 beta"}) + "\n")  # a lone surrogate: not text
            for doc in a[2:]:
                f.write(json.dumps({"text": doc, "meta": {"x": [1, 2]}}) + "\n")
        # b.parquet: 20 rows, one null
        b = word_docs(rng, 20)
        write_parquet(os.path.join(c, "b.parquet"), {"text": b[:5] + [None] + b[5:], "n": list(range(21))})
        # c.txt.gz: paragraphs, as a plain text file would give them
        cdocs = word_docs(rng, 30)
        with gzip.open(os.path.join(c, "c.txt.gz"), "wt") as f:
            f.write("\n\n".join(" \n".join(doc.split(" ", 1)) for doc in cdocs) + "\n")  # paragraphs of 1-2 lines
        # d.txt: one bad byte spoils its paragraph only (line 3), not the file
        ddocs = word_docs(rng, 3)
        with open(os.path.join(c, "d.txt"), "wb") as f:
            f.write(f"{ddocs[0]}\n\n".encode() + b"alpha \xff beta\n\n" + f"{ddocs[1]}\n{ddocs[2]}\n".encode())
        # sub/e.jsonl.gz: compressed JSON Lines in a subdirectory
        e = word_docs(rng, 4)
        with gzip.open(os.path.join(c, "sub", "e.jsonl.gz"), "wt") as f:
            f.write("".join(json.dumps({"text": doc}) + "\n" for doc in e))
        # bad files: binary, a JSON document (not lines), a gzip that is not, a Parquet file without the column,
        # an archive, an empty file; and names starting with '.' (not read)
        open(os.path.join(c, "f.bin"), "wb").write(bytes(range(256)) * 4)
        open(os.path.join(c, "g.json"), "w").write(json.dumps({"text": "alpha"}, indent=2))
        open(os.path.join(c, "h.txt.gz"), "wb").write(b"this is not gzip data at all\n")
        write_parquet(os.path.join(c, "i.parquet"), {"body": ["alpha beta"]})
        open(os.path.join(c, "j.tar"), "wb").write(b"\0" * 1024)
        open(os.path.join(c, "k.txt"), "w").close()
        open(os.path.join(c, ".notes.txt"), "w").write("gamma delta\n")
        open(os.path.join(c, ".git", "config"), "w").write("alpha alpha alpha\n")

        out = os.path.join(d, "out")
        args = ["text", "--input", c, "--tokenizer", vocab_file(d), "--out", out, "--seq-len", "16",
                "--val-fraction", "0"]
        meta, got = prepare_ok(args)
        docs = a + b + cdocs + [ddocs[0], " ".join(ddocs[1:])] + e  # the sorted order: a, b, c, d, sub/e
        assert got == expected_samples([ids_of(x) for x in docs], 16, 2, 3), "the good documents, whole, in order"
        row = meta["splits"][0]
        assert row["documents"] == len(docs) and row["tokens"] - 2 * row["samples"] == sum(len(x.split()) for x in docs)
        assert meta["skipped_files"] == {"not_text": 1, "not_jsonl": 1, "damaged": 1, "no_column": 1, "unsupported": 1,
                                         "empty": 1}, meta["skipped_files"]
        assert meta["skipped_documents"] == {"bad_json": 1, "missing_field": 3, "not_string": 1, "empty": 1,
                                             "undecodable": 2}, meta["skipped_documents"]
        assert meta["input_files"] == 11 and meta["input_formats"] == {
            "JSON Lines": 2, "JSON Lines .gz": 1, "Parquet": 2, "text": 3, "text .gz": 2, "other": 1}, meta
        # The same command again: the same shards, byte for byte (and the summary says what was skipped, and why).
        first = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out) if n.endswith(".bin")}
        rc, text, err = run_tool(args)
        assert rc == 0 and {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)
                            if n.endswith(".bin")} == first
        for want in ("skipped 6 of 11 files:", "1 not UTF-8 text (first: " + os.path.join(c, "f.bin"),
                     "1 not JSON Lines (first: " + os.path.join(c, "g.json"), "skipped 8 documents:",
                     "3 without the field 'text' (or null) (first: " + os.path.join(c, "a.jsonl") + " line 3",
                     "2 not UTF-8 (first: " + os.path.join(c, "a.jsonl") + " line 9: a lone surrogate",
                     "2 hidden names not read"):
            assert want in text, f"{want!r} not in {text}"
        assert err == "", f"no progress bar when stderr is not a terminal: {err!r}"
        # The progress bar (forced here; on a terminal it shows by itself): tokens/s and an ETA, on stderr.
        rc, text, err = run_tool(args, env={"PREPARE_PROGRESS": "1"})
        assert rc == 0 and "tokenizing" in err and "tokens/s" in err and "<" in err, err
        # A trained vocabulary reads the same documents.
        rc, text, err = run_tool(["text", "--input", c, "--train-vocab", "60", "--out", os.path.join(d, "tv"),
                                  "--seq-len", "16"])
        assert rc == 0 and "skipped 8 documents:" in text, text + err


def test_truncated_and_zstd():
    """.zst (several frames, as parallel compressors write) reads as its plain text; a truncated .gz keeps the
    documents before the damage and is counted; .jsonl.zst; .xz and .bz2 from the standard library."""
    import bz2
    import gzip
    import lzma
    import zstandard
    rng = random.Random(12)
    docs = word_docs(rng, 200)
    plain = ("\n\n".join(docs) + "\n").encode()
    with tempfile.TemporaryDirectory() as d:
        vocab = vocab_file(d)
        c = os.path.join(d, "c")
        os.makedirs(c)
        cz = zstandard.ZstdCompressor()
        half = len(plain) // 2
        open(os.path.join(c, "a.txt.zst"), "wb").write(cz.compress(plain[:half]) + cz.compress(plain[half:]))
        lines = "".join(json.dumps({"text": x}) + "\n" for x in docs).encode()
        open(os.path.join(c, "b.jsonl.zst"), "wb").write(cz.compress(lines))
        open(os.path.join(c, "c.txt.xz"), "wb").write(lzma.compress(plain))
        open(os.path.join(c, "d.txt.bz2"), "wb").write(bz2.compress(plain))
        meta, got = prepare_ok(["text", "--input", c, "--tokenizer", vocab, "--out", os.path.join(d, "o"),
                                "--seq-len", "64", "--val-fraction", "0"])
        assert got == expected_samples([ids_of(x) for x in docs] * 4, 64, 2, 3)
        assert meta["skipped_files"] == {} and meta["skipped_documents"] == {}
        # a .gz cut short: what came before the cut is kept, the file counted as damaged, the run goes on
        big = ("\n\n".join(word_docs(rng, 20000)) + "\n").encode()  # more than the 1 MiB read at a time
        gz = gzip.compress(big)
        t = os.path.join(d, "t")
        os.makedirs(t)
        open(os.path.join(t, "a.txt.gz"), "wb").write(gz[:len(gz) * 3 // 4])
        open(os.path.join(t, "b.txt"), "w").write("alpha beta\n")
        meta, got = prepare_ok(["text", "--input", t, "--tokenizer", vocab, "--out", os.path.join(d, "o2"),
                                "--seq-len", "1000", "--val-fraction", "0"])
        assert meta["skipped_files"] == {"damaged": 1}, meta
        kept = [s[1:-1] for s in got[:-1]]
        assert got[-1] == [2] + ids_of("alpha beta") + [3] and 0 < len(kept) < 20000
        want = [ids_of(x) for x in big.decode().split("\n\n")]
        assert kept == want[:len(kept)], "a prefix of the documents of the damaged file"


def test_text_field():
    """--text-field names the JSON Lines field and the Parquet column; without it, 'text' is missing: an error that
    says so, and what the records hold."""
    rng = random.Random(13)
    docs = word_docs(rng, 25)
    with tempfile.TemporaryDirectory() as d:
        vocab = vocab_file(d)
        c = os.path.join(d, "c")
        os.makedirs(c)
        with open(os.path.join(c, "a.jsonl"), "w") as f:
            f.write("".join(json.dumps({"id": i, "body": x}) + "\n" for i, x in enumerate(docs[:10])))
        write_parquet(os.path.join(c, "b.parquet"), {"id": list(range(15)), "body": docs[10:]})
        meta, got = prepare_ok(["text", "--input", c, "--tokenizer", vocab, "--text-field", "body",
                                "--out", os.path.join(d, "o"), "--seq-len", "64", "--val-fraction", "0"])
        assert got == expected_samples([ids_of(x) for x in docs], 64, 2, 3) and meta["text_field"] == "body"
        rc, text, err = run_tool(["text", "--input", c, "--tokenizer", vocab, "--out", os.path.join(d, "o2")])
        assert rc == 1 and "nothing to tokenize" in err and "without a string column 'text'" in err, err
        assert "without the field 'text'" in err and ("its fields: id, body" in err or "its columns: id, body" in err)
        assert not os.path.exists(os.path.join(d, "o2", "tokenizer.json")), "a failed run leaves no tokenizer.json"
        # a column that is not strings
        write_parquet(os.path.join(d, "n.parquet"), {"text": [1, 2, 3]})
        rc, text, err = run_tool(["text", "--input", os.path.join(d, "n.parquet"), "--tokenizer", vocab,
                                  "--out", os.path.join(d, "o3")])
        assert rc == 1 and "n.parquet: without a string column 'text' (the column 'text' is int64" in err, err


def test_strict():
    """--strict: the first bad input is an error naming the file (and line) and what was expected; no shards left.
    A clean corpus passes --strict."""
    with tempfile.TemporaryDirectory() as d:
        vocab = vocab_file(d)
        good = os.path.join(d, "good")
        os.makedirs(good)
        open(os.path.join(good, "a.txt"), "w").write("alpha beta\n\ngamma\n")
        write_parquet(os.path.join(good, "b.parquet"), {"text": ["delta"]})
        prepare_ok(["text", "--input", good, "--tokenizer", vocab, "--out", os.path.join(d, "o0"), "--strict"])
        cases = {
            "bad.jsonl": ('{"text": "alpha"}\n{"text": 5}\n', "bad.jsonl line 2: whose field 'text' is not a string "
                          "(a JSON number); expected JSON Lines: one JSON object per line with a string field 'text'"),
            "miss.jsonl": ('{"text": "alpha"}\n\n{"body": "x"}\n', "miss.jsonl line 3: without the field 'text'"),
            "latin.txt": (b"alpha beta\n\ncaf\xe9\n", "latin.txt line 3: not UTF-8; expected UTF-8 text (--strict)"),
            "bin.dat": (bytes(range(256)), "bin.dat: not UTF-8 text (a NUL byte in its first 64 KiB: binary); "
                        "expected UTF-8 text (--strict)"),
            "z.txt.gz": (b"not gzip", "z.txt.gz: damaged or truncated (Not a gzipped file"),
            "long.txt": ("alpha " * 50 + "\n", "long.txt line 1: longer than --max-doc-chars (100 characters)"),
        }
        for name, (content, want) in cases.items():
            c = os.path.join(d, "c_" + name)
            os.makedirs(c)
            shutil.copy(os.path.join(good, "a.txt"), c)
            with open(os.path.join(c, name), "wb" if isinstance(content, bytes) else "w") as f:
                f.write(content)
            out = os.path.join(d, "o_" + name)
            flags = ["--max-doc-chars", "100"]
            rc, text, err = run_tool(["text", "--input", c, "--tokenizer", vocab, "--out", out, "--strict"] + flags)
            assert rc == 1 and os.path.join(c, want) in err, f"{name}: {err!r}"
            left = os.listdir(out) if os.path.isdir(out) else []  # (a bad file is found before --out is made)
            assert "Traceback" not in err and not [n for n in left if n.endswith((".bin", ".tmp", ".json"))], left
            rc, text, err = run_tool(["text", "--input", c, "--tokenizer", vocab, "--out", out] + flags)
            assert rc == 0 and "skipped 1" in text, f"{name}: without --strict, skipped and counted: {text} {err}"
        # with --train-vocab, the first pass (the vocabulary) stops at it already
        rc, text, err = run_tool(["text", "--input", os.path.join(d, "c_bad.jsonl"), "--train-vocab", "50",
                                  "--out", os.path.join(d, "tv"), "--strict"])
        assert rc == 1 and "bad.jsonl line 2: whose field 'text' is not a string" in err, err


def test_named_files_and_too_long():
    """A file named on --input must open as its format: an error before anything is written (the earlier shards
    stay). Found in a directory, the same file is skipped and counted. --max-doc-chars skips longer documents, a
    line far longer is never held (read past); one bad byte skips one paragraph, not its file."""
    with tempfile.TemporaryDirectory() as d:
        vocab = vocab_file(d)
        c = os.path.join(d, "c")
        os.makedirs(c)
        open(os.path.join(c, "a.txt"), "w").write("alpha beta\n\n" + "gamma " * 30 + "\n\ndelta\n\n" +
                                                    "zeta " * 2000 + "\n\nbeta\n")
        open(os.path.join(c, "b.json"), "w").write('{\n  "text": "alpha"\n}\n')
        out = os.path.join(d, "out")
        meta, got = prepare_ok(["text", "--input", c, "--tokenizer", vocab, "--out", out, "--max-doc-chars", "100",
                                "--val-fraction", "0"])
        assert [s[1:-1] for s in got] == [ids_of("alpha beta"), ids_of("delta"), ids_of("beta")], got
        assert meta["skipped_documents"] == {"too_long": 2} and meta["skipped_files"] == {"not_jsonl": 1}, meta
        before = sorted(os.listdir(out))
        rc, text, err = run_tool(["text", "--input", os.path.join(c, "a.txt"), os.path.join(c, "b.json"),
                                  "--tokenizer", vocab, "--out", out])
        assert rc == 1 and f"{os.path.join(c, 'b.json')}: not JSON Lines (line 1: " in err, err
        assert "a file named on --input must be readable as its format" in err and sorted(os.listdir(out)) == before


def test_input_out_overlap():
    """--input equal to --out, or inside it, is refused before anything is removed; an --out inside an --input
    directory is not read (a second run reads what the first one read)."""
    with tempfile.TemporaryDirectory() as d:
        vocab = vocab_file(d)
        c = os.path.join(d, "c")
        os.makedirs(c)
        open(os.path.join(c, "a.txt"), "w").write("alpha beta gamma\n\ndelta\n")
        out = os.path.join(c, "shards")  # --out inside the input directory
        args = ["text", "--input", c, "--tokenizer", vocab, "--out", out, "--val-fraction", "0"]
        meta, got = prepare_ok(args)
        meta2, got2 = prepare_ok(args)
        assert got == got2 == [[2] + ids_of("alpha beta gamma") + [3], [2] + ids_of("delta") + [3]]
        assert meta2["input_files"] == 1, "the shards, meta.json and tokenizer.json of the first run were not read"
        before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
        for mode in (["text", "--tokenizer", vocab], ["bytes"]):
            for inp, want in ((out, f"--input {out} is --out itself"),
                              (os.path.join(out, "train_00000.bin"), f"lies inside --out {out}")):
                rc, text, err = run_tool([mode[0], "--input", inp, "--out", out] + mode[1:])
                assert rc == 1 and want in err and "nothing was removed" in err, f"{mode} {inp}: {err}"
                after = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
                assert after == before, "the earlier shards are untouched"


def test_everything_skipped():
    """A corpus where every file is skipped: an error that says so and why, and no shards, no tokenizer.json."""
    with tempfile.TemporaryDirectory() as d:
        vocab = vocab_file(d)
        c = os.path.join(d, "c")
        os.makedirs(c)
        open(os.path.join(c, "a.bin"), "wb").write(b"\x00\x01" * 100)
        open(os.path.join(c, "b.jsonl"), "w").write('{"title": "alpha"}\n')
        open(os.path.join(c, "c.txt"), "w").close()
        for extra in (["--tokenizer", vocab], ["--train-vocab", "50"]):
            out = os.path.join(d, "out" + extra[0])
            rc, text, err = run_tool(["text", "--input", c, "--out", out] + extra)
            assert rc == 1 and "nothing to tokenize: no document in the 3 input files had any text" in err, err
            assert "1 not UTF-8 text" in err and "1 empty" in err and "1 document without the field 'text'" in err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
            assert os.listdir(out) == [], os.listdir(out)


if __name__ == "__main__":
    passed = failed = 0
    for name, fn in sorted((n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)):
        try:
            fn()
            passed += 1
            print(f"ok   {name}")
        except Exception as e:  # noqa: BLE001 - report and go on
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
