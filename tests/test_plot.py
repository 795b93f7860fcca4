#!/usr/bin/env python3
"""tests/test_plot.py: tests of tools/plot.py (needs matplotlib: tools/requirements.txt).

    python3 tests/test_plot.py          # prints "N passed, N failed" last; exit code 1 on failure

A hand-made metrics.jsonl that follows the trainer's record format (train, val, eval records, nulls,
an unknown kind) is rendered and the PNG checked: signature, size, dimensions from its header, and
the curves' colours in its pixels. Bad files give one line naming the line; a bad line among good ones is
named and skipped. test_real_run trains
./trainer_cpu for a few steps (tiny preset, --seq 32, --val) and plots its --out. The title comes from the run's
directory (run.json, config.json, byte_tokenizer.json), the loss panels have the chance level ln(V), --overlay
compares validation losses at the same tokens (interpolated), and runs written as tools/peer_train.py writes them
(its record functions, no torch needed) overlay by wall-clock (--x time) with the time to a loss.
"""
import contextlib
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOL = os.path.join(ROOT, "tools", "plot.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import plot  # noqa: E402


def train_record(step, loss):
    return {"kind": "train", "step": step, "tokens": 256 * step, "epoch": step / 50, "elapsed_s": 0.1 * step,
            "loss": loss, "lr": 1e-3 * min(1, step / 5), "grad_norm": 2.0 / step, "tokens_per_s": 2500.0 + step,
            "mfu": None, "data_wait_ms": 0.01}


def handmade(path, broken_loss_at=7):
    lines = []
    for s in range(1, 41):
        loss = 5.6 * math.exp(-s / 15) + 1.0
        lines.append(json.dumps(train_record(s, None if s == broken_loss_at else loss)))
        if s % 10 == 0:
            lines.append(json.dumps({"kind": "val", "step": s, "tokens": 256 * s, "elapsed_s": 0.1 * s,
                                     "val_loss": loss + 0.2, "val_accuracy": 0.1 + s / 100, "val_masked": 612}))
    lines.append(json.dumps({"kind": "note", "text": "a kind plot.py does not know"}))
    lines.append(json.dumps({"kind": "eval", "step": 40, "source": "runs/x/checkpoint.bin", "val_loss": 1.9,
                             "val_accuracy": 0.52, "val_masked": 612}))
    lines.append(json.dumps({"kind": "eval", "step": 0, "source": "runs/x", "val_loss": 2.1,  # an export: step 0
                             "val_accuracy": 0.5, "val_masked": 612}))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def png_info(path):
    """(width, height) from the IHDR chunk, after checking the signature and the chunk's CRC."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature"
    length, ctype = struct.unpack(">I4s", data[8:16])
    assert ctype == b"IHDR" and length == 13, "IHDR first"
    assert struct.unpack(">I", data[29:33])[0] == zlib.crc32(data[12:29]), "IHDR CRC"
    assert data[-12:-4] == b"\x00\x00\x00\x00IEND", "ends with IEND"
    w, h = struct.unpack(">II", data[16:24])
    return w, h, len(data)


def colour_pixels(path, rgb, tol=0.06):
    """How many pixels are within tol of a colour (RGB in 0..1)."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(path)[:, :, :3]
    return int((np.abs(img - np.array(rgb)).max(axis=2) < tol).sum())


C0, C1, C2 = (0.122, 0.467, 0.706), (1.0, 0.498, 0.055), (0.173, 0.627, 0.173)  # matplotlib's tab10 colours


def run_tool(*args):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def test_render_handmade():
    with tempfile.TemporaryDirectory() as d:
        handmade(os.path.join(d, "metrics.jsonl"))
        rc, out, err = run_tool(d)
        assert rc == 0, err
        png = os.path.join(d, "metrics.png")
        assert f"wrote {png} (40 train, 4 val, 2 eval records)" in out, out
        assert "1 record(s) of other kinds ignored" in err, err
        w, h, size = png_info(png)
        assert (w, h) == (1200, 800), (w, h)  # figsize 12 x 8 inches at 100 dpi
        assert size > 20000, size
        # The curves are drawn: training (C0), validation (C1) and tokens/s (C2) pixels
        assert colour_pixels(png, C0) > 300 and colour_pixels(png, C1) > 100 and colour_pixels(png, C2) > 100
        assert not [p for p in os.listdir(d) if ".tmp" in p], "no temporary file left"


def test_read_metrics():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "metrics.jsonl")
        handmade(path)
        m, notes = plot.read_metrics(path)
        assert [len(m[k]) for k in ("train", "val", "eval")] == [40, 4, 2]
        assert math.isnan(m["train"][6]["loss"]) and math.isnan(m["train"][0]["mfu"]), "null is nan (a gap)"
        assert abs(m["val"][1]["val_accuracy"] - 0.3) < 1e-12 and m["eval"][1]["val_loss"] == 1.9
        # a step logged twice keeps its last record; records come sorted by step
        with open(path, "a") as f:
            f.write(json.dumps(train_record(3, 9.5)) + "\n")
        m, _ = plot.read_metrics(path)
        assert len(m["train"]) == 40 and m["train"][2]["loss"] == 9.5
        assert [r["step"] for r in m["train"]] == list(range(1, 41))
        # an unfinished last line (the trainer is writing it) is skipped with a note
        with open(path, "a") as f:
            f.write('{"kind": "train", "step": 41, "lo')
        m, notes = plot.read_metrics(path)
        assert len(m["train"]) == 40 and any("unfinished last line" in n for n in notes), notes
        assert plot.moving_average([1, math.nan, 3, 5], 2) == [1, 1, 2, 4]


