"""Bit-for-bit reference outputs of enkflow (issue 21, acceptance 1): record fingerprints of one
checkout's outputs, compare two recordings, or check a checkout against the committed reference.

    python benchmarks/bitwise_reference.py record --src SRC --out FILE.json [--only G,...] [--work DIR]
    python benchmarks/bitwise_reference.py compare A.json B.json
    python benchmarks/bitwise_reference.py check --src SRC [--only G,...] [--work DIR] [--reference FILE.json]

``SRC``: any checkout's ``src/``; commands run as ``python -m enkflow ...`` (this python, ``mpiexec`` beside
it) with ``PYTHONPATH=SRC`` and one BLAS/OpenMP thread. Another commit: ``git worktree add W COMMIT``, then
``enkflow/analysis/_lanes*.so`` built (``cd W && python setup.py build_ext --inplace``) or copied into
``W/src/enkflow/analysis/``. ``check`` compares with ``tests/data/bitwise_reference.json`` (recorded at
7d0a604; recorded again, each time after a compare showed every earlier key unchanged, once issue 24 added
files and variables, issue 23 per-rank figures and issue 27 ``enkflow bench io``'s ``safe_update_method`` and
``enkflow bench land``'s CPU keys, then its window seconds and both layouts' search and kernel seconds, and the smaller observation-space bytes once an owner multiplied its own pieces of H in place), keeping its work directory on a difference; ``compare`` compares the groups in both files, names the
others, and notes a variable that only changed its name.

Groups (each alone with ``--only``; every run in a fresh directory under ``--work``):

* ``demo_offline``: ``enkflow demo``; ``demo_online``: ``enkflow demo --mode online`` (1 server rank);
  ``demo_online2``: the online demo's own problem and experiment.toml (``enkflow demo --mode online
  --runners 0`` writes them, then refuses the configuration; failing that, :func:`template_by_synth`)
  with ``[online] ranks = 2``, run by ``enkflow run``. Files: the final member restarts and every
  cycle's ``*.nc`` (analysis mean/spread, ``obs_diag.nc``, the statistics files).
* ``l96``: ``enkflow l96 --json`` of the six methods (16 members, inflation 1.02, 300 cycles after 50),
  LETKF and LESTKF with ``--adaptive miyoshi2011``, ETKF and LETKF with ``--online 2`` (40 cycles).
* ``land``: ``enkflow synth --size small --members 20``, then on a fresh copy each ``enkflow bench land
  --size small --cutoff-km 1500 --ranks P --json``, P = 1, 2, 3: the members and the JSON's numbers.
* ``native``: ``SRC/../native`` built with CMake (cached in the work directory by a hash of the tree);
  the online demo study run by ``enkflow_demo_c``/``enkflow_demo_f`` (C and Fortran runner APIs) and by
  ``c_netcdf_model``/``fortran_netcdf_model`` through the interception wrapper (``intercept.py``, found
  by name under SRC), as tests/native do.
* ``bench_keys``: the set of JSON keys (dotted paths, ``[]`` for list items) that ``enkflow bench
  analysis|io|land|online|online-scale|output`` print at tiny sizes.

Fingerprints, never of file bytes (time stamps): per NetCDF file the dimensions, each variable's dtype,
shape, dimensions and sha256 of its data in C order (no masking/scaling), every attribute as text (a
sha256 beyond 200 characters; the run's directory as ``<case>``, the work directory ``<work>``: the
mean/spread files name their template restart by its absolute path). Excluded, the only attribute that
varied between recordings of the base: the global ``history`` (a UTC time stamp and the writer's pid).
JSON numbers are kept exactly (floats by ``repr``) except timing keys, dropped: ``imbalance`` and a key
with a ``_``-separated word among ``s ms seconds gbps rate rss cpu wall load memory time elapsed``.

Prints progress and every difference, then one JSON line; ``compare``/``check`` exit 1 on a difference.
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
TIMING_KEYS = frozenset({"imbalance"})
L96 = ["--members", "16", "--cycles", "300", "--burn-in", "50", "--radius", "5", "--inflation", "1.02", "--json"]
LAND_RANKS = (1, 2, 3)
FORMAT = 2  # of the recording; compare refuses two formats
MISSING = object()


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
                 "dims": {k: f"{len(d)}{' unlimited' if d.isunlimited() else ''}" for k, d in g.dimensions.items()},
                 "vars": {}}
    for name, v in g.variables.items():
        v.set_auto_maskandscale(False)
        data = np.ascontiguousarray(v[...])
        # One line per variable: "dtype shape(dims) sha256-of-the-C-order-bytes".
        out["vars"][name] = {"data": f"{data.dtype} {list(data.shape)}({','.join(v.dimensions)}) "
                                     f"{hashlib.sha256(data.tobytes()).hexdigest()}",
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


DEMO_FILES = ("members/member_*.nc", "run/cycles/*/*.nc")
_TEMPLATES: dict[Path, Path] = {}


def demo(ctx: Ctx, group: str, *args: str) -> dict:
    d = ctx.case_dir(f"{group}/demo")
    run(ctx, enkflow("demo", *args, "--dir", str(d)), ctx.work / "logs" / f"{group}.log")
    return {"demo": fingerprints(d, ctx.work, DEMO_FILES)}


def online_template(ctx: Ctx) -> Path:
    """The online demo's problem and experiment.toml, not yet run (made once per recording): ``enkflow demo
    --mode online --runners 0`` writes them, then refuses ``runners = 0``. Where it refuses before writing,
    :func:`template_by_synth` makes them instead."""
    if ctx.work in _TEMPLATES:
        return _TEMPLATES[ctx.work]
    d = ctx.case_dir("template/online")
    run(ctx, enkflow("demo", "--mode", "online", "--runners", "0", "--dir", str(d)),
        ctx.work / "logs" / "template.log", check=False)
    if not (d / "experiment.toml").exists() or not (d / "members" / "member_0001.nc").exists():
        print(f"  `enkflow demo --mode online --runners 0` left no experiment.toml: {d} made by a demo run and synth")
        template_by_synth(ctx, d)
    _TEMPLATES[ctx.work] = d
    return d


def template_by_synth(ctx: Ctx, d: Path) -> None:
    """The online demo run in ``d``, its run directory removed and its members written again by ``enkflow
    synth`` with the demo's settings (on 7d0a604 the same bytes as the demo's own initial members)."""
    run(ctx, enkflow("demo", "--mode", "online", "--dir", str(d)), ctx.work / "logs" / "template_demo.log")
    shutil.rmtree(d / "run")
    run(ctx, enkflow("synth", "--size", "tiny", "--members", "8", "--seed", "0", "--obs-fraction", "0.3",
                     "--obs-std", "0.05", "--overwrite", "--out", str(d / "members")),
        ctx.work / "logs" / "template_synth.log")


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

    def two_ranks(text: str, d: Path) -> str:
        new, n = re.subn(r"^runners = \d+$", f"runners = 2\nranks = 2\nmpiexec = {json.dumps(mpiexec)}", text,
                         count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"{d}/experiment.toml has no 'runners = N' line in [online] to add 'ranks = 2' to")
        return new

    return {"demo": run_study(ctx, study(ctx, "demo_online2/demo", two_ranks))}


def l96(ctx: Ctx) -> dict:
    cases = [(m, ["--method", m]) for m in ("etkf", "estkf", "denkf", "enkf", "letkf", "lestkf")]
    cases += [(f"{m}_miyoshi2011", ["--method", m, "--adaptive", "miyoshi2011"]) for m in ("letkf", "lestkf")]
    cases += [(f"{m}_online2", ["--method", m, "--online", "2", "--cycles", "40", "--burn-in", "10"])
              for m in ("etkf", "letkf")]
    # argparse: the later --cycles/--burn-in win
    return {name: {"stdout.json": scores(last_json(run(ctx, enkflow("l96", *L96, *args),
                                                       ctx.work / "logs" / f"l96_{name}.log")))}
            for name, args in cases}


def land(ctx: Ctx) -> dict:
    problem = ctx.case_dir("land/problem")
    run(ctx, enkflow("synth", "--size", "small", "--members", "20", "--out", str(problem)),
        ctx.work / "logs" / "land_synth.log")
    out = {}
    for p in LAND_RANKS:
        d = ctx.case_dir(f"land/ranks{p}")
        shutil.copytree(problem, d)
        argv = enkflow("bench", "land", "--size", "small", "--members", "20", "--cutoff-km", "1500", "--dir", str(d),
                       "--ranks", str(p), "--json")
        res = last_json(run(ctx, argv, ctx.work / "logs" / f"land_{p}.log"))
        # The bench keeps the forecast in d and leaves its analysis in d/analysed.
        out[f"ranks{p}"] = {**fingerprints(d / "analysed", ctx.work, ("member_*.nc",)), "stdout.json": scores(res)}
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


def _online_section(runner: str) -> Callable[[str, Path], str]:
    """An edit of the template's experiment.toml: its ``[online]`` section with ``runner`` (``@DIR@`` the study)."""
    def edit(text: str, d: Path) -> str:
        cmd = runner.replace("@DIR@", str(d))
        return text[:text.index("\n[online]")] + (f"\n[online]\nrunner = {json.dumps(cmd)}\nrunners = 2\n"
                                                  "heartbeat = 0.5\nheartbeat_timeout = 10.0\n")
    return edit


