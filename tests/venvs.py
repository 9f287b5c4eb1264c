"""Virtualenvs for tests that run installed commands the way a node or a laptop does (only the standard library, so a
virtualenv's own interpreter can import this file too).

A test venv must see the packages of the interpreter running the suite (torch and ray are too big to install per
test). `python -m venv --system-site-packages` does not give that when the suite itself runs from a virtualenv: the
new venv is linked to the *base* interpreter's site-packages, not to the running venv's, so a newcomer's
`python3 -m venv` + `pip install -e ".[test]"` saw ray vanish in the nested venv (issue 40 item 0). Here a .pth
file in the new venv adds the running interpreter's own site directories after the venv's, so whatever a test
installs into the new venv still comes first, and the result is the same from a venv and from the system python.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

PTH_NAME = "_running_interpreter_site.pth"  # sorts after `__editable__*.pth`: the venv's own editable installs win


def running_site_dirs() -> list[str]:
    """The site directories of the running interpreter: its venv's (and, with --system-site-packages, its base's),
    plus the user site when that is on."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def venv_site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def make_venv(venv: Path, scripts: tuple[str, ...] = ()) -> Path:
    """A virtualenv at `venv` (no pip of its own: `python -m pip` is the running interpreter's, installing into
    the venv) that sees the running interpreter's packages, with console scripts in its bin/ for the named
    entry points (`ray`, say: a node's shell finds them on PATH as after `pip install ray`). Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    lines = [f"import site; site.addsitedir({d!r})\n" for d in running_site_dirs()]
    (venv_site_packages(venv) / PTH_NAME).write_text("".join(lines))
    python = venv / "bin" / "python"
    for name in scripts:
        (ep,) = entry_points(group="console_scripts", name=name)
        module, _, attr = ep.value.partition(":")
        script = venv / "bin" / name
        script.write_text(f"#!{python}\nimport sys\nimport {module} as m\n"
                          f"sys.exit(m.{attr.strip() or 'main'}())\n")
        script.chmod(0o755)
    return python


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """os.environ as a shell inside `venv` sees it after `activate`, with no package index at all (PIP_NO_INDEX=1,
    no pip configuration: no find-links, no extra index) and no PYTHONPATH, so imports come from the venv."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), **extra)
    return env
