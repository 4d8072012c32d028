"""Bit-for-bit reference outputs of enkflow (issue 21, acceptance 1): record fingerprints of one
checkout's outputs, compare two recordings, or check a checkout against the committed reference.

    python benchmarks/bitwise_reference.py record --src SRC --out FILE.json [--only G,...] [--work DIR]
    python benchmarks/bitwise_reference.py compare A.json B.json
    python benchmarks/bitwise_reference.py check --src SRC [--only G,...] [--work DIR] [--reference FILE.json]

``SRC`` is the ``src/`` of any checkout; every command runs as ``python -m enkflow ...`` with
``PYTHONPATH=SRC`` (this script's python, e.g. ``.venv/bin/python``; ``mpiexec`` is looked up beside
it first). A checkout of another commit: ``git worktree add W COMMIT``, then its compiled kernel
``enkflow/analysis/_lanes*.so`` into ``W/src/enkflow/analysis/``: ``cd W && python setup.py build_ext
--inplace``, or copy it from a checkout whose C sources (``src/enkflow/analysis/_c``) are the same.
The ``native`` group builds ``SRC/../native`` with CMake (cached in the work directory by a hash of
that tree). ``check`` compares against ``tests/data/bitwise_reference.json`` (recorded from commit
7d0a604). Each group runs alone with ``--only``; ``compare`` compares only the groups present in both
files and names the others.

Groups (every run in a fresh directory under ``--work``; the same arguments on every commit):

* ``demo_offline``: ``enkflow demo``; ``demo_online``: ``enkflow demo --mode online`` (1 server rank);
  ``demo_online2``: the online demo with ``[online] ranks = 2`` (the demo's own experiment.toml and
  problem, made by ``enkflow demo --mode online --runners 0``, which writes them and then refuses
  the configuration; then ``enkflow run``). Files: the final member restarts and every cycle's
  ``*.nc`` (analysis mean/spread, ``obs_diag.nc``, the statistics files).
* ``l96``: ``enkflow l96 --json`` scores of all six methods (16 members, 300 cycles after 50),
  LETKF and LESTKF with ``--adaptive miyoshi2011``, and ETKF and LETKF with ``--online 2``.
* ``land``: ``enkflow synth --size small --members 20``, then ``enkflow bench land --size small
  --cutoff-km 1500 --ranks P --json`` at P = 1, 2, 3, each on a fresh copy: the analysed members and
  the JSON's non-timing numbers.
* ``native``: the four models of ``native/examples`` in the online demo study (as tests/native do):
  ``enkflow_demo_c`` and ``enkflow_demo_f`` as runners (C and Fortran runner APIs),
  ``c_netcdf_model`` and ``fortran_netcdf_model`` through ``python -m enkflow.online.intercept``
  (the module is looked up by file name under SRC, so it may move).
* ``bench_keys``: the SET of JSON keys (dotted paths, ``[]`` for list items) that each
  ``enkflow bench analysis|io|land|online|online-scale|output`` prints at its smallest sizes.

Fingerprints: file bytes are never hashed (NetCDF/HDF5 files carry time stamps). Per NetCDF file:
every dimension (size, unlimited); every variable's dtype, dimensions, shape and the sha256 of its raw
data in C order (masking and scaling off); every variable attribute and every global attribute
except the exclusions below. Attribute values are kept as text (a sha256 when longer than 200
characters), with the run's own directory replaced by ``<case>`` and the work directory by
``<work>`` (the mean/spread files name their template restart by its absolute path).

Exclusions (found by recording the base twice; everything else was identical run to run):
global attribute ``history`` (a UTC time stamp, and the output writer's pid). JSON scores keep
every number exactly (floats through ``repr``) except timing keys: a key whose last component has a
word (split on ``_``) among ``s ms seconds gbps rate rss cpu wall load memory time elapsed``, or is
one of ``imbalance`` (= ``imbalance_cpu``), ``balanced``; those are dropped.

Prints what it does and the differences, and ends with one JSON line. ``compare``/``check`` exit 1
when anything differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import netCDF4
import numpy as np

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "bitwise_reference.json"
EXCLUDED_GLOBAL_ATTRS = frozenset({"history"})
TIMING_WORDS = frozenset({"s", "ms", "seconds", "gbps", "rate", "rss", "cpu", "wall", "load", "memory", "time",
                          "elapsed"})
TIMING_KEYS = frozenset({"imbalance", "balanced"})
L96 = ["--members", "16", "--cycles", "300", "--burn-in", "50", "--radius", "5", "--inflation", "1.02", "--json"]
LAND_RANKS = (1, 2, 3)
DEMO_MEMBERS, DEMO_CYCLES = 8, 3


@dataclass(frozen=True)
class Ctx:
    """Where one recording runs: ``src`` the checkout's ``src/``, ``work`` the scratch directory."""

    src: Path
    work: Path

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(self.src), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   MKL_NUM_THREADS="1")
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        return env

    def case_dir(self, name: str) -> Path:
        d = self.work / name
        shutil.rmtree(d, ignore_errors=True)
        d.parent.mkdir(parents=True, exist_ok=True)
        return d


