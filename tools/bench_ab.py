#!/usr/bin/env python3
"""bench_ab.py: one change measured before and after, in one job on one GPU.

    tools/bench_ab.py A B [--rounds N] [--cpu] [--keep DIR] [--a-flags F] [--b-flags F] [-- TRAINER --bench FLAGS]

A and B are each a git commit (a hash, branch or tag of this repository), `.` for the working tree as it is
(uncommitted changes included), or the path of a trainer binary already built. Each commit or tree is
exported to its own directory and built there with ./build.sh (what this machine can run; a commit that
resolves to the same tree as another is built once), then `TRAINER --bench FLAGS` runs N rounds of
A, B, A, B, ... (default 2), alternating so that a GPU's clocks and temperature drift on both alike. For
each preset it prints one table: tokens/s and the step's wall-clock time per round, and the median of each
phase of --bench's table (data wait, embedding, attention, matmuls, other kernels, optimizer, all-reduce),
for A and B and as B / A. The logs stay in the directory it names (--keep DIR to choose it). --a-flags and
--b-flags add flags to one side only (after FLAGS; split at spaces): one flag's effect on the same commit, built
once.

    tools/bench_ab.py HEAD~1 HEAD                       # bert-base and bert-large (--bench's default)
    tools/bench_ab.py main . -- --preset bert-base      # the working tree against main
    tools/bench_ab.py /tmp/trainer_old ./trainer --rounds 3 -- --preset bert-large
    tools/bench_ab.py --cpu HEAD . -- --preset tiny --seq 32 --batch 16   # without a GPU: ./trainer_cpu
    tools/bench_ab.py HEAD HEAD --b-flags "--batch 256" -- --preset bert-base   # one flag against the default

A run's micro-batch comes from each side's planner unless FLAGS give --batch; a table says when the two
differ. Exit code 0, or 2 with one line naming what was wrong (a ref that is no commit, a build that
failed, a trainer that stopped).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PHASES = ["data wait", "embedding", "attention forward", "attention backward", "matmuls", "other kernels",
          "optimizer", "gradient all-reduce"]
RESULT = re.compile(r"^bench-result preset=(\S+) .*\bbatch=(\d+) .*\btokens_per_s=(\d+) step_ms=([0-9.]+)")
HEADER = re.compile(r"^bench (\S+): ")
PHASE = re.compile(r"^  (" + "|".join(PHASES) + r")\s+([0-9.]+)\s")


class Fail(Exception):
    pass


def git(*args):
    r = subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True)
    return r.returncode, r.stdout.strip()


def export(spec):
    """The trainer binary for spec: a path as it is, else the commit or working tree exported and built."""
    if spec != "." and os.path.isfile(spec):
        if not os.access(spec, os.X_OK):
            raise Fail(f"{spec}: not an executable trainer binary")
        return {"label": spec, "binary": os.path.abspath(spec), "tree": None}
    if spec == ".":
        rc, files = git("ls-files", "-z", "-co", "--exclude-standard")
        if rc != 0:
            raise Fail(f".: {ROOT} is not a git checkout (give commits or trainer binaries)")
        return {"label": "working tree", "files": [f for f in files.split("\0") if f], "tree": "."}
    rc, sha = git("rev-parse", "--verify", "--quiet", spec + "^{commit}")
    if rc != 0 or not sha:
        raise Fail(f"{spec}: not a commit of {ROOT}, nor a trainer binary (expected a hash, branch or tag, . or a path)")
    _, tree = git("rev-parse", spec + "^{tree}")
    return {"label": f"{spec} ({sha[:7]})", "sha": sha, "tree": tree}


def build(side, work, name, binary_name, built):
    if side["tree"] is None:
        return
    if side["tree"] in built:  # the same tree as the other side: one build
        side["binary"] = built[side["tree"]]
        return
    d = os.path.join(work, name)
    os.makedirs(d)
    if side["tree"] == ".":
        for f in side["files"]:
            src = os.path.join(ROOT, f)
            if os.path.isfile(src):  # (a deleted file is still listed until it is staged)
                os.makedirs(os.path.dirname(os.path.join(d, f)), exist_ok=True)
                shutil.copy2(src, os.path.join(d, f))
    else:
        archive = subprocess.run(["git", "-C", ROOT, "archive", side["sha"]], capture_output=True)
        if archive.returncode != 0:
            raise Fail(f"{side['label']}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
        subprocess.run(["tar", "-x", "-C", d], input=archive.stdout, check=True)
    log = os.path.join(work, name + "_build.log")
    with open(log, "w") as f:
        rc = subprocess.run(["./build.sh"], cwd=d, stdout=f, stderr=subprocess.STDOUT).returncode
    binary = os.path.join(d, binary_name)
    if rc != 0 or not os.path.isfile(binary):
        tail = open(log).read().strip().splitlines()[-1:] or ["(no output)"]
        why = f"./build.sh failed: {tail[0]}" if rc != 0 else f"./build.sh made no {binary_name}" + (
            " (no GPU here? --cpu compares ./trainer_cpu)" if binary_name == "trainer" else "")
        raise Fail(f"{side['label']}: {why} (log: {log})")
    side["binary"] = built[side["tree"]] = binary


def parse(text):
    """{preset: {"tokens_per_s", "step_ms", "batch", phase: ms}} from one --bench output."""
    out, preset = {}, None
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            preset = out.setdefault(m.group(1), {})
            continue
        m = PHASE.match(line)
        if m and preset is not None:
            preset[m.group(1)] = float(m.group(2))
            continue
        m = RESULT.match(line)
        if m:
            r = out.setdefault(m.group(1), {})
            r.update(batch=int(m.group(2)), tokens_per_s=int(m.group(3)), step_ms=float(m.group(4)))
    return {k: v for k, v in out.items() if "tokens_per_s" in v}


def run(side, flags, log):
    with open(log, "w") as f:
        r = subprocess.run([side["binary"], "--bench"] + flags, stdout=subprocess.PIPE, stderr=f, text=True)
        f.write(r.stdout)
    got = parse(r.stdout)
    if r.returncode != 0 or not got:
        last = (open(log).read().strip().splitlines() or ["(no output)"])[-1]
        cmd = " ".join([os.path.basename(side["binary"]), "--bench"] + flags)
        raise Fail(f"{side['label']}: {cmd} exited {r.returncode}: {last} (log: {log})")
    return got


def table(preset, a, b, la, lb):
    """One preset's lines: per-round tokens/s and step time, then each phase's median, A, B and B / A."""
    def med(runs, key):
        vals = [r[key] for r in runs if key in r]
        return statistics.median(vals) if vals else None

    lines = [f"{preset}:", f"  {'':24} {la:>24} {lb:>24}   B / A"]
    ta, tb = med(a, "tokens_per_s"), med(b, "tokens_per_s")
    rounds = lambda runs, key, fmt: " / ".join(fmt.format(r[key]) for r in runs)  # noqa: E731
    lines.append(f"  {'tokens/s (each round)':24} {rounds(a, 'tokens_per_s', '{:,}'):>24} "
                 f"{rounds(b, 'tokens_per_s', '{:,}'):>24}   {tb / ta:.4f}")
    for key, name in [("step_ms", "step ms (wall clock)")] + [(p, p + " ms") for p in PHASES]:
        va, vb = med(a, key), med(b, key)
        if va is None or vb is None:
            continue
        ratio = f"{vb / va:.4f}" if va > 0 else "-"
        lines.append(f"  {name:24} {va:>24.3f} {vb:>24.3f}   {ratio}")
    ba, bb = {r["batch"] for r in a}, {r["batch"] for r in b}
    if ba != bb:
        lines.append(f"  (the micro-batches differ: A {sorted(ba)}, B {sorted(bb)}; give --batch to compare at one)")
    return lines


def main(argv):
    flags = []
    if "--" in argv:
        i = argv.index("--")
        argv, flags = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="bench_ab.py", description=__doc__.split("\n\n")[0])
    p.add_argument("a", metavar="A", help="commit, . (the working tree) or a trainer binary: before")
    p.add_argument("b", metavar="B", help="the same for after")
    p.add_argument("--rounds", type=int, default=2, help="rounds of A then B (default 2)")
    p.add_argument("--cpu", action="store_true", help="build and run ./trainer_cpu (the CPU runtime)")
    p.add_argument("--keep", metavar="DIR", help="the directory for the trees and logs (default: a new one in /tmp)")
    p.add_argument("--a-flags", default="", metavar="F", help="more trainer flags for A only (split at spaces)")
    p.add_argument("--b-flags", default="", metavar="F", help="more trainer flags for B only (split at spaces)")
    o = p.parse_args(argv)
    if o.rounds < 1:
        raise Fail(f"--rounds {o.rounds}: expected a positive integer")
    sides = [export(o.a), export(o.b)]
    work = o.keep or tempfile.mkdtemp(prefix="mlm_bench_ab_")
    os.makedirs(work, exist_ok=True)
    binary_name = "trainer_cpu" if o.cpu else "trainer"
    built = {}
    for side, name in zip(sides, ["a", "b"]):
        build(side, work, name, binary_name, built)
    side_flags = [flags + o.a_flags.split(), flags + o.b_flags.split()]
    for k, extra in enumerate((o.a_flags, o.b_flags)):
        if extra.split():
            sides[k]["label"] += " with " + " ".join(extra.split())
    print(f"A: {sides[0]['label']}\nB: {sides[1]['label']}\nlogs and trees in {work}")
    results = [[], []]
    for r in range(o.rounds):
        for k, side in enumerate(sides):
            results[k].append(run(side, side_flags[k], os.path.join(work, f"{'ab'[k]}_round{r + 1}.log")))
    for preset in results[0][0]:
        a = [x[preset] for x in results[0] if preset in x]
        b = [x[preset] for x in results[1] if preset in x]
        if len(b) == o.rounds and len(a) == o.rounds:
            print("\n".join(table(preset, a, b, "A", "B")))
        else:
            print(f"{preset}: not in every run of both sides")
    if not o.keep:  # the logs stay; the trees and their builds go
        for name in ("a", "b"):
            shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print(f"bench_ab.py: {e}", file=sys.stderr)
        sys.exit(2)
