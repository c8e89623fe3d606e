"""A real Slurm cluster on this one host, started and stopped by the test session.

What runs (every daemon is started here; apt never starts services on these machines):

- ``munged`` on a private socket and key (slurm.conf ``AuthInfo=socket=`` /
  ``AccountingStoragePass=`` point every Slurm part at it);
- a private MariaDB (own data directory, loopback TCP on a free port, run as ``mysql``);
- ``slurmdbd`` (accounting: ``sacct``, ``sacctmgr``) with ``slurmdbd.conf`` mode 600;
- ``slurmctld``;
- one ``slurmd -N <node>`` per fake node, each with its own port, spool and log, and fake
  NVIDIA device files (``mknod c 195 N``) named in ``gres.conf`` as typed ``gpu`` GRES
  (``SlurmdParameters=config_overrides`` lets a node declare CPUs and memory it does not have).

Run by hand: ``python -m tests.slurm.cluster`` starts it and prints how to use it until Ctrl-C.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fixtures.ports import free_port

CLUSTER = "gpubudgettest"
PARTITION = "gpubudget"
DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd",
           "sbatch", "scontrol", "sacct", "sacctmgr", "squeue", "scancel", "sudo")


@dataclass(frozen=True)
class FakeNode:
    name: str
    gpus: int
    gres_type: str = "h100"
    cpus: int = 4
    memory_mib: int = 8000


DEFAULT_NODES = (FakeNode("gpu1", 2), FakeNode("gpu2", 2))


def missing_parts() -> list[str]:
    """System parts the cluster needs that are not installed."""
    return [d for d in DAEMONS if shutil.which(d) is None
            and not Path("/usr/sbin", d).exists()]


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class ClusterError(RuntimeError):
    pass


@dataclass
class SlurmCluster:
    dir: Path
    nodes: tuple[FakeNode, ...] = DEFAULT_NODES
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    hostname: str = field(default_factory=lambda: socket.gethostname().split(".")[0])

    # ------------------------------------------------------------------ paths
    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm commands run against this cluster."""
        e = dict(os.environ)
        e["SLURM_CONF"] = str(self.conf)
        return e

    def log(self, name: str, tail: int = 3000) -> str:
        try:
            return (self.dir / "log" / f"{name}.log").read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    # ------------------------------------------------------------------ commands
    def run(self, *argv: str, check: bool = True, timeout: float = 30, **kw: object) -> str:
        p = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                           timeout=timeout, **kw)  # type: ignore[call-overload]
        if check and p.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} -> {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def node_state(self, node: str) -> tuple[str, str]:
        """(State=..., Reason=...) of a node as scontrol reports them."""
        out = self.run("scontrol", "show", "node", "-o", node)
        fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
        reason = out.split("Reason=", 1)[1].strip() if "Reason=" in out else ""
        return fields.get("State", ""), reason

    def wait(self, what: str, pred, timeout: float = 30, interval: float = 0.2):  # noqa: ANN001
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = pred()
            except (ClusterError, subprocess.TimeoutExpired) as e:
                last = e
                last_ok = False
            else:
                last_ok = bool(last)
            if last_ok:
                return last
            time.sleep(interval)
        raise ClusterError(f"timed out waiting for {what} (last: {last!r})\n"
                           f"slurmctld: {self.log('slurmctld')}")

    # ------------------------------------------------------------------ start
    def start(self) -> SlurmCluster:
        if os.geteuid() != 0:
            raise ClusterError("the test cluster runs its daemons as root")
        t0 = time.monotonic()
        for sub in ("etc", "munge", "log", "spool", "state", "dev", "run"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        # users' jobs must reach the config and the munge socket
        for d in (self.dir, self.dir / "etc", self.dir / "munge", self.dir / "dev"):
            d.chmod(0o755)
        self.ports = {"ctld": free_port(), "dbd": free_port(), "mysql": free_port()}
        for n in self.nodes:
            self.ports[n.name] = free_port()
        self._devices()
        self._write_configs()
        self._start_munge()
        self._start_mariadb()
        self._start_slurmdbd()
        self.run("sacctmgr", "-i", "add", "cluster", CLUSTER)
        self._start_slurmctld()
        for n in self.nodes:
            self.start_node(n.name)
        self.wait("nodes idle", lambda: all(
            self.node_state(n.name)[0].startswith("IDLE") for n in self.nodes))
        self.started_in = time.monotonic() - t0
        return self

    def _devices(self) -> None:
        minor = 0
        for n in self.nodes:
            for _ in range(n.gpus):
                dev = self.dir / "dev" / f"nvidia{minor}"
                if not dev.exists():
                    os.mknod(dev, 0o666 | 0o020000, os.makedev(195, minor))
                minor += 1

    def _write_configs(self) -> None:
        d = self.dir
        node_lines, gres_lines = [], []
        minor = 0
        for n in self.nodes:
            node_lines.append(
                f"NodeName={n.name} NodeHostname={self.hostname} NodeAddr=127.0.0.1 "
                f"Port={self.ports[n.name]} CPUs={n.cpus} RealMemory={n.memory_mib} "
                f"Gres=gpu:{n.gres_type}:{n.gpus} State=UNKNOWN")
            files = f"{d}/dev/nvidia[{minor}-{minor + n.gpus - 1}]" if n.gpus > 1 \
                else f"{d}/dev/nvidia{minor}"
            gres_lines.append(f"NodeName={n.name} Name=gpu Type={n.gres_type} File={files}")
            minor += n.gpus
        names = ",".join(n.name for n in self.nodes)
        sock = self.munge_socket
        self.conf.write_text(f"""\
# written by tests/slurm/cluster.py: a throw-away cluster on one host
ClusterName={CLUSTER}
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={self.ports['ctld']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
SchedulerType=sched/backfill
# heterogeneous jobs (gangs with unequal GPUs per node) start only from the backfill pass
SchedulerParameters=bf_interval=1,sched_min_interval=100000
DefMemPerCPU=256
ReturnToService=2
SlurmdTimeout=6
SlurmctldTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=30
JobRequeue=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={self.ports['dbd']}
AccountingStoragePass={sock}
AccountingStorageEnforce=associations,limits
AccountingStorageTRES=gres/gpu,gres/gpu:{self.nodes[0].gres_type}
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
{chr(10).join(node_lines)}
PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE PreemptMode=OFF State=UP AllocNodes=localhost,{self.hostname}
""")
        (d / "etc" / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        self.db_pass = secrets.token_hex(12)
        dbd = d / "etc" / "slurmdbd.conf"
        dbd.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={sock}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.ports['dbd']}
SlurmUser=root
LogFile={d}/log/slurmdbd.log
PidFile={d}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.ports['mysql']}
StorageUser=slurm
StoragePass={self.db_pass}
StorageLoc=slurm_acct_db
""")
        dbd.chmod(0o600)
        for f in ("slurm.conf", "gres.conf"):
            (d / "etc" / f).chmod(0o644)

    def _spawn(self, name: str, argv: list[str], **kw: object) -> subprocess.Popen:
        log = open(self.dir / "log" / f"{name}.out", "ab")  # noqa: SIM115
        p = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True,
                             **kw)  # type: ignore[call-overload]
        self.procs[name] = p
        return p

    def _alive(self, name: str) -> bool:
        p = self.procs.get(name)
        if p is not None and p.poll() is not None:
            out = (self.dir / "log" / f"{name}.out").read_text(errors="replace")[-2000:]
            raise ClusterError(f"{name} exited with {p.returncode}: {out}\n{self.log(name)}")
        return True

    def _start_munge(self) -> None:
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self._spawn("munged", [_exe("munged"), "--foreground", "--force",
                               f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={self.dir / 'run' / 'munged.pid'}",
                               f"--log-file={self.dir / 'log' / 'munged.log'}",
                               f"--seed-file={self.dir / 'munge' / 'seed'}"])
        self.wait("munged socket", lambda: self._alive("munged") and self.munge_socket.exists())

    def _start_mariadb(self) -> None:
        data = self.dir / "mysql"
        data.mkdir(exist_ok=True)
        mysql = pwd.getpwnam("mysql")
        os.chown(data, mysql.pw_uid, mysql.pw_gid)
        sock = self.dir / "run" / "mysqld.sock"
        (self.dir / "run").chmod(0o777)  # mysqld (as mysql) writes its socket and pid here
        p = subprocess.run([_exe("mariadb-install-db"), "--no-defaults", f"--datadir={data}",
                            "--user=mysql", "--auth-root-authentication-method=socket",
                            "--skip-test-db", "--skip-name-resolve"],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise ClusterError(f"mariadb-install-db failed: {p.stdout[-1500:]} {p.stderr[-1500:]}")
        self._spawn("mariadbd", [
            _exe("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=mysql",
            f"--socket={sock}", f"--port={self.ports['mysql']}", "--bind-address=127.0.0.1",
            f"--pid-file={self.dir / 'run' / 'mysqld.pid'}",
            f"--log-error={self.dir / 'log' / 'mariadbd.log'}", "--skip-name-resolve",
            "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
            "--innodb-flush-log-at-trx-commit=2", "--skip-log-bin",
            "--performance-schema=OFF"])
        self.wait("mariadb socket", lambda: self._alive("mariadbd") and sock.exists(), 60)
        sql = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.db_pass}';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        self.wait("mariadb answers", lambda: subprocess.run(
            [_exe("mariadb"), "--no-defaults", "-S", str(sock), "-u", "root", "-e", sql],
            capture_output=True, timeout=20).returncode == 0, 60)

    def _start_slurmdbd(self) -> None:
        self._spawn("slurmdbd", [_exe("slurmdbd"), "-D"])
        self.wait("slurmdbd", lambda: self._alive("slurmdbd") and self.run(
            "sacctmgr", "-n", "-P", "list", "cluster", timeout=10) is not None, 90, 0.5)

    def _start_slurmctld(self) -> None:
        self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-i"])
        self.wait("slurmctld", lambda: self._alive("slurmctld") and self.run(
            "scontrol", "ping", timeout=10).count("UP") > 0, 60, 0.3)

    def start_node(self, name: str) -> None:
        """Start (or restart) the slurmd of one fake node."""
        self._spawn(f"slurmd-{name}", [_exe("slurmd"), "-D", "-N", name])

    def stop_node(self, name: str) -> None:
        """Stop one node's slurmd, as if the node had died (its jobs' steps are killed too)."""
        p = self.procs.pop(f"slurmd-{name}", None)
        if p is not None:
            _kill_group(p)

    # ------------------------------------------------------------------ compute-node Python
    def job_python(self) -> Path:
        """The Python environment jobs use on the "compute nodes": a venv of the system's
        Python that sees this project's packages. (The project's own venv may live where
        other users cannot reach, e.g. a pyenv Python under /root.) Returns its bin/ with
        jupyterhub-singleuser and batchspawner-singleuser."""
        import sys
        import sysconfig

        env = self.dir / "jobenv"
        bindir = env / "bin"
        if (bindir / "batchspawner-singleuser").exists():
            return bindir
        system = "/usr/bin/python3"
        ver = subprocess.run([system, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
        mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if ver != mine:
            raise ClusterError(f"{system} is Python {ver}, the project's venv {mine}: the "
                               "jobs' environment cannot share its packages")
        subprocess.run([system, "-m", "venv", "--without-pip", str(env)], check=True,
                       capture_output=True)
        site_dir = Path(sysconfig.get_paths()["purelib"])
        (env / "lib" / f"python{ver}" / "site-packages" / "gpubudget-project.pth").write_text(
            f"import site; site.addsitedir({str(site_dir)!r})\n")
        for sub in ("etc/jupyter", "share/jupyter"):  # server extensions, lab assets
            (env / sub).parent.mkdir(parents=True, exist_ok=True)
            (env / sub).symlink_to(Path(sys.prefix) / sub)
        py = bindir / "python"
        for name, module in (("jupyterhub-singleuser", "jupyterhub.singleuser"),
                             ("batchspawner-singleuser", "batchspawner.singleuser")):
            script = bindir / name
            script.write_text(f"#!{py}\nimport sys\nfrom {module} import main\n"
                              "sys.exit(main())\n")
            script.chmod(0o755)
        env.chmod(0o755)
        return bindir

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        for name in list(self.procs):
            if name.startswith("slurmd-"):
                _kill_group(self.procs.pop(name))
        _kill_leftover_steps(self.dir)
        for name in ("slurmctld", "slurmdbd", "mariadbd", "munged"):
            p = self.procs.pop(name, None)
            if p is not None:
                _kill_group(p)


def _kill_group(p: subprocess.Popen, grace: float = 5.0) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)


def _kill_leftover_steps(d: Path) -> None:
    """slurmstepd processes of this cluster's jobs (found by their spool directory)."""
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmd = (pid_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"slurmstepd"):
            try:
                env = (pid_dir / "environ").read_bytes()
            except OSError:
                continue
            if str(d).encode() in env:
                try:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def start_cluster(base: Path | None = None,
                  nodes: tuple[FakeNode, ...] = DEFAULT_NODES) -> SlurmCluster:
    d = Path(base) if base else Path(tempfile.mkdtemp(prefix="gpubudget-slurm-"))
    c = SlurmCluster(d, nodes)
    try:
        return c.start()
    except BaseException:
        c.stop()
        raise


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    c = start_cluster()
    print(f"cluster up in {c.started_in:.1f} s: export SLURM_CONF={c.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