def run(ctx: Ctx, argv: list[str], log: Path, *, cwd: Path | None = None, check: bool = True,
        env: dict[str, str] | None = None, timeout: float = 600) -> str:
    """Run ``argv`` niced with the checkout on the path; stdout+stderr go to ``log``; returns stdout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["nice", "-n", "5", *argv], capture_output=True, text=True, cwd=cwd or ctx.work,
                          env=env or ctx.env, timeout=timeout, stdin=subprocess.DEVNULL)
    log.write_text(f"$ {' '.join(argv)}\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    if check and proc.returncode != 0:
        raise SystemExit(f"failed (exit {proc.returncode}): {' '.join(argv)}\n{proc.stderr[-3000:]}\n(log: {log})")
    return proc.stdout


def enkflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "enkflow", *args]


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# --- fingerprints -------------------------------------------------------------------------------------

def _attr_text(value: object, dirs: dict[str, str]) -> str:
    if isinstance(value, np.ndarray):
        text = f"{value.dtype}:{value.tolist()!r}"
    elif isinstance(value, np.generic):
        text = f"{value.dtype}:{value.item()!r}"
    else:
        text = repr(value)
    for path, name in dirs.items():
        text = text.replace(path, name)
    return text if len(text) <= 200 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _attrs(obj: netCDF4.Dataset | netCDF4.Variable, dirs: dict[str, str], exclude: frozenset[str]) -> dict[str, str]:
    return {k: _attr_text(obj.getncattr(k), dirs) for k in obj.ncattrs() if k not in exclude}


def _group(g: netCDF4.Dataset, dirs: dict[str, str]) -> dict:
    out: dict = {"attrs": _attrs(g, dirs, EXCLUDED_GLOBAL_ATTRS),
                 "dims": {k: [len(d), d.isunlimited()] for k, d in g.dimensions.items()}, "vars": {}}
    for name, v in g.variables.items():
        v.set_auto_maskandscale(False)
        data = np.ascontiguousarray(v[...])
        out["vars"][name] = {"dtype": str(data.dtype), "dims": list(v.dimensions), "shape": list(data.shape),
                             "sha256": hashlib.sha256(data.tobytes()).hexdigest(),
                             "attrs": _attrs(v, dirs, frozenset())}
    for name, sub in g.groups.items():
        out.setdefault("groups", {})[name] = _group(sub, dirs)
    return out


def fingerprint(path: Path, case: Path, work: Path) -> dict:
    """The fingerprint of one NetCDF (or NetCDF-4/HDF5) file; see the module docstring."""
    dirs = {str(case.resolve()): "<case>", str(work.resolve()): "<work>"}
    with netCDF4.Dataset(path) as ds:
        return {"format": ds.data_model, **_group(ds, dirs)}


def fingerprints(case: Path, work: Path, patterns: tuple[str, ...]) -> dict[str, dict]:
    """Fingerprints of the files under ``case`` that match ``patterns``, by relative path."""
    files = sorted({p for pat in patterns for p in case.glob(pat)})
    if not files:
        raise SystemExit(f"no output files matching {patterns} under {case}")
    return {str(p.relative_to(case)): fingerprint(p, case, work) for p in files}


def is_timing(key: str) -> bool:
    return key in TIMING_KEYS or bool(TIMING_WORDS & set(key.split("_")))


def scores(obj: object) -> object:
    """``obj`` (parsed JSON) without its timing keys, recursively."""
    if isinstance(obj, dict):
        return {k: scores(v) for k, v in obj.items() if not is_timing(k)}
    if isinstance(obj, list):
        return [scores(v) for v in obj]
    return obj


def key_paths(obj: object, prefix: str = "") -> list[str]:
    """The dotted key paths of parsed JSON (``[]`` for list items), sorted."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out.add(p)
            out.update(key_paths(v, p))
    elif isinstance(obj, list):
        for v in obj:
            out.update(key_paths(v, prefix + "[]"))
    return sorted(out)


