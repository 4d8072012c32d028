"""One cycle's observations distributed by locality over the ranks of a local analysis
(docs/analysis.md, "Observations distributed by locality").

Each rank reads an equal share of the file (:func:`read_share`: checked and located there, an error
reaching every rank) and sends every observation to its *owner*, the rank whose I/O row block holds
its H row's first state row (:class:`OwnedObservations`). The owner assembles its H(x)
(:class:`~enkflow.obs.hx_exchange.HXExchange`), decides its quality control (with the buddies of
neighbouring owners, :mod:`enkflow.obs.buddy_ring`) and its statistics, and sends each kept
observation with its H(x) to the ranks whose local domains can see it (:meth:`OwnedObservations.held`).
No rank ever holds the whole file or the whole H(x).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from enkflow.analysis.geometry import Geometry
from enkflow.analysis.qc import ACCEPTED, BUDDY, BuddyPool, QualityControl
from enkflow.config import Metric
from enkflow.obs.buddy_ring import gather_buddies
from enkflow.obs.hx_exchange import HXExchange
from enkflow.obs.load import load_for_state, with_kind_arrays
from enkflow.obs.partition import DomainWindows, owners
from enkflow.obs.reader import ObsPart, obs_count
from enkflow.obs.fileformat import ObsFile
from enkflow.obs.records import ObsRecords
from enkflow.obs.source import ObsFileSource
from enkflow.obs.space import FileObservations, qc_for, read_given_hx
from enkflow.parallel import Comm
from enkflow.parallel.together import raise_together


@dataclass(frozen=True)
class ReadShare:
    """The observations this rank read (global numbers ``records.ids``) of a file of ``n_total``;
    ``kind_names`` and ``lonlat`` as :class:`~enkflow.obs.fileformat.ObsFile` has them."""

    records: ObsRecords
    n_total: int
    kind_names: dict[int, str]
    lonlat: bool


def share(n: int, ranks: int, rank: int) -> ObsPart:
    """Rank ``rank``'s equal share of ``n`` observations, the first ranks one more where it does not divide."""
    q, r = divmod(n, ranks)
    start = rank * q + min(rank, r)
    return ObsPart(start, start + q + (1 if rank < r else 0))


def read_share(source: ObsFileSource, comm: Comm) -> ReadShare:
    """This rank's share of ``source``'s file, read, checked and located, with its H(x) from the operator
    stage's files where the source has them (collective: an error on one rank is raised on every rank);
    the per-kind arrays and the kind names are those of the whole file."""
    layout, settings = source.layout, source.settings
    metric = settings.localization.metric if settings.localization is not None else None

    def read():
        n = obs_count(source.path, source.cycle)
        part = share(n, comm.size, comm.rank)
        of = load_for_state(source.path, layout, metric, cycle=source.cycle, settings=settings, part=part)
        hx = None
        if source.hx_files:
            ids = np.arange(part.start, part.stop, dtype=np.int64)
            hx = read_given_hx(list(source.hx_files), n, of.time, ids=ids)
        return n, part, of, hx

    n, part, of, hx = raise_together(comm, read)
    H = of.operator_for(layout.n_rows).H
    every = [ShareFacts(**f) for f in comm.allgather_obj(asdict(ShareFacts.of(of, H)))]
    of = with_kind_arrays(of, settings, half_width=any(f.half_width for f in every),
                          qc_sigma=any(f.qc_sigma for f in every))
    records = ObsRecords.from_file(of, part.start, H, max(f.h_width for f in every))
    return ReadShare(records if hx is None else records.with_hx(hx), n, _kind_names(every), of.lonlat)


@dataclass(frozen=True)
class ShareFacts:
    """What a rank's share of a file tells the others: ``h_width`` the most entries of one of its H rows;
    whether it has per-kind ``half_width`` and ``qc_sigma`` arrays; its ``kind_names`` and the kind codes it
    holds (``kinds_held``)."""

    h_width: int
    half_width: bool
    qc_sigma: bool
    kind_names: dict[int, str]
    kinds_held: list[int]

    @classmethod
    def of(cls, of: ObsFile, H: sp.csr_matrix) -> "ShareFacts":
        """The facts of the share ``of`` whose H is ``H``."""
        return cls(int(np.diff(H.indptr).max(initial=0)), of.obs.half_width is not None, of.qc_sigma is not None,
                   dict(of.kind_names), np.unique(of.obs.kinds).tolist())


def _kind_names(every: list[ShareFacts]) -> dict[int, str]:
    """The whole file's kind names from every rank's share: a code's name as a rank that holds it gives it
    (the configured one), else as any rank does (the file's)."""
    names: dict[int, str] = {}
    for f in every:
        for code, name in f.kind_names.items():
            names.setdefault(code, name)
    for f in every:
        for code in f.kinds_held:
            if code in f.kind_names:
                names[code] = f.kind_names[code]
    return names


