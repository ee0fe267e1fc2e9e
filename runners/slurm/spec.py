"""How a Slurm cluster is used, as the ``slurm:`` mapping of an inventory entry (:class:`SlurmSpec`)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["SlurmSpec"]

_DIRECTIVE = re.compile(r"--[a-z][a-z0-9-]*(=\S.*)?")
#: Directives servetune writes itself: an inventory entry that sets them would fight the runner.
_OWN = ("--job-name", "--comment", "--output", "--error", "--chdir", "--nodes", "--requeue", "--no-requeue",
        "--parsable", "--wrap")


class SlurmSpec(BaseModel):
    """A host that is a Slurm cluster: each trial is one batch job (``sbatch``) submitted from the login node
    (the entry's ``address``: SSH, or ``local`` when the controller runs there). ``runs_root`` must be on the
    filesystem the login node and the compute nodes share."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: str | None = Field(default=None, description="`--partition` (None: the cluster's default)")
    account: str | None = Field(default=None, description="`--account`")
    qos: str | None = Field(default=None, description="`--qos`")
    time_limit: str = Field(default="01:00:00", description="`--time` of every job: start-up, sweep and stop "
                            "must fit in it (Slurm ends the job at the limit: the trial is FAIL `scheduler`)")
    gpu_directive: str = Field(default="--gres=gpu:{gpus}",
                               description="how this cluster asks for GPUs; `{gpus}` is the trial's GPUs per node "
                               "(`--gres=gpu:h100:{gpus}`, `--gpus-per-node={gpus}`)")
    max_jobs: int = Field(default=1, ge=1, le=256, description="trials run as parallel jobs, at most this many")
    directives: tuple[str, ...] = Field(default=(), description="extra sbatch options, each `--name[=value]` "
                                        "(`--constraint=ib`, `--exclusive`)")
    queue_timeout: float | None = Field(default=None, gt=0, description="seconds a job may wait in the queue "
                                        "before it is cancelled and its trial FAILs (None: as long as the run)")
    poll_interval: float = Field(default=2.0, gt=0, le=60, description="seconds between two looks at a job's "
                                 "state (squeue, scontrol) while it waits or runs")
    gpu_memory_mib: float | None = Field(default=None, gt=0,
                                         description="memory of one GPU of the partition, as nvidia-smi's "
                                         "memory.total (MiB): sinfo does not say it, and the memory model sizes "
                                         "SGLang's defaults by it (None: learnt from the trials alone)")
    server_port: int | None = Field(default=None, ge=1024, le=65000,
                                    description="the first port servers bind on the head node; job slot i binds "
                                    "this + i (None: a port in 20000-32767 picked for each launch)")

    @field_validator("partition", "account", "qos", "time_limit")
    @classmethod
    def _word(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError(f"must be one word, got {value!r}")
        return value

    @field_validator("gpu_directive")
    @classmethod
    def _gpus(cls, value: str) -> str:
        if "{gpus}" not in value or not _DIRECTIVE.fullmatch(value.replace("{gpus}", "1")):
            raise ValueError(f"must be one `--name=...{{gpus}}...` option, got {value!r}")
        return value

    @field_validator("directives")
    @classmethod
    def _directives(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not _DIRECTIVE.fullmatch(item) or "\n" in item:
                raise ValueError(f"{item!r} is not one sbatch option (`--name` or `--name=value`, one line)")
            name = item.split("=", 1)[0]
            if name in _OWN:
                raise ValueError(f"{name} is set by servetune itself (allowed: any other sbatch option)")
        return value

    def gpu_option(self, gpus: int) -> str:
        """The GPU request for ``gpus`` GPUs per node, in this cluster's spelling."""
        return self.gpu_directive.replace("{gpus}", str(int(gpus)))