# --- groups -----------------------------------------------------------------------------------------------

DEMO_FILES = ("members/member_*.nc", "run/cycles/*/*.nc")
_TEMPLATES: dict[Path, Path] = {}


def demo_offline(ctx: Ctx) -> dict:
    d = ctx.case_dir("demo_offline/demo")
    run(ctx, enkflow("demo", "--dir", str(d)), ctx.work / "logs" / "demo_offline.log")
    return {"demo": fingerprints(d, ctx.work, DEMO_FILES)}


def demo_online(ctx: Ctx) -> dict:
    d = ctx.case_dir("demo_online/demo")
    run(ctx, enkflow("demo", "--mode", "online", "--dir", str(d)), ctx.work / "logs" / "demo_online.log")
    return {"demo": fingerprints(d, ctx.work, DEMO_FILES)}


def online_template(ctx: Ctx) -> Path:
    """The online demo's problem and experiment.toml, not yet run (made once per recording): ``enkflow demo
    --mode online --runners 0`` writes them, then refuses ``runners = 0``."""
    if ctx.work in _TEMPLATES:
        return _TEMPLATES[ctx.work]
    d = ctx.case_dir("template/online")
    run(ctx, enkflow("demo", "--mode", "online", "--runners", "0", "--dir", str(d)),
        ctx.work / "logs" / "template.log", check=False)
    text = (d / "experiment.toml").read_text() if (d / "experiment.toml").exists() else ""
    if "\nrunners = 0\n" not in text or not (d / "members" / "member_0001.nc").exists():
        raise SystemExit(f"`enkflow demo --mode online --runners 0 --dir {d}` did not leave its experiment.toml "
                         f"(with 'runners = 0') and members: see {ctx.work / 'logs' / 'template.log'}")
    _TEMPLATES[ctx.work] = d
    return d


def study(ctx: Ctx, name: str, edit: Callable[[str, Path], str]) -> Path:
    """A copy of the online template at ``work/name`` whose experiment.toml is ``edit(text, directory)``."""
    d = ctx.case_dir(name)
    shutil.copytree(online_template(ctx), d, symlinks=True)
    toml = d / "experiment.toml"
    toml.write_text(edit(toml.read_text(), d))
    return d


def run_study(ctx: Ctx, d: Path, env: dict[str, str] | None = None) -> dict:
    run(ctx, enkflow("run", str(d / "experiment.toml")), d.with_suffix(".log"), cwd=d, env=env)
    return fingerprints(d, ctx.work, DEMO_FILES)


def demo_online2(ctx: Ctx) -> dict:
    mpiexec = shutil.which("mpiexec", path=ctx.env["PATH"])
    if mpiexec is None:
        raise SystemExit("demo_online2 needs mpiexec (pip install mpich)")
    d = study(ctx, "demo_online2/demo", lambda text, _d: text.replace(
        "\nrunners = 0\n", f"\nrunners = 2\nranks = 2\nmpiexec = {json.dumps(mpiexec)}\n"))
    return {"demo": run_study(ctx, d)}


