#!/usr/bin/env python3
"""tests/test_peer_train.py: tests of tools/peer_train.py, the Hugging Face peer trained as mlm.c trains.

    python3 tests/test_peer_train.py     # prints "N passed, N failed, N skipped" last; exit code 1 on failure
    PYTHON_WITH_TORCH tests/test_peer_train.py   # a python with torch and transformers runs every test
    TRAINER=path/to/trainer_cpu python3 tests/test_peer_train.py   # (default ./trainer_cpu)

Without torch (CI installs only tools/requirements.txt): the schedule against trainer.cu's lr_at (and the lr
column of a ./trainer_cpu run), the packing against data.h's best fit, the masking's rates (15% of each sample's
non-special tokens, 80/10/10), the batches and the validation split's, the records against the trainer's (plot.py
reads them), --like, the one-line errors, and the one-line exit without torch. With torch and transformers (else
skipped, saying why): a packed row computes each of its samples as that sample alone (the attention mask and the
position ids), and the peer trains the tiny preset a few steps on the CPU on shards made by tools/prepare.py; its
metrics.jsonl is plotted and overlaid with ./trainer_cpu's run on the same shards by tokens and by wall-clock.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOL = os.path.join(ROOT, "tools", "peer_train.py")
PLOT = os.path.join(ROOT, "tools", "plot.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import compare_hf  # noqa: E402
import peer_train as pt  # noqa: E402
import plot  # noqa: E402

# The fields of the trainer's records, in its order (trainer.cu's log_step and log_validation).
TRAIN_KEYS = ["kind", "step", "tokens", "epoch", "elapsed_s", "loss", "lr", "grad_norm", "tokens_per_s", "mfu",
              "data_wait_ms", "comm_bytes"]
VAL_KEYS = ["kind", "step", "tokens", "elapsed_s", "val_loss", "val_accuracy", "val_masked", "val_sequences",
            "val_split"]


class Skip(Exception):
    pass


def torch_or_skip():
    """torch and transformers, or Skip saying why they cannot be used here."""
    try:
        import torch
        import transformers

        transformers.BertConfig  # noqa: B018 - a transformers too new for this torch fails here
    except Exception as e:  # noqa: BLE001 - any failure to import is a reason to skip
        raise Skip(f"needs torch and transformers ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; "
                   f"CI installs only tools/requirements.txt)") from None
    return torch, transformers


_DATA = {}


def shards():
    """Byte shards of the repository's cpu/ sources (T = 32), made once by tools/prepare.py."""
    if "dir" not in _DATA:
        d = tempfile.mkdtemp(prefix="peer_train_test_")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare.py"), "bytes", "--input",
                            os.path.join(ROOT, "cpu"), "--out", os.path.join(d, "data"), "--seq-len", "32",
                            "--val-fraction", "0.3"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-500:]
        _DATA["dir"] = d
    return os.path.join(_DATA["dir"], "data")


def trainer_run():
    """./trainer_cpu's run of the tiny preset on shards(): 12 steps of 8 rows, validation every 4 (its --out), or
    Skip when there is no trainer_cpu."""
    if "mlmc" not in _DATA:
        trainer = os.environ.get("TRAINER") or os.path.join(ROOT, "trainer_cpu")
        if not os.access(trainer, os.X_OK):
            raise Skip(f"no {trainer} (./build.sh builds it)")
        data, out = shards(), os.path.join(_DATA["dir"], "mlmc")
        r = subprocess.run([trainer, "--data", os.path.join(data, "train_*.bin"), "--val",
                            os.path.join(data, "val_*.bin"), "--out", out, "--preset", "tiny", "--seq", "32",
                            "--batch", "8", "--steps", "12", "--lr", "5e-3", "--warmup", "2", "--val-every", "4"],
                           capture_output=True, text=True, env=dict(os.environ, EMU_THREADS="2"))
        assert r.returncode == 0, (r.stdout + r.stderr)[-500:]
        _DATA["mlmc"] = out
    return _DATA["mlmc"]


