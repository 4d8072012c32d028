"""The demo model as a C runner (libenkflow_runner) and as a Fortran runner (enkflow_runner_mod): a
3-cycle online study with the bundled analysis gives analysis ensembles (final restarts, every cycle's
analysis mean and spread) bitwise equal to the Python demo model's offline run through restart files. The
runners exchange through the server's shared memory by themselves (on its node); no segment is left behind.
(Forced TCP, bitwise the same: test_native_slices.py, test_native_protocol.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from demo_study import differences, make_forcing, online_study, outputs, run_study



@pytest.mark.parametrize("program", ["enkflow_demo_c", "enkflow_demo_f"])
def test_native_demo_online_is_bitwise_the_python_model_offline(native_build, reference, tmp_path: Path,
                                                                  program: str) -> None:
    exe = native_build.exe(program)
    forcing = tmp_path / "forcing.nc"
    study = online_study(tmp_path / "study", f"{exe} --address {{address}} --token-file {{token_file}} --grid {{restart}} "
                                             f"--forcing {forcing} --length {{length}} --curve-key={{curve_key}}")
    make_forcing(study.directory / "members" / "member_0001.nc", forcing)
    run_study(study)
    assert study.rc == 0, f"enkflow run failed ({study.rc}):\n{study.log}\n{study.runner_logs()}"
    bad = differences(reference, outputs(study.directory, study.run_dir))
    assert not bad, f"{program}: not bitwise the offline run: {bad}"
    said = study.shm_ranks()
    assert said and set(said) == {1}, (said, study.runner_logs())
    assert not study.segments_left()
    # Every forecast was the native runner's: no member was redone.
    requeued = [e for e in study.events() if e.get("event") == "task_requeue"]
    assert not requeued, requeued
