#!/usr/bin/env python3
"""kernel_report.py: what ptxas and the SASS say about the kernels, without a GPU.

Default: compiles tests/bench_attention.cu (which instantiates every attention kernel) with nvcc for sm_90a, and
prints per kernel: registers, spill bytes, shared memory (static + the dynamic bytes the launcher asks for, from
`build/bench_attention --smem`), the blocks per SM that registers and shared memory allow on an H100
(64K registers, 228 KB shared memory with 1 KB reserved per block, 2048 threads, 32 blocks), and counts of
SASS instructions: tensor-core HMMA, warpgroup HGMMA (wgmma), ldmatrix LDSM, cp.async LDGSTS, local-memory
LDL/STL (spills), and EX2 async: the exponentials (MUFU.EX2) that the SASS places while a wgmma issued before them
may still run (a wait for all wgmma follows them before the next HGMMA), the overlap of softmax and products that
the wgmma kernels are built for.

--all: every kernel a training step launches. Compiles trainer.cu for sm_90a (ptxas: registers, spills, static
shared memory; SASS counts), and runs ./trainer_cpu --bench on the CPU runtime with EMU_LAUNCH_STATS=2 for one
and for two timed steps (the difference: the launches of two steps), which gives each kernel's block size, the
dynamic shared memory its launcher asks for, and its launches per step at that shape. Per kernel: launches per
step, threads per block, registers, spills, shared memory, blocks per SM (and what limits them: registers,
shared memory or threads), HMMA and LDL/STL counts; then the kernels of the build whose shuffles ptxas also compiled
for a diverged warp (ENDCOLLECTIVE, see sass_counts). The shape: --preset (bert-base), --seq (64), --batch (1);
block sizes and shared memory follow the preset's hidden and head sizes, launch counts its layers and B x T.

  python3 tools/kernel_report.py            (after ./build.sh; needs nvcc, and cuobjdump + nvdisasm:
                                             the CUDA toolkit's, or `pip install nvidia-cuda-cuobjdump
                                             nvidia-cuda-nvdisasm`)
  python3 tools/kernel_report.py --all [--preset bert-base] [--seq 64] [--batch 1] [--hopper]
"""
import argparse
import os, re, shutil, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def die(msg):
    print(f"kernel_report.py: {msg}", file=sys.stderr)
    sys.exit(1)


def find_tool(name):
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for d in [os.path.join(cuda, "bin")] + os.environ.get("PATH", "").split(os.pathsep):
        if os.path.isfile(os.path.join(d, name)):
            return os.path.join(d, name)
    try:  # the PyPI packages nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
        import nvidia

        for base in nvidia.__path__:
            for sub in ("cu13/bin", "cuda_cuobjdump/bin", "cuda_nvdisasm/bin"):
                p = os.path.join(base, sub, name)
                if os.path.isfile(p):
                    return p
    except ImportError:
        pass
    return None


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: short_name(d) for n, d in zip(names, out)}


def short_name(demangled):
    """'void attention_forward<64>(__nv_bfloat16*, ...)' -> 'attention_forward<64>'"""
    return demangled.split("(")[0].replace("void ", "").strip()


def compile_info(nvcc, args):
    """ptxas -v for one nvcc command: {mangled kernel: {regs, spill, smem}}"""
    r = subprocess.run([nvcc, "-std=c++17", "-O3", "-arch=sm_90a", "-Xptxas", "-v", "-I" + os.path.join(ROOT, "gpu")]
                       + args, capture_output=True, text=True)
    if r.returncode:
        die("nvcc failed:\n" + r.stderr[-3000:])
    info, cur = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
            info[cur] = {}
        elif cur:
            for key, pat in (("spill", r"(\d+) bytes spill stores"), ("regs", r"Used (\d+) registers"),
                             ("smem", r"(\d+) bytes smem")):
                m = re.search(pat, line)
                if m:
                    info[cur][key] = int(m.group(1))
    return info


