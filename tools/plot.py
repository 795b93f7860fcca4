#!/usr/bin/env python3
"""plot.py: a run's metrics log as PNG curves.

    python3 tools/plot.py runs/a                    # writes runs/a/metrics.png
    python3 tools/plot.py runs/a --out loss.png     # or that file (--out DIR: DIR/metrics.png)
    python3 tools/plot.py runs/a --x tokens         # against tokens seen instead of steps (--x time: wall-clock)
    python3 tools/plot.py --overlay runs/a runs/b --x tokens --out ab.png [--labels A,B]   # runs overlaid
    python3 tools/plot.py --overlay runs/mlmc runs/peer --x time --out t.png   # mlm.c and tools/peer_train.py's run

Reads DIR/metrics.jsonl, which the trainer's rank 0 appends in --out: one JSON object per line,
{"kind": "train", ...} per logged step, {"kind": "val", ...} per validation, {"kind": "eval", ...}
per ./trainer --eval (step 0 for an export); tools/peer_train.py writes the same records. Writes one figure of
four panels, titled with the run's preset, T, global batch, steps and data (run_info: DIR/run.json, config.json,
the tokenizer files and the records; what none of them records is left out of the title):
  loss           training loss per logged step (and its moving average), validation loss, --eval loss (the
                 legend says how many of the validation split's sequences each covered)
                 (a point at the checkpoint's step, or a dashed level line for an export), and the level of
                 chance, ln(vocabulary size) (a model that knows nothing: ln 260 = 5.56 for byte shards)
  accuracy       masked-token accuracy on the validation set (and --eval's)
  throughput     tokens/s (real tokens, padding not counted)
  optimizer      learning rate, and the gradient norm before clipping on a second axis
With --overlay RUN RUN ..., one figure of two panels instead, every run a colour (labelled by its folder's
name, or --labels): the training loss (its moving mean over --window logged steps, the raw values faint; with
--x tokens or time, --window steps of the run with the fewest tokens per step, and the same tokens for the
others) and the validation loss, with the chance level. On stdout, tables of the runs' losses at the same x
for every run, each with its difference to the first run in percent:
  at equal tokens  X = the fewest tokens any run reached; train: the mean of the run's training losses in
                   (0.9 X, X] (none there: its last one before X); val: the run's validation loss at X,
                   interpolated linearly between its two validations around X (exact at one); when a run's
                   validations end before X, all are compared where the first of them end
  at equal time    the same at the wall-clock (elapsed_s) of the shortest run, where every run has elapsed_s
  time to a loss   the wall-clock and tokens each run took to reach the lowest validation loss that every run
                   reached (linear between its validations; already below it at its first: that one's time;
                   without validations in every run, the training loss's moving mean)
Unknown kinds and fields are ignored; a null (a value that was not finite) leaves a gap. A step
logged twice (a resumed run that repeated it) keeps its last record. An unfinished last line (the
run is still writing it) is skipped with a note; so is any other bad line (not UTF-8, not JSON, a
field of the wrong type), named by its number: the rest is plotted. Only a log with nothing to plot
is an error (naming the first bad line, if any).
Needs matplotlib (python3 -m pip install -r tools/requirements.txt); runs headless (Agg).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_peer.py's PRESETS (preset_of)

PIP = "python3 -m pip install -r tools/requirements.txt"
# The numeric fields of each known kind (the trainer's contract); others are ignored.
FIELDS = {
    "train": ("tokens", "epoch", "elapsed_s", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "data_wait_ms"),
    "val": ("tokens", "elapsed_s", "val_loss", "val_accuracy", "val_masked", "val_sequences", "val_split"),
    "eval": ("val_loss", "val_accuracy", "val_masked", "val_sequences", "val_split"),
}



def covers(name, r):
    """A validation or --eval line's label with what it covered: "validation (all 358 sequences once)",
    "validation (64 of 358 sequences)"; just the name for records without the counts (older trainers)."""
    done, split = r.get("val_sequences", math.nan), r.get("val_split", math.nan)
    if math.isnan(done) or math.isnan(split):
        return name
    if done == split:
        return f"{name} (all {int(split)} sequences once)"
    return f"{name} ({int(done)} of {int(split)} sequences)"


class MetricsError(Exception):
    pass


def die(msg):
    print(f"plot.py: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_record(path, n, line):
    """One line of metrics.jsonl as a dict with the kind, an int step and floats (nan for null), or None for
    a record of a kind this tool does not plot. Raises MetricsError naming the line."""
    try:
        r = json.loads(line)
    except ValueError as e:
        raise MetricsError(f"{path}:{n}: not JSON ({e})") from None
    if not isinstance(r, dict):
        raise MetricsError(f"{path}:{n}: expected a JSON object, got {type(r).__name__}")
    kind = r.get("kind")
    if not isinstance(kind, str):
        raise MetricsError(f'{path}:{n}: no "kind" (expected "train", "val", "eval" or another string)')
    if kind not in FIELDS:
        return None
    step = r.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise MetricsError(f'{path}:{n}: "step" is {json.dumps(step)} (expected an integer >= 0)')
    out = {"kind": kind, "step": step}
    for f in FIELDS[kind]:
        v = r.get(f)
        if v is None:
            out[f] = math.nan
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise MetricsError(f'{path}:{n}: "{f}" is {json.dumps(v)} (expected a number or null)')
        else:
            out[f] = float(v)
    return out


def read_metrics(path):
    """metrics.jsonl as {kind: [records sorted by step, one per step]}, and notes for the user."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise MetricsError(f"{path}: no such file (the trainer writes metrics.jsonl in its --out directory)") from None
    except OSError as e:
        raise MetricsError(f"{path}: cannot read: {e.strerror}") from None
    raw = data.split(b"\n")
    notes, lines, bad = [], [], []
    for n, b in enumerate(raw, 1):  # each line decoded on its own: a bad one does not hide the others
        try:
            lines.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            bad.append(f"{path}:{n}: not UTF-8 text")
            lines.append("")
    if lines and lines[-1].strip():  # no newline at the end: a line the trainer is still writing
        try:
            json.loads(lines[-1])
        except ValueError:
            notes.append(f"{path}:{len(lines)}: an unfinished last line, skipped")
            lines[-1] = ""
    by_kind, unknown = {k: {} for k in FIELDS}, 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = parse_record(path, n, line)
        except MetricsError as e:
            bad.append(str(e))
            continue
        if r is None:
            unknown += 1
        else:
            by_kind[r["kind"]][r["step"]] = r  # the last record of a step wins
    if not any(by_kind.values()):
        what = f" ({unknown} record(s) of other kinds)" if unknown else ""
        first = f"; {len(bad)} bad line(s), the first {bad[0]}" if bad else ""
        raise MetricsError(f"{path}: no train, val or eval record{what}{first}: nothing to plot")
    bad.sort(key=lambda m: int(m[len(path) + 1:].split(":")[0]))
    notes += [f"{m}; line skipped" for m in bad]
    if unknown:
        notes.append(f"{path}: {unknown} record(s) of other kinds ignored")
    return {k: [v[s] for s in sorted(v)] for k, v in by_kind.items()}, notes


