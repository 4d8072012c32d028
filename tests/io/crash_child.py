"""Child of test_crash.py: open (finishing any interrupted update), report, then update.

usage: crash_child.py FILES_DIR LOG_DIR METHOD [pause]
LOG_DIR ``default``: no ``log_dir``, the default place; METHOD: ``[io.safe_update] method`` (shadow, log, auto).
Prints ``state old|new|mixed`` after opening (what the files hold once recovery has run), then
``go`` just before the safe update and ``done <seconds> <log_seconds>`` after it. With a third
argument ``pause``, it prints ``committed`` right after the commit marker is written and then stops
there (sleeps), so the parent can kill it inside the window between commit and the end of the writes
(the log's) or the renames (the shadows') whatever the machine's speed.
"""

import sys
import time
from pathlib import Path

import numpy as np

from enkflow.io import EnsembleFiles, IOConfig, SafeUpdateConfig, UpdateMethod, shadow, wal
from enkflow.io.generate import land_mask_config
from enkflow.state import StateLayout


def new_values(n_rows: int, n_ens: int) -> np.ndarray:
    return np.asfortranarray(np.cos(np.arange(n_rows)[:, None] * 0.01) + np.arange(n_ens)[None, :] * 0.5)


def _then_pause(commit):
    def commit_then_pause(*a, **k):
        marker = commit(*a, **k)
        print("committed", flush=True)
        time.sleep(60)
        return marker

    return commit_then_pause


def main() -> None:
    d, log_dir, method = Path(sys.argv[1]), sys.argv[2], UpdateMethod(sys.argv[3])
    paths = sorted(str(p) for p in d.glob("member_*.nc"))
    masked = "masked" in d.name
    lay = StateLayout.from_file(paths[0], ["var0", "var1"], mask=land_mask_config() if masked else None)
    cfg = IOConfig(chunk_kb=64, safe_update=SafeUpdateConfig(log_dir=None if log_dir == "default" else log_dir,
                                                              method=method))
    if len(sys.argv) > 4 and sys.argv[4] == "pause":
        for module in (wal, shadow):
            module.commit = _then_pause(module.commit)
    with EnsembleFiles(paths, lay, mode="r+", config=cfg) as ef:
        X = ef.read()
        Xn = new_values(lay.n_rows, len(paths))
        Xn32 = Xn.copy()
        Xn32[lay.variable("var1").rows] = Xn32[lay.variable("var1").rows].astype(np.float32)
        old = np.load(d / "old.npy")
        state = "new" if np.array_equal(X, Xn32) else "old" if np.array_equal(X, old) else "mixed"
        print("state", state, flush=True)
        print("go", flush=True)
        st = ef.update(Xn, safe=True)
        print("done", st.seconds, st.log_seconds, flush=True)


if __name__ == "__main__":
    main()
