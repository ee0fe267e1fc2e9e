"""A Slurm cluster as a servetune host: each trial is one batch job (see :mod:`runners.slurm.host`).

* :mod:`runners.slurm.spec` -- the ``slurm:`` mapping of an inventory entry (:class:`SlurmSpec`);
* :mod:`runners.slurm.jobs` -- ``sbatch``, ``scontrol``, ``squeue``, ``scancel`` on the login node, as values;
* :mod:`runners.slurm.host` -- :class:`SlurmHost`, one job slot of a cluster, and the batch script;
* ``scripts/`` -- the job body and the log follower, shipped as files (shellcheck-clean).
"""

from runners.slurm.host import JobRef, SlurmHost, SrunTransport, job_script
from runners.slurm.jobs import JobInfo, SlurmClient
from runners.slurm.spec import SlurmSpec

__all__ = ["JobInfo", "JobRef", "SlurmClient", "SlurmHost", "SlurmSpec", "SrunTransport", "job_script"]