def test_out_and_x():
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "run")
        os.makedirs(run)
        handmade(os.path.join(run, "metrics.jsonl"))
        rc, out, err = run_tool(run, "--out", os.path.join(d, "curves.png"), "--x", "tokens")
        assert rc == 0 and png_info(os.path.join(d, "curves.png"))[:2] == (1200, 800), err
        rc, out, err = run_tool(os.path.join(run, "metrics.jsonl"), "--out", os.path.join(d, "plots", "deep"))
        assert rc == 0 and os.path.isfile(os.path.join(d, "plots", "deep", "metrics.png")), err
        # only train records: the accuracy panel says why it is empty; still a full figure
        with open(os.path.join(run, "metrics.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(train_record(s, 5.0 - s / 10)) for s in range(1, 6)) + "\n")
        rc, out, err = run_tool(run)
        assert rc == 0 and "(5 train records)" in out, out + err


def test_errors_one_line():
    """A missing or empty log, or one with nothing to plot: exit 1 and one line naming the file (and the first bad
    line), no traceback. A bad line among good ones is named and skipped, and the rest plotted."""
    with tempfile.TemporaryDirectory() as d:
        def case(content, want, *extra):
            run = tempfile.mkdtemp(dir=d)
            if content is not None:
                with open(os.path.join(run, "metrics.jsonl"), "wb") as f:
                    f.write(content if isinstance(content, bytes) else content.encode())
            rc, out, err = run_tool(run, *extra)
            assert rc == 1, f"{want}: exit {rc}"
            assert want in err, f"{err!r} does not say {want!r}"
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
            assert not os.path.exists(os.path.join(run, "metrics.png")), "no plot from a bad log"

        def skipped(content, want):  # a bad line among good ones: named and skipped, the rest plotted
            run = tempfile.mkdtemp(dir=d)
            with open(os.path.join(run, "metrics.jsonl"), "wb") as f:
                f.write(content if isinstance(content, bytes) else content.encode())
            rc, out, err = run_tool(run)
            assert rc == 0, f"{want}: exit {rc}: {err}"
            assert want in err and "; line skipped" in err, f"{err!r} does not say {want!r}"
            assert os.path.isfile(os.path.join(run, "metrics.png")) and "Traceback" not in err, err

        good = json.dumps(train_record(1, 5.0))
        good2 = json.dumps(train_record(2, 4.0))
        case(None, "metrics.jsonl: no such file (the trainer writes metrics.jsonl in its --out directory)")
        case("", "metrics.jsonl: no train, val or eval record")
        case("\n\n", "metrics.jsonl: no train, val or eval record")
        case('{"kind": "note"}\n', "no train, val or eval record (1 record(s) of other kinds)")
        skipped(good + "\n" + good2 + "\n{not json}\n" + good + "\n", "metrics.jsonl:3: not JSON")
        skipped(good + "\n[1, 2]\n" + good2 + "\n", "metrics.jsonl:2: expected a JSON object, got list")
        case("{not json}\n[1, 2]\n", "no train, val or eval record; 2 bad line(s), the first ")
        case('{"step": 1}\n', 'metrics.jsonl:1: no "kind"')
        case('{"kind": "train", "step": "one"}\n', 'metrics.jsonl:1: "step" is "one" (expected an integer >= 0)')
        case('{"kind": "train", "step": 2.5}\n', '"step" is 2.5')
        skipped(good + '\n{"kind": "val", "step": 1, "val_loss": "low"}\n', 'metrics.jsonl:2: "val_loss" is "low"')
        case('{"kind": "train", "step": 1, "loss": true}\n', '"loss" is true')
        skipped(b'{"kind": "train", "step": 1}\n\xff\xfe\n' + good2.encode() + b"\n", "metrics.jsonl:2: not UTF-8 text")
        case(b"\xff\xfe\n", "metrics.jsonl:1: not UTF-8 text")
        case(good + "\n", "--out", "--out", os.path.join(d, "nodir", "x.png"))
        regular = os.path.join(d, "regular")
        open(regular, "w").close()
        case(good + "\n", "exists and is not a directory", "--out", regular)
        rc, out, err = run_tool(os.path.join(d, "no-such-run"))
        assert rc == 1 and "no-such-run: no such directory" in err and "Traceback" not in err, err


def test_without_matplotlib():
    """Without matplotlib: one line with the pip command."""
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "fake", "matplotlib"))
        with open(os.path.join(d, "fake", "matplotlib", "__init__.py"), "w") as f:
            f.write("raise ImportError('No module named matplotlib')\n")
        handmade(os.path.join(d, "metrics.jsonl"))
        env = dict(os.environ, PYTHONPATH=os.path.join(d, "fake"))
        r = subprocess.run([sys.executable, TOOL, d], capture_output=True, text=True, env=env)
        assert r.returncode == 1 and "needs matplotlib" in r.stderr and "pip install -r tools/requirements.txt" in r.stderr
        assert "Traceback" not in r.stderr, r.stderr


