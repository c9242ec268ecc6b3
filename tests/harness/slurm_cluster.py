"""A one-node SLURM cluster on loopback for the tests (the `slurm` fixture in conftest.py), from
Debian's packages (slurm-wlm), without systemd or munge: auth/none, no accounting, state in a
folder of the test session. Settings that make a requeue take seconds instead of minutes:
KillWait=10 (a stop with its checkpoint fits in it, on a loaded machine too), cred_expire=5 and a scheduler that looks every second.

submitit asks `sacct` for job states, which needs accounting; a stand-in first on PATH answers
from `scontrol show job` (jobs stay there MinJobAge, 300 s by default: longer than any test)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sinfo", "scancel", "srun")

CONF = """\
ClusterName=seqlabtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=10
NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost CPUs={cpus} Sockets=1 CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

# sacct -o JobID,State,NodeList --parsable2 -j ID [-j ID ...], answered from scontrol.
SACCT = """#!{python}
import subprocess, sys
ids = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "-j"]
print("JobID|State|NodeList")
for jid in ids:
    out = subprocess.run(["scontrol", "-o", "show", "job", jid.split("_")[0]], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        name = f"{{f['ArrayJobId']}}_{{f['ArrayTaskId']}}" if f.get("ArrayTaskId") else f.get("JobId", "")
        print(f"{{name}}|{{f.get('JobState', 'UNKNOWN')}}|{{f.get('NodeList', '')}}")
"""


def missing() -> str | None:
    """Why no cluster can start here (None: it can)."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return f"SLURM is not installed ({', '.join(absent)}; apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "the one-node SLURM test cluster runs its daemons as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """slurmctld and slurmd in the foreground (-D) as children of the test run; `env` is what a
    command needs to use it (SLURM_CONF, the sacct stand-in on PATH)."""

    def __init__(self, root: Path, cpus: int = 2) -> None:
        self.root = root
        for sub in ("state", "spool", "log", "bin"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.conf = root / "slurm.conf"
        self.conf.write_text(
            CONF.format(root=root, ctld_port=_free_port(), slurmd_port=_free_port(), cpus=cpus)
        )
        sacct = root / "bin" / "sacct"
        sacct.write_text(SACCT.format(python=sys.executable))
        sacct.chmod(0o755)
        path = f"{root / 'bin'}:/usr/sbin:{os.environ.get('PATH', '')}"
        self.env = {"SLURM_CONF": str(self.conf), "PATH": path}
        self.procs: list[subprocess.Popen] = []

    def _environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def run(self, *cmd: str, timeout: float = 30) -> str:
        return subprocess.run(
            cmd, env=self._environ(), capture_output=True, text=True, timeout=timeout, check=True
        ).stdout

    def start(self, ready_s: float = 30) -> "Cluster":
        for cmd in (
            ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            ["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)],
        ):
            log = open(self.root / "log" / f"{cmd[0]}.out", "w")
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    env=self._environ(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            try:
                if self.run("sinfo", "-h", "-o", "%T", timeout=5).strip() == "idle":
                    return self
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(
            f"the test SLURM cluster did not become idle in {ready_s:.0f} s; see {self.root / 'log'}"
        )

    def queue(self) -> list[str]:
        """`JOBID STATE` per job in the queue."""
        return self.run("squeue", "-h", "-o", "%i %T").split("\n")[:-1]

    def drain(self, timeout: float = 30) -> None:
        """Cancel every job and wait for an empty queue (a job in COMPLETING holds the node's cores)."""
        subprocess.run(
            ["scancel", "--user=root"], env=self._environ(), capture_output=True, timeout=30
        )
        deadline = time.monotonic() + timeout
        while self.queue() and time.monotonic() < deadline:
            time.sleep(0.3)

    def stop(self) -> None:
        # Jobs first: killing the daemons first leaves slurmstepd and the jobs' processes running.
        try:
            self.drain()
        except (subprocess.SubprocessError, OSError):
            pass
        for proc in reversed(self.procs):  # slurmd, then slurmctld with its slurmscriptd
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
