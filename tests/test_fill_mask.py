#!/usr/bin/env python3
"""tests/test_fill_mask.py: tests of tools/fill_mask.py that need no PyTorch (needs tools/requirements.txt).

    python3 tests/test_fill_mask.py          # prints "N passed, N failed" last; exit code 1 on failure

What runs without PyTorch: reading an export's byte_tokenizer.json and config.json, the masked input
ids for bytes and for text (through `tokenizers`), the choice of masked positions, every argument
error (one line, no traceback), and the PyTorch-missing message. test_real_export reads the export
of a real ./trainer_cpu run (tiny preset) with --inputs-only, and reads its tokenizer.json with Hugging
Face's `tokenizers`: the model's ids for bytes and for [PAD] [CLS] [SEP] [MASK], the same input ids as
fill_mask.py; where transformers is installed, AutoTokenizer.from_pretrained(DIR) gives those ids too, and
where PyTorch is too, pipeline("fill-mask", model=DIR)'s top prediction is fill_mask.py's at every mask.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOL = os.path.join(ROOT, "tools", "fill_mask.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import fill_mask  # noqa: E402

BYTE_TOK = {"type": "bytes", "vocab_size": 260, "bytes": "token id b (0..255) is the byte b",
            "special_tokens": {"[PAD]": 256, "[CLS]": 257, "[SEP]": 258, "[MASK]": 259}}
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "the", "cat", "sat", "on", "mat", "."]


def byte_export(d, max_pos=40, tok=BYTE_TOK, vocab=260):
    os.makedirs(d, exist_ok=True)
    json.dump({"model_type": "bert", "max_position_embeddings": max_pos, "vocab_size": vocab},
              open(os.path.join(d, "config.json"), "w"))
    if tok is not None:
        json.dump(tok, open(os.path.join(d, "byte_tokenizer.json"), "w"))
    return d


def text_export(d, max_pos=40):
    from tokenizers.implementations import BertWordPieceTokenizer

    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "vocab.txt"), "w") as f:
        f.write("\n".join(WORDS) + "\n")
    BertWordPieceTokenizer(os.path.join(d, "vocab.txt"), lowercase=True).save(os.path.join(d, "tokenizer.json"))
    json.dump({"model_type": "bert", "max_position_embeddings": max_pos, "vocab_size": len(WORDS)},
              open(os.path.join(d, "config.json"), "w"))
    return d


def parse(argv):
    return fill_mask.build_parser().parse_args(argv)


def run_tool(*argv):
    r = subprocess.run([sys.executable, TOOL, *argv], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def test_byte_tokenizer():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "byte_tokenizer.json")
        json.dump(BYTE_TOK, open(path, "w"))
        t = fill_mask.load_byte_tokenizer(path)
        assert t == {"vocab_size": 260, "[PAD]": 256, "[CLS]": 257, "[SEP]": 258, "[MASK]": 259}, t
        bad = [
            ({**BYTE_TOK, "type": "wordpiece"}, '"type": "bytes"'),
            ({**BYTE_TOK, "vocab_size": 100}, '"vocab_size" is 100'),
            ({**BYTE_TOK, "vocab_size": "260"}, '"vocab_size" is "260"'),
            ({k: v for k, v in BYTE_TOK.items() if k != "special_tokens"}, 'no "special_tokens"'),
            ({**BYTE_TOK, "special_tokens": {"[PAD]": 256, "[CLS]": 257, "[SEP]": 258}}, "[MASK] is null"),
            ({**BYTE_TOK, "special_tokens": {"[PAD]": 256, "[CLS]": 257, "[SEP]": 258, "[MASK]": 65}}, "[MASK] is 65"),
            ({**BYTE_TOK, "special_tokens": {"[PAD]": 256, "[CLS]": 257, "[SEP]": 258, "[MASK]": 260}}, "in 256..259"),
            ({**BYTE_TOK, "special_tokens": {"[PAD]": 256, "[CLS]": 257, "[SEP]": 257, "[MASK]": 259}}, "id 257 of another"),
            ([1, 2], '"type": "bytes"'),
        ]
        for content, want in bad:
            json.dump(content, open(path, "w"))
            try:
                fill_mask.load_byte_tokenizer(path)
                assert False, f"accepted {content}"
            except fill_mask.FillMaskError as e:
                assert want in str(e) and path in str(e), f"{e} does not say {want}"
        open(path, "w").write("{not json")
        try:
            fill_mask.load_byte_tokenizer(path)
            assert False, "accepted bad JSON"
        except fill_mask.FillMaskError as e:
            assert "not readable JSON" in str(e)


def test_byte_inputs():
    with tempfile.TemporaryDirectory() as d:
        exp = byte_export(os.path.join(d, "exp"))
        data = bytes(range(100, 200))
        f = os.path.join(d, "blob")
        open(f, "wb").write(data)
        # a window, every 8th byte masked: [CLS] 10 bytes [SEP], positions 0 and 8 masked
        p = fill_mask.prepare(parse([exp, "--file", f, "--offset", "5", "--length", "10", "--mask-every", "8"]))
        want = [257] + list(data[5:15]) + [258]
        want[1] = want[9] = 259
        assert p["ids"] == want and p["where"] == [1, 9] and p["was"] == [105, 113], p
        # --positions, repeated and out of order
        p = fill_mask.prepare(parse([exp, "--file", f, "--length", "6", "--positions", "5,0,5"]))
        assert p["ids"] == [257, 259, 101, 102, 103, 104, 259, 258] and p["was"] == [100, 105]
        # the default --length: what the model's 40 positions hold
        p = fill_mask.prepare(parse([exp, "--file", f, "--mask-every", "10"]))
        assert len(p["ids"]) == 40 and p["ids"][1:-1].count(259) == 4
        # --text on a bytes export: its UTF-8 bytes, [MASK] written in it
        p = fill_mask.prepare(parse([exp, "--text", "ab[MASK]c\u00e9[MASK]"]))
        assert p["ids"] == [257, 97, 98, 259, 99, 0xC3, 0xA9, 259, 258] and p["where"] == [3, 7]
        assert p["was"] == [None, None]
        assert fill_mask.byte_name(65, {}) == "0x41 'A'" and fill_mask.byte_name(0, {}) == "0x00"
        rc, out, err = run_tool(exp, "--file", f, "--length", "4", "--positions", "1", "--inputs-only")
        assert rc == 0 and out.strip() == "input (6 tokens, 1 masked as __): [CLS] 64 __ 66 67 [SEP]", out + err


def test_text_inputs():
    with tempfile.TemporaryDirectory() as d:
        exp = text_export(os.path.join(d, "exp"))
        ids = {w: i for i, w in enumerate(WORDS)}
        p = fill_mask.prepare(parse([exp, "--text", "The cat [MASK] on the mat."]))
        want = [ids[w] for w in ("[CLS]", "the", "cat", "[MASK]", "on", "the", "mat", ".", "[SEP]")]
        assert p["ids"] == want and p["where"] == [3] and p["was"] == [None], p["ids"]
        p = fill_mask.prepare(parse([exp, "--text", "[MASK] cat sat[MASK]", "--top", "3"]))
        assert p["ids"] == [2, 4, 8, 9, 4, 3] and p["where"] == [1, 4]
        # an input without [MASK]: --mask-every, --positions (the token that was there is known)
        p = fill_mask.prepare(parse([exp, "--text", "hello world the cat", "--mask-every", "2"]))
        assert p["ids"] == [2, 4, 6, 4, 8, 3] and p["was"] == [ids["hello"], ids["the"]]
        p = fill_mask.prepare(parse([exp, "--text", "hello world", "--positions", "1"]))
        assert p["ids"] == [2, 5, 4, 3] and p["was"] == [6]
        # --file on a text export: the window decoded as UTF-8 and tokenized
        f = os.path.join(d, "doc.txt")
        open(f, "w").write("xx hello world")
        p = fill_mask.prepare(parse([exp, "--file", f, "--offset", "3", "--positions", "0"]))
        assert p["ids"] == [2, 4, 6, 3] and p["was"] == [5]
        rc, out, err = run_tool(exp, "--text", "hello [MASK]", "--inputs-only")
        assert rc == 0 and out.strip() == "input (4 tokens, 1 masked as __): [CLS] hello __ [SEP]", out + err


def test_errors_one_line():
    """Every bad argument or export: exit 1 and one line naming the flag or file, no traceback."""
    with tempfile.TemporaryDirectory() as d:
        bexp = byte_export(os.path.join(d, "b"))
        texp = text_export(os.path.join(d, "t"))
        f = os.path.join(d, "blob")
        open(f, "wb").write(bytes(range(50)))
        cases = [
            ([os.path.join(d, "none"), "--text", "a"], "none: no such directory"),
            ([d, "--text", "a"], "config.json: no such file"),
            ([byte_export(os.path.join(d, "notok"), tok=None), "--text", "a[MASK]"], "no tokenizer.json or byte_tokenizer.json"),
            ([byte_export(os.path.join(d, "v"), vocab=300), "--text", "a[MASK]"], "the tokenizer has 260 tokens but config.json's vocab_size is 300"),
            ([bexp], "give --text TEXT or --file PATH"),
            ([bexp, "--text", "abc"], "nothing to mask"),
            ([bexp, "--text", "abc", "--positions", "3"], "--positions 3: outside the input's 3 tokens"),
            ([bexp, "--text", "abc", "--positions", "x,1"], "--positions: 'x,1': expected 0-based positions separated by commas"),
            ([bexp, "--text", "abc", "--positions", "0", "--mask-every", "2"], "give one of them"),
            ([bexp, "--text", "a[MASK]", "--mask-every", "2"], "has [MASK] already"),
            ([bexp, "--text", "abc", "--mask-every", "0"], "--mask-every 0: expected >= 1"),
            ([bexp, "--text", "a[MASK]", "--top", "0"], "--top 0: expected >= 1"),
            ([bexp, "--text", "x" * 39 + "[MASK]"], "more than the model's 40 positions (at most 38 tokens"),
            ([bexp, "--file", f, "--length", "60", "--mask-every", "4"], "is 50 tokens; with [CLS] and [SEP]"),
            ([bexp, "--file", f, "--offset", "50", "--mask-every", "4"], "no bytes at --offset 50 (the file has 50)"),
            ([bexp, "--file", f, "--offset", "-1", "--mask-every", "4"], "--offset -1: expected >= 0"),
            ([bexp, "--file", f, "--length", "0", "--mask-every", "4"], "--length 0: expected >= 1"),
            ([bexp, "--file", os.path.join(d, "missing"), "--mask-every", "4"], "--file"),
            ([bexp, "--text", "a[MASK]", "--length", "4"], "--offset and --length select a window of --file"),
            ([bexp, "--text", "a", "--file", f], "not allowed with argument"),
            ([texp, "--text", "hello world"], "nothing to mask"),
        ]
        for argv, want in cases:
            rc, out, err = run_tool(*argv, "--inputs-only")
            assert rc != 0, f"{argv}: exit 0: {out}"
            lines = err.strip().splitlines()
            assert lines and want in lines[-1], f"{argv}: {err!r} does not say {want!r}"
            assert "Traceback" not in err and (len(lines) == 1 or lines[0].startswith("usage:")), f"{argv}: {err}"
        open(os.path.join(texp, "tokenizer.json"), "w").write('{"version": "1.0"}')
        rc, out, err = run_tool(texp, "--text", "hello [MASK]", "--inputs-only")
        assert rc == 1 and "tokenizer.json: not a tokenizer.json" in err and "Traceback" not in err, err


def test_without_pytorch():
    """Loading the model without PyTorch or transformers: one line with the pip command."""
    have = importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")
    if have:
        print("skip test_without_pytorch: torch and transformers are installed")
        return
    with tempfile.TemporaryDirectory() as d:
        exp = byte_export(os.path.join(d, "b"))
        rc, out, err = run_tool(exp, "--text", "ab[MASK]")
        assert rc == 1 and "needs PyTorch and transformers" in err and "pip install torch transformers" in err, err
        assert "Traceback" not in err and "input (5 tokens" in out, out + err


def test_real_export():
    """The export of a real ./trainer_cpu run (tiny preset, bytes): its files are what fill_mask.py reads."""
    trainer = os.environ.get("TRAINER") or os.path.join(ROOT, "trainer_cpu")  # TRAINER overrides ./trainer_cpu
    assert os.access(trainer, os.X_OK), f"no {trainer} (run ./build.sh cpu)"
    with tempfile.TemporaryDirectory() as d:
        prep = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare.py"), "bytes", "--input",
                               os.path.join(ROOT, "cpu"), "--out", os.path.join(d, "data"), "--seq-len", "32"],
                              capture_output=True, text=True)
        assert prep.returncode == 0, prep.stderr[-500:]
        out = os.path.join(d, "run")
        r = subprocess.run([trainer, "--data", os.path.join(d, "data", "train_*.bin"), "--out", out, "--preset", "tiny",
                            "--seq", "32", "--batch", "4", "--steps", "2"], capture_output=True, text=True)
        assert r.returncode == 0, (r.stdout + r.stderr)[-500:]
        assert os.path.isfile(os.path.join(out, "byte_tokenizer.json")), (
            "the export has no byte_tokenizer.json (the export's tokenizer comes with the trainer's issue-11 branch)")
        tok = fill_mask.load_byte_tokenizer(os.path.join(out, "byte_tokenizer.json"))
        assert tok == {"vocab_size": 260, "[PAD]": 256, "[CLS]": 257, "[SEP]": 258, "[MASK]": 259}, tok
        config = json.load(open(os.path.join(out, "config.json")))
        assert config["pad_token_id"] == 256, f"config.json pad_token_id {config['pad_token_id']} (the byte [PAD] is 256)"
        # the default --length: the T=32 the run trained at (tokenizer_config.json), said; a longer input is said
        rc, o, err = run_tool(out, "--file", trainer, "--offset", "4096", "--mask-every", "8", "--inputs-only")
        assert rc == 0 and o.startswith("input (32 tokens, 4 masked as __): [CLS] "), o + err
        assert "--length 30 bytes by default: the model was trained at T=32" in err, err
        rc, o, err = run_tool(out, "--file", trainer, "--length", "38", "--mask-every", "8", "--inputs-only")
        assert rc == 0 and "the input is 40 tokens with [CLS] and [SEP], longer than the T=32" in err, o + err
        hf_byte_tokenizer(out)


def hf_byte_tokenizer(out):
    """The byte export's tokenizer.json through Hugging Face's tokenizers (and transformers, when installed)."""
    from tokenizers import Tokenizer, pre_tokenizers

    t = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    specials = {"[PAD]": 256, "[CLS]": 257, "[SEP]": 258, "[MASK]": 259}
    assert t.get_vocab_size() == 260 and {k: t.token_to_id(k) for k in specials} == specials
    vocab = t.get_vocab()
    assert sorted(v for k, v in vocab.items() if k not in specials) == list(range(256)), "ids 0..255: the bytes"
    assert {k for k, v in vocab.items() if v < 256} == set(pre_tokenizers.ByteLevel.alphabet()), "ByteLevel's alphabet"
    text = "".join(map(chr, range(128))) + " caf\u00e9 \u20ac\U0001F600 \u00ff"  # every ASCII byte, multi-byte characters
    e = t.encode(text)
    assert e.ids == [257] + list(text.encode("utf-8")) + [258], e.ids[:20]
    assert t.decode(e.ids) == text, "decodes back to the text"
    cfg = json.load(open(os.path.join(out, "tokenizer_config.json")))
    sm = json.load(open(os.path.join(out, "special_tokens_map.json")))
    names = {"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["model_max_length"] == 32, cfg
    assert all(cfg[k] == v and sm[k] == v for k, v in names.items()), (cfg, sm)
    # the same ids as fill_mask.py's, [MASK] written in the text
    masked = "int f() { return [MASK]; }\n\u00e9[MASK]"
    p = fill_mask.prepare(parse([out, "--text", masked]))
    assert t.encode(masked).ids == p["ids"], (t.encode(masked).ids, p["ids"])
    if not importlib.util.find_spec("transformers"):
        print("  (transformers is not installed: AutoTokenizer and pipeline('fill-mask') not checked)")
        return
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(out)
    assert (hf.pad_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id) == (256, 257, 258, 259)
    assert hf(masked)["input_ids"] == p["ids"] and hf(text)["input_ids"] == e.ids
    if not importlib.util.find_spec("torch"):
        print("  (PyTorch is not installed: pipeline('fill-mask') not checked)")
        return
    from transformers import pipeline

    res = pipeline("fill-mask", model=out, top_k=1)(masked)
    got = [r[0]["token"] for r in res]  # one list per [MASK]
    want = [ids[0] for ids, _ in fill_mask.predict(out, p["ids"], p["where"], 1)]
    assert got == want, (got, want)


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