def l96(ctx: Ctx) -> dict:
    cases = [(m, ["--method", m]) for m in ("etkf", "estkf", "denkf", "enkf", "letkf", "lestkf")]
    cases += [(f"{m}_miyoshi2011", ["--method", m, "--adaptive", "miyoshi2011"]) for m in ("letkf", "lestkf")]
    cases += [(f"{m}_online2", ["--method", m, "--online", "2", "--cycles", "40", "--burn-in", "10"])
              for m in ("etkf", "letkf")]
    out = {}
    for name, args in cases:
        argv = enkflow("l96", *L96, *args)  # argparse: the later --cycles/--burn-in win
        out[name] = {"stdout.json": scores(last_json(run(ctx, argv, ctx.work / "logs" / f"l96_{name}.log")))}
    return out


def land(ctx: Ctx) -> dict:
    problem = ctx.case_dir("land/problem")
    run(ctx, enkflow("synth", "--size", "small", "--members", "20", "--out", str(problem)),
        ctx.work / "logs" / "land_synth.log")
    out = {}
    for p in LAND_RANKS:
        d = ctx.case_dir(f"land/ranks{p}")
        shutil.copytree(problem, d)
        res = last_json(run(ctx, enkflow("bench", "land", "--size", "small", "--members", "20", "--cutoff-km", "1500",
                                         "--dir", str(d), "--ranks", str(p), "--json"), ctx.work / "logs" / f"land_{p}.log"))
        out[f"ranks{p}"] = {**fingerprints(d, ctx.work, ("member_*.nc",)), "stdout.json": scores(res)}
    return out


def native_build(ctx: Ctx) -> Path:
    """``SRC/../native`` configured, built and installed with CMake; returns the install prefix (cached in the
    work directory under a hash of the tree)."""
    tree = ctx.src.resolve().parent / "native"
    h = hashlib.sha256()
    for p in sorted(q for q in tree.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(tree)).encode() + b"\0" + p.read_bytes())
    root = ctx.work / f"native-build-{h.hexdigest()[:16]}"
    prefix = root / "install"
    if (root / "done").exists():
        return prefix
    missing = [t for t in ("cmake", "pkg-config", "cc", "gfortran") if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"the native group needs {', '.join(missing)}: apt-get install gfortran libzmq3-dev "
                         "libnetcdf-dev libnetcdff-dev pkg-config cmake")
    shutil.rmtree(root, ignore_errors=True)
    log = ctx.work / "logs" / "native_build.log"
    run(ctx, ["cmake", "-S", str(tree), "-B", str(root / "build"), f"-DCMAKE_INSTALL_PREFIX={prefix}",
              "-DCMAKE_INSTALL_LIBDIR=lib", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], log)
    run(ctx, ["cmake", "--build", str(root / "build"), "-j", "2"], log.with_name("native_build2.log"))
    run(ctx, ["cmake", "--install", str(root / "build")], log.with_name("native_build3.log"))
    (root / "done").write_text(str(tree))
    return prefix


def module_of(ctx: Ctx, filename: str) -> str:
    """The dotted name of the one module ``filename`` under ``SRC/enkflow`` (so that a move is followed)."""
    found = sorted((ctx.src / "enkflow").rglob(filename))
    if len(found) != 1:
        raise SystemExit(f"expected one {filename} under {ctx.src / 'enkflow'}, found {[str(p) for p in found]}")
    return ".".join(found[0].relative_to(ctx.src).with_suffix("").parts)


def _online_section(runner: str, extra: str = "") -> Callable[[str, Path], str]:
    def edit(text: str, d: Path) -> str:
        head = text[:text.index("\n[online]")]
        cmd = runner.replace("@DIR@", str(d))
        return head + f"\n[online]\nrunner = {json.dumps(cmd)}\nrunners = 2\n{extra}"
    return edit


