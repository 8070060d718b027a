#!/usr/bin/env python3
"""Mutation audit: breaks the code one line at a time and checks that some test notices.

    python3 scripts/mutate.py [--list tests/mutations.txt] [--only NAME[,NAME...]]
                              [--scratch DIR] [--markdown FILE] [--timeout SECONDS]
                              [--jobs N] [--cuda [--cuda-arch ARCH]]

Each mutation in the list (format at the top of tests/mutations.txt) replaces one exact snippet
of one file. The script copies the tracked files into a scratch tree (default
/tmp/mt-mutate/src; never the working tree), configures one CPU build there (ccache for C++ when
installed), and for each mutation: applies it, rebuilds (one file recompiles, the tests relink),
runs the mutation's tests (its gtest filter, else every CPU test) and restores the file. A
mutation is caught when a test fails, the run crashes or times out, or the tree no longer builds;
it SURVIVED when everything passes. A snippet that no longer occurs exactly once is skipped and
reported ("snippet not found"), so a list that has gone stale says so instead of passing.

--cuda breaks the CUDA kernels instead, on a machine with a GPU: the list is
tests/mutations-cuda.txt, the scratch build has CUDA on (sm_90a unless --cuda-arch says
otherwise), every entry names its tests (a filter without a '-' part), and the run refuses to
start where nvidia-smi lists no GPU (a skipped CUDA test catches nothing). The unmutated tree runs
the union of the entries' tests.

A run stopped by SIGTERM (a time limit) still restores the file it had broken, and a file copied
into the scratch tree is stamped with the time of the copy, so the next run rebuilds it.

It prints a table (mutation -> the failing tests, or SURVIVED) and exits 1 when a mutation of a
must-catch area (MUST_CATCH below) survives or is skipped (a stale entry guards nothing), or the
unmutated tree fails its tests; survivors and skipped entries of
other areas are reported but do not fail the audit. Entries marked `equivalent:` are listed with
their reason and not run.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

MUST_CATCH = {"accumulation", "normalizer", "resume", "gradient"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAILED_RE = re.compile(r"^\[  FAILED  \] ([A-Za-z0-9_/.]+)(?:, where .*)? \(\d+ ms\)$", re.M)
BUILD_TARGETS = ["mt_tests", "train"]  # the CLI tests run the train binary


def parse_list(path):
    """Records separated by blank lines; `key: value` lines; '#' starts a comment line.
    In `find` and `replace`, \\n stands for a newline and \\\\ for a backslash."""
    records, cur = [], {}
    keys = {"name", "area", "file", "find", "replace", "tests", "equivalent"}
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if line.startswith("#"):
                continue
            if not line.strip():
                if cur:
                    records.append(cur)
                    cur = {}
                continue
            key, sep, value = line.partition(":")
            if not sep or key.strip() not in keys:
                sys.exit(f"{path}:{lineno}: expected one of {sorted(keys)} followed by ':', got {line!r}")
            key, value = key.strip(), value[1:] if value.startswith(" ") else value
            if key in cur:
                sys.exit(f"{path}:{lineno}: {key} given twice in mutation {cur.get('name', '?')}")
            if key in ("find", "replace"):
                value = re.sub(r"\\(n|\\)", lambda m: "\n" if m.group(1) == "n" else "\\", value)
            cur[key] = value
            cur.setdefault("line", lineno)
    if cur:
        records.append(cur)
    names = set()
    for r in records:
        missing = {"name", "area", "file", "find", "replace"} - r.keys()
        if missing:
            sys.exit(f"{path}:{r['line']}: mutation {r.get('name', '?')} lacks {sorted(missing)}")
        if r["name"] in names:
            sys.exit(f"{path}:{r['line']}: mutation name {r['name']} used twice")
        names.add(r["name"])
    return records


def sync_tree(src):
    """Copies the tracked (and untracked, not ignored) files into src, leaving files whose
    contents are already equal untouched so that the scratch build stays incremental."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        a, b = os.path.join(ROOT, rel), os.path.join(src, rel)
        if not os.path.isfile(a):
            continue  # deleted in the working tree
        with open(a, "rb") as f:
            data = f.read()
        if os.path.exists(b):
            with open(b, "rb") as f:
                if f.read() == data:
                    continue
        os.makedirs(os.path.dirname(b), exist_ok=True)
        shutil.copy(a, b)  # stamped now: newer than an object a stopped run built from a mutant


