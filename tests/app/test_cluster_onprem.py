"""`ray up` for real on an on-premise cluster: cluster/onprem.yaml (Ray's local provider) over SSH to loopback.

The slow test runs cluster/README.md section 7's command block as written, from a "laptop" virtualenv, against an
sshd bound to 127.0.0.1 whose account has a home (and a `~/raybench-venv`) of its own: `ray up` sets up the head
over SSH and starts Ray there, `raybench submit` runs a 2-cell grid through the forwarded dashboard, the export
comes back with `ray rsync-down`, `ray down` stops Ray. All of it runs in PID, network and mount namespaces of its
own (`unshare`), so the head's `ray stop` sees only the rehearsal's processes, its ports and /tmp are private, and
nothing on the machine (the suite's own Ray included) is touched; where namespaces are refused it skips.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from raybench.core.analysis_config import SecondaryConfig
from raybench.core.config import dump_run_config
from tests.small_run import small_config
from tests.suite_env import MATH_THREAD_VARS, QUIET_RAY
from tests.venvs import clean_env, make_venv

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
ONPREM = CLUSTER / "onprem.yaml"
SECTION = "## 7. Your own servers over SSH: cluster/onprem.yaml"
SYSTEM_PATH = f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin{os.pathsep}/sbin"
SUITE_ENV = (*MATH_THREAD_VARS, *QUIET_RAY)  # tests/conftest.py sets them for every Ray of the suite


def readme_commands() -> str:
    """cluster/README.md section 7's one bash block: the commands a new user runs, and this test runs."""
    text = (CLUSTER / "README.md").read_text()
    assert SECTION in text, f"cluster/README.md lacks the section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```bash\n")[1:]]
    assert len(blocks) == 1, f"section 7 has one bash block, found {len(blocks)}"
    return blocks[0]


def _commands(block: str) -> list[str]:
    return [ln.split("  #", 1)[0].strip() for ln in block.splitlines() if ln.strip()]


# ---------------------------------------------------------------- the config and the README, checked fast