def overlay_run(path, scale, steps=40, tokens_per_step=256, val_every=10, val_fn=None):
    """A hand-made run whose losses are scale x the handmade curve (its table values are known); its validation
    losses scale x 2.0, or val_fn(tokens)."""
    os.makedirs(path)
    lines = []
    for s in range(1, steps + 1):
        r = train_record(s, scale * (5.6 * math.exp(-s / 15) + 1.0))
        r["tokens"] = tokens_per_step * s
        lines.append(json.dumps(r))
        if s % val_every == 0:
            v = val_fn(tokens_per_step * s) if val_fn else scale * 2.0
            lines.append(json.dumps({"kind": "val", "step": s, "tokens": tokens_per_step * s, "elapsed_s": 0.1 * s,
                                     "val_loss": v, "val_accuracy": 0.3, "val_masked": 612}))
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")


def test_overlay():
    """--overlay: one figure of several runs (each its colour), and the table of losses at equal tokens."""
    with tempfile.TemporaryDirectory() as d:
        a, b, c = (os.path.join(d, n) for n in ("fp32", "half", "big"))
        overlay_run(a, 1.0)
        overlay_run(b, 1.01)
        overlay_run(c, 1.0, steps=10, tokens_per_step=4 * 256, val_every=5)  # 4x the batch: 40 x 256 tokens too
        png = os.path.join(d, "o.png")
        rc, out, err = run_tool("--overlay", a, b, c, "--x", "tokens", "--out", png)
        assert rc == 0, err
        assert f"wrote {png} (3 runs overlaid)" in out, out
        w, h, size = png_info(png)
        assert (w, h) == (960, 360) and 10000 < size < 200000, (w, h, size)  # 12 x 4.5 inches at 80 dpi
        assert colour_pixels(png, C0) > 200 and colour_pixels(png, C1) > 200 and colour_pixels(png, C2) > 40
        # the table: at 10240 tokens (all end there), the mean train loss over (9216, 10240] and the last val
        rows = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines()[2:5]}
        assert "losses at equal tokens: 10240 tokens" in out.splitlines()[0], out
        want_a = sum(5.6 * math.exp(-s / 15) + 1.0 for s in (37, 38, 39, 40)) / 4
        assert abs(float(rows["fp32"][0]) - want_a) < 1e-4 and rows["fp32"][1] == "+0.00%", rows
        assert rows["half"][1] == "+1.00%" and rows["half"][3] == "+1.00%" and float(rows["half"][2]) == 2.02, rows
        assert rows["big"][0] == f"{5.6 * math.exp(-10 / 15) + 1.0:.4f}" and rows["big"][3] == "+0.00%", rows
        # --labels; a run that ends first sets the equal tokens
        short = os.path.join(d, "short")
        overlay_run(short, 1.0, steps=20)
        rc, out, err = run_tool("--overlay", a, short, "--labels", "A,B", "--out", png, "--window", "5")
        assert rc == 0 and "losses at equal tokens: 5120 tokens" in out and out.splitlines()[2].startswith("A "), out
        # bad input: one line each, no figure written
        os.remove(png)
        for args, want in (((a, b, "--labels", "x", "--out", png), "--labels x: expected 2 non-empty names"),
                           ((a, b), "--overlay: needs --out FILE.png"),
                           ((a, os.path.join(d, "nope"), "--out", png), "nope: no such directory"),
                           ((a, b, "--out", png, "--window", "0"), "--window 0: expected at least 1")):
            rc, out, err = run_tool("--overlay", *args)
            assert rc == 1 and want in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
            assert not os.path.exists(png), args