def native(ctx: Ctx) -> dict:
    prefix = native_build(ctx)
    env = dict(ctx.env, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(prefix / "lib"),
                                                                       os.environ.get("LD_LIBRARY_PATH")])))
    forcing_script = ctx.src.resolve().parent / "native" / "examples" / "demo_forcing.py"
    intercept = module_of(ctx, "intercept.py")
    shim = prefix / "lib" / "libenkflow_intercept.so"
    runners = {
        "c_api": f"{prefix}/bin/enkflow_demo_c --address {{address}} --token-file {{token_file}} --grid {{restart}} "
                 "--forcing @DIR@/forcing.nc --length {length} --curve-key={curve_key}",
        "fortran_api": f"{prefix}/bin/enkflow_demo_f --address {{address}} --token-file {{token_file}} --grid {{restart}} "
                       "--forcing @DIR@/forcing.nc --length {length} --curve-key={curve_key}",
    }
    for name, exe in (("c_netcdf", "c_netcdf_model"), ("fortran_netcdf", "fortran_netcdf_model")):
        runners[name] = (f"{sys.executable} -m {intercept} --address {{address}} --token-file {{token_file}} "
                         f"--expdir {{expdir}} --shim {shim} --steps 6 -- {prefix}/bin/{exe} {{{{restart}}}} "
                         "--forcing @DIR@/forcing.nc --length {length} --cycle {{cycle}}")
    out = {}
    for name, runner in runners.items():
        d = study(ctx, f"native/{name}", _online_section(runner, "heartbeat = 0.5\nheartbeat_timeout = 10.0\n"))
        run(ctx, [sys.executable, str(forcing_script), str(d / "members" / "member_0001.nc"), str(d / "forcing.nc")],
            ctx.work / "logs" / f"native_{name}_forcing.log")
        out[name] = run_study(ctx, d, env)
    return out


def bench_keys(ctx: Ctx) -> dict:
    d = ctx.case_dir("bench_keys")
    d.mkdir(parents=True)
    cases = {
        "analysis": ["--nx", "30", "--ny", "30", "--members", "8", "--baseline-points", "50", "--ranks", "1"],
        "io": ["--members", "2", "--mb-per-file", "1", "--repeat", "1", "--no-cold", "--dir", str(d)],
        "land": ["--size", "tiny", "--members", "4"],
        "online": ["--state-mb", "1", "--members", "2", "--runners", "1", "--ranks", "2", "--cycles", "1",
                   "--dir", str(d)],
        "online-scale": ["--members", "8", "--runners", "2", "--ranks", "1", "--cycles", "1", "--dir", str(d)],
        "output": ["--nx", "72", "--ny", "36", "--steps", "4", "--substeps", "1", "--repeat", "1",
                   "--dir", str(d)],
    }
    return {name: {"keys": key_paths(last_json(run(ctx, enkflow("bench", name, *args, "--json"),
                                                   ctx.work / "logs" / f"bench_{name}.log", cwd=d)))}
            for name, args in cases.items()}


GROUPS: dict[str, Callable[[Ctx], dict]] = {
    "demo_offline": demo_offline, "demo_online": demo_online, "demo_online2": demo_online2, "l96": l96,
    "land": land, "native": native, "bench_keys": bench_keys,
}


# --- record, compare, check -------------------------------------------------------------------------------