def run_peer(*args, env=None):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, env=env)
    return r.returncode, r.stdout, r.stderr


# ----------------------------------------------------------------------------
# Without torch.
def test_schedule():
    """lr_at is trainer.cu's: linear warmup to --lr, linear decay to 0 at the last step; --warmup's default 1%."""
    got = [pt.lr_at(s, 12, 2, 5e-3) for s in (1, 2, 3, 11, 12)]
    assert all(abs(a - b) < 1e-15 for a, b in zip(got, [2.5e-3, 5e-3, 4.5e-3, 5e-4, 0.0])), got
    assert pt.lr_at(1, 10, 0, 1e-3) == 1e-3 * 9 / 10 and pt.lr_at(10, 10, 0, 1e-3) == 0.0
    assert pt.default_warmup(1000) == 10 and pt.default_warmup(50) == 0
    m, _ = plot.read_metrics(os.path.join(trainer_run(), "metrics.jsonl"))  # the trainer's own lr column
    got = [(r["step"], r["lr"]) for r in m["train"]]
    assert len(got) == 12 and all(abs(lr - pt.lr_at(s, 12, 2, 5e-3)) <= 1e-6 * 5e-3 for s, lr in got), got


def test_pack():
    """data.h's best fit: each sample into the fullest of 16 open rows with room, a full row out at once, the
    fullest row out when none has room; every sample once, whole, in rows of at most T."""
    assert list(pt.pack([5, 3, 4, 2, 6], range(5), 8)) == [[0, 1], [2, 3], [4]]
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 33, 5000)
    order = rng.permutation(5000)
    rows = list(pt.pack(lengths, order, 32))
    flat = [g for r in rows for g in r]
    assert sorted(flat) == list(range(5000)) and all(sum(lengths[g] for g in r) <= 32 for r in rows)
    fill = lengths.sum() / (32 * len(rows))
    assert fill > 0.95, fill
    # never more than 16 open rows: 17 samples of 31 tokens (none fits beside another): the 17th closes the first
    # (the fullest, the first of equals) and takes its place; the open rows come out at the end in their order
    got = list(pt.pack([31] * 17, range(17), 32))
    assert got == [[0], [16]] + [[k] for k in range(1, 16)], got
    # the same rows as data.h: ./trainer_cpu packs a split of mixed lengths in file order (its validation) into
    # as many rows of 32 as pack() does
    trainer = os.environ.get("TRAINER") or os.path.join(ROOT, "trainer_cpu")
    if not os.access(trainer, os.X_OK):
        print(f"  (no {trainer}: the row count is not compared with data.h's)")
        return
    import prepare

    with tempfile.TemporaryDirectory() as d:
        lengths = rng.integers(1, 33, 3000)
        w = prepare.ShardWriter(os.path.join(d, "mixed_00000.bin"), 260, prepare.BYTE_SPECIAL, 32)
        for n in lengths:
            w.add(rng.integers(0, 256, int(n)))
        w.close()
        shard = os.path.join(d, "mixed_*.bin")
        r = subprocess.run([trainer, "--data", shard, "--val", shard, "--out", os.path.join(d, "run"), "--preset",
                            "tiny", "--seq", "32", "--batch", "8", "--steps", "1"], capture_output=True, text=True,
                           env=dict(os.environ, EMU_THREADS="2"))
        assert r.returncode == 0, (r.stdout + r.stderr)[-500:]
        theirs = [ln for ln in r.stdout.splitlines() if ln.startswith(f"data: {shard}:")]
        assert len(theirs) == 2, r.stdout  # --data (shuffled), then --val (file order)
        ours = len(list(pt.pack(lengths, range(3000), 32)))
        assert f"epoch 0: {ours} rows of 32" in theirs[1], (ours, theirs[1])
        shuffled = len(list(pt.pack(lengths, np.random.default_rng(5).permutation(3000), 32)))
        want = int(theirs[0].split("epoch 0: ")[1].split()[0])
        assert abs(shuffled - want) <= 0.02 * want, (shuffled, want)  # another shuffle: about as many rows


