"""The demo model as an online runner that also writes its forecasts through the study's output service:
``python demo_runner_with_output.py ADDRESS TOKEN_FILE CURVE_KEY RESTART LENGTH OUTPUT_ADDRESS OUTPUT_TOKEN_FILE``
(the runner line :func:`with_model_output` puts into an experiment file)."""

from __future__ import annotations

import sys
from pathlib import Path

import netCDF4

from enkflow.online.models import demo_runner
from enkflow.online.runner import Runner, State
from enkflow.output.remote import RemoteOutput


class WritingRunner(Runner):
    """A runner that also hands each forecast to ``out``, before the server takes it."""

    out: RemoteOutput | None = None

    def expose(self, state: State) -> tuple[State, int]:
        if self.member and self.out is not None:  # state: this member's forecast of this cycle
            self.out.add("soil_moisture", state, time=float(self.cycle), member=self.member)
        return super().expose(state)


def main(argv: list[str]) -> int:
    address, token_file, curve_key, grid, length, output_address, output_token = argv
    runner = WritingRunner(address, Path(token_file).read_text().strip(), curve_server_key=curve_key or None)
    with RemoteOutput(output_address, token_file=output_token) as out, runner:
        runner.out = out
        return demo_runner(runner, Path(grid), float(length))


def with_model_output(toml: Path, members: int) -> int:
    """Make the demo's experiment file ``toml`` run this runner and declare its output field
    ``soil_moisture(point)``; the number of points."""
    with netCDF4.Dataset(toml.parent / "members" / "member_0001.nc") as ds:
        n_land = len(ds.variables["land_i"])
    runner = (f'runner = "{sys.executable} {Path(__file__)} {{address}} {{token_file}} {{curve_key}} '
              '{restart} {length} {output_address} {output_token_file}"')
    lines = [runner if ln.startswith("runner = ") else ln for ln in toml.read_text().splitlines()]
    lines += ["", "[output]", 'directory = "model_output"', f"members = {members}",
              f"dims = {{ point = {{ size = {n_land} }} }}",
              'fields = { soil_moisture = { dims = ["point"], dtype = "float64", units = "m3 m-3" } }']
    toml.write_text("\n".join(lines) + "\n")
    return n_land


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
