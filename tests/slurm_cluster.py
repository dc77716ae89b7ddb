"""A one-node SLURM cluster on this machine for tests: munged, slurmctld and slurmd on localhost."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
# The jobstep plugin strips SLURM_* variables (SLURM_CONF too) before its nested srun, so the config
# must also sit where srun looks by default. Only a file carrying this marker is ever replaced.
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "# written by moeplace's test cluster\n"


def ensure_installed() -> None:
    """Debian's slurm-wlm and munge (CI is root on a Debian machine)."""
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "munged", "sbatch")):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, capture_output=True)


def _config(root: Path, host: str, cpus: int, memory_mb: int) -> str:
    return f"""ClusterName=moeplace-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={host} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@contextmanager
def one_node_cluster(root: Path) -> Iterator[dict[str, str]]:
    """Start the cluster; yield the environment clients need (SLURM_CONF); always shut it down."""
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 2
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    for sub in ("munge", "state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(MARKER + _config(root, host, cpus, memory_mb))
    if SYSTEM_CONF.exists() and not SYSTEM_CONF.read_text().startswith(MARKER):
        raise RuntimeError(f"{SYSTEM_CONF} belongs to a real SLURM installation; not starting a test cluster here")
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SYSTEM_CONF.write_text(conf.read_text())
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemon_log = (root / "daemons.log").open("a")
    procs = [
        subprocess.Popen(
            [
                "munged",
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={root}/munge/munge.socket",
                f"--pid-file={root}/munge/munged.pid",
                f"--log-file={root}/munge/munged.log",
                f"--seed-file={root}/munge/munged.seed",
            ],
            start_new_session=True,
            stdout=daemon_log,
            stderr=subprocess.STDOUT,
        )
    ]
    try:
        time.sleep(1)
        procs.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-i", "-f", str(conf)],
                env=env,
                start_new_session=True,
                stdout=daemon_log,
                stderr=subprocess.STDOUT,
            )
        )
        time.sleep(2)
        procs.append(
            subprocess.Popen(
                ["slurmd", "-D", "-f", str(conf)],
                env=env,
                start_new_session=True,
                stdout=daemon_log,
                stderr=subprocess.STDOUT,
            )
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            if out.stdout.strip() in ("idle", "mixed", "allocated"):
                break
            time.sleep(1)
        else:
            raise RuntimeError(f"the test cluster did not come up: {out.stdout} {out.stderr}; see {root}")
        yield env
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        daemon_log.close()
        SYSTEM_CONF.unlink(missing_ok=True)