def column(records, field):
    return [r[field] for r in records]


def moving_average(ys, k):
    """The mean of the last k finite values at each point (nan where there is none yet)."""
    out, window = [], []
    for y in ys:
        if not math.isnan(y):
            window.append(y)
            window = window[-k:]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


def x_of(records, x, train, unit=1.0):
    """The x coordinates: steps, tokens seen, or the wall-clock (elapsed_s / unit); eval records have no tokens or
    time: those of the train record of their step."""
    if x == "step":
        return column(records, "step")
    f = "tokens" if x == "tokens" else "elapsed_s"
    at = {r["step"]: r[f] for r in train}
    return [(r[f] if f in r else at.get(r["step"], math.nan)) / unit for r in records]


def time_unit(runs):
    """(seconds per unit, its name) for a wall-clock axis reaching the runs' longest elapsed_s."""
    longest = max((r["elapsed_s"] for m in runs for k in ("train", "val") for r in m[k]
                   if not math.isnan(r["elapsed_s"])), default=0.0)
    return (3600.0, "h") if longest > 3 * 3600 else (60.0, "min") if longest > 180 else (1.0, "s")


def x_label(x, unit_name="s"):
    return {"step": "step", "tokens": "tokens seen"}.get(x, f"wall-clock ({unit_name})")