def test_overlay_val_at_equal_tokens():
    """The table's validation losses are compared at the same tokens: where one run's validations end first (at 9216
    tokens, its batch 4x the other's), the other's is interpolated there between its validations at 7680 and 10240
    tokens, not taken from its validation nearest the end (10240)."""
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "small"), os.path.join(d, "big")
        line = lambda tokens: 5.0 - tokens / 10240  # noqa: E731 - the same validation curve against tokens
        overlay_run(a, 1.0, val_fn=line)  # validations at 2560, 5120, 7680, 10240 tokens
        overlay_run(b, 1.0, steps=10, tokens_per_step=1024, val_every=3, val_fn=line)  # 3072, 6144, 9216
        png = os.path.join(d, "o.png")
        rc, out, err = run_tool("--overlay", a, b, "--x", "tokens", "--out", png)
        assert rc == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("losses at equal tokens: 10240 tokens") and "val: at 9216 tokens" in lines[0], out
        rows = {ln.split()[0]: ln.split()[1:] for ln in lines[2:4]}
        assert rows["small"][2] == rows["big"][2] == f"{line(9216):.4f}" and rows["big"][3] == "+0.00%", out
        # the helper: exact at a point, linear between two, nan outside
        pts = [(0.0, 1.0), (10.0, 3.0)]
        assert plot.value_at(pts, 10.0) == 3.0 and plot.value_at(pts, 2.5) == 1.5 and math.isnan(plot.value_at(pts, 11))
        assert plot.value_at([(5.0, 2.0)], 5.0) == 2.0