def sass_counts(path):
    """{mangled kernel: counts of HMMA, HGMMA, LDSM, LDGSTS, LDL/STL, ENDCOLLECTIVE and EX2 async} from cuobjdump, or
    {} without the tools. ENDCOLLECTIVE: the warp-wide operations (shuffles) that ptxas also compiled into a copy for a
    warp that arrives diverged, since it could not tell that the lanes arrive together (after a spin loop in inline
    PTX, say): code that never runs in a converged warp, as long as the code it copies. EX2 async: the MUFU.EX2 (exponentials) that, in program order, a wait for every wgmma (WARPGROUP.DEPBAR
    gsb0, 0x0) follows before any new HGMMA is issued: that wait is for products issued before them (in a loop, in
    the iteration before), which the tensor cores may still be computing while they run."""
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if not (cuobjdump and nvdisasm):
        return {}
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    out = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True, env=env).stdout
    sass, cur = {}, None
    for line in out.splitlines():
        m = re.search(r"Function : (\w+)", line)
        if m:
            cur = m.group(1)
            sass[cur] = {"HMMA": 0, "HGMMA": 0, "LDSM": 0, "LDGSTS": 0, "LDL/STL": 0, "EX2 async": 0,
                         "ENDCOLLECTIVE": 0}
            ex2 = 0  # exponentials since the last HGMMA or full wait
        elif cur:
            m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\S*)\s*([^;]*)", line)
            if m:
                op = m.group(1)
                if op in ("LDL", "STL"):
                    op = "LDL/STL"
                if op in sass[cur]:
                    sass[cur][op] += 1
                if op == "HGMMA":
                    ex2 = 0
                elif op == "WARPGROUP" and m.group(2) == ".DEPBAR.LE" and m.group(3).replace(" ", "") == "gsb0,0x0":
                    sass[cur]["EX2 async"] += ex2
                    ex2 = 0
                elif op == "MUFU" and m.group(2) == ".EX2":
                    ex2 += 1
    return sass


