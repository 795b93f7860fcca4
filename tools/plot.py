#!/usr/bin/env python3
"""plot.py: a run's metrics log as PNG curves.

    python3 tools/plot.py runs/a                    # writes runs/a/metrics.png
    python3 tools/plot.py runs/a --out loss.png     # or that file (--out DIR: DIR/metrics.png)
    python3 tools/plot.py runs/a --x tokens         # against tokens seen instead of steps
    python3 tools/plot.py --overlay runs/a runs/b --x tokens --out ab.png [--labels A,B]   # runs overlaid

Reads DIR/metrics.jsonl, which the trainer's rank 0 appends in --out: one JSON object per line,
{"kind": "train", ...} per logged step, {"kind": "val", ...} per validation, {"kind": "eval", ...}
per ./trainer --eval (step 0 for an export). Writes one figure of four panels:
  loss           training loss per logged step (and its moving average), validation loss, --eval loss (the
                 legend says how many of the validation split's sequences each covered)
                 (a point at the checkpoint's step, or a dashed level line for an export)
  accuracy       masked-token accuracy on the validation set (and --eval's)
  throughput     tokens/s (real tokens, padding not counted)
  optimizer      learning rate, and the gradient norm before clipping on a second axis
With --overlay RUN RUN ..., one figure of two panels instead, every run a colour (labelled by its folder's
name, or --labels): the training loss (its moving mean over --window logged steps, the raw values faint; with
--x tokens, --window steps of the run with the fewest tokens per step, and the same tokens for the others) and
the validation loss; and a table on stdout of each run's losses at equal tokens, the fewest tokens any run
reached (X): the mean training loss over its records in (0.9 X, X], the validation loss of its validation
nearest X, each with its difference to the first run in percent.
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


def x_of(records, x, train):
    """The x coordinates: steps, or tokens seen (eval records have none: the train record of their step)."""
    if x == "step":
        return column(records, "step")
    at = {r["step"]: r["tokens"] for r in train}
    return [r["tokens"] if "tokens" in r else at.get(r["step"], math.nan) for r in records]


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

def plot(metrics, out_path, x="step", title=None):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MetricsError(f"needs matplotlib ({e}): {PIP}") from None
    train, val, ev = metrics["train"], metrics["val"], metrics["eval"]
    xt, xv, xe = x_of(train, x, train), x_of(val, x, train), x_of(ev, x, train)
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
    xlabel = "step" if x == "step" else "tokens seen"
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
    fig.suptitle(title or "")
    save_png(fig, plt, out_path)


def overlay_table(runs, labels):
    """The table of losses at equal tokens (see the docstring) as lines of text; the first run is the reference."""
    ends = [r["train"][-1]["tokens"] for r in runs if r["train"]]
    if len(ends) < len(runs):
        raise MetricsError("--overlay: a run has no train record: no loss at equal tokens")
    x = min(ends)
    rows = []
    for m in runs:
        window = [r["loss"] for r in m["train"] if 0.9 * x < r["tokens"] <= x and not math.isnan(r["loss"])]
        val = [(abs(r["tokens"] - x), r["val_loss"]) for r in m["val"] if not math.isnan(r["val_loss"])]
        rows.append((sum(window) / len(window) if window else math.nan, min(val)[1] if val else math.nan))
    ref = rows[0]
    lines = [f"losses at equal tokens: {x:.0f} tokens (the fewest any run reached); train: the mean over (0.9 x, x];"
             f" val: the validation nearest x; vs {labels[0]}: the relative difference",
             f"{'run':<16} {'train loss':>10} {'vs ' + labels[0]:>12} {'val loss':>10} {'vs ' + labels[0]:>12}"]

    def rel(a, b):
        return f"{100 * (a - b) / b:+.2f}%" if not (math.isnan(a) or math.isnan(b)) else "-"

    for lab, (t, v) in zip(labels, rows):
        lines.append(f"{lab:<16} {t:>10.4f} {rel(t, ref[0]):>12} {v:>10.4f} {rel(v, ref[1]):>12}")
    return lines


def overlay_windows(runs, window, x):
    """Each run's moving-mean window in logged steps: window against steps; against tokens, window steps of the
    run with the fewest tokens per logged step and as many tokens in the others (a run of 8x the batch: window/8)."""
    if x == "step":
        return [window for _ in runs]
    per = []
    for m in runs:
        t = [r["tokens"] for r in m["train"] if not math.isnan(r["tokens"])]
        per.append((t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else math.nan)
    least = min((p for p in per if p > 0), default=math.nan)
    return [max(1, round(window * least / p)) if p > 0 and least > 0 else window for p in per]


def plot_overlay(runs, labels, out_path, x="tokens", window=25):
    """Several runs' training (moving mean) and validation losses, one colour each, in two panels."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MetricsError(f"needs matplotlib ({e}): {PIP}") from None
    fig, (a_train, a_val) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=80)
    windows = overlay_windows(runs, window, x)
    for i, (m, lab) in enumerate(zip(runs, labels)):
        train, val, c = m["train"], m["val"], f"C{i}"
        if train:
            xt, loss = x_of(train, x, train), column(train, "loss")
            a_train.plot(xt, loss, color=c, alpha=0.15, lw=0.6)
            a_train.plot(xt, moving_average(loss, windows[i]), color=c, lw=1.6, label=lab)
        if val:
            a_val.plot(x_of(val, x, train), column(val, "val_loss"), "o-", color=c, ms=4, lw=1.4, label=lab)
    xlabel = "step" if x == "step" else "tokens seen"
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
    save_png(fig, plt, out_path)


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
    runs = []
    for r in args.overlay:
        metrics, notes = read_metrics(metrics_path(r)[0])
        for note in notes:
            print(f"plot.py: {note}", file=sys.stderr)
        runs.append(metrics)
    table = overlay_table(runs, labels)
    plot_overlay(runs, labels, out, args.x, args.window)
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
    p.add_argument("--x", choices=("step", "tokens"), default="step", help="the x axis (default step)")
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
        plot(metrics, out, args.x, title=os.path.abspath(run_dir))
    except MetricsError as e:
        die(str(e))
    counts = ", ".join(f"{len(v)} {k}" for k, v in metrics.items() if v)
    print(f"plot.py: wrote {out} ({counts} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