def run(cmd, cwd, timeout=None, env=None):
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out


def build(build_dir, jobs):
    return run(["cmake", "--build", build_dir, "-j", str(jobs), "--target", *BUILD_TARGETS], build_dir)


def run_tests(build_dir, flt, timeout, cuda):
    cmd = [os.path.join(build_dir, "mt_tests"), "--gtest_brief=1"]
    if cuda:
        cmd.append("--gtest_filter=" + flt)
    else:
        # The CUDA tests skip without a GPU; the filter keeps them out of the count either way.
        cpu_only = "" if "-" in (flt or "") else "-Cuda*:*CUDA*"
        cmd.append("--gtest_filter=" + (flt or "*") + cpu_only)
    rc, out = run(cmd, build_dir, timeout)
    return rc, out, sorted(set(FAILED_RE.findall(out)))


def main():
    # A time limit's TERM unwinds through the `finally` that restores a broken file (and
    # subprocess.run kills the build or the tests it was waiting for).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", help="default: tests/mutations.txt, or tests/mutations-cuda.txt")
    ap.add_argument("--only", default="", help="comma-separated mutation names")
    ap.add_argument("--scratch", help="default: /tmp/mt-mutate, or /tmp/mt-mutate-cuda")
    ap.add_argument("--markdown", help="also write the table, in Markdown, to this file")
    ap.add_argument("--timeout", type=int, default=600, help="seconds for one mutation's tests")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cuda", action="store_true", help="break the CUDA kernels (needs a GPU)")
    ap.add_argument("--cuda-arch", default="90a", help="CMAKE_CUDA_ARCHITECTURES with --cuda")
    args = ap.parse_args()

    listed = args.list or os.path.join(ROOT, "tests",
                                       "mutations-cuda.txt" if args.cuda else "mutations.txt")
    muts = parse_list(listed)
    if args.cuda:
        untested = [m["name"] for m in muts if not m.get("tests") and "equivalent" not in m]
        if untested:
            sys.exit(f"--cuda: every mutation names its tests; these do not: {untested}")
        negative = [m["name"] for m in muts if "-" in m.get("tests", "")]
        if negative:  # the baseline joins the filters with ':', which a '-' part would cut
            sys.exit(f"--cuda: a filter with a '-' part cannot join the others: {negative}")
        gpus = run(["nvidia-smi", "-L"], ROOT) if shutil.which("nvidia-smi") else (1, "")
        if gpus[0] != 0 or "GPU " not in gpus[1]:
            sys.exit("--cuda: nvidia-smi lists no GPU; the CUDA tests would skip, catching nothing")
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m["name"] for m in muts}
        if unknown:
            sys.exit(f"--only: no mutation named {sorted(unknown)}")
        muts = [m for m in muts if m["name"] in wanted]
    scratch = args.scratch or ("/tmp/mt-mutate-cuda" if args.cuda else "/tmp/mt-mutate")
    src, build_dir = os.path.join(scratch, "src"), os.path.join(scratch, "build")
    os.makedirs(src, exist_ok=True)
    start = time.time()
    sync_tree(src)
    env = dict(os.environ)
    if shutil.which("ccache"):
        env["CMAKE_CXX_COMPILER_LAUNCHER"] = "ccache"
    ninja = ["-G", "Ninja"] if shutil.which("ninja") else []
    cuda = ["-DMT_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={args.cuda_arch}"] if args.cuda else [
        "-DMT_CUDA=OFF"]
    rc, out = run(["cmake", "-S", src, "-B", build_dir, *ninja, *cuda,
                   "-DCMAKE_BUILD_TYPE=Release"], ROOT, env=env)
    if rc != 0:
        sys.exit("configuring the scratch build failed:\n" + out[-3000:])
    print(f"building the unmutated tree in {build_dir} ...", flush=True)
    rc, out = build(build_dir, args.jobs)
    if rc != 0:
        sys.exit("the unmutated tree does not build:\n" + out[-3000:])

    rows, bad_baseline = [], []
    for i, m in enumerate(muts, 1):
        label = f"[{i}/{len(muts)}] {m['name']}"
        if "equivalent" in m:
            rows.append((m, "equivalent", m["equivalent"]))
            print(f"{label}: equivalent ({m['equivalent']})", flush=True)
            continue
        path = os.path.join(src, m["file"])
        text = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        count = text.count(m["find"]) if text is not None else 0
        if count != 1:
            why = "file not found" if text is None else (
                "snippet not found" if count == 0 else f"snippet occurs {count} times")
            rows.append((m, "skipped", why))
            print(f"{label}: skipped ({why})", flush=True)
            continue
        t0 = time.time()
        stat = os.stat(path)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace(m["find"], m["replace"]))
            rc, out = build(build_dir, args.jobs)
            if rc != 0:
                rows.append((m, "caught", "does not compile"))
            else:
                rc, out, failed = run_tests(build_dir, m.get("tests"), args.timeout, args.cuda)
                if failed:
                    rows.append((m, "caught", ", ".join(failed)))
                elif rc is None:
                    rows.append((m, "caught", f"tests timed out after {args.timeout} s"))
                elif rc != 0:
                    rows.append((m, "caught", f"mt_tests exited with {rc} (crash)"))
                else:
                    rows.append((m, "SURVIVED", ""))
        finally:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.utime(path, ns=(stat.st_atime_ns, time.time_ns()))  # newer: the build redoes it
        print(f"{label}: {rows[-1][1]} {rows[-1][2]} ({time.time() - t0:.0f} s)", flush=True)

    # The tests must pass on the unmutated tree, else every "caught" above means nothing.
    rc, out = build(build_dir, args.jobs)
    every = ":".join(sorted({m["tests"] for m in muts if m.get("tests")})) if args.cuda else None
    if every != "":  # with --cuda, only equivalent entries: no tests to run
        rc, out, failed = run_tests(build_dir, every, args.timeout, args.cuda)
        if rc != 0:
            bad_baseline.append(", ".join(failed) or f"exit {rc}")

    table = ["| # | area | mutation | file | result |", "|---|---|---|---|---|"]
    for i, (m, status, detail) in enumerate(rows, 1):
        if status == "caught" and detail.count(", ") >= 4:  # the first tests, then a count
            names = detail.split(", ")
            detail = ", ".join(names[:3]) + f" and {len(names) - 3} more"
        result = {"caught": f"caught by {detail}", "SURVIVED": "**SURVIVED**",
                  "skipped": f"skipped: {detail}", "equivalent": f"equivalent: {detail}"}[status]
        table.append(f"| {i} | {m['area']} | {m['name']} | {m['file']} | {result} |")
    counts = {s: sum(1 for r in rows if r[1] == s) for s in ("caught", "SURVIVED", "skipped", "equivalent")}
    summary = (f"{len(rows)} mutations: {counts['caught']} caught, {counts['SURVIVED']} survived, "
               f"{counts['skipped']} skipped, {counts['equivalent']} equivalent; "
               f"{time.time() - start:.0f} s")
    print("\n" + "\n".join(table) + "\n\n" + summary)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write("\n".join(table) + "\n\n" + summary + "\n")
    status = 0
    for line in bad_baseline:
        print(f"FAILED: the unmutated tree fails its tests: {line}")
        status = 1
    for m, s, _ in rows:
        if s == "SURVIVED" and m["area"] in MUST_CATCH:
            print(f"FAILED: {m['name']} ({m['area']}, a must-catch area) survived")
            status = 1
        if s == "skipped" and m["area"] in MUST_CATCH:  # a stale entry guards nothing
            print(f"FAILED: {m['name']} ({m['area']}, a must-catch area) no longer applies: update it")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
