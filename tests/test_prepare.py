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
