#!/usr/bin/env python3
"""kernel_report.py: what ptxas and the SASS say about the attention kernels, without a GPU.

Compiles tests/bench_attention.cu (which instantiates every attention kernel) with nvcc for sm_90, and prints
per kernel: registers, spill bytes, shared memory (static + the dynamic bytes the launcher asks for, from
`build/bench_attention --smem`), the blocks per SM that registers and shared memory allow on an H100
(64K registers, 228 KB shared memory with 1 KB reserved per block, 2048 threads, 32 blocks), and counts of
SASS instructions: tensor-core HMMA, ldmatrix LDSM, cp.async LDGSTS, and local-memory LDL/STL (spills).

  python3 tools/kernel_report.py            (after ./build.sh; needs nvcc, and cuobjdump + nvdisasm:
                                             the CUDA toolkit's, or `pip install nvidia-cuda-cuobjdump
                                             nvidia-cuda-nvdisasm`)
"""
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
    return {n: d.split("(")[0].replace("void ", "") for n, d in zip(names, out)}


def main():
    nvcc, cuobjdump, nvdisasm = find_tool("nvcc"), find_tool("cuobjdump"), find_tool("nvdisasm")
    if not nvcc:
        die("nvcc not found (set CUDA_HOME)")
    smem_bin = os.path.join(ROOT, "build", "bench_attention")
    if not os.path.isfile(smem_bin):
        die(f"{smem_bin} not found: run ./build.sh first")
    dyn = {}
    for line in subprocess.run([smem_bin, "--smem"], capture_output=True, text=True, check=True).stdout.splitlines():
        k, v = line.split()
        dyn[k] = int(v)
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "bench")
        cmd = [nvcc, "-std=c++17", "-O3", "-arch=sm_90", "-Xptxas", "-v", "-I" + os.path.join(ROOT, "gpu"),
               os.path.join(ROOT, "tests", "bench_attention.cu"), "-o", exe, "-lcublasLt", "-lcublas"]
        r = subprocess.run(cmd, capture_output=True, text=True)
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
        sass = {}
        if cuobjdump and nvdisasm:
            env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
            out = subprocess.run([cuobjdump, "--dump-sass", exe], capture_output=True, text=True, env=env).stdout
            cur = None
            for line in out.splitlines():
                m = re.search(r"Function : (\w+)", line)
                if m:
                    cur = m.group(1)
                    sass[cur] = {"HMMA": 0, "LDSM": 0, "LDGSTS": 0, "LDL/STL": 0}
                elif cur:
                    m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
                    if m:
                        op = m.group(1)
                        if op in ("LDL", "STL"):
                            op = "LDL/STL"
                        if op in sass[cur]:
                            sass[cur][op] += 1
    names = demangle([k for k in info if "attention" in k])
    print(f"{'kernel':34} {'regs':>4} {'spill':>5} {'smem B':>7} {'blk/SM':>6} {'(regs':>5} {'smem)':>5} "
          f"{'HMMA':>5} {'LDSM':>5} {'LDGSTS':>6} {'LDL/STL':>7}")
    for k in sorted(names, key=lambda k: names[k]):
        i, name = info[k], names[k]
        regs = i.get("regs", 0)
        per_warp = ((max(regs, 1) * 32 + 255) // 256) * 256
        by_regs = 65536 // (per_warp * 4)
        smem = i.get("smem", 0) + dyn.get(name, 0)
        by_smem = (233472 // (smem + 1024)) if smem else 32
        blocks = min(by_regs, by_smem, 16, 32)
        s = sass.get(k, {})
        print(f"{name:34} {regs:4d} {i.get('spill', 0):5d} {smem:7d} {blocks:6d} {by_regs:5d} {by_smem:5d} "
              f"{s.get('HMMA', '-'):>5} {s.get('LDSM', '-'):>5} {s.get('LDGSTS', '-'):>6} {s.get('LDL/STL', '-'):>7}")
    if not sass:
        print("(no SASS counts: cuobjdump/nvdisasm not found; pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


if __name__ == "__main__":
    main()