def native(ctx: Ctx) -> dict:
    prefix = native_build(ctx)
    env = dict(ctx.env, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(prefix / "lib"),
                                                                       os.environ.get("LD_LIBRARY_PATH")])))
    forcing_script = ctx.src.resolve().parent / "native" / "examples" / "demo_forcing.py"
    intercept = f"{sys.executable} -m {module_of(ctx, 'intercept.py')} --address {{address}} --token-file " \
                f"{{token_file}} --expdir {{expdir}} --shim {prefix}/lib/libenkflow_intercept.so --steps 6 --"
    runners = {name: f"{prefix}/bin/{exe} --address {{address}} --token-file {{token_file}} --grid {{restart}} "
                     "--forcing @DIR@/forcing.nc --length {length} --curve-key={curve_key}"
               for name, exe in (("c_api", "enkflow_demo_c"), ("fortran_api", "enkflow_demo_f"))}
    runners |= {name: f"{intercept} {prefix}/bin/{exe} {{{{restart}}}} --forcing @DIR@/forcing.nc --length {{length}} "
                      "--cycle {{cycle}}"
                for name, exe in (("c_netcdf", "c_netcdf_model"), ("fortran_netcdf", "fortran_netcdf_model"))}
    out = {}
    for name, runner in runners.items():
        d = study(ctx, f"native/{name}", _online_section(runner))
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
        "output": ["--nx", "72", "--ny", "36", "--steps", "4", "--substeps", "1", "--repeat", "1", "--dir", str(d)],
    }
    return {name: {"keys": key_paths(last_json(run(ctx, enkflow("bench", name, *args, "--json"),
                                                   ctx.work / "logs" / f"bench_{name}.log", cwd=d)))}
            for name, args in cases.items()}