def peer_style_run(path, steps, per_step_s, start_s, loss_fn, val_fn, val_every=10, tokens_per_step=256, run=None):
    """A run directory written with tools/peer_train.py's record functions (no torch), elapsed start_s + per_step_s
    x step; run.json from run (as the peer writes it)."""
    import peer_train

    os.makedirs(path)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            t, n = start_s + per_step_s * s, tokens_per_step * s
            f.write(peer_train.train_record(s, n, n / 1e6, t, loss_fn(s), 1e-3, 1.0, tokens_per_step / per_step_s, 0.1))
            if s % val_every == 0:
                f.write(peer_train.val_record(s, n, t, val_fn(s), 0.3, 612, 100, 100))
    if run is not None:
        with open(os.path.join(path, "run.json"), "w") as f:
            json.dump(run, f)


def test_overlay_time_with_peer():
    """mlm.c's run and the peer's (written by peer_train.py's record functions) overlaid by wall-clock: the figure,
    the losses at equal time (the shorter run's 5 s) and the time each took to reach the loss both reached."""
    with tempfile.TemporaryDirectory() as d:
        loss = lambda s: 5.6 * math.exp(-s / 15) + 1.0  # noqa: E731
        val = lambda s: 6.0 - s / 10  # noqa: E731 - 5, 4, 3, 2 at steps 10 .. 40
        a, b = os.path.join(d, "mlmc"), os.path.join(d, "peer")
        peer_style_run(a, 40, 1 / 8, 0.0, loss, val)  # ends at 5 s
        peer_style_run(b, 40, 1 / 4, 1.0, loss, val, run={"steps": 40, "seq": 32, "global_batch": 8, "vocab_size": 260,
                                                          "preset": "tiny", "data": "d/train_*.bin"})  # ends at 11 s
        png = os.path.join(d, "t.png")
        rc, out, err = run_tool("--overlay", a, b, "--x", "time", "--out", png, "--labels", "mlm.c,peer")
        assert rc == 0, err
        assert png_info(png)[:2] == (960, 360) and colour_pixels(png, C0) > 100 and colour_pixels(png, C1) > 100
        assert "mlmc: no vocabulary size recorded" in err, err  # the peer's run.json has one: its chance level
        lines = out.splitlines()
        at = lines.index(next(ln for ln in lines if ln.startswith("losses at equal wall-clock")))
        assert lines[at].startswith("losses at equal wall-clock: 5.0 s (the shortest run)"), lines[at]
        rows = {ln.split()[0]: ln.split()[1:] for ln in lines[at + 2:at + 4]}
        # mlm.c: steps 37..40 in (4.5, 5.0] s, validation 2.0 at 5 s; the peer: steps 15, 16 (1 + s/4 in (4.5, 5]),
        # validation interpolated at 5 s between 5.0 (3.5 s) and 4.0 (6 s)
        assert float(rows["mlm.c"][0]) == round(sum(loss(s) for s in range(37, 41)) / 4, 4), rows
        assert float(rows["peer"][0]) == round((loss(15) + loss(16)) / 2, 4), rows
        assert rows["mlm.c"][2] == "2.0000" and rows["peer"][2] == "4.4000" and rows["peer"][3] == "+120.00%", rows
        reach = lines.index(next(ln for ln in lines if ln.startswith("time to the validation loss 2.0000")))
        assert lines[reach + 1].split()[:5] == ["mlm.c", "5.0", "s", "10,240", "tokens"], lines[reach + 1]
        assert lines[reach + 2].split()[:5] == ["peer", "11.0", "s", "10,240", "tokens"], lines[reach + 2]
        assert "2.20x mlm.c's time" in lines[reach + 2], lines[reach + 2]
        # the figure: wall-clock axes, a chance level (the peer's vocabulary) on both panels
        runs = [plot.read_metrics(os.path.join(r, "metrics.jsonl"))[0] for r in (a, b)]
        fig = plot.overlay_figure(runs, ["mlm.c", "peer"], "time", 25, [260])
        for ax in fig.axes:
            assert ax.get_xlabel() == "wall-clock (s)", ax.get_xlabel()
            chance = [ln for ln in ax.get_lines() if ln.get_label() == "chance: ln 260 = 5.56"]
            assert len(chance) == 1 and abs(chance[0].get_ydata()[0] - math.log(260)) < 1e-12
        # a single run against the wall-clock, in minutes past 3 minutes
        rc, out, err = run_tool(b, "--x", "time")
        assert rc == 0 and png_info(os.path.join(b, "metrics.png"))[:2] == (1200, 800), err
        m = runs[1]
        for r in m["train"] + m["val"]:
            r["elapsed_s"] *= 60
        assert plot.figure(m, "time").axes[0].get_xlabel() == "wall-clock (min)"


