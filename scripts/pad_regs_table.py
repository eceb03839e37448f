"""Registers, spills and shared memory of the padded dispatcher kernel vs the plain kernels,
and the occupancy each RT kernel class gets under each proxy-variant selection (static: nvcc
``-cubin -Xptxas -v``, no GPU; issue 30 item 3, docs/cuda.md "Register and shared-memory
use, padded vs plain").

    .venv/bin/python scripts/pad_regs_table.py [--arch sm_90] [--models vgg19,...]
        [--scale scaled] [--levels 1,2,4,8] [--json out.json]

What it does: builds the plans of the models (default the five DISB models, scaled: their
kernel bodies are the full-size models' code, only sizes differ), compiles ONE module with
every plain kernel (``union_source``) and the padded dispatcher module of all of them
(``build_padded_module``, as ``CudaDevice.prepare_padding`` does) with nvcc, reads ptxas'
report per function, and for every plain kernel (grouped by kind) computes the blocks per
SM it gets plainly and as a padded launch with no BE part (REEF Fig. 18a's case) under
``pad_select=parts`` (level 1 without parts) and ``pad_select=regs`` (the fewest registers
that hold the kernel: ``PaddedModule.variant_for_regs`` with the registers ptxas reports).
Occupancy uses sm_90's limits (65536 registers allocated per warp in units of 256, 64 warps,
32 blocks, 2048 threads, 228 KB shared memory with 1 KB reserved per block); what a GPU's
occupancy API says may differ by its own rounding. Nothing here is a time: which selection
is faster only a GPU can say (scripts/gpu_check.sh, step ``pad_select``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REGS_PER_SM, MAX_WARPS, MAX_BLOCKS, SMEM_PER_SM, SMEM_RESERVED = 65536, 64, 32, 233472, 1024


def occupancy(regs: int, threads: int, smem: int) -> int:
    """Resident blocks per SM on sm_90 for ``regs`` registers/thread, ``threads`` per block
    and ``smem`` static shared bytes per block."""
    warps = -(-threads // 32)
    per_warp = -(-(max(regs, 1) * 32) // 256) * 256
    by_regs = (REGS_PER_SM // per_warp) // warps
    by_smem = SMEM_PER_SM // (smem + SMEM_RESERVED) if smem else MAX_BLOCKS
    return max(0, min(MAX_BLOCKS, MAX_WARPS // warps, by_regs, by_smem))


def ptxas_report(source: str, arch: str, nvcc: str) -> dict[str, dict[str, int]]:
    """Per function: regs, spill_stores, spill_loads, smem (bytes), from ``-Xptxas -v``."""
    with tempfile.TemporaryDirectory(prefix="avi_ptxas_") as d:
        src = Path(d) / "k.cu"
        src.write_text(source)
        r = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-std=c++17", "-w",
                            "-Xptxas", "-v", "-o", str(Path(d) / "k.cubin"), str(src)],
                           capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed:\n{r.stderr[-3000:]}")
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = out.setdefault(m.group(1), {"regs": 0, "spill_stores": 0,
                                             "spill_loads": 0, "smem": 0})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["spill_stores"], cur["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return out


def main(argv: list[str] | None = None) -> int:
    from av_infer.bench.gpu_bench import DISB_ZOO, _zoo_plan
    from av_infer.kernels.cuda.padding import build_padded_module
    from av_infer.kernels.cuda.sources import build_plan_source, union_source
    from av_infer.kernels.cuda_compile import find_nvcc

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--models", default=",".join(DISB_ZOO))
    ap.add_argument("--scale", default="scaled")
    ap.add_argument("--levels", default=None,
                    help="occupancy levels of the proxy variants (default padding.OCC_LEVELS)")
    ap.add_argument("--json", default=None, help="write the tables as JSON here ('-': stdout)")
    a = ap.parse_args(argv)
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc not found", file=sys.stderr)
        return 2
    plans = [_zoo_plan(m.strip(), a.scale)[0] for m in a.models.split(",") if m.strip()]
    srcs = [build_plan_source(p) for p in plans]
    levels = ([int(v) for v in a.levels.split(",")] if a.levels else None)
    padded = build_padded_module(srcs, levels) if levels else build_padded_module(srcs)
    plain = ptxas_report(union_source(plans), a.arch, nvcc)
    pad = ptxas_report(padded.source, a.arch, nvcc)
    padded.variant_regs = {lv: pad[name]["regs"] for lv, name in padded.variants.items()}
    variants = {name: {"level": lv, **pad[name],
                       "occupancy_256": occupancy(pad[name]["regs"], 256, pad[name]["smem"])}
                for lv, name in padded.variants.items()}
    by_name = {v: lv for lv, v in padded.variants.items()}
    classes: dict[str, dict[str, Any]] = {}
    for p, src in zip(plans, srcs):
        for spec in src.specs:
            kind = p.kernels[spec.kernel].kind
            info = plain[spec.func]
            threads = int(spec.block[0])
            old = padded.variant_for(1)
            new = padded.variant_for_regs(info["regs"])
            row = {"threads": threads, "regs": info["regs"],
                   "spills": f"{info['spill_stores']}/{info['spill_loads']}",
                   "smem": info["smem"], "plain_occ": occupancy(info["regs"], threads,
                                                                info["smem"]),
                   "parts": f"O{by_name[old]}",
                   "parts_occ": occupancy(pad[old]["regs"], threads, pad[old]["smem"]),
                   "regs_sel": f"O{by_name[new]}",
                   "regs_occ": occupancy(pad[new]["regs"], threads, pad[new]["smem"])}
            c = classes.setdefault(kind, {"kernels": 0, "funcs": set(), "rows": {}})
            c["kernels"] += 1
            c["funcs"].add(spec.func)
            key = tuple(row.items())
            c["rows"][key] = c["rows"].get(key, 0) + 1
    print(f"nvcc {a.arch}, models {a.models} ({a.scale}); padded module: "
          f"{len(padded.body_ids)} bodies, {padded.threads} threads\n")
    print("| variant | registers | spills (stores / loads B) | static smem | blocks/SM at 256 |")
    print("|---|---|---|---|---|")
    for name, v in variants.items():
        print(f"| `{name}` | {v['regs']} | {v['spill_stores']} / {v['spill_loads']} | "
              f"{v['smem']} B | {v['occupancy_256']} |")
    print("\n| RT kernel kind | kernels | threads | registers | spills | plain blocks/SM | "
          "padded no-BE, `parts` | padded no-BE, `regs` |")
    print("|---|---|---|---|---|---|---|---|")
    table = []
    for kind in sorted(classes):
        c = classes[kind]
        for key, n in sorted(c["rows"].items(), key=lambda kv: -kv[1]):
            r = dict(key)
            table.append({"kind": kind, "kernels": n, **r})
            print(f"| {kind} | {n} | {r['threads']} | {r['regs']} | {r['spills']} | "
                  f"{r['plain_occ']} | {r['parts']}: {r['parts_occ']} | "
                  f"{r['regs_sel']}: {r['regs_occ']} |")
    tot = sum(t["kernels"] for t in table)
    lost_old = sum(t["kernels"] for t in table if t["parts_occ"] < t["plain_occ"])
    lost_new = sum(t["kernels"] for t in table if t["regs_occ"] < t["plain_occ"])
    print(f"\nkernels with fewer blocks/SM padded than plain: parts {lost_old}/{tot}, "
          f"regs {lost_new}/{tot}")
    if a.json:
        doc = {"arch": a.arch, "models": a.models, "scale": a.scale, "variants": variants,
               "kernels": table, "fewer_blocks": {"parts": lost_old, "regs": lost_new,
                                                  "of": tot}}
        text = json.dumps(doc, indent=1)
        if a.json == "-":
            print(text)
        else:
            Path(a.json).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