def _commit(src: Path) -> str:
    git = ["git", "-C", str(src)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+changes" if dirty else "")


def record(src: Path, groups: list[str], work: Path) -> dict:
    """Run ``groups`` with ``PYTHONPATH=src`` in ``work``; returns the recording (see the module docstring)."""
    src, work = src.resolve(), work.resolve()
    if not (src / "enkflow" / "__init__.py").exists():
        raise SystemExit(f"--src {src}: no enkflow package there (give a checkout's src/ directory)")
    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(src, work)
    out: dict = {"format": 1, "src": str(src), "commit": _commit(src), "seconds": {}, "groups": {}}
    for g in groups:
        t0 = time.perf_counter()
        print(f"record {g} ...", flush=True)
        out["groups"][g] = GROUPS[g](ctx)
        out["seconds"][g] = round(time.perf_counter() - t0, 1)
        print(f"record {g}: {len(out['groups'][g])} case(s) in {out['seconds'][g]:.1f} s", flush=True)
    return out


def flatten(obj: object, prefix: str = "") -> dict[str, object]:
    """Leaves of nested dicts by '/'-joined path (lists are leaves)."""
    if not isinstance(obj, dict):
        return {prefix: obj}
    out: dict[str, object] = {}
    for k, v in obj.items():
        out.update(flatten(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


def _short(v: object) -> str:
    text = json.dumps(v)
    return text if len(text) <= 120 else text[:117] + "..."


def compare(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> dict:
    """Print every leaf that differs between the groups present in both recordings; returns the summary."""
    ga, gb = a["groups"], b["groups"]
    common = [g for g in ga if g in gb]
    skipped = {g: f"only in {names[0]}" for g in ga if g not in gb} | {g: f"only in {names[1]}" for g in gb if g not in ga}
    diffs: list[str] = []
    for g in common:
        fa, fb = flatten(ga[g], g), flatten(gb[g], g)
        for key in sorted(fa.keys() | fb.keys()):
            if key not in fb:
                diffs.append(f"{key}: only in {names[0]} ({_short(fa[key])})")
            elif key not in fa:
                diffs.append(f"{key}: only in {names[1]} ({_short(fb[key])})")
            elif fa[key] != fb[key]:
                diffs.append(f"{key}: {names[0]} {_short(fa[key])} != {names[1]} {_short(fb[key])}")
    for line in diffs:
        print("DIFFERS " + line)
    for g, why in skipped.items():
        print(f"skipped group {g} ({why})")
    print(f"{'IDENTICAL' if not diffs else 'DIFFERENT'}: {len(common)} group(s) compared ({', '.join(common)}), "
          f"{len(diffs)} difference(s); {names[0]} = {a.get('commit')}, {names[1]} = {b.get('commit')}")
    return {"identical": not diffs and bool(common), "groups_compared": common, "groups_skipped": skipped,
            "differences": len(diffs), "a_commit": a.get("commit"), "b_commit": b.get("commit")}


def _groups(only: str | None) -> list[str]:
    if not only:
        return list(GROUPS)
    names = [g.strip() for g in only.split(",") if g.strip()]
    bad = [g for g in names if g not in GROUPS]
    if bad:
        raise SystemExit(f"--only: unknown group(s) {bad}; the groups: {', '.join(GROUPS)}")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("record", "check"):
        p = sub.add_parser(name)
        p.add_argument("--src", type=Path, required=True, help="the src/ directory of a checkout")
        p.add_argument("--only", help=f"comma-separated groups (default all: {','.join(GROUPS)})")
        p.add_argument("--work", type=Path, help="scratch directory (default: a new one under the temp dir, removed "
                                                  "after a successful check)")
    sub.choices["record"].add_argument("--out", type=Path, required=True)
    sub.choices["check"].add_argument("--reference", type=Path, default=REFERENCE)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    a = ap.parse_args()
    if a.cmd == "compare":
        res = compare(json.loads(a.a.read_text()), json.loads(a.b.read_text()), (a.a.name, a.b.name))
        print(json.dumps(res))
        return 0 if res["identical"] else 1
    work = a.work or Path(tempfile.mkdtemp(prefix="enkflow-bitwise-"))
    t0 = time.perf_counter()
    rec = record(a.src, _groups(a.only), work)
    if a.cmd == "record":
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rec, indent=1, sort_keys=False) + "\n")
        print(json.dumps({"out": str(a.out), "commit": rec["commit"], "groups": list(rec["groups"]),
                          "seconds": rec["seconds"], "total_s": round(time.perf_counter() - t0, 1), "work": str(work)}))
        return 0
    res = compare(json.loads(a.reference.read_text()), rec, ("reference", "checkout"))
    if res["identical"] and a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({**res, "seconds": rec["seconds"], "work": str(work)}))
    return 0 if res["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
