#!/usr/bin/env python3
"""test_readable.py: what keeps trainer.cu readable as the story of a run, checked (run by tests/run.sh):
  - line budgets: trainer.cu at most 2,000 lines, no product file (the top-level .cu, .cuh and .h) over 1,700,
    README.md at most 350 (the rest of the documentation is in docs/);
  - main() is at most 100 lines and no function in trainer.cu or the headers it reads as its own parts
    (TRAINER_PARTS) is over 120 (a brace counter that skips comments, strings and character literals);
  - main() calls its phases by name (open_run, choose_model, plan_run, allocate_run, load_weights, train,
    finish_run);
  - every flag --help lists is one the trainer parses (not "unknown flag"), and every flag named in flags[]
    (options.h) is in --help: the table that parses them also documents them; --help shows the training
    flags first, the others under their headings;
  - the test's own brace counter finds a function it is given (so the length check cannot pass by finding none).
Needs ./trainer_cpu (./build.sh)."""
import os, re, subprocess, sys

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL test_readable:", what)


def functions(text):
    """(name, first line, length in lines) of every top-level function definition in C source text."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    code = re.sub(r'"(\\.|[^"\\\n])*"', '""', code)
    code = re.sub(r"'(\\.|[^'\\\n])*'", "''", code)
    out, depth, head, start = [], 0, None, 0
    lines = code.split("\n")
    for i, line in enumerate(lines):
        if depth == 0 and re.match(r"^[A-Za-z_][\w\s\*]*\b(\w+)\s*\(", line) and not line.rstrip().endswith(";"):
            head = (re.match(r"^[A-Za-z_][\w\s\*]*\b(\w+)\s*\(", line).group(1), i)
        for ch in line:
            if ch == "{":
                if depth == 0:
                    start = i
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and head and start >= head[1] and start - head[1] < 6:
                    out.append((head[0], head[1] + 1, i - head[1] + 1))
                    head = None
    return out


# the line budgets
def lines(path):
    with open(path) as f:
        return sum(1 for _ in f)
check(lines("trainer.cu") <= 2000, "trainer.cu is %d lines (at most 2,000)" % lines("trainer.cu"))
check(lines("README.md") <= 350, "README.md is %d lines (at most 350: users' text; depth goes to docs/)" % lines("README.md"))
product = sorted(f for f in os.listdir(".") if f.endswith((".cu", ".cuh", ".h")))
check("model.h" in product and "kernels.cuh" in product, "the product files: %s" % product)
for f in product:
    check(f == "trainer.cu" or lines(f) <= 1700, "%s is %d lines (at most 1,700)" % (f, lines(f)))

TRAINER_PARTS = ["trainer.cu", "options.h", "checkpoint.h", "run_dir.h", "bench.h", "progress.h"]
fns = []
for part in TRAINER_PARTS:
    fns += functions(open(part).read())
sample = functions("static int f(int a) {\n    if (a) {\n        return 1;  // }\n    }\n    return '}';\n}\n")
check(sample == [("f", 1, 6)], "the brace counter on a 6-line sample: %s" % sample)
by_name = {n: (s, l) for n, s, l in fns}
check("main" in by_name and len(fns) > 100, "found %d functions in the trainer's parts, main among them: %s" % (len(fns), "main" in by_name))
if "main" in by_name:
    check(by_name["main"][1] <= 100, "main() is %d lines (at most 100)" % by_name["main"][1])
for n, s, l in fns:
    check(l <= 120, "%s() at line %d of the trainer's parts is %d lines (at most 120)" % (n, s, l))
src = open("trainer.cu").read()
main_src = src[src.index("int main(int argc"):]
for phase in ["open_run", "choose_model", "plan_run", "allocate_run", "load_weights", "train", "finish_run"]:
    check(re.search(r"\b%s\(" % phase, main_src) is not None, "main() does not call %s()" % phase)

if not os.access("./trainer_cpu", os.X_OK):
    check(False, "no ./trainer_cpu (./build.sh)")
else:
    help_text = subprocess.run(["./trainer_cpu", "--help"], capture_output=True, text=True).stdout
    listed = sorted(set(re.findall(r"^  (--[a-z0-9-]+)", help_text, flags=re.M)))
    first = help_text[: help_text.index("the data loader:")] if "the data loader:" in help_text else ""
    check(all(f in first for f in ["--data", "--out", "--steps", "--lr", "--batch", "--val"])
          and not any(re.search(r"^  %s\b" % f, first, flags=re.M)
                      for f in ["--comm", "--plan-only", "--bench", "--loader-threads", "--bootstrap", "--zero"]),
          "--help's first group is not the training flags alone")
    for heading in ["the data loader:", "communication and the optimizer at scale", "several processes",
                    "the memory plan and the scaling prediction:", "usage: trainer --bench", "usage: trainer --eval"]:
        check(heading in help_text, "--help has no heading '%s'" % heading)
    for flag in listed:
        # FLAG @@: a flag with a value takes "@@" (and rejects it, or waits for the other flags); a switch is
        # taken and "@@" is then the unknown one. Either way the trainer stops before doing anything.
        r = subprocess.run(["./trainer_cpu", flag, "@@"], capture_output=True, text=True, timeout=60)
        check(flag + ": unknown flag" not in r.stderr, "%s is in --help but the trainer does not parse it: %s" % (flag, r.stderr.strip()))
    options = open("options.h").read()
    table = options[options.index("static const Flag flags[] = {"):]
    table = table[: table.index("\n};")]
    for flag in sorted(set(re.findall(r'\{"(--[a-z0-9-]+)"', table))):
        check(flag in listed, "%s is in flags[] but not in --help" % flag)
    r = subprocess.run(["./trainer_cpu", "--no-such-flag", "@@"], capture_output=True, text=True)
    check(r.returncode == 1 and "--no-such-flag: unknown flag" in r.stderr, "an unknown flag: %s" % r.stderr.strip())

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
