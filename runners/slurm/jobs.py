"""Slurm's own commands, run on the login node: submit a batch job, read its state, signal or cancel it, list
this user's servetune jobs. Every answer is a value (:class:`JobInfo`); Slurm's error texts are mapped into
:mod:`runners.errors` here, at the one boundary that reads them."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from runners.errors import HostMisconfigured, HostUnreachable, RunnerError
from runners.host.shell import Shell

__all__ = ["ACTIVE", "COMMENT_TAG", "FAULTS", "JobInfo", "SlurmClient", "parse_comment"]

#: States of a job that still holds (or waits for) its allocation.
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                    "SIGNALING", "STAGE_OUT", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED",
                    "RESV_DEL_HOLD", "REVOKED"})
#: How Slurm itself ended a job: the trial is FAIL with this reason, never PRUNED (the configuration did not
#: cause it). ``CANCELLED`` counts only when servetune did not cancel the job itself.
FAULTS = {
    "NODE_FAIL": "a node of the job failed",
    "PREEMPTED": "the job was preempted",
    "TIMEOUT": "the job reached its time limit",
    "CANCELLED": "the job was cancelled by someone else",
    "BOOT_FAIL": "a node of the job failed to boot",
    "DEADLINE": "the job reached its deadline",
    "FAILED": "Slurm could not run the job script",
}
#: What every comment of a servetune job starts with; the rest is ``key=value`` pairs joined by commas.
COMMENT_TAG = "servetune"
_UNREACHABLE = ("unable to contact slurm controller", "socket timed out", "connection refused",
                "slurm_load_jobs error: unexpected message", "zero bytes were transmitted")


@dataclass(frozen=True)
class JobInfo:
    """One job as Slurm sees it now; ``state`` is ``GONE`` once Slurm has forgotten it."""

    job_id: str
    state: str
    reason: str = ""
    nodes: tuple[str, ...] = ()
    """The job's nodes (expanded), the head node first; empty until it runs."""
    exit_code: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def head(self) -> str | None:
        return self.nodes[0] if self.nodes else None

    def describe(self) -> str:
        """``job 12 NODE_FAIL (NodeDown) on node1``."""
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        where = f" on {','.join(self.nodes)}" if self.nodes else ""
        return f"job {self.job_id} {self.state}{why}{where}"


def parse_comment(comment: str) -> dict[str, str]:
    """The ``key=value`` pairs of a servetune job's comment; empty for any other job's."""
    head, _, rest = comment.partition(",")
    if head != COMMENT_TAG:
        return {}
    pairs = (part.split("=", 1) for part in rest.split(",") if "=" in part)
    return {k: v for k, v in pairs}