def test_masking():
    """Per sample exactly floor(0.15 n + u) of its n non-special tokens are chosen (special tokens and padding never);
    of them 80% [MASK], 10% a random non-special token, 10% unchanged; the labels are the original ids."""
    special = {"pad": 256, "cls": 257, "sep": 258, "mask": 259, "unk": -1}
    rng = np.random.default_rng(1)
    B, T, V = 512, 64, 260
    ids = rng.integers(0, 256, (B, T))
    sample = np.full((B, T), -1)
    n = 0
    for b in range(B):  # rows of samples of 3..40 tokens, [CLS] ... [SEP], padding after the last
        at = 0
        while True:
            length = int(rng.integers(3, 41))
            if at + length > T:
                break
            ids[b, at], ids[b, at + length - 1] = 257, 258
            sample[b, at:at + length] = n
            n, at = n + 1, at + length
        ids[b, at:] = 256
    out, labels = pt.mask_tokens(ids, sample, n, special, V, rng)
    chosen = labels >= 0
    assert (labels[chosen] == ids[chosen]).all() and (out[~chosen] == ids[~chosen]).all()
    assert not np.isin(ids[chosen], [256, 257, 258, 259]).any() and not (sample[chosen] < 0).any()
    cand = np.bincount(sample[(sample >= 0) & (ids < 256)], minlength=n)
    got = np.bincount(sample[chosen], minlength=n)
    assert ((got == np.floor(0.15 * cand)) | (got == np.floor(0.15 * cand) + 1)).all()
    assert abs(got.sum() / cand.sum() - 0.15) < 0.005, got.sum() / cand.sum()
    k = chosen.sum()
    as_mask = (out[chosen] == 259).mean()
    kept = (out[chosen] == ids[chosen]).mean()
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1 - 0.1 / 256) < 0.015, (k, as_mask, kept)
    assert not np.isin(out[chosen & (out != 259)], [256, 257, 258]).any()  # random tokens are ordinary


def test_batches():
    """A micro-batch from the shards: the rows' samples with their spans (lo, hi), positions from 0 in each sample,
    padding after (outside the loss, seeing nothing); the validation batches: the split in file order, every
    sequence once, the same every time; --val-batches takes the first N."""
    train = pt.Shards(os.path.join(shards(), "train_*.bin"), "--data")
    val = pt.Shards(os.path.join(shards(), "val_*.bin"), "--val")
    assert train.vocab_size == 260 and train.special == {"pad": 256, "cls": 257, "sep": 258, "mask": 259, "unk": -1}
    assert train.meta and train.num_tokens == int(train.lengths.sum())
    short = [g for g in range(train.num_samples) if train.lengths[g] <= 12][:3]
    b = pt.make_batch(train, [short[:2], short[2:]], 3, 32, np.random.default_rng(0))
    n0, n1, n2 = (int(train.lengths[g]) for g in short)
    assert b["tokens"] == n0 + n1 + n2 and b["samples"] == 3
    assert list(b["lo"][0, :n0 + n1]) == [0] * n0 + [n0] * n1 and list(b["hi"][0, :n0]) == [n0] * n0
    assert list(b["position"][0, :n0 + n1]) == list(range(n0)) + list(range(n1))
    assert (b["ids"][2] == 256).all() and (b["lo"][2] == b["hi"][2]).all() and (b["labels"][2] < 0).all()
    assert (b["ids"][0, n0 + n1:] == 256).all() and (b["labels"][0, n0 + n1:] < 0).all()
    orig = np.concatenate([train.sample(g) for g in short[:2]])
    lab = b["labels"][0, :n0 + n1]
    assert (np.where(lab >= 0, lab, b["ids"][0, :n0 + n1]) == orig).all()  # the input is the samples, masked
    vb = pt.val_batches(val, 8, 32, 0)
    assert sum(x["samples"] for x in vb) == val.num_samples and sum(x["tokens"] for x in vb) == val.num_tokens
    again = pt.val_batches(val, 8, 32, 0)
    assert all((x["ids"] == y["ids"]).all() and (x["labels"] == y["labels"]).all() for x, y in zip(vb, again))
    assert len(pt.val_batches(val, 8, 32, 2)) == 2
    # the attention mask these spans give (compare_hf.packed_attention_mask, transformers 4.x form)
    mask = compare_hf.packed_attention_mask(b["lo"][:1], b["hi"][:1], 4)[0]
    assert mask[0, :n0].all() and not mask[0, n0:].any() and mask[n0, n0:n0 + n1].all() and not mask[n0, :n0].any()


