"""The experiment TOML (``enkflow run EXPERIMENT.toml``): schema and loading.

Relative paths are relative to the TOML file's directory. Command templates
are split like a shell would split them (:func:`shlex.split`) and run
without a shell; write ``sh -c '...'`` for pipes or redirections. See
``docs/configuration.md`` for every key.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import string
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from enkflow.config import ADAPTIVE_DEFAULTS, METHOD_TABLES, AdaptiveInflation, AnalysisConfig, Strict, load_toml, validate
from enkflow.errors import ConfigError
from enkflow.experiment.directory import ExperimentDir
from enkflow.experiment.verification import VerificationSection
from enkflow.io.config import IOConfig
from enkflow.jobs.config import LauncherSection
from enkflow.jobs.strategies import PilotSpan, Resources, Strategy
from enkflow.jobs.tasks import RestartWrite, Unchanged
from enkflow.obs.config import ObsSettingsConfig
from enkflow.output.config import OutputConfig
from enkflow.state.config import StateConfig
from enkflow.transport import Transport


def _fields(template: str) -> set[str]:
    """The placeholder names of a ``str.format`` template."""
    names = set()
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None:
            names.add(name.split(".")[0].split("[")[0])
    return names


def _check_template(template: str, allowed: set[str], what: str) -> None:
    try:
        names = _fields(template)
    except ValueError as exc:
        raise ValueError(f"invalid {what} template: {exc}") from None
    unknown = sorted(names - allowed)
    if unknown:
        raise ValueError(f"unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
                         f"valid: {', '.join('{' + a + '}' for a in sorted(allowed))}")
    if template.strip() and what.endswith("command"):
        try:
            shlex.split(template)
        except ValueError as exc:
            raise ValueError(f"cannot split the command like a shell: {exc}") from None


MODEL_FIELDS = {"member", "cycle", "restart", "length", "output", "expdir", "workdir"}
OPERATOR_FIELDS = {"member", "cycle", "restart", "obs", "output", "expdir"}
ANALYSIS_FIELDS = {"cycle", "expdir", "members", "obs", "config"}


class Mode(StrEnum):
    """``experiment.mode``: how the members advance."""

    OFFLINE = "offline"  # members advance their restart files through the job scheme
    ONLINE = "online"  # an assimilation server keeps the ensemble in memory ([online])


class Initial(StrEnum):
    """``experiment.initial``: which restarts the cycles advance."""

    IN_PLACE = "in-place"  # the configured ones, where they are
    COPY = "copy"  # copies under EXPDIR/restarts, so the initial ensemble stays untouched


class ExperimentSection(Strict):
    """``[experiment]``: the cycling itself."""

    directory: str = Field(default="experiment", description="experiment directory: state, logs, events, outputs")
    cycles: int = Field(ge=1, description="number of cycles K")
    first_cycle: int = Field(default=1, ge=0, description="index of the first cycle")
    members: int = Field(ge=2, description="ensemble size N_e")
    restart: str = Field(description="restart file of a member, template with {member}")
    forecast_length: float = Field(gt=0, description="forecast length per cycle, in the model's time unit, passed as {length}")
    mode: Mode = Field(
        default=Mode.OFFLINE,
        description="'offline': members advance their restart files through the job scheme; 'online': an "
                    "assimilation server keeps the ensemble in memory and runners exchange states with it ([online])")
    initial: Initial = Field(
        default=Initial.IN_PLACE,
        description="'in-place': cycle the restarts where they are; 'copy': copy them into EXPDIR/restarts first and "
                    "cycle the copies, so the initial ensemble stays untouched and a rerun from scratch is always possible")

    @field_validator("restart")
    @classmethod
    def _restart_template(cls, v: str) -> str:
        _check_template(v, {"member"}, "restart")
        if "member" not in _fields(v):
            raise ValueError("the restart template needs {member} (one file per member)")
        return v


class ModelSection(Strict):
    """``[model]``: the forecast command of one member."""

    command: str = Field(description="template; placeholders {member} {cycle} {restart} {length} {output} {expdir} {workdir}")
    max_attempts: int = Field(default=3, ge=1, description="non-zero exits of one member before the experiment stops")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of model runs")
    restart_write: RestartWrite = Field(
        default=RestartWrite.IN_PLACE,
        description="how the model writes its restart: 'in-place' (it may rewrite the file; the worker keeps a "
                    "copy aside before the first run) or 'rename' (it renames a finished file over it; a free hard "
                    "link is kept). A model writing {output} is 'rename' whatever this says")
    unchanged: Unchanged = Field(
        default=Unchanged.WARN, description="a model that exits 0 but leaves its restart unchanged: a warning, or an error")

    @field_validator("command")
    @classmethod
    def _template(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the model command is empty")
        _check_template(v, MODEL_FIELDS, "model command")
        return v


class ObservationsSection(ObsSettingsConfig):
    """``[observations]``: observation files and the optional operator stage; how H is built, the
    kinds, the time window and quality control (:class:`enkflow.obs.config.ObsSettingsConfig`)."""

    file: str = Field(description="observation file of a cycle, template with {cycle}")
    operator: str | None = Field(default=None, description="H(x) command run after each member's forecast")
    operator_output: str | None = Field(default=None, description="where the operator writes, template; passed as {output}")

    @field_validator("file")
    @classmethod
    def _file(cls, v: str) -> str:
        _check_template(v, {"cycle"}, "observation file")
        return v

    @field_validator("operator")
    @classmethod
    def _operator(cls, v: str | None) -> str | None:
        if v is not None:
            _check_template(v, OPERATOR_FIELDS, "operator command")
        return v

    @field_validator("operator_output")
    @classmethod
    def _operator_output(cls, v: str | None) -> str | None:
        if v is not None:
            _check_template(v, {"member", "cycle"}, "operator_output")
        return v

    @model_validator(mode="after")
    def _output_needed(self) -> "ObservationsSection":
        if self.operator is not None and self.operator_output is None and "output" in _fields(self.operator):
            raise ValueError("the operator uses {output}: set 'operator_output' (a template with {member} and {cycle})")
        return self


RUNNER_FIELDS = {"address", "token_file", "runner", "expdir", "length", "steps", "restart", "curve_key", "output_address",
                 "output_token_file"}


class OnlineSection(Strict):
    """``[online]``: the assimilation server and its runners (``experiment.mode = "online"``). Times in seconds."""

    runner: str = Field(description="command of one runner; placeholders {address} {token_file} {runner} {expdir} "
                                    "{length} {steps} {restart} (member 1's restart, a grid template) {curve_key} "
                                    "{output_address} {output_token_file} (the output service of [output], "
                                    "empty without [output] fields)")
    runners: int = Field(default=2, ge=1, description="runner processes kept alive (fewer than members is fine)")
    min_runners: int = Field(default=1, ge=1, description="hand out no member before this many runners joined "
                                                          "(with `enkflow serve` and runners started elsewhere)")
    ranks: int = Field(default=1, ge=1, description="MPI ranks of the server (started with mpiexec when > 1)")
    nodes: int = Field(default=1, ge=1, description="nodes of the server's job (SLURM), its ranks spread over them; "
                                                    "needs bind reachable from other nodes")
    bind: str = Field(default="127.0.0.1", description="where the server listens: loopback by default; an address, an "
                                                       "interface name (eth0) or \"*\" (every interface, advertised with "
                                                       "the node's address) for runners or ranks on other nodes")
    rank_timeout: float = Field(default=30.0, gt=0, description="a server rank silent this long on the ranks' bus "
                                                                 "during a forecast phase (its node lost) stops the server, "
                                                                 "which is restarted; longer than any one step of a rank's "
                                                                 "loop (docs/online.md)")
    port: int = Field(default=0, ge=0, le=65535, description="control port; 0 picks a free one")
    steps: int | None = Field(default=None, ge=1, description="model steps per cycle sent to runners; default round(forecast_length)")
    carried: list[str] = Field(default_factory=list, description="restart variables runners need back but the analysis "
                                                                 "does not update (hidden parts of the state)")
    heartbeat: float = Field(default=1.0, gt=0)
    heartbeat_timeout: float = Field(default=10.0, gt=0, description="a runner silent this long is lost; its member is rescheduled")
    due_floor: float = Field(default=60.0, gt=0, description="shortest due date of a forecast")
    due_factor: float = Field(default=3.0, gt=1, description="due date: this times the longest forecast so far (at least due_floor)")
    max_failures: int = Field(default=3, ge=1, description="failures of one member (on any runners) that stop the study")
    max_server_restarts: int = Field(default=5, ge=0, description="restarts of a crashed server from its checkpoint")
    curve: bool = Field(default=False, description="encrypt with ZeroMQ CURVE (for runners on other hosts)")
    stateless_check: bool = Field(default=True, description="before the first cycle, run member 1 twice from the same "
                                                            "state and require the same forecast bits")
    python: str | None = Field(default=None, description="python running the server (default: this one)")
    mpiexec: str = Field(default="mpiexec", description="MPI launcher of a server with ranks > 1")
    transport: Transport = Field(
        default=Transport.AUTO, description="how runners on a server rank's node exchange states: through shared memory "
                                    "where they can (auto), always (shm: an error where they cannot) or over TCP "
                                    "(tcp); runners that enkflow starts get it as ENKFLOW_TRANSPORT")

    @field_validator("runner")
    @classmethod
    def _runner(cls, v: str) -> str:
        _check_template(v, RUNNER_FIELDS, "runner command")
        return v

    @model_validator(mode="after")
    def _times(self) -> "OnlineSection":
        if self.heartbeat_timeout <= 2 * self.heartbeat or self.rank_timeout <= 2 * self.heartbeat:
            raise ValueError("heartbeat_timeout and rank_timeout must exceed twice the heartbeat period")
        if self.nodes > self.ranks:
            raise ValueError(f"nodes ({self.nodes}) must not exceed ranks ({self.ranks}): every node runs a rank")
        return self


class AnalysisTaskSection(Strict):
    """``[analysis_task]``: how the analysis task (ID N_e + 1) runs.

    Without ``command`` the built-in analysis
    (``enkflow.experiment.analysis_step.run_analysis``) runs with the
    ``[analysis]`` settings; ``command`` runs a user's analysis program instead.
    """

    command: str | None = Field(default=None, description="external analysis program; {cycle} {expdir} {members} {obs} {config}")
    launcher: str = Field(default="", description="prefix for a parallel analysis, e.g. 'mpiexec -n 4' or 'srun'")
    max_attempts: int = Field(default=3, ge=1)

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        if v is not None:
            _check_template(v, ANALYSIS_FIELDS, "analysis command")
        return v

    @field_validator("launcher")
    @classmethod
    def _launcher(cls, v: str) -> str:
        _check_template(v, set(), "analysis launcher command")
        return v


class JobsSection(Strict):
    """``[jobs]``: the job scheme. Times in seconds."""

    strategy: Strategy = Strategy.DYNAMIC
    workers: int | None = Field(default=None, ge=1, description="N_j pilot jobs (dynamic); default min(N_e, CPUs)")
    cpus_per_job: int = Field(default=1, ge=1)
    analysis_cpus: int = Field(default=1, ge=1, description="CPUs the analysis needs: the per-member strategy's analysis "
                               "job; dynamic: only a pilot this large takes it")
    time_limit: float = Field(default=3600.0, gt=0, description="wall-clock limit of each job, s")
    heartbeat: float = Field(default=2.0, gt=0, description="worker heartbeat period, s")
    lease: float = Field(default=30.0, gt=0, description="a claim whose worker on another host has not beaten for this long is requeued, s")
    poll: float = Field(default=0.2, gt=0, description="polling period of driver and waiting workers, s")
    max_resubmits: int = Field(default=20, ge=0, description="rounds of resubmission per cycle (jobs for tasks no live job covers), at most")
    pilots: PilotSpan = Field(default=PilotSpan.STUDY, description="dynamic: pilots that span cycles (study) or leave "
                              "when their cycle's list is empty (cycle)")
    idle_timeout: float = Field(default=120.0, gt=0, description="dynamic, pilots = study: a pilot idle this long "
                                "between cycles leaves, s")
    submit_ahead: float = Field(default=0.0, ge=0, description="dynamic, pilots = study: the next cycle's pilots are "
                                "submitted this long before the cycle is expected to be released (at the latest when "
                                "its analysis starts), s")

    @model_validator(mode="after")
    def _lease(self) -> "JobsSection":
        if self.lease <= 2 * self.heartbeat:
            raise ValueError("lease must exceed twice the heartbeat period")
        return self


class AnalysisOutputSection(Strict):
    """``[analysis_output]``: what the built-in analysis writes each cycle (docs/output.md, "The analysis's output")."""

    statistics: bool | None = Field(
        default=None, description="forecast mean, analysis mean and spread, increment per cycle through the "
                                  "asynchronous output server; default: yes (online one writer for the study, "
                                  "offline one output service for the study that the analysis tasks add to)")
    mean_spread_files: bool = Field(
        default=True, description="also analysis_mean.nc and analysis_spread.nc in the restart's layout (what "
                                  "enkflow demo and the report's maps read); offline with the output service the "
                                  "driver writes them from the statistics, off the analysis's path")
    compression: Literal["none", "zlib", "zstd"] = Field(default="zlib", description="of the statistics files")
    complevel: int = Field(default=1, ge=1, le=9)
    writer_timeout: float = Field(
        default=60.0, ge=0, description="seconds a process writing the analysis's output (the output service, its "
                                        "writers, the mean/spread writer) may go without progress (stopped, stuck "
                                        "in the file system) before it is killed and the run stops naming it; "
                                        "0: wait forever")

    def statistics_for(self, mode: Mode) -> bool:
        return self.statistics if self.statistics is not None else mode in (Mode.ONLINE, Mode.OFFLINE)

    def writer_settings(self) -> dict[str, Any]:
        """The keyword arguments of :func:`enkflow.output.analysis_output.output_config`."""
        return {"compression": self.compression, "complevel": self.complevel, "writer_timeout": self.writer_timeout}


class ArchiveSection(Strict):
    """``[archive]``: background archiving of each cycle (docs/output.md, "Archiving")."""

    dir: str | None = Field(default=None, description="archive directory; unset: no archiving")
    keep_last: int = Field(default=3, ge=0, description="archived cycles kept, newest first (0: all)")
    keep_every: int = Field(default=0, ge=0, description="also keep every cycle divisible by this (0: none)")
    compression: Literal["gzip", "none"] = Field(default="gzip", description="how archived files are compressed")
    level: int = Field(default=1, ge=1, le=9, description="gzip (zlib) compression level")
    on_failure: Literal["warn", "stop"] = Field(
        default="warn", description="a failed archive: an event and a warning, or also stop the experiment")
    timeout: float = Field(
        default=120.0, ge=0, description="seconds the archiver may go without progress (no byte read or written) "
                                         "while the run waits for it at its end: then it is killed and reported as "
                                         "failed (on_failure applies); 0: wait for ever")


class ExperimentConfig(Strict):
    """The whole experiment file. ``base_dir`` (not a TOML key) is the directory
    relative paths are resolved against."""

    experiment: ExperimentSection
    model: ModelSection | None = None
    online: OnlineSection | None = None
    observations: ObservationsSection
    state: StateConfig | None = None
    io: IOConfig = IOConfig()
    output: OutputConfig | None = None
    analysis: AnalysisConfig | None = None
    analysis_task: AnalysisTaskSection = AnalysisTaskSection()
    jobs: JobsSection = JobsSection()
    launcher: LauncherSection = LauncherSection()
    archive: ArchiveSection = ArchiveSection()
    analysis_output: AnalysisOutputSection = AnalysisOutputSection()
    verification: VerificationSection = VerificationSection()
    base_dir: str = "."

    @model_validator(mode="after")
    def _consistent(self) -> "ExperimentConfig":
        if self.analysis_task.command is None and self.analysis is None:
            raise ValueError("an [analysis] table is needed for the built-in analysis (or set analysis_task.command)")
        if self.experiment.mode is Mode.OFFLINE and self.model is None:
            raise ValueError("a [model] table is needed (the forecast command of a member)")
        if self.experiment.mode is Mode.ONLINE:
            if self.online is None:
                raise ValueError("experiment.mode = 'online' needs an [online] table (at least 'runner', the runner command)")
            if self.analysis is None or self.state is None:
                raise ValueError("online mode runs the built-in analysis: it needs [state] and [analysis] "
                                 "(analysis_task.command is for offline mode)")
            if self.analysis_task.command is not None:
                raise ValueError("analysis_task.command is for offline mode; online mode runs the built-in analysis")
            if self.observations.operator is not None:
                raise ValueError("observations.operator is for offline mode (an H(x) stage after each forecast); "
                                 "online mode applies the observation file's H (observations.interpolation) to the "
                                 "in-memory states")
        return self

    @property
    def steps_per_cycle(self) -> int:
        """Model steps of one forecast in online mode."""
        o = self.online
        return o.steps if o is not None and o.steps is not None else max(1, round(self.experiment.forecast_length))

    # -- derived values ---------------------------------------------------------

    def path(self, p: str) -> Path:
        """``p`` resolved against the TOML file's directory."""
        q = Path(p).expanduser()
        return q if q.is_absolute() else (Path(self.base_dir) / q).resolve()

    @property
    def expdir(self) -> Path:
        return self.path(self.experiment.directory)

    @property
    def dir(self) -> ExperimentDir:
        """The experiment directory's layout."""
        return ExperimentDir(self.expdir)

    @property
    def cycle_numbers(self) -> list[int]:
        first = self.experiment.first_cycle
        return list(range(first, first + self.experiment.cycles))

    def source_restart_path(self, member: int) -> Path:
        """The initial restart of ``member`` as configured (``experiment.restart``)."""
        return self.path(self.experiment.restart.format(member=member))

    def restart_path(self, member: int) -> Path:
        """The restart file that the cycles advance for ``member`` (IDs 1..N_e): the configured
        one, or with ``experiment.initial = "copy"`` its copy under ``EXPDIR/restarts``."""
        src = self.source_restart_path(member)
        if self.experiment.initial is Initial.COPY:
            return self.dir.restart_copy(member, src.name)
        return src

    def obs_path(self, cycle: int) -> Path:
        """Observation file of ``cycle``."""
        return self.path(self.observations.file.format(cycle=cycle))

    def truth_path(self, cycle: int) -> Path | None:
        """The truth file of ``cycle`` (``verification.truth``), None without one."""
        t = self.verification.truth
        return None if t is None else self.path(t.format(cycle=cycle))

    def operator_output(self, member: int, cycle: int) -> Path | None:
        t = self.observations.operator_output
        return None if t is None else self.path(t.format(member=member, cycle=cycle))

    def cycle_dir(self, cycle: int) -> Path:
        """``self.dir.cycle(cycle).path``."""
        return self.dir.cycle(cycle).path

    def resources(self, cpu_count: int) -> Resources:
        workers = self.jobs.workers or max(1, min(self.experiment.members, cpu_count))
        return Resources(workers=workers, cpus_per_job=self.jobs.cpus_per_job, analysis_cpus=self.jobs.analysis_cpus,
                         time_limit_s=self.jobs.time_limit, nodes=self.launcher.nodes, pilots=self.jobs.pilots,
                         idle_timeout_s=self.jobs.idle_timeout)

    def digests(self) -> dict[str, str]:
        """Hashes of the settings each kind of step depends on (see :mod:`enkflow.experiment.state`),
        one per part of :meth:`digest_parts`."""
        return {k: digest_of(v) for k, v in self.digest_parts().items()}

    def digest_parts(self) -> dict[str, dict[str, Any]]:
        """The settings each kind of step depends on, as JSON-able dicts, per part.

        ``ensemble``: members, restarts, cycle numbering, forecast length and state; ``model``:
        what a forecast runs; ``analysis``: what the analysis (and the operator stage) does.
        Settings that cannot change a result are left out: jobs, launcher, I/O tuning, retry
        limits, the analysis launcher, the number of cycles.
        """
        d = self.model_dump(mode="json", exclude={"jobs", "launcher", "base_dir", "io", "archive", "analysis_output"})
        exp = {k: v for k, v in d["experiment"].items() if k not in ("cycles", "directory")}
        model = {k: v for k, v in (d["model"] or {}).items() if k not in ("max_attempts", "unchanged")}
        if d.get("online"):
            model["online"] = {k: d["online"][k] for k in ("runner", "steps", "carried")}
        task = {k: v for k, v in d["analysis_task"].items() if k not in ("max_attempts", "launcher")}
        return {
            "ensemble": {"experiment": exp, "state": d["state"]},
            "model": model,
            # The decomposition of the analysis and where its observations live cannot change its result.
            "analysis": {"analysis": _without_later_defaults({k: v for k, v in (d["analysis"] or {}).items()
                                                              if k not in ("balance", "observations", "observation_windows")}),
                         "analysis_task": task, "observations": _without_obs_defaults(d["observations"])},
        }

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def digest_of(settings: dict[str, Any]) -> str:
    """The short hash of one part of :meth:`ExperimentConfig.digest_parts` (JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


# [analysis] keys added after experiments were made with it: left out of the digest at their defaults,
# so that an experiment directory made before a key existed can still be resumed.
_LATER_ANALYSIS_KEYS = {
    "localization": {"max_obs": None, "vertical_radius": None, "vertical_coordinate": None, "vertical_taper": None},
    "inflation": {"adaptive": "none", "adaptive_initial": 1.0, "adaptive_sd": None, "adaptive_minimum": None,
                  "adaptive_maximum": None, "adaptive_relax": 0.0, "adaptive_sd_initial": None,
                  "adaptive_damping": None, "adaptive_sd_max_change": None, "adaptive_target": "prior"},
}


def _without_later_defaults(analysis: dict[str, Any]) -> dict[str, Any]:
    """The analysis settings less the :data:`_LATER_ANALYSIS_KEYS` left at their defaults and the
    method-option tables not given (:data:`enkflow.config.METHOD_TABLES`)."""
    out = {k: v for k, v in analysis.items() if not (k in METHOD_TABLES and v is None)}
    for section, later in _LATER_ANALYSIS_KEYS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in later or v != later[k]}
    infl = out.get("inflation")
    if isinstance(infl, dict) and infl.get("adaptive", "none") != "none":
        # A scheme's parameter spelled out at the scheme's default is the same setting as one left out (before
        # the keys defaulted per scheme, a study wrote Miyoshi's defaults, e.g. adaptive_sd = 0.04).
        defaults = ADAPTIVE_DEFAULTS[AdaptiveInflation(infl["adaptive"])]
        out["inflation"] = {k: v for k, v in infl.items()
                            if not (k.startswith("adaptive_") and defaults.get(k.removeprefix("adaptive_")) == v)}
    return out


def _without_obs_defaults(obs: dict[str, Any]) -> dict[str, Any]:
    """The observation settings less the keys of :class:`ObsSettingsConfig` left at their defaults, so
    that experiments made before those keys existed keep their digest (and can be resumed)."""
    defaults = ObsSettingsConfig().model_dump(mode="json")
    return {k: v for k, v in obs.items() if k not in defaults or v != defaults[k]}


def load_experiment(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment TOML; errors name the dotted key and the file."""
    p = Path(path).resolve()
    data = load_toml(p)
    data.setdefault("base_dir", str(p.parent))
    cfg = validate(ExperimentConfig, data, file=str(p))
    if cfg.jobs.workers is not None and cfg.jobs.workers > cfg.experiment.members:
        raise ConfigError(f"N_j = {cfg.jobs.workers} workers exceed N_e = {cfg.experiment.members} members",
                          key="jobs.workers", file=str(p))
    return cfg


def experiment_from_json(data: dict[str, Any], *, file: str | None = None) -> ExperimentConfig:
    """The configuration saved in an experiment directory (``config.json``)."""
    return validate(ExperimentConfig, data, file=file)
