#!/usr/bin/env python3
"""tests/bench_prepare.py: tools/prepare.py text's speed against tokenizers' own encode_batch on the same text.

    python3 tests/bench_prepare.py --input CORPUS... [--tokenizer tokenizer.json] [--repeat 3]
                                   [--prepare OTHER/prepare.py] [--doc-per blank]

It reads the corpus's documents as prepare.py reads them (into memory: take a corpus of some tens of MB), then
alternates, --repeat times: encode_batch over those documents in prepare.py's batches (2048 documents), the same
with encode_batch_fast where tokenizers has it (no character offsets), and a whole `prepare.py text` run of the
corpus into a temporary directory (reading, tokenizing, writing the shards and their fsync). Each is timed by the
wall clock and by the CPU time of the process (all threads). It prints the tokens per second of each, and
prepare.py's as a fraction of encode_batch's: of the best wall-clock times (on a machine shared with other jobs the
best is the least disturbed) and of the CPU times. The token counts are checked equal (the same text).

Without --tokenizer, a WordPiece vocabulary of 30522 is trained on the corpus first (not timed). --prepare times
another prepare.py (an older commit's: git show REV:tools/prepare.py > /tmp/old_prepare.py) on the same text.
Not a test: timings belong to the machine. tests/test_prepare.py tests the behaviour.
"""
import argparse
import contextlib
import importlib.util
import io
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import prepare  # noqa: E402  (this tree's reader gives the documents)


def load_module(path):
    spec = importlib.util.spec_from_file_location("prepare_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def clock():
    return time.perf_counter(), time.process_time()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--tokenizer", help="a tokenizer.json (default: train a WordPiece vocabulary of 30522 first)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--doc-per", default="blank", choices=("line", "blank", "file"))
    p.add_argument("--prepare", default=os.path.join(HERE, "..", "tools", "prepare.py"),
                   help="the prepare.py to time (default: this tree's)")
    a = p.parse_args()
    under_test = load_module(a.prepare)
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tok_path = a.tokenizer
        if tok_path is None:
            print("training a WordPiece vocabulary of 30522 on the corpus (not timed)")
            with contextlib.redirect_stdout(io.StringIO()):
                prepare.main(["text", "--input", *a.input, "--train-vocab", "30522", "--out", os.path.join(tmp, "v"),
                              "--doc-per", a.doc_per])
            tok_path = os.path.join(tmp, "v", "tokenizer.json")
        tok = Tokenizer.from_file(tok_path)

        args = argparse.Namespace(text_field="text", max_doc_chars=1 << 24, doc_per=a.doc_per, strict=False)
        listing = prepare.list_files(a.input, None, hidden=False)
        sources = [prepare.Source(f, args) for f in listing.files]
        corpus = prepare.Corpus(sources, prepare.Skips(args), set())
        docs = [text for text, _, _ in corpus.documents()]
        mb = sum(s.size for s in sources) / 1e6
        print(f"{len(sources):,} files, {mb:.1f} MB, {len(docs):,} documents; {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.1f}")

        def encode(fn):
            n = 0
            for i in range(0, len(docs), 2048):
                n += sum(len(e.ids) for e in fn(docs[i:i + 2048], add_special_tokens=False))
            return n

        def run_prepare(k):
            out = os.path.join(tmp, f"out{k}")
            with contextlib.redirect_stdout(io.StringIO()):
                rc = under_test.main(["text", "--input", *a.input, "--tokenizer", tok_path, "--out", out,
                                      "--seq-len", "512", "--doc-per", a.doc_per])
            assert rc == 0
            meta = json.load(open(os.path.join(out, "meta.json")))
            return sum(r["tokens"] - 2 * r["samples"] for r in meta["splits"])  # document tokens: no [CLS]/[SEP]

        cases = [("encode_batch", lambda k: encode(tok.encode_batch))]
        if hasattr(tok, "encode_batch_fast"):
            cases.append(("encode_batch_fast", lambda k: encode(tok.encode_batch_fast)))
        cases.append(("prepare.py text", run_prepare))
        times = {name: [] for name, _ in cases}
        tokens = {}
        for k in range(a.repeat):
            for name, fn in cases:
                w0, c0 = clock()
                tokens[name] = fn(k)
                w1, c1 = clock()
                times[name].append((w1 - w0, c1 - c0))
                print(f"  run {k + 1}: {name:18} {tokens[name] / (w1 - w0) / 1e6:6.3f} M tokens/s "
                      f"({w1 - w0:.2f} s wall, {c1 - c0:.2f} s CPU)", flush=True)
        counts = set(tokens.values())
        assert len(counts) == 1, f"not the same text: {tokens}"
        n = counts.pop()
        print(f"\n{n:,} tokens each; tokens/s (best wall, median wall, per CPU second):")
        best = {}
        for name, _ in cases:
            walls, cpus = [t[0] for t in times[name]], [t[1] for t in times[name]]
            best[name] = (min(walls), statistics.median(walls), min(cpus))
            print(f"  {name:18} {n / min(walls) / 1e6:6.3f} M   {n / statistics.median(walls) / 1e6:6.3f} M   "
                  f"{n / min(cpus) / 1e6:6.3f} M")
        ref, got = best["encode_batch"], best["prepare.py text"]
        print(f"\nprepare.py text / encode_batch: {100 * ref[0] / got[0]:.0f}% (best wall), "
              f"{100 * ref[1] / got[1]:.0f}% (median wall), {100 * ref[2] / got[2]:.0f}% (CPU)")
        if "encode_batch_fast" in best:
            f = best["encode_batch_fast"]
            print(f"prepare.py text / encode_batch_fast: {100 * f[0] / got[0]:.0f}% (best wall), "
                  f"{100 * f[2] / got[2]:.0f}% (CPU)")


if __name__ == "__main__":
    main()