# What a run's directory records about it, for the figure's title and the chance level (run_info).
def read_json(path):
    """A JSON object from path, or None (no such file, or not a JSON object)."""
    try:
        with open(path, "rb") as f:
            v = json.loads(f.read())
        return v if isinstance(v, dict) else None
    except (OSError, ValueError):
        return None


def preset_of(config):
    """The name of the preset (bench_peer.PRESETS, model.h's) with a config.json's shape, or "L x C" when none."""
    try:
        from bench_peer import PRESETS
    except ImportError:
        PRESETS = {}
    try:
        shape = tuple(int(config[k]) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                               "intermediate_size", "max_position_embeddings"))
    except (KeyError, TypeError, ValueError):
        return None
    for name, (_, L, C, NH, I, P) in PRESETS.items():
        if (L, C, NH, I, P) == shape:
            return name
    return f"{shape[0]} x {shape[1]}"


def run_info(run_dir, metrics):
    """What the run's directory says of it: preset, seq (T), global_batch, steps, data, vocab_size, trainer (None
    where nothing records it). From run.json (the trainer writes steps, warmup, lr, global_batch, seq;
    tools/peer_train.py also preset, data, vocab_size, trainer), config.json (the export: the vocabulary and the shape,
    named as a preset), byte_tokenizer.json (byte shards: their vocabulary) and the records (the last step; tokens /
    epoch: the training shards' tokens)."""
    run = read_json(os.path.join(run_dir, "run.json")) or {}
    config = read_json(os.path.join(run_dir, "config.json")) or {}
    byte_tok = read_json(os.path.join(run_dir, "byte_tokenizer.json")) or {}

    def num(v):
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None

    info = {k: num(run.get(k)) for k in ("seq", "global_batch", "steps")}
    info["preset"] = run.get("preset") if isinstance(run.get("preset"), str) else preset_of(config) if config else None
    info["trainer"] = run.get("trainer") if isinstance(run.get("trainer"), str) else None
    info["vocab_size"] = num(run.get("vocab_size")) or num(config.get("vocab_size")) or num(byte_tok.get("vocab_size"))
    data = run.get("data") if isinstance(run.get("data"), str) else None
    if data is None:
        kind = "byte" if byte_tok else "text" if os.path.exists(os.path.join(run_dir, "tokenizer.json")) else None
        ends = [r for r in metrics["train"] if r["epoch"] > 0 and not math.isnan(r["epoch"])]
        if ends:
            data = f"{ends[-1]['tokens'] / ends[-1]['epoch']:,.0f} training tokens"
            data += f" ({kind} shards)" if kind else ""
        elif kind:
            data = f"{kind} shards"
    info["data"] = data
    if info["steps"] is None and metrics["train"]:
        info["steps"] = metrics["train"][-1]["step"]
    return info


def run_title(name, info):
    """The single-run figure's title: the run's name, then what run_info found."""
    parts = [info["preset"] or "preset not recorded"]
    if info["seq"]:
        parts.append(f"T={info['seq']}")
    if info["global_batch"]:
        parts.append(f"global batch {info['global_batch']}")
    if info["steps"]:
        parts.append(f"{info['steps']:,} steps")
    parts.append(f"data: {info['data'] or 'not recorded'}")
    who = f" ({info['trainer']})" if info["trainer"] else ""
    return f"{name}{who}: " + ", ".join(parts)


def chance(vocab):
    """The chance level of the MLM loss, ln(vocab): a prediction uniform over the vocabulary; and its label."""
    return math.log(vocab), f"chance: ln {vocab:g} = {math.log(vocab):.2f}"


def save_png(fig, plt, out_path):
    """Writes fig to out_path whole (a temporary file, then renamed: a reader never sees half a PNG)."""
    fig.tight_layout()
    tmp = out_path + ".tmp.png"
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, out_path)
    except OSError as e:
        raise MetricsError(f"{out_path}: cannot write: {e.strerror}") from None
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)

