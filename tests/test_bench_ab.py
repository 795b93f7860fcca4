#!/usr/bin/env python3
"""tests/test_bench_ab.py: tests of tools/bench_ab.py (before/after --bench of two commits or binaries).

    python3 tests/test_bench_ab.py      # prints "N passed, N failed" last; exit code 1 on failure

The parser and the table on a hand-made --bench output (two presets); bad input (a ref that is no commit,
a file that is not executable, --rounds 0, a trainer that fails) gives exit 2 and one line naming it; then
real runs on the CPU runtime: ./trainer_cpu against itself as binaries (also with --b-flags: one side only runs
--grad-accum 2; and a bad --a-flags), and HEAD against HEAD (one build, the same tree) and HEAD against the working
tree, each exported and built by ./build.sh.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOL = os.path.join(ROOT, "tools", "bench_ab.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bench_ab  # noqa: E402

passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL test_bench_ab: {what}")


def tool(*args):
    """exit code, stdout, stderr, and the directory the tool named for its logs (None if it named none)"""
    r = subprocess.run([sys.executable, TOOL] + list(args), capture_output=True, text=True, cwd=ROOT)
    work = [line[len("logs and trees in "):] for line in r.stdout.splitlines() if line.startswith("logs and trees in ")]
    return r.returncode, r.stdout, r.stderr, work[0] if work else None


def read_log(work, name):
    path = os.path.join(work or "", name)
    return open(path).read() if work and os.path.isfile(path) else ""


def clean(work):
    if work:
        shutil.rmtree(work, ignore_errors=True)


SAMPLE = """bench: NVIDIA H100 80GB HBM3
bench bert-base: T=512, B=609 (the planner's largest: 609), 1 process(es) x 1 micro-batch(es) per step, bf16
  phase (CUDA events)                   ms/step   share
  data wait                               0.010    0.0%
  embedding                               2.500    0.6%
  attention forward                      26.800    6.0%
  attention backward                     76.800   17.1%
  matmuls                               251.548   56.0%
  other kernels                          87.379   19.4%
  optimizer                               2.000    0.4%
  gradient all-reduce                     0.000    0.0%
  sum of phases                         447.000  100.0%
  step (wall clock)                     448.006
bench-result preset=bert-base T=512 batch=609 max_batch=609 world=1 tokens_per_s=689659 step_ms=448.006 mfu=0.4099 device="x"
bench bert-large: T=512, B=229 (the planner's largest: 229), 1 process(es) x 1 micro-batch(es) per step, bf16
  matmuls                               296.476   60.2%
  other kernels                          85.326   17.3%
bench-result preset=bert-large T=512 batch=229 max_batch=229 world=1 tokens_per_s=236034 step_ms=492.653 mfu=0.4754 device="x"
"""


def test_parse_and_table():
    got = bench_ab.parse(SAMPLE)
    check(sorted(got) == ["bert-base", "bert-large"], f"parse: presets {sorted(got)}")
    base = got.get("bert-base", {})
    check(base.get("tokens_per_s") == 689659 and base.get("batch") == 609 and base.get("step_ms") == 448.006 and
          base.get("matmuls") == 251.548 and base.get("other kernels") == 87.379 and
          base.get("attention backward") == 76.8 and "sum of phases" not in base, f"parse: bert-base {base}")
    check(got.get("bert-large", {}).get("matmuls") == 296.476, f"parse: bert-large {got.get('bert-large')}")
    check(bench_ab.parse("trainer: --bench: error\n") == {}, "parse: an output without bench-result gives nothing")
    a = [dict(base), dict(base, tokens_per_s=689000)]
    b = [dict(base, tokens_per_s=700000, matmuls=240.0), dict(base, tokens_per_s=702000, matmuls=242.0)]
    text = "\n".join(bench_ab.table("bert-base", a, b, "A", "B"))
    want_ratio = f"{701000 / 689329.5:.4f}"  # medians: (700000 + 702000) / 2 over (689659 + 689000) / 2
    check("689,659 / 689,000" in text and "700,000 / 702,000" in text and want_ratio in text,
          f"table: per-round tokens/s and the medians' ratio {want_ratio}:\n{text}")
    check(f"{241.0 / 251.548:.4f}" in text and "micro-batches differ" not in text, f"table: matmuls' ratio:\n{text}")
    b[1]["batch"] = 600
    text = "\n".join(bench_ab.table("bert-base", a, b, "A", "B"))
    check("the micro-batches differ: A [609], B [600, 609]" in text, f"table: differing batches not said:\n{text}")


def test_bad_input():
    rc, out, err, work = tool("no-such-ref", ".")
    check(rc == 2 and err.count("\n") == 1 and "no-such-ref: not a commit" in err, f"a bad ref: {rc} {err!r}")
    clean(work)
    with tempfile.NamedTemporaryFile(suffix="_trainer") as f:
        rc, out, err, work = tool(f.name, f.name)
        check(rc == 2 and f"{f.name}: not an executable trainer binary" in err, f"a plain file: {rc} {err!r}")
        clean(work)
    rc, out, err, work = tool("--rounds", "0", "HEAD", "HEAD")
    check(rc == 2 and "--rounds 0: expected a positive integer" in err, f"--rounds 0: {rc} {err!r}")
    clean(work)
    rc, out, err, work = tool("/bin/false", "/bin/false")
    check(rc == 2 and "/bin/false: false --bench exited 1" in err, f"a trainer that fails: {rc} {err!r}")
    clean(work)


def test_real_runs():
    flags = ["--", "--preset", "tiny", "--seq", "32", "--batch", "8", "--bench-steps", "1", "--bench-warmup", "1"]
    trainer = os.path.join(ROOT, "trainer_cpu")
    rc, out, err, work = tool(trainer, trainer, "--rounds", "2", *flags)
    check(rc == 0 and "tiny:" in out and "tokens/s (each round)" in out and "matmuls ms" in out,
          f"two binaries: exit {rc}\n{out}{err}")
    check(work is not None and os.path.isfile(os.path.join(work, "b_round2.log")), f"two binaries: the logs in {work}")
    clean(work)
    rc, out, err, work = tool(trainer, trainer, "--rounds", "1", "--b-flags", "--grad-accum 2", *flags)
    alog, blog = (read_log(work, f"{k}_round1.log") for k in "ab")
    check(rc == 0 and "with --grad-accum 2" in out and "x 2 micro-batch(es)" in blog and "x 2 micro" not in alog,
          f"--b-flags: B alone runs --grad-accum 2: exit {rc}\n{out}{err}")
    clean(work)
    rc, out, err, work = tool(trainer, trainer, "--rounds", "1", "--a-flags", "--comm cutlass", *flags)
    check(rc == 2 and "--comm cutlass" in err, f"--a-flags with a bad flag: the trainer's refusal named: {rc} {err!r}")
    clean(work)
    with tempfile.TemporaryDirectory() as d:
        rc, out, err, work = tool("--cpu", "--keep", d, "HEAD", "HEAD", "--rounds", "1", *flags)
        check(rc == 0 and "A: HEAD (" in out and "tiny:" in out, f"HEAD against HEAD: exit {rc}\n{out}{err}")
        check(os.path.isfile(os.path.join(d, "a", "trainer_cpu")) and not os.path.exists(os.path.join(d, "b")),
              f"HEAD against HEAD: not one build: {sorted(os.listdir(d))}")
    rc, out, err, work = tool("--cpu", "HEAD", ".", "--rounds", "1", *flags)
    check(rc == 0 and "B: working tree" in out and "tiny:" in out, f"HEAD against the working tree: exit {rc}\n{out}{err}")
    check(work is not None and os.path.isfile(os.path.join(work, "b_round1.log")) and
          not os.path.exists(os.path.join(work, "a")) and not os.path.exists(os.path.join(work, "b")),
          f"without --keep: the logs stay, the trees go ({work}: {sorted(os.listdir(work)) if work else None})")
    clean(work)


test_parse_and_table()
test_bad_input()
test_real_runs()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