def test_records():
    """The peer's records have the trainer's fields in its order (those of a ./trainer_cpu run), a number that is
    not finite is null, and plot.py reads them."""
    line = pt.train_record(3, 768, 0.01, 1.5, 5.25, 1e-3, float("inf"), 512.0, 0.2)
    v = pt.val_record(4, 1024, 2.5, 5.0, 0.25, 37, 8, 167)
    assert list(json.loads(line)) == TRAIN_KEYS and list(json.loads(v)) == VAL_KEYS
    assert json.loads(line)["grad_norm"] is None and json.loads(line)["mfu"] is None and line.endswith("}\n")
    r = plot.parse_record("peer", 1, line)
    assert r["step"] == 3 and r["tokens"] == 768 and r["elapsed_s"] == 1.5 and math.isnan(r["grad_norm"])
    assert plot.parse_record("peer", 2, v)["val_split"] == 167
    with open(os.path.join(trainer_run(), "metrics.jsonl")) as f:
        theirs = [json.loads(ln) for ln in f]
    assert list(next(r for r in theirs if r["kind"] == "train")) == TRAIN_KEYS
    assert list(next(r for r in theirs if r["kind"] == "val")) == VAL_KEYS


def test_like():
    """--like RUN takes the schedule of an mlm.c run from its run.json; flags given win."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "run.json"), "w") as f:
            f.write('{"steps": 300, "warmup": 7, "lr": 0.00100000005, "global_batch": 64, "world": 2, '
                    '"grad_accum": 4, "batch": 8, "seq": 128}\n')
        a = pt.parse_args(["--data", "x", "--out", "y", "--like", d, "--preset", "mini"])
        assert (a.steps, a.warmup, a.lr, a.global_batch, a.batch, a.seq) == (300, 7, 0.00100000005, 64, 64, 128)
        a = pt.parse_args(["--data", "x", "--out", "y", "--like", d, "--preset", "mini", "--batch", "16", "--steps",
                           "100", "--seq", "64"])
        assert (a.steps, a.warmup, a.global_batch, a.batch, a.seq) == (100, 7, 64, 16, 64)


def test_errors_one_line():
    """Bad flags, shards or --out: exit 1 and one line naming the flag or file, before torch is needed."""
    data = os.path.join(shards(), "train_*.bin")
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "old")
        os.makedirs(run)
        open(os.path.join(run, "metrics.jsonl"), "w").close()
        base = ["--data", data, "--out", os.path.join(d, "r"), "--preset", "tiny", "--seq", "32", "--steps", "3"]
        for args, want in (
                (["--data", data, "--out", d, "--preset", "nope", "--steps", "3"], "--preset nope: unknown; one of"),
                (["--data", data, "--out", d, "--preset", "tiny", "--seq", "32"], "--steps: missing (expected"),
                (base + ["--warmup", "3"], "--warmup 3: expected 0 <= warmup < --steps 3"),
                (base[:-2] + ["--steps", "0"], "--steps 0: expected"),
                (base + ["--global-batch", "8", "--batch", "3"], "--global-batch 8 --batch 3: expected"),
                (base[:6] + ["--seq", "64", "--steps", "3", "--batch", "2"], "--seq 64: expected 2..40 (tiny's"),
                (base + ["--batch", "2", "--val-every", "2"], "--val-every 2: needs --val GLOB"),
                (base + ["--batch", "2", "--lr", "2"], "--lr 2.0: expected a number in [0, 1]"),
                (["--data", os.path.join(d, "none_*.bin")] + base[2:] + ["--batch", "2"],
                 "--data " + os.path.join(d, "none_*.bin") + ": no such file"),
                (base[:2] + ["--out", run] + base[4:] + ["--batch", "2"], f"--out {run}: holds a run (metrics.jsonl)"),
                (base + ["--batch", "2", "--like", d], f"--like {d}: cannot read the run's schedule"),
                (base[:6] + ["--seq", "16", "--steps", "3", "--batch", "2"],
                 "do not fit rows of T=16 (prepare it with")):
            rc, out, err = run_peer(*args)
            assert rc == 1 and want in err, (args, rc, err)
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_without_torch():
    """Without torch (or transformers): one line naming them and the pip command, exit 2."""
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "fake", "torch"))
        with open(os.path.join(d, "fake", "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('No module named torch')\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(d, "fake"))
        rc, out, err = run_peer("--data", os.path.join(shards(), "train_*.bin"), "--out", os.path.join(d, "r"),
                                "--preset", "tiny", "--seq", "32", "--steps", "3", "--batch", "2", env=env)
        assert rc == 2 and "needs PyTorch and transformers (pip install torch transformers)" in err, (rc, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


# ----------------------------------------------------------------------------
# With torch and transformers.
def test_packed_rows_are_samples_alone():
    """The mask and position ids the peer gives transformers make each sample of a packed row compute as it would
    alone in a row of its own (mlm.c's packing); without them the samples see each other."""
    torch, transformers = torch_or_skip()
    train = pt.Shards(os.path.join(shards(), "train_*.bin"), "--data")
    short = [g for g in range(train.num_samples) if train.lengths[g] <= 14][:3]
    b = pt.make_batch(train, [short[:2], short[2:]], 2, 32, np.random.default_rng(0))
    peer = pt.Peer.__new__(pt.Peer)  # only what tensors() needs
    peer.torch, peer.device, peer.autocast = torch, "cpu", False
    peer.major = int(transformers.__version__.split(".")[0])
    torch.manual_seed(0)
    model, attn = pt.new_model(transformers, pt.bert_config(transformers, "tiny", 260, 256), eager_fallback=True)
    model.eval()
    ids, mask, position, _ = peer.tensors(b)
    err = plain = 0.0
    with torch.no_grad():
        packed = model(input_ids=ids, attention_mask=mask, position_ids=position).logits
        unmasked = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        for r, row in enumerate([short[:2], short[2:]]):
            at = 0
            for g in row:
                n = int(train.lengths[g])
                one = ids[r:r + 1, at:at + n]
                alone = model(input_ids=one, attention_mask=torch.ones_like(one)).logits[0]
                err = max(err, (alone - packed[r, at:at + n]).abs().max().item())
                plain = max(plain, (alone - unmasked[r, at:at + n]).abs().max().item())
                at += n
    assert err < 1e-4 and plain > 1e-3, (err, plain, attn, transformers.__version__)


def test_attention_mask():
    """The mask made on the device is compare_hf.packed_attention_mask's, for transformers 4.x and 5.x."""
    torch, _ = torch_or_skip()
    rng = np.random.default_rng(3)
    lo = np.zeros((3, 16), np.int64)
    hi = np.zeros((3, 16), np.int64)
    for b in range(3):  # samples of random lengths, then padding (lo == hi)
        at = 0
        while at < 16:
            n = int(rng.integers(1, 8))
            if at + n > 16 or rng.random() < 0.15:
                break
            lo[b, at:at + n], hi[b, at:at + n] = at, at + n
            at += n
    for major in (4, 5):
        want = compare_hf.packed_attention_mask(lo, hi, major)
        got = pt.attention_mask(torch, torch.from_numpy(lo), torch.from_numpy(hi), major, torch.float32).numpy()
        assert got.shape == want.shape and got.dtype == want.dtype and (got == want).all(), (major, got, want)


def test_train_tiny_cpu():
    """The peer trains the tiny preset 12 steps on the CPU (global batch 8 as 2 x 4, validation every 4 on the
    whole split); plot.py reads its metrics.jsonl as the trainer's, plots it, and overlays it with ./trainer_cpu's
    run on the same shards by tokens and by wall-clock."""
    torch_or_skip()
    data = shards()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "peer")
        rc, o, err = run_peer("--data", os.path.join(data, "train_*.bin"), "--val", os.path.join(data, "val_*.bin"),
                              "--out", out, "--preset", "tiny", "--seq", "32", "--global-batch", "8", "--batch", "4",
                              "--steps", "12", "--lr", "5e-3", "--warmup", "2", "--val-every", "4", "--device", "cpu")
        assert rc == 0, (o + err)[-800:]
        m, notes = plot.read_metrics(os.path.join(out, "metrics.jsonl"))
        assert not notes, notes
        train, val = m["train"], m["val"]
        assert [r["step"] for r in train] == list(range(1, 13)) and [r["step"] for r in val] == [4, 8, 12]
        assert all(abs(r["lr"] - pt.lr_at(r["step"], 12, 2, 5e-3)) < 1e-12 for r in train)
        assert all(0 < r["tokens"] - p["tokens"] <= 8 * 32 for p, r in zip(train, train[1:]))
        assert all(p["elapsed_s"] < r["elapsed_s"] for p, r in zip(train, train[1:]))
        assert abs(train[0]["loss"] - math.log(260)) < 0.3 and train[-1]["loss"] < train[0]["loss"], train
        assert val[-1]["val_loss"] < val[0]["val_loss"] + 0.05 and val[-1]["val_sequences"] == val[-1]["val_split"]
        with open(os.path.join(out, "run.json")) as f:
            run = json.load(f)
        assert {k: run[k] for k in ("steps", "warmup", "global_batch", "grad_accum", "batch", "seq", "preset",
                                    "vocab_size")} == {"steps": 12, "warmup": 2, "global_batch": 8, "grad_accum": 2,
                                                       "batch": 4, "seq": 32, "preset": "tiny", "vocab_size": 260}
        r = subprocess.run([sys.executable, PLOT, out], capture_output=True, text=True)
        assert r.returncode == 0 and "(12 train, 3 val records)" in r.stdout, r.stdout + r.stderr
        try:
            mlmc = trainer_run()
        except Skip as e:
            print(f"  (no overlay with mlm.c's run: {e})")
            return
        for x in ("tokens", "time"):
            png = os.path.join(d, f"{x}.png")
            r = subprocess.run([sys.executable, PLOT, "--overlay", mlmc, out, "--labels", "mlm.c,peer", "--x", x,
                                "--out", png, "--window", "3"], capture_output=True, text=True)
            assert r.returncode == 0 and os.path.isfile(png), r.stdout + r.stderr
            assert "losses at equal tokens: 3072 tokens" in r.stdout and "losses at equal wall-clock" in r.stdout
            assert "the lowest every run reached" in r.stdout, r.stdout
        print("\n".join("  " + ln for ln in r.stdout.splitlines()))


if __name__ == "__main__":
    passed = failed = skipped = 0
    for name, fn in sorted((n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)):
        try:
            fn()
            passed += 1
            print(f"ok   {name}")
        except Skip as e:
            skipped += 1
            print(f"skip {name}: {e}")
        except Exception as e:  # noqa: BLE001 - report and go on
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    if "dir" in _DATA:
        shutil.rmtree(_DATA["dir"], ignore_errors=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)