class SlurmClient:
    """``sbatch``, ``scontrol``, ``squeue`` and ``scancel`` through one shell (the login node's)."""

    def __init__(self, shell: Shell, *, timeout: float = 60.0) -> None:
        self.shell = shell
        self.timeout = timeout

    @property
    def name(self) -> str:
        return self.shell.name

    def _run(self, command: str, what: str) -> str:
        res = self.shell.run(command, timeout=self.timeout)
        if res.ok:
            return res.stdout
        err = (res.stderr.strip() or res.stdout.strip() or f"exit {res.rc}").splitlines()
        line = next((ln for ln in reversed(err) if "error" in ln.lower()), err[-1])
        if res.rc == 127:
            raise HostMisconfigured(f"{self.name}: {what}: Slurm's commands are not on PATH ({line}); fix: install "
                                    "slurm-client on the login node or add it to the host's PATH (inventory env)",
                                    host=self.name, fault="no_slurm")
        if any(t in line.lower() for t in _UNREACHABLE):
            raise HostUnreachable(f"{self.name}: {what}: {line}", host=self.name)
        raise RunnerError(f"{self.name}: {what}: {line}", host=self.name)

    def submit(self, script_path: str) -> str:
        """Submit the batch script at ``script_path`` (on the shared filesystem); its job id. A directive
        Slurm refuses (an unknown option, a partition, account or QOS it does not know, a GPU request no node
        can meet) raises HostMisconfigured: waiting will not fix it."""
        try:
            out = self._run(f"sbatch --parsable {shlex.quote(script_path)}", "sbatch")
        except HostUnreachable:
            raise
        except RunnerError as exc:
            raise HostMisconfigured(f"{exc}; fix: correct the slurm: settings of this host in the inventory",
                                    host=self.name, fault="slurm_rejected") from None
        job = out.strip().splitlines()[-1].split(";", 1)[0].strip() if out.strip() else ""
        if not job.isdigit():
            raise RunnerError(f"{self.name}: sbatch printed no job id: {out.strip()[:200]}", host=self.name)
        return job

    def info(self, job_id: str) -> JobInfo:
        """The job's state, reason and nodes (``scontrol show job``; ``sacct`` once the controller has
        forgotten it, where accounting is on); state ``GONE`` when neither knows it."""
        res = self.shell.run(f"scontrol show job -o {shlex.quote(job_id)}", timeout=self.timeout)
        if res.ok and "JobState=" in res.stdout:
            fields = dict(_pairs(res.stdout))
            nodes: tuple[str, ...] = ()
            listed = fields.get("NodeList", "(null)")
            if listed not in ("(null)", ""):
                nodes = self.hostnames(listed)
                head = fields.get("BatchHost", "")
                if head in nodes:
                    nodes = (head, *(n for n in nodes if n != head))
            return JobInfo(job_id, fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""), nodes,
                           fields.get("ExitCode", ""))
        low = (res.stderr + res.stdout).lower()
        if any(t in low for t in _UNREACHABLE):
            raise HostUnreachable(f"{self.name}: scontrol show job {job_id}: {res.stderr.strip()[:200]}",
                                  host=self.name)
        acct = self.shell.run(f"sacct -n -X -P -o State,Reason -j {shlex.quote(job_id)}", timeout=self.timeout)
        line = acct.stdout.strip().splitlines()[0] if acct.ok and acct.stdout.strip() else ""
        if line:
            state, _, reason = line.partition("|")
            return JobInfo(job_id, state.split()[0] if state else "UNKNOWN", reason)
        return JobInfo(job_id, "GONE")

    def hostnames(self, nodelist: str) -> tuple[str, ...]:
        """``node[1-2]`` expanded by ``scontrol show hostnames``."""
        if not re.search(r"[\[,]", nodelist):
            return (nodelist,)
        out = self._run(f"scontrol show hostnames {shlex.quote(nodelist)}", "scontrol show hostnames")
        return tuple(line.strip() for line in out.splitlines() if line.strip())

    def node_address(self, node: str) -> str:
        """The address Slurm reaches ``node`` at (its ``NodeAddr``; the name itself when Slurm shows none)."""
        out = self._run(f"scontrol show node -o {shlex.quote(node)}", "scontrol show node")
        return dict(_pairs(out)).get("NodeAddr") or node

    def signal(self, job_id: str, signal: str) -> None:
        """Send ``signal`` to the batch script and every step of the job (``scancel --signal --full``); a job
        that has already ended is no error."""
        self.shell.run(f"scancel --full --signal={shlex.quote(signal)} {shlex.quote(job_id)}",
                       timeout=self.timeout)

    def cancel(self, job_id: str) -> None:
        """Cancel the job (Slurm sends SIGTERM, then SIGKILL after its KillWait); an ended job is no error."""
        self.shell.run(f"scancel {shlex.quote(job_id)}", timeout=self.timeout)

    def own_jobs(self) -> list[tuple[str, str, str, dict[str, str]]]:
        """``(job id, state, working directory, comment fields)`` of this user's servetune jobs the controller
        still lists (``squeue -u``: never another user's)."""
        out = self._run('squeue -h -u "$(id -un)" -o "%i|%T|%Z|%k"', "squeue")
        jobs = []
        for line in out.splitlines():
            parts = line.strip().split("|", 3)
            if len(parts) == 4 and parts[0].isdigit() and parse_comment(parts[3]):
                jobs.append((parts[0], parts[1], parts[2], parse_comment(parts[3])))
        return jobs


def _pairs(text: str) -> list[tuple[str, str]]:
    """``Key=value`` pairs of ``scontrol show -o`` (a value may hold spaces only in keys it prints last)."""
    return [(k, v) for k, _, v in (tok.partition("=") for tok in text.split()) if k]