def pyplot():
    """matplotlib.pyplot, headless, or MetricsError with the pip command."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MetricsError(f"needs matplotlib ({e}): {PIP}") from None
    return plt


def plot(metrics, out_path, x="step", title=None, vocab=None):
    """The single-run figure (figure) written to out_path."""
    fig = figure(metrics, x, title, vocab)
    save_png(fig, pyplot(), out_path)


def figure(metrics, x="step", title=None, vocab=None):
    """The single-run figure of the docstring (vocab: the vocabulary size for the chance level, or None)."""
    plt = pyplot()
    train, val, ev = metrics["train"], metrics["val"], metrics["eval"]
    unit, unit_name = time_unit([metrics])
    xt, xv, xe = x_of(train, x, train, unit), x_of(val, x, train, unit), x_of(ev, x, train, unit)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8), dpi=100)
    (a_loss, a_acc), (a_tps, a_opt) = ax
    if train:
        loss = column(train, "loss")
        a_loss.plot(xt, loss, color="C0", alpha=0.35, lw=0.8, label="train (each logged step)")
        if len(train) >= 20:
            k = max(5, len(train) // 25)
            a_loss.plot(xt, moving_average(loss, k), color="C0", lw=1.8, label=f"train (mean of the last {k})")
        a_tps.plot(xt, column(train, "tokens_per_s"), color="C2", lw=1.2)
        a_opt.plot(xt, column(train, "lr"), color="C4", lw=1.2)
        g = a_opt.twinx()
        g.plot(xt, column(train, "grad_norm"), color="C3", alpha=0.6, lw=0.8)
        g.set_ylabel("gradient norm", color="C3")
    if val:
        label = covers("validation", val[-1])
        a_loss.plot(xv, column(val, "val_loss"), "o-", color="C1", ms=4, label=label)
        a_acc.plot(xv, column(val, "val_accuracy"), "o-", color="C1", ms=4, label=label)
    for r, x_r in zip(ev, xe):
        # an export has no step (the trainer records 0): a level line across the panel; a checkpoint, a point
        for a, f in ((a_loss, "val_loss"), (a_acc, "val_accuracy")):
            if r["step"] == 0 and train:
                a.axhline(r[f], color="C3", ls="--", lw=1.2, label=covers("--eval of the export", r))
            else:
                a.plot([x_r], [r[f]], "s", color="C3", ms=7, label=covers("--eval", r))
    if vocab:
        level, label = chance(vocab)
        a_loss.axhline(level, color="C7", ls=":", lw=1.5, label=label)
    xlabel = x_label(x, unit_name)
    for a, t, y in ((a_loss, "MLM loss (masked tokens)", "loss"), (a_acc, "masked-token accuracy", "accuracy"),
                    (a_tps, "throughput", "tokens/s"), (a_opt, "optimizer", "learning rate")):
        a.set_title(t)
        a.set_xlabel(xlabel)
        a.set_ylabel(y)
        a.grid(alpha=0.3)
    a_opt.yaxis.label.set_color("C4")
    for a in (a_loss, a_acc):
        handles, labels = a.get_legend_handles_labels()
        if handles:
            keep = [labels.index(lab) for lab in dict.fromkeys(labels)]  # one entry per label
            a.legend([handles[i] for i in keep], [labels[i] for i in keep], loc="best", fontsize=8)
    if not (val or ev):
        a_acc.text(0.5, 0.5, "no validation yet\n(--val GLOB --val-every N)", ha="center", va="center",
                   transform=a_acc.transAxes, color="gray")
    fig.suptitle(title or "", fontsize=11)
    return fig


def value_at(points, x):
    """The value at x of the line through points [(x, y)] sorted by x (exact at a point, linear between two); nan
    outside their range."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x == x0 else y1 if x == x1 or x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[0][1] if len(points) == 1 and points[0][0] == x else math.nan


def rel(a, b):
    return f"{100 * (a - b) / b:+.2f}%" if not (math.isnan(a) or math.isnan(b)) else "-"


