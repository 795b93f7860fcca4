#!/usr/bin/env python3
"""test_readable.py: what keeps trainer.cu readable as the story of a run, checked (run by tests/run.sh):
  - main() is at most 100 lines and no function in trainer.cu is over 120 (a brace counter that skips
    comments, strings and character literals);
  - main() calls its phases by name (open_run, choose_model, plan_run, allocate_run, load_weights, train,
    finish_run);
  - every flag --help lists is one the trainer parses (not "unknown flag"), and every flag named in flags[]
    is in --help: the table that parses them also documents them;
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


fns = functions(open("trainer.cu").read())
sample = functions("static int f(int a) {\n    if (a) {\n        return 1;  // }\n    }\n    return '}';\n}\n")
check(sample == [("f", 1, 6)], "the brace counter on a 6-line sample: %s" % sample)
by_name = {n: (s, l) for n, s, l in fns}
check("main" in by_name and len(fns) > 100, "found %d functions in trainer.cu, main among them: %s" % (len(fns), "main" in by_name))
if "main" in by_name:
    check(by_name["main"][1] <= 100, "main() is %d lines (at most 100)" % by_name["main"][1])
for n, s, l in fns:
    check(l <= 120, "%s() at trainer.cu:%d is %d lines (at most 120)" % (n, s, l))
src = open("trainer.cu").read()
main_src = src[src.index("int main(int argc"):]
for phase in ["open_run", "choose_model", "plan_run", "allocate_run", "load_weights", "train", "finish_run"]:
    check(re.search(r"\b%s\(" % phase, main_src) is not None, "main() does not call %s()" % phase)

if not os.access("./trainer_cpu", os.X_OK):
    check(False, "no ./trainer_cpu (./build.sh)")
else:
    help_text = subprocess.run(["./trainer_cpu", "--help"], capture_output=True, text=True).stdout
    listed = sorted(set(re.findall(r"^  (--[a-z0-9-]+)", help_text, flags=re.M)))
    check(len(listed) > 50, "--help lists %d flags" % len(listed))
    for flag in listed:
        # FLAG @@: a flag with a value takes "@@" (and rejects it, or waits for the other flags); a switch is
        # taken and "@@" is then the unknown one. Either way the trainer stops before doing anything.
        r = subprocess.run(["./trainer_cpu", flag, "@@"], capture_output=True, text=True, timeout=60)
        check(flag + ": unknown flag" not in r.stderr, "%s is in --help but the trainer does not parse it: %s" % (flag, r.stderr.strip()))
    table = src[src.index("static const Flag flags[] = {"):]
    table = table[: table.index("\n};")]
    for flag in sorted(set(re.findall(r'\{"(--[a-z0-9-]+)"', table))):
        check(flag in listed, "%s is in flags[] but not in --help" % flag)
    r = subprocess.run(["./trainer_cpu", "--no-such-flag", "@@"], capture_output=True, text=True)
    check(r.returncode == 1 and "--no-such-flag: unknown flag" in r.stderr, "an unknown flag: %s" % r.stderr.strip())

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
