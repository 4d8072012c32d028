"""``enkflow synth``: write the synthetic global land problem (Zheng et al. 2020) to NetCDF files."""

from __future__ import annotations

import argparse
import sys
import time

from enkflow.cli import COMMANDS
from enkflow.models.synthetic_land import Size
from enkflow.models.synthetic_land_files import MIN_MEMBERS, NcFormat, generate


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``synth`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "synth",
        help=COMMANDS["synth"],
        description=(
            "Write N NetCDF restart files of identical structure (member_0001.nc ...), truth.nc and obs.nc "
            "for the synthetic global land problem of Zheng et al. (GMD 2020). Sizes: "
            + ", ".join(f"{s.value} {s.shape[0]}x{s.shape[1]}" for s in Size)
            + ". See docs/formats.md for the file layout."
        ),
    )
    p.add_argument("--size", required=True, choices=[s.value for s in Size], help="grid size")
    p.add_argument("--members", required=True, type=int, metavar="N", help=f"ensemble size (>= {MIN_MEMBERS})")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--obs-fraction", type=float, default=0.1, metavar="F",
                   help="observations per land point on average: F <= 1 observes a random fraction F of the points, "
                        "F > 1 every point floor(F) times and a random F - floor(F) of them once more (default 0.1)")
    p.add_argument("--obs-std", type=float, default=0.25, help="observation error standard deviation (default 0.25)")
    p.add_argument("--format", choices=[f.value for f in NcFormat], default=NcFormat.NC4.value,
                   help="nc4: NetCDF-4 contiguous (default); cdf5: NetCDF-3 64-bit data")
    p.add_argument("--overwrite", action="store_true", help="replace existing files of the same names")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Generate the files; progress lines go to stderr, the summary to stdout. Returns the exit code."""
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"synth [{time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)

    r = generate(
        args.out,
        size=args.size,
        members=args.members,
        seed=args.seed,
        obs_fraction=args.obs_fraction,
        obs_std=args.obs_std,
        format=args.format,
        overwrite=args.overwrite,
        progress=progress,
    )
    print(
        f"synthetic land '{args.size}': grid {r.grid.n_x}x{r.grid.n_y}, {r.n_land} land points, "
        f"{r.members} members, {r.n_obs} observations\n"
        f"wrote {r.members + 2} files ({r.bytes_written / 1e6:.1f} MB) to {r.out_dir} in {r.seconds:.1f} s"
    )
    return 0
