"""How long the cluster in a box takes to start and stop, with and without SLURM, and to lose and revive a node.

Each repetition starts a fresh cluster of ``--nodes`` nodes (plus the head
node), times its start-up (namespaces and keepers; then munged, slurmctld
and the slurmd of every node until all are idle), one ``kill_node`` and one
``revive_node`` of the last node (with SLURM: until the node is idle again)
and the full stop. Prints a table (median and range of the repetitions, in
seconds) and one JSON line. Needs root.

usage: python benchmarks/cluster_startup.py [--nodes 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))

from enkflow_testing.cluster import Cluster  # noqa: E402
from enkflow_testing.cluster_ns import missing_reason  # noqa: E402


def one(nodes: int, slurm: bool) -> dict[str, float]:
    """Seconds of each phase for one fresh cluster."""
    c = Cluster(n_nodes=nodes, slurm=slurm)
    t0 = time.perf_counter()
    c.start()
    try:
        times = {"start": time.perf_counter() - t0, **{f"start:{k}": v for k, v in c.startup_s.items()}}
        t0 = time.perf_counter()
        c.kill_node(c.names[-1])
        times["kill_node"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        c.revive_node(c.names[-1])
        times["revive_node"] = time.perf_counter() - t0
    finally:
        t0 = time.perf_counter()
        c.stop()
    times["stop"] = time.perf_counter() - t0
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    reason = missing_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    result = {}
    for slurm in (False, True):
        runs = [one(args.nodes, slurm) for _ in range(args.repeat)]
        label = "with SLURM" if slurm else "without SLURM"
        print(f"{args.nodes} nodes + head, {label} ({args.repeat} runs): median [min, max] s")
        for phase in runs[0]:
            xs = [r[phase] for r in runs]
            print(f"  {phase:14s} {statistics.median(xs):7.3f} [{min(xs):.3f}, {max(xs):.3f}]")
            result[f"{'slurm' if slurm else 'plain'}:{phase}"] = round(statistics.median(xs), 4)
    print(json.dumps({"nodes": args.nodes, "repeat": args.repeat, "median_s": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