def loss_table(runs, labels, f):
    """The table of losses at equal f ("tokens" or "elapsed_s", see the docstring) as lines of text; the first run
    is the reference."""
    ends = [r["train"][-1][f] for r in runs if r["train"]]
    if len(ends) < len(runs):
        raise MetricsError("--overlay: a run has no train record: no loss at equal tokens")
    x = min(ends)
    vals = [[(r[f], r["val_loss"]) for r in m["val"] if not (math.isnan(r["val_loss"]) or math.isnan(r[f]))]
            for m in runs]
    xv = min((v[-1][0] for v in vals if v), default=math.nan)
    xv = min(x, xv) if all(vals) else x  # the validations compared where every run has them
    rows = []
    for m, v in zip(runs, vals):
        done = [r for r in m["train"] if r[f] <= x and not math.isnan(r["loss"])]
        window = [r["loss"] for r in done if r[f] > 0.9 * x] or [r["loss"] for r in done[-1:]]
        rows.append((sum(window) / len(window) if window else math.nan, value_at(v, xv) if v else math.nan))
    ref = rows[0]
    if f == "tokens":
        where, at = "tokens", f"{x:.0f} tokens (the fewest any run reached)"
        val_at = "x" if xv == x else f"{xv:.0f} tokens (the fewest any run validated at)"
    else:
        where, at = "wall-clock", f"{x:.1f} s (the shortest run)"
        val_at = "x" if xv == x else f"{xv:.1f} s (the soonest any run's validations end)"
    lines = [f"losses at equal {where}: {at}; train: the mean over (0.9 x, x] (or the last record before); "
             f"val: at {val_at}, interpolated between the run's validations; vs {labels[0]}: the relative difference",
             f"{'run':<16} {'train loss':>10} {'vs ' + labels[0]:>12} {'val loss':>10} {'vs ' + labels[0]:>12}"]
    def loss(v):
        return "-" if math.isnan(v) else f"{v:.4f}"

    for lab, (t, v) in zip(labels, rows):
        lines.append(f"{lab:<16} {loss(t):>10} {rel(t, ref[0]):>12} {loss(v):>10} {rel(v, ref[1]):>12}")
    if any(math.isnan(v) for _, v in rows):
        lines.append("(-: no validation of that run around x)")
    return lines


def first_reach(points, target):
    """The first (elapsed_s, tokens) at which a series [(elapsed_s, tokens, loss)] reaches target (loss <= target),
    linear between the record before and the first at or below it; None if it never does."""
    prev = None
    for t, n, y in points:
        if y <= target:
            if prev is None or prev[2] == y:
                return t, n
            w = (prev[2] - target) / (prev[2] - y)
            return prev[0] + w * (t - prev[0]), prev[1] + w * (n - prev[1])
        prev = (t, n, y)
    return None


def reach_table(runs, labels, windows):
    """The time each run took to reach the lowest loss every run reached (see the docstring), as lines of text."""
    if all(m["val"] for m in runs):
        what = "validation loss"
        series = [[(r["elapsed_s"], r["tokens"], r["val_loss"]) for r in m["val"]] for m in runs]
    else:
        what = "training loss (moving mean)"
        series = [list(zip(column(m["train"], "elapsed_s"), column(m["train"], "tokens"),
                           moving_average(column(m["train"], "loss"), k))) for m, k in zip(runs, windows)]
    series = [[p for p in s if not any(math.isnan(v) for v in p)] for s in series]
    if not all(series):
        return []
    target = max(min(p[2] for p in s) for s in series)
    lines = [f"time to the {what} {target:.4f} (the lowest every run reached):"]
    reached = [first_reach(s, target) for s in series]
    ref = reached[0]
    for lab, r in zip(labels, reached):
        speed = f"  {r[0] / ref[0]:.2f}x {labels[0]}'s time" if ref[0] > 0 and lab != labels[0] else ""
        lines.append(f"{lab:<16} {r[0]:>10.1f} s {r[1]:>14,.0f} tokens{speed}")
    return lines


