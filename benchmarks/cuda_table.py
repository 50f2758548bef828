#!/usr/bin/env python3
"""The GPU machine's report (scripts/gpu.sh), three subcommands:

  tests FILE...          which *_CUDA GoogleTests ran; fails if one failed or was skipped
  adamw OUT.json         times torch.optim.AdamW(fused=True) on the parameter lists
                         of bm_cuda_optimizers.cpp (same sizes, CUDA events)
  table BM.json ADAMW.json
                         the table of docs/cuda.md: step time, GB/s against the
                         copy of the same bytes (each entry's bytes_per_param
                         counter), speed-up over the reference path, and fp32
                         LAMB against fused AdamW
"""
import json
import sys


# ------------------------------------------------- the parameter lists ----
# The same sizes as bm_cuda_optimizers.cpp (bert_large, resnet50, many_small).

def bert_large():
    sizes = [30522 * 1024, 512 * 1024, 2 * 1024, 1024, 1024]
    for _ in range(24):
        for _ in range(4):
            sizes += [1024 * 1024, 1024]
        sizes += [1024] * 4
        sizes += [1024 * 4096, 4096, 4096 * 1024, 1024]
    sizes += [1024 * 1024, 1024, 1024 * 1024, 1024, 1024, 1024, 30522]
    return "bert_large_335M", sizes


def resnet50():
    sizes = []

    def conv_bn(cin, cout, k):
        sizes.extend([cout * cin * k * k, cout, cout])

    conv_bn(3, 64, 7)
    cin = 64
    for width, blocks in zip([64, 128, 256, 512], [3, 4, 6, 3]):
        for b in range(blocks):
            conv_bn(cin, width, 1)
            conv_bn(width, width, 3)
            conv_bn(width, 4 * width, 1)
            if b == 0:
                conv_bn(cin, 4 * width, 1)
            cin = 4 * width
    sizes += [2048 * 1000, 1000]
    return "resnet50_25M", sizes


def many_small():
    return "small_10000t", [64 << (i % 5) for i in range(10000)]


LISTS = [bert_large(), resnet50(), many_small()]


# --------------------------------------------------------------- tests ----

def tests(paths):
    ran, bad = [], []
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for suite in report.get("testsuites", []):
            for test in suite.get("testsuite", []):
                name = f"{suite['name']}.{test['name']}"
                if "_CUDA" not in name:  # parameterized ones end in /PARAM
                    continue
                if test.get("failures"):
                    bad.append(name + " FAILED")
                elif test.get("result") == "SKIPPED":
                    bad.append(name + " SKIPPED")
                else:
                    ran.append(name)
    print(f"_CUDA tests passed: {len(ran)}; failed or skipped: {len(bad)}")
    for line in bad:
        print("  " + line)
    return 1 if bad or not ran else 0


# --------------------------------------------------------------- adamw ----

def adamw(out_path):
    import torch

    results = {}
    for name, sizes in LISTS:
        torch.manual_seed(0)
        params = [torch.randn(n, device="cuda", requires_grad=True) for n in sizes]
        for p in params:
            p.grad = 1e-3 * torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
        for _ in range(3):
            opt.step()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(20):
            start.record()
            opt.step()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        times.sort()
        results[name] = times[len(times) // 2]
        print(f"AdamW(fused=True) {name}: {results[name]:.3f} ms (median of 20)")
        del opt, params
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    return 0


# --------------------------------------------------------------- table ----

def medians(bm_path):
    """name -> (median ms, GB/s, counters), in the benchmark file's order."""
    with open(bm_path) as f:
        report = json.load(f)
    out = {}
    for b in report["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b.get("error_occurred"):
            continue
        name = b.get("run_name", b["name"]).replace("/manual_time", "")
        out[name] = (b["real_time"], b.get("bytes_per_second", 0.0) / 1e9, b)
    return out


def table(bm_path, adamw_path):
    runs = medians(bm_path)
    with open(adamw_path) as f:
        adamw_ms = json.load(f)
    print("| optimizer | list | bytes/param | fused ms | GB/s | copy GB/s | of copy | reference ms | speed-up "
          "| fused AdamW ms | vs AdamW |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for list_name, _ in LISTS:
        for name, (ms, gbs, bench) in runs.items():
            opt, lst, path = (name.split("/") + ["", ""])[:3]
            if lst != list_name or path != "fused":
                continue
            nbytes = int(bench.get("bytes_per_param", 0))
            ref = runs.get(f"{opt}/{list_name}/reference")
            copy = runs.get(f"copy/{list_name}/{nbytes}B")
            row = [opt, list_name, str(nbytes), f"{ms:.3f}", f"{gbs:.0f}"]
            row += [f"{copy[1]:.0f}", f"{gbs / copy[1]:.0%}"] if copy else ["", ""]
            row += [f"{ref[0]:.3f}", f"{ref[0] / ms:.1f}x"] if ref else ["", ""]
            # fused AdamW is timed on fp32 parameters: the fp32 LAMB rows only
            if opt in ("LAMB", "LAMB_clip") and list_name in adamw_ms:
                row += [f"{adamw_ms[list_name]:.3f}", f"{ms / adamw_ms[list_name]:.2f}x"]
            else:
                row += ["", ""]
            print("| " + " | ".join(row) + " |")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "tests":
        return tests(argv[2:])
    if len(argv) == 3 and argv[1] == "adamw":
        return adamw(argv[2])
    if len(argv) == 4 and argv[1] == "table":
        return table(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
