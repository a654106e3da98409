"""The workflow on a real SLURM: a single-node cluster on localhost (Debian's slurmctld, slurmd and
munge), tests/configs/tiny.yaml run through profiles/slurm so that its kernel build and bench jobs
are submitted with sbatch by Snakemake's SLURM executor plugin, and the outcome compared with the
same config run locally.

Opt-in: LONGCTX_SLURM=1 (`make test` sets it and installs the packages through `make slurm`; run
as root, this test installs them too). It needs root: it writes /etc/slurm/slurm.conf and
gres.conf (the plugin's job step does not pass SLURM_CONF on) and removes them at the end, starts
munged (unless one answers already), slurmctld and slurmd, and stops each by its pid. It leaves a
SLURM that someone else configured alone, and waits for another run of itself (a lock file).
"""

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from longctx import config as lcfg
from longctx.measure.process import _die_with
from longctx.measure.resources import bench_resources

from .conftest import ENV, ROOT, TINY, copy_workflow

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

PACKAGES = "slurmctld slurmd slurm-client munge"
COMMANDS = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "munged", "munge")
CONF_DIR = Path("/etc/slurm")
MARK = "# written by longctx tests/test_slurm.py, removed when it ends"
PORTS = (6817, 6818)  # slurmctld's and slurmd's defaults
NODE_CPUS = 4  # the three bench jobs (one CPU each under --cores 1) run side by side on the node
LOCK = Path("/tmp/longctx-slurm-test.lock")
RUN_TIMEOUT_S = 300
SQUEUE_FIELDS = ("JobID", "Comment", "State", "tres-per-job", "MinMemory", "TimeLimit", "StartTime", "EndTime", "NodeList")

if not os.environ.get("LONGCTX_SLURM"):
    pytest.skip("the real-SLURM test is opt-in: set LONGCTX_SLURM=1 (make test does)", allow_module_level=True)


def command(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)


def missing_commands() -> list[str]:
    return [c for c in COMMANDS if command(c) is None]


def run(*cmd: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([command(cmd[0]) or cmd[0], *cmd[1:]], capture_output=True, text=True, timeout=timeout,
                          check=check)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def slurm_conf(state: Path) -> str:
    return f"""{MARK}
ClusterName=longctx-test
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MinJobAge=600
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=localhost CPUs={NODE_CPUS} RealMemory=64000 Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


class Daemons:
    """The daemons this test started, each stopped by its pid (SIGTERM, then SIGKILL); each also gets SIGTERM when this
    test's process dies without stopping them (PR_SET_PDEATHSIG, as longctx's servers do): a suite killed mid-run left
    them up in sessions of their own, and the next run's SLURM tests skipped on their ports."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *cmd: str, **popen) -> subprocess.Popen:
        with open(self.logdir / f"{name}.out", "wb") as out:
            proc = subprocess.Popen([command(cmd[0]), *cmd[1:]], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with(os.getpid()),
                                    **popen)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


def logs(state: Path) -> str:
    return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(state.glob("*.*")) if p.suffix in (".log", ".out"))


def munge_answers() -> bool:
    if command("munge") is None:
        return False
    return subprocess.run([command("munge"), "-n"], capture_output=True, timeout=10).returncode == 0