GROUPS: dict[str, Callable[[Ctx], dict]] = {
    "demo_offline": lambda ctx: demo(ctx, "demo_offline"),
    "demo_online": lambda ctx: demo(ctx, "demo_online", "--mode", "online"), "demo_online2": demo_online2, "l96": l96,
    "land": land, "native": native, "bench_keys": bench_keys,
}


def _commit(src: Path) -> str:
    """The checkout's commit, with '+changes' where ``src`` has uncommitted changes."""
    git = ["git", "-C", str(src)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def record(src: Path, groups: list[str], work: Path) -> dict:
    """Run ``groups`` with ``PYTHONPATH=src`` in ``work``; returns the recording (see the module docstring)."""
    src, work = src.resolve(), work.resolve()
    if not (src / "enkflow" / "__init__.py").exists():
        raise SystemExit(f"--src {src}: no enkflow package there (give a checkout's src/ directory)")
    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(src, work)
    out: dict = {"format": FORMAT, "src": str(src), "commit": _commit(src), "seconds": {}, "groups": {}}
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


def _difference(va: object, vb: object, names: tuple[str, str]) -> str:
    if va is MISSING or vb is MISSING:
        return f"only in {names[va is MISSING]} ({_short(vb if va is MISSING else va)})"
    if isinstance(va, list) and isinstance(vb, list):  # a key set: name what is missing on each side
        return f"only in {names[0]} {sorted(set(map(str, va)) - set(map(str, vb)))}, " \
               f"only in {names[1]} {sorted(set(map(str, vb)) - set(map(str, va)))}"
    return f"{names[0]} {_short(va)} != {names[1]} {_short(vb)}"


def _renamed(fa: dict[str, object], fb: dict[str, object], names: tuple[str, str]) -> list[str]:
    """Variables found only on one side whose data is that of a variable only on the other, in the same file."""
    only_b = {(k.rsplit("/vars/", 1)[0], v): k for k, v in fb.items() if k.endswith("/data") and k not in fa}
    out = []
    for k, v in fa.items():
        other = only_b.get((k.rsplit("/vars/", 1)[0], v)) if k.endswith("/data") and k not in fb else None
        if other:
            out.append(f"{k[:-5]} in {names[0]} has the data of {other[:-5]} in {names[1]} (renamed?)")
    return out


def compare(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> dict:
    """Print every leaf that differs between the groups present in both recordings; returns the summary."""
    if a.get("format") != b.get("format"):
        raise SystemExit(f"{names[0]} is format {a.get('format')}, {names[1]} format {b.get('format')}: record both "
                         "with the same version of this script")
    ga, gb = a["groups"], b["groups"]
    common = [g for g in ga if g in gb]
    skipped = {g: f"only in {names[g in gb]}" for g in sorted(ga.keys() ^ gb.keys())}
    diffs, notes = [], []
    for g in common:
        fa, fb = flatten(ga[g], g), flatten(gb[g], g)
        diffs += [f"{key}: {_difference(fa.get(key, MISSING), fb.get(key, MISSING), names)}"
                  for key in sorted(fa.keys() | fb.keys()) if fa.get(key, MISSING) != fb.get(key, MISSING)]
        notes += _renamed(fa, fb, names)
    for line in diffs:
        print("DIFFERS " + line)
    for line in notes:
        print("NOTE " + line)
    print("".join(f"skipped group {g} ({why})\n" for g, why in skipped.items()), end="")
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