def test_title_and_chance():
    """The single-run figure's title: the run's preset, T, global batch, steps and data from its directory (not its
    path); the loss panel's chance level ln(V) where the directory records V, and none where it does not."""
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "mlmc")
        os.makedirs(run)
        handmade(os.path.join(run, "metrics.jsonl"))  # epoch = step / 50 of 256 tokens a step: 12,800 tokens
        m, _ = plot.read_metrics(os.path.join(run, "metrics.jsonl"))
        info = plot.run_info(run, m)
        assert info["preset"] is None and info["vocab_size"] is None and info["steps"] == 40, info
        assert plot.run_title("mlmc", info) == "mlmc: preset not recorded, 40 steps, data: 12,800 training tokens"
        # what ./trainer leaves: run.json; at the end the export's config.json and, for byte shards, byte_tokenizer.json
        with open(os.path.join(run, "run.json"), "w") as f:
            f.write('{"steps": 40, "warmup": 0, "lr": 0.001, "global_batch": 8, "world": 1, "grad_accum": 1, '
                    '"batch": 8, "seq": 32}\n')
        with open(os.path.join(run, "config.json"), "w") as f:
            json.dump({"vocab_size": 260, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "intermediate_size": 512, "max_position_embeddings": 512}, f)
        with open(os.path.join(run, "byte_tokenizer.json"), "w") as f:
            json.dump({"type": "bytes", "vocab_size": 260}, f)
        info = plot.run_info(run, m)
        want = "mlmc: mini, T=32, global batch 8, 40 steps, data: 12,800 training tokens (byte shards)"
        assert plot.run_title("mlmc", info) == want and info["vocab_size"] == 260, plot.run_title("mlmc", info)
        assert plot.chance(260) == (math.log(260), "chance: ln 260 = 5.56")
        # main() titles the figure with it (not the run's absolute path) and draws the chance level
        got = {}
        real = plot.plot
        plot.plot = lambda metrics, out, x="step", title=None, vocab=None: got.update(title=title, vocab=vocab)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert plot.main([run]) == 0
        finally:
            plot.plot = real
        assert got == {"title": want, "vocab": 260}, got
        fig = plot.figure(m, "step", want, 260)
        assert fig._suptitle.get_text() == want
        chance = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "chance: ln 260 = 5.56"]
        assert len(chance) == 1 and abs(chance[0].get_ydata()[0] - math.log(260)) < 1e-12
        assert "chance: ln 260 = 5.56" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert not [ln for ln in plot.figure(m).axes[0].get_lines() if ln.get_label().startswith("chance")]
        # the peer's run.json names its preset, data and vocabulary itself
        with open(os.path.join(run, "run.json"), "w") as f:
            json.dump({"steps": 40, "global_batch": 16, "seq": 64, "trainer": "peer_train.py", "preset": "tiny",
                       "data": "data/x/train_*.bin", "vocab_size": 211}, f)
        assert plot.run_title("peer", plot.run_info(run, m)) == \
            "peer (peer_train.py): tiny, T=64, global batch 16, 40 steps, data: data/x/train_*.bin"
        assert plot.run_info(run, m)["vocab_size"] == 211