def start_munged(daemons: Daemons) -> None:
    """munged in the foreground as the munge user, with the key Debian's package made."""
    if munge_answers():
        return
    run_dir = Path("/run/munge")
    run_dir.mkdir(exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        run("mungekey", "--create", "--keyfile", "/etc/munge/munge.key")
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
    daemons.start("munged", "munged", "--foreground", user="munge", group="munge", extra_groups=[])
    deadline = time.monotonic() + 10
    while not munge_answers():
        if time.monotonic() > deadline:
            raise AssertionError(f"munged did not answer within 10 s\n{logs(daemons.logdir)}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A single-node SLURM on localhost: slurm.conf written, munged, slurmctld -D and slurmd -D up."""
    if os.geteuid() != 0:
        if missing_commands():
            pytest.skip(f"SLURM is not installed; to run this test: sudo apt-get install --no-install-recommends {PACKAGES}, "
                        "then run it as root")
        pytest.skip("the SLURM test writes /etc/slurm/slurm.conf and starts slurmctld and slurmd: run it as root")
    if missing_commands():
        subprocess.run(["bash", str(ROOT / "envs" / "ensure-slurm.sh")], check=True, timeout=600)
    LOCK.touch()
    with open(LOCK) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run of this test on the machine: wait for it
        for name in ("slurm.conf", "gres.conf"):
            path = CONF_DIR / name
            if path.exists() and MARK not in path.read_text(errors="replace"):
                pytest.skip(f"{path} exists and this test did not write it: a configured SLURM is left alone")
        if any(port_open(p) for p in PORTS):
            pytest.skip(f"something listens on port {PORTS[0]} or {PORTS[1]}: a SLURM daemon runs already")
        state = tmp_path_factory.mktemp("slurm")
        for name in ("gpu0", "gpu1"):  # device files of the node's two (pretend) GPUs
            (state / name).touch()
        CONF_DIR.mkdir(exist_ok=True)
        (CONF_DIR / "slurm.conf").write_text(slurm_conf(state))
        (CONF_DIR / "gres.conf").write_text(f"{MARK}\nNodeName=localhost Name=gpu File={state}/gpu[0-1]\n")
        daemons = Daemons(state)
        try:
            start_munged(daemons)
            daemons.start("slurmctld", "slurmctld", "-D")
            daemons.start("slurmd", "slurmd", "-D", "-N", "localhost")
            deadline = time.monotonic() + 30
            while run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip() != "idle":
                if time.monotonic() > deadline or any(p.poll() is not None for p in daemons.procs):
                    raise AssertionError(f"the SLURM node did not come up\n{logs(state)}")
                time.sleep(0.3)
            yield state
        finally:
            with contextlib.suppress(Exception):  # nothing of this test's may outlive it: its jobs first
                cancel_jobs()
            daemons.stop()
            for name in ("slurm.conf", "gres.conf"):
                (CONF_DIR / name).unlink(missing_ok=True)


def cancel_jobs(timeout_s: float = 30) -> None:
    """scancel what still runs (after a failed or timed-out run) and wait until slurmd has ended it."""
    active = "PENDING,RUNNING,COMPLETING,CONFIGURING,SUSPENDED"
    jobs = run("squeue", "-h", "-t", active, "-o", "%i", check=False).stdout.split()
    if jobs:
        run("scancel", *jobs, check=False)
    deadline = time.monotonic() + timeout_s
    while jobs and time.monotonic() < deadline:
        time.sleep(0.5)
        jobs = run("squeue", "-h", "-t", active, "-o", "%i", check=False).stdout.split()


def squeue() -> list[dict]:
    """Every job slurmctld knows (MinJobAge keeps finished ones for 10 minutes)."""
    fmt = ",".join(f"{f}:400|" for f in SQUEUE_FIELDS)
    out = run("squeue", "-h", "-t", "all", "-O", fmt).stdout
    return [dict(zip(SQUEUE_FIELDS, (v.strip() for v in line.split("|")))) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def slurm_run(slurm, tmp_path_factory):
    """tiny.yaml through the SLURM profile; page1 asks for one GPU (the reference engine ignores it)."""
    work = copy_workflow(tmp_path_factory.mktemp("slurm-wf"))
    config = yaml.safe_load(TINY.read_text())
    config["configurations"]["page1"]["resources"] = {"gpus": 1}
    (work / "tiny.yaml").write_text(yaml.safe_dump(config))
    before = {job["JobID"] for job in squeue()}
    cmd = ["timeout", "-k", "10", str(RUN_TIMEOUT_S), sys.executable, "-m", "snakemake", "--profile", "profiles/slurm",
           "--configfile", "tiny.yaml",  # the default target, as the local run: the PDF and its twin
           # the test node's CPUs; no accounting (no slurmdbd); status 2 s after a submission, then 10 s longer each
           # time none finished (2, 12, 22 s: the kernel builds and the bench jobs take 10 to 15 s here); the jobs' logs
           "--cores", "1", "--slurm-no-account", "--slurm-init-seconds-before-status-checks", "2",
           "--slurm-keep-successful-logs"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=ENV, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the SLURM run failed (exit {proc.returncode}):\n{out[-6000:]}\n{logs(slurm)}"
    jobs = [job for job in squeue() if job["JobID"] not in before]
    return {"work": work, "out": out, "jobs": jobs, "seconds": time.monotonic() - t0, "config": lcfg.validate(config)}


def test_bench_jobs_calibration_and_kernel_build_went_through_sbatch_and_the_rest_stayed_local(slurm_run):
    jobs = {job["Comment"]: job for job in slurm_run["jobs"]}
    assert set(jobs) == {*(f"rule_build_kernel_wildcards_{k}" for k in ("paged_mla_decode_torch", "paged_mla_decode_twin")),
                         "rule_calibrate_hardware", "rule_bench_kernel_wildcards_paged_mla_decode_twin",
                         *(f"rule_bench_configuration_wildcards_{c}" for c in ("page1", "page16", "page16-ngram"))}, jobs
    assert jobs["rule_calibrate_hardware"]["tres-per-job"] == "N/A"  # the reference engine computes on the CPU
    assert all(job["State"] == "COMPLETED" and job["NodeList"] == "localhost" for job in jobs.values()), jobs
    for job in jobs.values():  # the plugin's own log of each SLURM job, kept by --slurm-keep-successful-logs
        rule, _, wildcard = job["Comment"].removeprefix("rule_").partition("_wildcards_")
        assert (slurm_run["work"] / "data" / "logs" / "slurm" / f"rule_{rule}" / wildcard / f"{job['JobID']}.log").is_file()
    for rule in ("aggregate_results", "fit_models", "plan_memory", "plot_figures", "render_report",
                 "build_pdf", "render_markdown"):
        assert f"localrule {rule}:" in slurm_run["out"]


def test_each_bench_job_asked_for_its_gpus_memory_and_time(slurm_run):
    for configuration in ("page1", "page16", "page16-ngram"):
        job = next(j for j in slurm_run["jobs"] if j["Comment"].endswith(f"_wildcards_{configuration}"))
        want = bench_resources(slurm_run["config"], configuration)
        assert job["tres-per-job"] == ("gres:gpu:1" if configuration == "page1" else "N/A"), job
        assert want["gpu"] == (1 if configuration == "page1" else 0)
        assert job["MinMemory"] == f"{want['mem_mb']}M", job
        hours, minutes = divmod(want["runtime"], 60)
        assert job["TimeLimit"] == (f"{hours}:{minutes:02d}:00" if hours else f"{minutes}:00"), job


def test_bench_jobs_shared_the_node_each_with_its_own_server_port(slurm_run):
    # page1 and page16-ngram wait for the same (quick) kernel build, so they run at once; page16 waits
    # for the CPU twin's compilation and may start later
    benches = [j for j in slurm_run["jobs"] if j["Comment"].endswith(("_wildcards_page1", "_wildcards_page16-ngram"))]
    spans = [(datetime.fromisoformat(j["StartTime"]), datetime.fromisoformat(j["EndTime"])) for j in benches]
    assert len(spans) == 2 and max(start for start, _ in spans) < min(end for _, end in spans), f"the bench jobs did not overlap: {spans}"
    raw = slurm_run["work"] / "data" / "raw"
    bases = {c: json.loads((raw / c / "64.json").read_text())["provenance"]["base_url"] for c in ("page1", "page16", "page16-ngram")}
    assert len(set(bases.values())) == 3, bases


def structure(work: Path) -> dict:
    """What a run produced, without the measured values."""
    def keys(obj, prefix=""):
        if isinstance(obj, dict):
            return {k for key, value in obj.items() for k in {f"{prefix}{key}", *keys(value, f"{prefix}{key}.")}}
        return set()

    df = pd.read_csv(work / "data" / "results.csv")
    return {
        "files": sorted(str(p.relative_to(work)) for d in ("data/raw", "report/figures") for p in (work / d).rglob("*")
                        if p.is_file()) + sorted(p.name for p in (work / "report").glob("longctx.*")),
        "columns": list(df.columns),
        "rows": sorted(df[["configuration", "length", "concurrency", "trial", "request", "status"]].astype(str)
                       .agg("/".join, axis=1)),
        "provenance": sorted(keys(json.loads((work / "data" / "provenance.json").read_text()))),
        "sections": re.findall(r"\\(?:sub)*section\*?\{([^}]*)\}", (work / "report" / "longctx.tex").read_text()),
    }


def test_the_slurm_run_gives_what_the_local_run_gives(slurm_run, request):
    local_run = request.getfixturevalue("tiny_workflow")  # only once SLURM ran (session fixtures come first)
    slurm, local = structure(slurm_run["work"]), structure(local_run)
    assert all(slurm.values()) and all(r.endswith("/ok") for r in slurm["rows"])
    assert "report/figures/ttft.pdf" in slurm["files"] and "longctx.pdf" in slurm["files"]
    for key in local:
        assert slurm[key] == local[key], key
    print(f"SLURM run: {slurm_run['seconds']:.1f} s")