class OwnedObservations:
    """The observations this rank owns (``records``, ascending global numbers) of a cycle's file of
    ``n_total``, routed from every rank's :class:`ReadShare` (collective); ``io_bounds`` (P + 1,) the
    ranks' I/O row blocks of the state, ``n_rows`` its rows."""

    def __init__(self, part: ReadShare, comm: Comm, io_bounds: np.ndarray, n_rows: int,
                 source: ObsFileSource):
        self.comm, self.source = comm, source
        self.n_total, self.kind_names, self.lonlat = part.n_total, part.kind_names, part.lonlat
        rec = part.records
        dest = owners(rec.first_column, io_bounds)
        self.records = rec.route(comm, dest, np.arange(rec.n))
        self.exchange = HXExchange(comm, self.records.h_matrix(n_rows), io_bounds)
        self.routed_bytes = 0  # bytes of H(x) rows sent to and received from the holders (held())

    @property
    def ids(self) -> np.ndarray:
        return self.records.ids

    def forecast_hx(self, X_local: np.ndarray) -> np.ndarray:
        """H(x) of the forecast members, (n_own, N) C-order: from the operator stage's files where the
        source has them, else H of this rank's rows ``X_local`` of its I/O block (collective)."""
        if self.records.hx is not None:
            return self.records.hx
        return self.exchange.apply(X_local)

    def quality_control(self) -> QualityControl | None:
        return qc_for(self.records.qc_sigma, self.records.n, self.lonlat, self.source.settings)

    def qc_flags(self, qc: QualityControl | None, HX: np.ndarray) -> np.ndarray:
        """The owned observations' QC flags (n_own,) int8, those of a whole-file check (collective)."""
        if qc is None:
            return np.zeros(self.records.n, np.int8)
        z, flags = qc.gross(self.records.obs, HX)
        if qc.buddy_radius is not None:
            kept = np.flatnonzero(flags == ACCEPTED)
            o = self.records.obs
            pool = gather_buddies(self.comm, qc, BuddyPool(o.coords[kept], o.kinds[kept], z[kept]))
            flags[kept[qc.buddy_rejects(pool, kept.size)]] = BUDDY
        return flags

    def held(self, keep: np.ndarray, HX: np.ndarray, windows: DomainWindows, support: float, window: int) -> ObsRecords:
        """The kept observations (``keep`` (n_own,) bool) that every rank's window ``window`` of ``windows``
        holds at the localization ``support``, sent there with their H(x) ``HX`` (n_own, N); returns those
        this rank's window holds, ascending global numbers (collective)."""
        kept = np.flatnonzero(keep)
        dest, rows = windows.holders(self.records.obs.coords[kept], support, window)
        held = self.records.for_analysis(HX).route(self.comm, dest, kept[rows])
        to_self = np.count_nonzero(dest == self.comm.rank)
        sent, received = dest.size - to_self, held.n - to_self
        self.routed_bytes += int((sent + received) * 8 * HX.shape[1])
        return held

    def sample_counts(self, keep: np.ndarray, metric: Metric, period: float | None, sample: np.ndarray,
                      radius: float) -> np.ndarray:
        """The kept observations (all ranks') within ``radius`` of each of the ``sample`` coordinates
        (n_sample, n_dim), (n_sample,) float64, the same on every rank (collective)."""
        geo = Geometry(metric, self.records.obs.coords[keep], period)
        geo.check_domain_coords(sample)
        return self.comm.allreduce_sum(geo.counts(sample, radius).astype(np.float64))


def kept_max(comm: Comm, values: np.ndarray | None, keep: np.ndarray) -> float | None:
    """The largest of ``values[keep]`` over every rank (None where ``values`` is None; -inf where none is kept)."""
    if values is None:
        return None
    mine = float(values[keep].max(initial=-np.inf))
    return max(comm.allgather_obj(mine))


class SharedFileObservations:
    """An observation space whose file each rank read its share of at once (:func:`read_share`, so its
    errors come before anything else happens), for an analysis that keeps the observations distributed
    (:meth:`source`, :meth:`share`); whole (:class:`~enkflow.obs.space.FileObservations`) only where a
    replicated analysis asks for them."""

    def __init__(self, source: ObsFileSource, comm: Comm):
        self._source, self._share = source, read_share(source, comm)
        self._whole: FileObservations | None = None

    def source(self, cycle: int) -> ObsFileSource:
        return self._source

    def share(self, cycle: int, comm: Comm) -> ReadShare:
        return self._share

    def whole(self) -> FileObservations:
        if self._whole is None:
            s = self._source
            self._whole = FileObservations.load(s.path, s.layout, s.settings, s.cycle, s.hx_files)
        return self._whole

    def observations(self, cycle: int):
        return self.whole().observations(cycle)

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self.whole().apply(cycle, X, row_start, comm)

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self.whole().apply_analysis(cycle, Xa, row_start, comm)

    def quality_control(self, cycle: int) -> QualityControl | None:
        return self.whole().quality_control(cycle)

    def kind_names(self, cycle: int) -> dict[int, str]:
        return self._share.kind_names

    def coordinate_metric(self, cycle: int) -> Metric | None:
        return Metric.SPHERE if self._share.lonlat else None