def test_real_run():
    """End to end: ./trainer_cpu trains the tiny preset a few steps with validation; plot.py draws its --out."""
    trainer = os.environ.get("TRAINER") or os.path.join(ROOT, "trainer_cpu")  # TRAINER overrides ./trainer_cpu
    assert os.access(trainer, os.X_OK), f"no {trainer} (run ./build.sh cpu)"
    with tempfile.TemporaryDirectory() as d:
        prep = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare.py"), "bytes", "--input",
                               os.path.join(ROOT, "cpu"), "--out", os.path.join(d, "data"), "--seq-len", "32",
                               "--val-fraction", "0.3"], capture_output=True, text=True)
        assert prep.returncode == 0, prep.stderr[-500:]
        out = os.path.join(d, "run")
        r = subprocess.run([trainer, "--data", os.path.join(d, "data", "train_*.bin"), "--val",
                            os.path.join(d, "data", "val_*.bin"), "--out", out, "--preset", "tiny", "--seq", "32",
                            "--batch", "8", "--steps", "12", "--lr", "5e-3", "--warmup", "2", "--val-every", "4",
                            "--val-batches", "2"], capture_output=True, text=True, env=dict(os.environ, EMU_THREADS="2"))
        assert r.returncode == 0, (r.stdout + r.stderr)[-500:]
        log = os.path.join(out, "metrics.jsonl")
        assert os.path.isfile(log), ("the trainer wrote no metrics.jsonl in --out (the metrics log comes with "
                                     "the trainer's issue-11 branch)")
        m, _ = plot.read_metrics(log)
        assert [r["step"] for r in m["train"]] == list(range(1, 13)), [r["step"] for r in m["train"]]
        assert {4, 8, 12} <= {r["step"] for r in m["val"]}, [r["step"] for r in m["val"]]  # --val-every 4
        assert all(0 <= r["val_accuracy"] <= 1 for r in m["val"]) and m["train"][-1]["loss"] < m["train"][0]["loss"]
        rc, o, err = run_tool(out)
        assert rc == 0 and re.search(r"\(12 train, [0-9]+ val records\)", o), o + err
        w, h, size = png_info(os.path.join(out, "metrics.png"))
        assert (w, h) == (1200, 800) and size > 20000 and colour_pixels(os.path.join(out, "metrics.png"), C1) > 50

        assert m["val"][-1]["val_sequences"] < m["val"][-1]["val_split"]  # --val-batches 2: part of the split
        assert re.fullmatch(r"validation \([0-9]+ of [0-9]+ sequences\)", plot.covers("validation", m["val"][-1]))


def test_coverage_labels():
    """The validation and --eval lines say what they covered (metrics.jsonl's val_sequences of val_split)."""
    nan = math.nan
    assert plot.covers("validation", {"val_sequences": 358.0, "val_split": 358.0}) == \
        "validation (all 358 sequences once)"
    assert plot.covers("--eval of the export", {"val_sequences": 64.0, "val_split": 358.0}) == \
        "--eval of the export (64 of 358 sequences)"
    assert plot.covers("validation", {"val_sequences": nan, "val_split": nan}) == "validation"  # older records
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "metrics.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps({"kind": "val", "step": 4, "val_loss": 4.0, "val_accuracy": 0.2, "val_masked": 900,
                                "val_sequences": 358, "val_split": 358}) + "\n")
        m, _ = plot.read_metrics(path)
        assert plot.covers("validation", m["val"][0]) == "validation (all 358 sequences once)", m["val"][0]


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
