"""The Fortran module with fields of every type and several ranks: real(8) (4, 5), real(4) (2, 3, 4),
integer(4) (6,) carried and integer(8) (2, 2) carried, bound as they are (assumed rank). Two Fortran
runners (built with ``pkg-config enkflow_runner_f`` against the installed module and libraries) serve a 2-cycle ETKF study; its final
ensemble is bitwise that of the same study served by Python runners running the same model on the
server's row-major arrays: the shapes are declared reversed and the memory is the same."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import numpy as np

from enkflow.analysis import ETKF, ObsSet
from enkflow.experiment.cycling import ObservationSpace
from enkflow.experiment.step import AnalysisStep
from enkflow.online import Field, Problem, Runner, SchedulerConfig, Server, ServerConfig

HERE = Path(__file__).resolve().parent
TOKEN = "fortran-fields"
MEMBERS = 3
CYCLES = [1, 2]
NSTEPS = 2
FIELDS = (Field("a", "float64", (5, 4)), Field("b", "float32", (4, 3, 2)),
          Field("age", "int32", (6,), assimilated=False), Field("stamp", "int64", (2, 2), assimilated=False))
N_ROWS = 20 + 24


class Obs(ObservationSpace):
    """Every assimilated element observed (H = I), cycle-dependent values."""

    def observations(self, cycle: int) -> ObsSet:
        return ObsSet(np.cos(np.arange(N_ROWS) * 0.7 + cycle), np.full(N_ROWS, 0.5), np.arange(N_ROWS, dtype=float))

    def apply(self, cycle, X, row_start, comm):
        return comm.allgather_rows(np.array(X, order="C"))

    def apply_analysis(self, cycle, Xa, row_start, comm):
        return comm.allgather_rows(np.array(Xa, order="C"))


def problem() -> Problem:
    rng = np.random.default_rng(5)
    init = [rng.standard_normal((20, MEMBERS)), rng.standard_normal((24, MEMBERS)).astype(np.float32),
            rng.integers(0, 100, (6, MEMBERS)).astype(np.int32), rng.integers(-10**12, 10**12, (4, MEMBERS))]

    def initial(store) -> None:
        for part, x in zip(store.parts, init):
            part[...] = x

    return Problem(FIELDS, MEMBERS, initial, lambda cycle: NSTEPS, Obs(), AnalysisStep(ETKF()))


def python_model(s: dict[str, np.ndarray], member: int, cycle: int, nsteps: int) -> None:
    """fields_runner.f90's model on the row-major arrays: Fortran x(i, j, k) is x[k-1, j-1, i-1]."""
    a, b, age, stamp = s["a"].reshape(5, 4), s["b"].reshape(4, 3, 2), s["age"], s["stamp"].reshape(2, 2)
    jj, ii = np.meshgrid(np.arange(1, 6), np.arange(1, 5), indexing="ij")
    kb, jb, ib = np.meshgrid(np.arange(1, 5), np.arange(1, 4), np.arange(1, 3), indexing="ij")
    js, is_ = np.meshgrid(np.arange(1, 3), np.arange(1, 3), indexing="ij")
    for _ in range(nsteps):
        a[...] = a + (0.5 * ii + jj) * float(cycle)
        b[...] = b * np.float32(0.5) + (ib + 10 * jb + 100 * kb).astype(np.float32)
        age[...] = age + 1
        stamp[...] = stamp + (member * 1000 + cycle * 100 + 10 * is_ + js)


def serve(start_runners) -> list[np.ndarray]:
    # min_runners: both runners join before the first member, so that neither finds the study over.
    server = Server(problem(), ServerConfig(token=TOKEN, heartbeat_s=0.2, heartbeat_timeout_s=10.0, min_runners=2,
                                            scheduler=SchedulerConfig(due_floor=60.0)))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run(CYCLES)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    finish = start_runners(server.address)
    t.join(60)
    assert not t.is_alive(), "the server did not finish"
    assert not errors, errors
    finish()
    return [np.array(p) for p in server.store.parts]


def test_fortran_fields_of_every_type_and_rank(native_build, tmp_path: Path) -> None:
    exe = tmp_path / "fields_runner"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "enkflow_runner_f"], env=native_build.env(),
                           capture_output=True, text=True)
    assert flags.returncode == 0, f"pkg-config does not find the installed enkflow_runner_f.pc: {flags.stderr}"
    cc = subprocess.run(["gfortran", "-std=f2018", str(HERE / "fields_runner.f90"), "-o", str(exe),
                         *flags.stdout.split(), f"-Wl,-rpath,{native_build.lib}"], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr

    def fortran(address: str):
        procs = [subprocess.Popen([str(exe), address, TOKEN], stderr=subprocess.PIPE, text=True) for _ in range(2)]

        def finish() -> None:
            for p in procs:
                _, err = p.communicate(timeout=30)
                assert p.returncode == 0, err
        return finish

    def python(address: str):
        def one() -> None:
            with Runner(address, TOKEN, reconnect_s=5) as r:
                r.init(FIELDS)
                s = {f.name: np.zeros(f.size, dtype=f.dtype) for f in FIELDS}
                s, n = r.expose(s)
                while n:
                    python_model(s, r.member, r.cycle, n)
                    s, n = r.expose(s)

        threads = [threading.Thread(target=one, daemon=True) for _ in range(2)]
        for th in threads:
            th.start()

        def finish() -> None:
            for th in threads:
                th.join(30)
        return finish

    got, want = serve(fortran), serve(python)
    for f, g, w in zip(FIELDS, got, want):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), f"field {f.name}: Fortran {g.ravel()[:6]} vs Python {w.ravel()[:6]}"
    # The carried integers went through untouched by the analysis: 2 cycles x NSTEPS updates.
    assert np.array_equal(got[2], problem_initial_age() + len(CYCLES) * NSTEPS)


def problem_initial_age() -> np.ndarray:
    rng = np.random.default_rng(5)
    rng.standard_normal((20, MEMBERS))
    rng.standard_normal((24, MEMBERS))
    return rng.integers(0, 100, (6, MEMBERS)).astype(np.int32)


def test_fortran_bind_refuses_a_non_contiguous_section(native_build, tmp_path: Path) -> None:
    """A strided section would reach the library as a temporary copy (freed on return, then written into by
    every expose): refused with ENKFLOW_EINVAL, naming the field. Contiguous sections, a zero-size array and
    a one-element section are bound."""
    exe = tmp_path / "bind_checks"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "enkflow_runner_f"], env=native_build.env(),
                           capture_output=True, text=True, check=True).stdout.split()
    fc = subprocess.run(["gfortran", "-std=f2018", str(HERE / "bind_checks.f90"), "-o", str(exe), *flags,
                         f"-Wl,-rpath,{native_build.lib}"], capture_output=True, text=True, cwd=tmp_path)
    assert fc.returncode == 0, fc.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split(" ", 1)[0]: line.split(" ", 2)[1:] for line in out.stdout.splitlines()}
    for name, field in (("strided", "x"), ("rows_of_2d", "y"), ("row_of_real4", "f"), ("strided_int64", "n")):
        assert rows[name][0] == "1", (name, rows[name])
        assert f"field '{field}': the array bound is not contiguous" in rows[name][1], (name, rows[name])
    for name in ("contiguous_section", "contiguous_columns", "zero_size", "one_element"):
        assert rows[name] == ["0"] or rows[name] == ["0", ""], (name, rows[name])