def overlay_table(runs, labels, windows=None):
    """The tables of the docstring (--overlay) as lines of text; the first run is the reference."""
    lines = loss_table(runs, labels, "tokens")
    if all(m["train"] and not any(math.isnan(r["elapsed_s"]) for r in m["train"]) for m in runs):
        lines += [""] + loss_table(runs, labels, "elapsed_s")
        lines += [""] + reach_table(runs, labels, windows or [1 for _ in runs])
    return lines


def overlay_windows(runs, window, x):
    """Each run's moving-mean window in logged steps: window against steps; against tokens (or time), window steps of
    the run with the fewest tokens per logged step and as many tokens in the others (a run of 8x the batch:
    window/8)."""
    if x == "step":
        return [window for _ in runs]
    per = []
    for m in runs:
        t = [r["tokens"] for r in m["train"] if not math.isnan(r["tokens"])]
        per.append((t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else math.nan)
    least = min((p for p in per if p > 0), default=math.nan)
    return [max(1, round(window * least / p)) if p > 0 and least > 0 else window for p in per]


def plot_overlay(runs, labels, out_path, x="tokens", window=25, vocabs=()):
    """The overlay figure (overlay_figure) written to out_path."""
    fig = overlay_figure(runs, labels, x, window, vocabs)
    save_png(fig, pyplot(), out_path)


def overlay_figure(runs, labels, x="tokens", window=25, vocabs=()):
    """Several runs' training (moving mean) and validation losses, one colour each, in two panels; a chance level
    for each vocabulary size in vocabs."""
    plt = pyplot()
    fig, (a_train, a_val) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=80)
    windows = overlay_windows(runs, window, x)
    unit, unit_name = time_unit(runs)
    for i, (m, lab) in enumerate(zip(runs, labels)):
        train, val, c = m["train"], m["val"], f"C{i}"
        if train:
            xt, loss = x_of(train, x, train, unit), column(train, "loss")
            a_train.plot(xt, loss, color=c, alpha=0.15, lw=0.6)
            a_train.plot(xt, moving_average(loss, windows[i]), color=c, lw=1.6, label=lab)
        if val:
            a_val.plot(x_of(val, x, train, unit), column(val, "val_loss"), "o-", color=c, ms=4, lw=1.4, label=lab)
    for v in sorted(set(vocabs)):
        level, label = chance(v)
        for a in (a_train, a_val):
            a.axhline(level, color="C7", ls=":", lw=1.5, label=label)
    xlabel = x_label(x, unit_name)
    what = f"the last {window} logged steps" if x == "step" else f"{window} steps of the smallest batch"
    for a, t in ((a_train, f"training loss (moving mean over {what})"), (a_val, "validation loss")):
        a.set_title(t)
        a.set_xlabel(xlabel)
        a.set_ylabel("MLM loss (masked tokens)")
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(loc="best", fontsize=9)
    if not any(m["val"] for m in runs):
        a_val.text(0.5, 0.5, "no validation records", ha="center", va="center", transform=a_val.transAxes,
                   color="gray")
    lows = [v for m, k in zip(runs, windows) for v in moving_average(column(m["train"], "loss"), k)[k:]
            if not math.isnan(v)]
    if lows:  # the interesting part: from the moving means' highest after the first window down
        top, bottom = max(lows), min(lows)
        a_train.set_ylim(bottom - 0.05 * (top - bottom + 1e-9), top + 0.1 * (top - bottom + 1e-9))
    return fig


def metrics_path(run):
    """A run's --out directory or its metrics.jsonl: the metrics file and the run's directory."""
    if os.path.isdir(run):
        return os.path.join(run, "metrics.jsonl"), run
    if os.path.exists(run) or run.endswith(".jsonl"):
        return run, os.path.dirname(run) or "."
    raise MetricsError(f"{run}: no such directory (expected a run's --out directory)")