def blocks_per_sm(regs, smem, threads):
    """the resident blocks an H100 SM allows, and what limits them"""
    warps = (threads + 31) // 32
    per_warp = ((max(regs, 1) * 32 + 255) // 256) * 256  # registers are allocated per warp, 256 at a time
    limits = {"regs": (65536 // per_warp) // warps, "smem": (233472 // (smem + 1024)) if smem else 1 << 30,
              "threads": 2048 // threads, "blocks": 32}
    lim = min(limits, key=lambda k: limits[k])
    return limits[lim], lim, limits


def attention_report(nvcc):
    smem_bin = os.path.join(ROOT, "build", "bench_attention")
    if not os.path.isfile(smem_bin):
        die(f"{smem_bin} not found: run ./build.sh first")
    dyn, threads = {}, {}
    for line in subprocess.run([smem_bin, "--smem"], capture_output=True, text=True, check=True).stdout.splitlines():
        f = line.split()  # kernel, dynamic shared memory bytes, and the block's threads where not 128
        dyn[f[0]] = int(f[1])
        threads[f[0]] = int(f[2]) if len(f) > 2 else 128
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "bench")
        info = compile_info(nvcc, [os.path.join(ROOT, "tests", "bench_attention.cu"), "-o", exe, "-lcublasLt",
                                   "-lcublas"])
        sass = sass_counts(exe)
    names = demangle([k for k in info if "attention" in k])
    print(f"{'kernel':34} {'regs':>4} {'spill':>5} {'smem B':>7} {'blk/SM':>6} {'(regs':>5} {'smem)':>5} "
          f"{'HMMA':>5} {'HGMMA':>5} {'LDSM':>5} {'LDGSTS':>6} {'LDL/STL':>7} {'EX2 async':>9}")
    for k in sorted(names, key=lambda k: names[k]):
        i, name = info[k], names[k]
        smem = i.get("smem", 0) + dyn.get(name, 0)
        blocks, _, lim = blocks_per_sm(i.get("regs", 0), smem, threads.get(name, 128))
        s = sass.get(k, {})
        print(f"{name:34} {i.get('regs', 0):4d} {i.get('spill', 0):5d} {smem:7d} {min(blocks, 16):6d} "
              f"{lim['regs']:5d} {min(lim['smem'], 32):5d} {s.get('HMMA', '-'):>5} {s.get('HGMMA', '-'):>5} {s.get('LDSM', '-'):>5} "
              f"{s.get('LDGSTS', '-'):>6} {s.get('LDL/STL', '-'):>7} {s.get('EX2 async', '-'):>9}")
    if not sass:
        print("(no SASS counts: cuobjdump/nvdisasm not found; pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


LAUNCH_RE = re.compile(r"^emu: kernel (.*): (\d+) launches, block \((\d+),(\d+),(\d+)\), up to (\d+) blocks and "
                       r"(\d+) bytes of dynamic shared memory a launch$")


def cpu_launches(trainer, a, steps):
    """the per-kernel lines of EMU_LAUNCH_STATS=2 for ./trainer_cpu --bench with `steps` timed steps"""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, EMU_LAUNCH_STATS="2", TMPDIR=tmp,
                   EMU_COMPUTE_CAPABILITY="9.0" if a.hopper else "8.0")
        r = subprocess.run([trainer, "--bench", "--preset", a.preset, "--seq", str(a.seq), "--batch", str(a.batch),
                            "--bench-warmup", "0", "--bench-steps", str(steps)], capture_output=True, text=True,
                           env=env)
    if r.returncode:
        die(f"{trainer} --bench failed (exit {r.returncode}):\n" + (r.stdout + r.stderr)[-2000:])
    out = {}
    for line in r.stderr.splitlines():
        m = LAUNCH_RE.match(line)
        if m:
            out[short_name(m.group(1))] = {"launches": int(m.group(2)), "threads": int(m.group(3)) * int(m.group(4))
                                           * int(m.group(5)), "dyn": int(m.group(7))}
    if not out:
        die(f"{trainer} printed no per-kernel launch counts (EMU_LAUNCH_STATS=2): is it the CPU build?")
    return out


def all_report(nvcc, a):
    trainer = os.path.join(ROOT, "trainer_cpu")
    if not os.path.isfile(trainer):
        die(f"{trainer} not found: run ./build.sh first")
    one, two = cpu_launches(trainer, a, 1), cpu_launches(trainer, a, 2)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "trainer.cubin")
        info = compile_info(nvcc, ["-cubin", os.path.join(ROOT, "trainer.cu"), "-o", cubin])
        sass = sass_counts(cubin)
    names = demangle(list(info))
    by_name = {names[k]: k for k in info}
    print(f"kernels of a training step: {a.preset}, T={a.seq}, B={a.batch}, compute capability "
          f"{'9.0' if a.hopper else '8.0'} "
          f"(launches from ./trainer_cpu --bench, "
          f"EMU_LAUNCH_STATS=2; registers and spills from ptxas, sm_90a; blocks per SM on an H100)")
    print(f"{'kernel':34} {'launch/step':>11} {'threads':>7} {'regs':>4} {'spill':>5} {'smem B':>7} {'blk/SM':>6} "
          f"{'limit':>7} {'HMMA':>5} {'LDL/STL':>7}")
    low = []
    for name in sorted(two):
        t = two[name]
        per_step = (t["launches"] - one.get(name, {}).get("launches", 0)) / 2
        k = by_name.get(name)
        if k is None:
            print(f"{name:34} {per_step:11g} {t['threads']:7d}  (not in the sm_90a build of trainer.cu)")
            continue
        i, s = info[k], sass.get(k, {})
        smem = i.get("smem", 0) + t["dyn"]
        blocks, limit, _ = blocks_per_sm(i.get("regs", 0), smem, t["threads"])
        if per_step > 0 and blocks < 2:
            low.append(name)
        print(f"{name:34} {per_step:11g} {t['threads']:7d} {i.get('regs', 0):4d} {i.get('spill', 0):5d} {smem:7d} "
              f"{blocks:6d} {limit:>7} {s.get('HMMA', '-'):>5} {s.get('LDL/STL', '-'):>7}")
    steps = sum((two[n]["launches"] - one.get(n, {}).get("launches", 0)) / 2 for n in two)
    coll = sorted(f"{names[k]} ({sass[k]['ENDCOLLECTIVE']})" for k in info if sass.get(k, {}).get("ENDCOLLECTIVE"))
    print(f"kernel launches per step: {steps:g}; kernels with spills: "
          f"{sum(1 for k in info if info[k].get('spill', 0)) or 'none'}; launched each step with fewer than 2 blocks "
          f"per SM: {', '.join(low) or 'none'}")
    if sass:  # every kernel of the build, launched or not
        print(f"kernels with a diverged-warp copy of their shuffles (ENDCOLLECTIVE): {', '.join(coll) or 'none'}")


def main():
    ap = argparse.ArgumentParser(description="registers, spills, shared memory and occupancy of the kernels (sm_90a)")
    ap.add_argument("--all", action="store_true", help="every kernel of a training step (default: attention only)")
    ap.add_argument("--preset", default="bert-base")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hopper", action="store_true",
                    help="--all: the step a compute capability 9.0 device runs (the wgmma attention kernels)")
    a = ap.parse_args()
    nvcc = find_tool("nvcc")
    if not nvcc:
        die("nvcc not found (set CUDA_HOME)")
    if a.all:
        all_report(nvcc, a)
    else:
        attention_report(nvcc)


if __name__ == "__main__":
    main()
