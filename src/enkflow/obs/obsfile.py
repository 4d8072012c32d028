"""The observation file's public API (docs/formats.md, "Observation file"): its contents
(:class:`ObsFile`, :mod:`enkflow.obs.fileformat`), reading and writing it, and loading it for a
state with the configured observation operator.

Where each part lives:

* :mod:`enkflow.obs.fileformat` - the variables of the file, :class:`ObsFile`;
* :mod:`enkflow.obs.reader` / :mod:`enkflow.obs.writer` - :func:`read_obs_file` (whole, or an
  :class:`ObsPart` of the observations), :func:`obs_count`, :func:`write_obs_file`;
* :mod:`enkflow.obs.settings` - :class:`ObsSettings` (``[observations]``, localization, time window);
* :mod:`enkflow.obs.load` - :func:`load_for_state`, which runs the operator and applies the kinds;
* :mod:`enkflow.obs.registry` - the observation operators by name, one module each in
  :mod:`enkflow.obs.locators`.
"""

from enkflow.obs.fileformat import ObsFile
from enkflow.obs.load import load_for_state
from enkflow.obs.reader import ObsPart, obs_count, read_obs_file
from enkflow.obs.settings import ObsSettings
from enkflow.obs.writer import write_obs_file

__all__ = ["ObsFile", "ObsPart", "ObsSettings", "load_for_state", "obs_count", "read_obs_file", "write_obs_file"]