def test_onprem_yaml_is_a_local_provider_config_installing_the_checked_wheel_as_aws_does():
    import jsonschema
    import ray.autoscaler

    cfg = yaml.safe_load(ONPREM.read_text())
    aws = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    schema = (Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text()
    jsonschema.validate(cfg, json.loads(schema))
    provider, auth = cfg["provider"], cfg["auth"]
    assert provider["type"] == "local" and provider["head_ip"] and isinstance(provider["worker_ips"], list)
    assert auth["ssh_user"] and auth["ssh_private_key"]
    assert "available_node_types" not in cfg, "Ray's local provider refuses node types of its own (one per IP)"
    assert cfg["file_mounts"] == aws["file_mounts"], "the token and wheel folders reach every node as on AWS"
    assert cfg["setup_commands"][-1] == aws["setup_commands"][-1], "the checked-wheel install is aws.yaml's"
    assert cfg["worker_start_ray_commands"] == aws["worker_start_ray_commands"]
    head = " ".join(cfg["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=token" in head and "--dashboard-host=127.0.0.1" in head
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head


def test_readme_section_walks_the_mission_path_on_onprem_yaml():
    """Section 7 is `ray up` -> submit through the dashboard -> results fetched -> `ray down`, in that order."""
    commands = _commands(readme_commands())
    order = ["raybench cluster wheel", "ray up -y cluster/onprem.yaml", "ray dashboard --port 8266 cluster/onprem.yaml",
             "raybench submit --address http://127.0.0.1:8266 -- grid", "ray rsync-down cluster/onprem.yaml",
             "ray down -y cluster/onprem.yaml"]
    found = [next((i for i, c in enumerate(commands) if c.startswith(step)), None) for step in order]
    assert None not in found and found == sorted(found), dict(zip(order, found, strict=True))


# ---------------------------------------------------------------- the rehearsal over SSH, in namespaces


def _namespaces_refused() -> str | None:
    """Why the rehearsal cannot run here, or None."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs root on Linux (unshare of PID, network and mount namespaces, an sshd on 127.0.0.1)"
    missing = [t for t in ("unshare", "ip", "sshd", "ssh", "ssh-keygen", "rsync", "curl")
               if not shutil.which(t, path=SYSTEM_PATH)]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: openssh-server rsync curl iproute2; .ci/run installs them)"
    probe = subprocess.run(["unshare", "--pid", "--net", "--mount", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"namespaces refused here (unshare -pnmf --mount-proc: {probe.stderr.strip()[-200:]})"
    return None


def _run_config(run_dir: str):
    """2 cells (1 model x 1 depth x 2 E, the fewest the common-scale AUC takes, x 1 seed) in one Tune trial
    (trial_unit model, as the demo preset: start-up dominates tiny SAEs; tests/sae/test_grid_elastic.py spreads trials
    over nodes), from a fresh synthetic cohort of 48 records, 24 patients (its training split holds 38: SAE batches of
    32 fit it); no feature dashboards or secondary analyses, one bootstrap chunk of each kind (the path under test is
    the cluster's, not the analyses')."""
    cfg = small_config(Path(run_dir), models=("csfm",), steps=40)
    p = cfg.protocol
    return replace(cfg, protocol=replace(p, grid=replace(p.grid, depths=(1.0,), expansions=(1, 4), seeds=(4311,),
                                                         sensitivity_depth=None),
                                         sae=replace(p.sae, batch_size=32),
                                         inference=replace(p.inference, patient_draws=100, crossed_draws=100)),
                   cohort=replace(cfg.cohort, records=48, patients=24),
                   resources=replace(cfg.resources, trial_unit="model"),
                   features=replace(cfg.features, enabled=False), secondary=SecondaryConfig(analyses=())).validate()


def _checkout(tmp: Path, user: str, run_dir: str) -> Path:
    """A copy of the checkout's raybench, with onprem.yaml pointed at loopback and the run's run.yaml."""
    checkout = tmp / "checkout"
    shutil.copytree(ROOT / "raybench", checkout / "raybench", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    cfg = yaml.safe_load(ONPREM.read_text())
    cfg["provider"].update(head_ip="127.0.0.1", worker_ips=[])  # a worker here would share the head's /tmp/ray
    # ssh expands a key's `~` from /etc/passwd, which names the head's home here: the laptop's key, spelled out
    cfg["auth"].update(ssh_user=user, ssh_private_key=str(tmp / "laptop" / ".ssh" / "id_ed25519"))
    (checkout / "cluster").mkdir()
    (checkout / "cluster" / "onprem.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (checkout / "run.yaml").write_text(dump_run_config(_run_config(run_dir)))
    return checkout


def _laptop(tmp: Path, checkout: Path) -> tuple[Path, Path]:
    """The laptop's home (the cluster token, an SSH key) and its virtualenv with raybench installed from the
    checkout as cluster/README.md section 0 does (`pip install -e .`)."""
    home = tmp / "laptop"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")],
                   check=True)
    auth = home / ".raybench" / "cluster_auth"
    auth.mkdir(parents=True, mode=0o700)
    (auth / "auth_token").write_text(os.urandom(32).hex() + "\n")
    (auth / "auth_token").chmod(0o600)
    venv = tmp / "laptop-venv"
    python = make_venv(venv, scripts=("ray",))
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "-e", str(checkout)], env=clean_env(venv), check=True, capture_output=True, timeout=300)
    return home, venv


def _head(tmp: Path, user: str, laptop_home: Path) -> Path:
    """The head's account: its home (authorized key; `~/raybench-venv` made already, seeing this interpreter's
    torch and ray as a server's would after `pip install -r requirements.txt`; no package index), an
    /etc/passwd naming that home, and an sshd config for 127.0.0.1:22 in the rehearsal's network namespace."""
    home = tmp / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy(laptop_home / ".ssh" / "id_ed25519.pub", home / ".ssh" / "authorized_keys")
    # a sandboxed server: no package index, no usage stats (Ray Data's collection actor: a process of its own), no
    # workers prestarted for the first driver (the submitted job's tasks need workers with its working_dir); and the
    # suite's settings for every Ray it starts (tests/conftest.py: one math thread per process, Ray's background
    # metrics and polling quieted), which sshd does not pass on: the head's Ray is the suite's like any other
    suite = " ".join(f"{k}={shlex.quote(os.environ[k])}" for k in SUITE_ENV if k in os.environ)
    (home / ".bashrc").write_text("export PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1\n"
                                  "export RAY_USAGE_STATS_ENABLED=0 RAY_prestart_worker_first_driver=0\n"
                                  + (f"export {suite}\n" if suite else ""))
    make_venv(home / "raybench-venv", scripts=("ray",))
    entries = []
    for line in Path("/etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            fields[5], fields[6] = str(home), "/bin/bash"
        entries.append(":".join(fields))
    (tmp / "passwd").write_text("\n".join(entries) + "\n")
    sshd = tmp / "sshd"
    sshd.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(sshd / "host_key")], check=True)
    (sshd / "sshd_config").write_text("\n".join([
        "ListenAddress 127.0.0.1", "Port 22", f"HostKey {sshd / 'host_key'}", f"PidFile {sshd / 'sshd.pid'}",
        f"AuthorizedKeysFile {home / '.ssh' / 'authorized_keys'}", f"AllowUsers {user}",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no",  # the test's folder lies under /tmp
        "Subsystem sftp internal-sftp", ""]))
    return home


# Runs as PID 1 of the new namespaces. /tmp and /run become private tmpfs (the test's folder and the other folders
# under /tmp it is given mounted back where they were), /etc/passwd names the head's home, sshd listens on the
# namespace's loopback, then the README's block runs.
NAMESPACE_SCRIPT = """set -euo pipefail
T=$1; shift
ip link set lo up
mount --bind /tmp /mnt
mount -t tmpfs tmpfs /tmp
for keep in "$T" "$@"; do
  case "$keep" in /tmp/*) mkdir -p "$keep" && mount --bind "/mnt/${keep#/tmp/}" "$keep";; esac
done
mount -t tmpfs tmpfs /run && mkdir -p -m 755 /run/sshd
mount --bind "$T/passwd" /etc/passwd
"$(PATH=$PATH:/usr/sbin:/sbin command -v sshd)" -f "$T/sshd/sshd_config" -E "$T/sshd/sshd.log"
python3 "$T/fake_index.py" 8999 &  # the package index `raybench cluster wheel` reads its pinned hashes from
export PIP_INDEX_URL=http://127.0.0.1:8999/simple
cd "$T/checkout"
rc=0
bash -e -x "$T/readme.sh" > "$T/readme.log" 2>&1 || rc=$?
ps -eo pid,args > "$T/ps-after.txt"
exit $rc
"""


def _interpreter_under_tmp() -> list[str]:
    """The running interpreter's folders that lie under /tmp (a suite run from a virtualenv made there): the
    namespaces' private /tmp would hide them from the venvs made by tests/venvs.py, which import from them."""
    import site

    dirs = sorted({str(Path(d).resolve()) for d in (sys.prefix, sys.base_prefix, *site.getsitepackages())})
    under = [d for d in dirs if d.startswith("/tmp/")]
    return [d for d in under if not any(d.startswith(o + "/") for o in under)]


def test_the_rehearsal_says_why_it_cannot_run(monkeypatch):
    """Where namespaces or the tools are missing the rehearsal skips, and its reason names what to change."""
    import types

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in _namespaces_refused()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool, path=None: None if tool in ("sshd", "rsync") else tool)
    assert _namespaces_refused().startswith("sshd, rsync not installed") and "openssh-server" in _namespaces_refused()
    monkeypatch.setattr(shutil, "which", lambda tool, path=None: tool)
    refused = types.SimpleNamespace(returncode=1, stderr="unshare: unshare failed: Operation not permitted\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: refused)
    assert _namespaces_refused() == ("namespaces refused here (unshare -pnmf --mount-proc: unshare: unshare failed: "
                                     "Operation not permitted)")


@pytest.mark.slow
@pytest.mark.timeout(900)  # 520-576 s on the 2-core Intel VM shared by 9 agents (load 35-50); the suite's is 600
def test_ray_up_submit_fetch_and_ray_down_on_an_onprem_cluster_over_ssh(tmp_path):
    reason = _namespaces_refused()
    if reason:
        pytest.skip(f"the on-prem rehearsal {reason}")
    t0 = time.perf_counter()
    tmp = tmp_path
    user = pwd.getpwuid(os.getuid()).pw_name
    head_home = tmp / "home"
    run_dir = str(head_home / "runs" / "onprem")
    checkout = _checkout(tmp, user, run_dir)
    laptop_home, laptop_venv = _laptop(tmp, checkout)
    _head(tmp, user, laptop_home)
    (tmp / "readme.sh").write_text(readme_commands())
    (tmp / "ns.sh").write_text(NAMESPACE_SCRIPT)
    shutil.copy(Path(__file__).resolve().parents[1] / "fake_index.py", tmp / "fake_index.py")
    env = {k: v for k, v in clean_env(laptop_venv).items() if not k.startswith(("RAY_", "RAYBENCH_"))}
    env.update(HOME=str(laptop_home), TMPDIR=str(tmp / "laptop-tmp"), RUN_DIR=run_dir)
    (tmp / "laptop-tmp").mkdir()
    prepared = time.perf_counter() - t0

    # outside the namespaces, a process `ray stop` would end (it matches the name "raylet"): it must survive
    (tmp / "bin").mkdir()
    (tmp / "bin" / "raylet").symlink_to(shutil.which("sleep"))
    bystander = subprocess.Popen([str(tmp / "bin" / "raylet"), "900"])
    try:  # --kill-child: when unshare is killed (the timeout), everything in the namespaces dies with it
        proc = subprocess.run(["unshare", "--pid", "--net", "--mount", "--fork", "--mount-proc", "--kill-child",
                               "bash", str(tmp / "ns.sh"), str(tmp), *_interpreter_under_tmp()], env=env,
                              capture_output=True, text=True,
                              timeout=840)
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired:
        rc, err = "timed out after 840 s", ""
    finally:
        survived = bystander.poll() is None
        bystander.kill()
        bystander.wait()
    log = (tmp / "readme.log").read_text() if (tmp / "readme.log").exists() else ""
    sshd_log = (tmp / "sshd" / "sshd.log").read_text() if (tmp / "sshd" / "sshd.log").exists() else ""
    assert rc == 0, f"rc {rc}\n{err[-2000:]}\n--- README block:\n{log[-8000:]}\n--- sshd:\n{sshd_log[-2000:]}"

    assert "raybench-onprem" in log and "SUCCEEDED" in log, log[-4000:]
    assert "2/2 cells ok" in log, log[-4000:]
    fetched = checkout / "onprem-export"
    for rel in ("report.html", "EXPORT.json", "tables/cells.parquet", "run.yaml"):
        assert (fetched / rel).is_file(), f"{rel} did not come back with ray rsync-down"
    cells = pd.read_parquet(fetched / "tables" / "cells.parquet")
    assert len(cells) == 2 and (cells["status"] == "ok").all()
    assert not (fetched / "manifest").exists(), "only the export leaves the head"
    assert (Path(run_dir) / "manifest" / "manifest.parquet").exists(), "the run folder stayed on the head"
    installed = list((head_home / "raybench-venv").glob("lib/python*/site-packages/raybench/__init__.py"))
    assert installed, "the head's raybench came from the shipped wheel, installed into ~/raybench-venv"
    assert survived, "the head's `ray stop` reached a process outside the rehearsal's namespaces"
    left = (tmp / "ps-after.txt").read_text()
    assert not any(name in left for name in ("raylet", "gcs_server")), f"ray down left Ray running:\n{left}"
    print(f"\non-prem rehearsal: {time.perf_counter() - t0:.0f} s ({prepared:.0f} s preparing the laptop and head)")