def main_overlay(args):
    """--overlay: the runs' metrics, the figure and the table."""
    if args.run is not None:
        raise MetricsError(f"{args.run}: with --overlay, give every run after it (--overlay A B ...)")
    if not args.out or not args.out.lower().endswith(".png"):
        raise MetricsError(f"--overlay: needs --out FILE.png (got {args.out or 'none'})")
    out = output_path(".", args.out)
    names = [os.path.basename(os.path.normpath(metrics_path(r)[1])) for r in args.overlay]
    labels = args.labels.split(",") if args.labels is not None else names
    if len(labels) != len(args.overlay) or not all(labels):
        raise MetricsError(f"--labels {args.labels}: expected {len(args.overlay)} non-empty names, one per run")
    runs, vocabs = [], []
    for r in args.overlay:
        path, run_dir = metrics_path(r)
        metrics, notes = read_metrics(path)
        for note in notes:
            print(f"plot.py: {note}", file=sys.stderr)
        runs.append(metrics)
        vocab = run_info(run_dir, metrics)["vocab_size"]
        if vocab:
            vocabs.append(vocab)
        else:
            print(f"plot.py: {run_dir}: no vocabulary size recorded (run.json, config.json, byte_tokenizer.json): "
                  f"no chance level for it", file=sys.stderr)
    table = overlay_table(runs, labels, overlay_windows(runs, args.window, "tokens"))
    plot_overlay(runs, labels, out, args.x, args.window, vocabs)
    print("\n".join(table))
    print(f"plot.py: wrote {out} ({len(runs)} runs overlaid)")
    return 0


def output_path(run_dir, out):
    """--out FILE.png, or --out DIR (created) for DIR/metrics.png; by default the run's directory."""
    if out is None:
        return os.path.join(run_dir, "metrics.png")
    if out.lower().endswith(".png"):
        parent = os.path.dirname(out) or "."
        if not os.path.isdir(parent):
            raise MetricsError(f"--out {out}: the directory {parent} does not exist")
        return out
    if os.path.exists(out) and not os.path.isdir(out):
        raise MetricsError(f"--out {out}: exists and is not a directory (a file name must end in .png)")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise MetricsError(f"--out {out}: cannot create the directory: {e.strerror}") from None
    return os.path.join(out, "metrics.png")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", help="a run's --out directory (or its metrics.jsonl)")
    p.add_argument("--out", help="FILE.png, or a directory for metrics.png (default: the run's directory)")
    p.add_argument("--x", choices=("step", "tokens", "time"), default="step",
                   help="the x axis: steps, tokens seen or wall-clock (elapsed_s) (default step)")
    p.add_argument("--overlay", nargs="+", metavar="RUN", help="overlay these runs in one figure (needs --out FILE.png)")
    p.add_argument("--labels", help="--overlay: the runs' names in the legend and table, comma-separated")
    p.add_argument("--window", type=int, default=25, help="--overlay: the moving mean's logged steps (default 25)")
    args = p.parse_args(argv)
    if args.overlay:
        try:
            if args.window < 1:
                raise MetricsError(f"--window {args.window}: expected at least 1")
            return main_overlay(args)
        except MetricsError as e:
            die(str(e))
    if args.run is None:
        die("give a run's directory, or --overlay RUN RUN ... (see --help)")
    try:
        if os.path.isdir(args.run):
            path, run_dir = os.path.join(args.run, "metrics.jsonl"), args.run
        elif os.path.exists(args.run) or args.run.endswith(".jsonl"):
            path, run_dir = args.run, os.path.dirname(args.run) or "."
        else:
            raise MetricsError(f"{args.run}: no such directory (expected a run's --out directory)")
        metrics, notes = read_metrics(path)
        for note in notes:
            print(f"plot.py: {note}", file=sys.stderr)
        out = output_path(run_dir, args.out)
        info = run_info(run_dir, metrics)
        if not info["vocab_size"]:
            print(f"plot.py: {run_dir}: no vocabulary size recorded (run.json, config.json, byte_tokenizer.json): "
                  f"no chance level", file=sys.stderr)
        name = os.path.basename(os.path.abspath(run_dir))
        plot(metrics, out, args.x, title=run_title(name, info), vocab=info["vocab_size"])
    except MetricsError as e:
        die(str(e))
    counts = ", ".join(f"{len(v)} {k}" for k, v in metrics.items() if v)
    print(f"plot.py: wrote {out} ({counts} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
