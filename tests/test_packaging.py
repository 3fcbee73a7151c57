"""What the built distributions carry: the license, the metadata, a long
description that reads on a package index page.

The sdist and the wheel are built once, with the installed ``build`` and
``hatchling`` (no network); ``.ci/run`` builds them again in isolation,
runs ``twine check --strict`` and installs the wheel into a fresh venv.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from _tools import require_modules

import wool_pooling

MISSING_TOOLS = require_modules("build", "hatchling", extra="release")

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REPOSITORY = PROJECT["urls"]["Source"]
#: A Markdown link or image target: ``[text](target)``.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def test_repository_has_the_mit_license_text() -> None:
    """``LICENSE`` at the root is the MIT license ``pyproject.toml`` declares."""
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Permission is hereby granted, free of charge" in text
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]


def test_wheel_metadata_names_the_license_file_it_carries(dist: Path) -> None:
    """The wheel's METADATA says ``License-Expression: MIT`` and
    ``License-File: LICENSE``, and the file is in its ``.dist-info``."""
    (wheel,) = dist.glob("wool_pooling-*.whl")
    metadata = _wheel_metadata(wheel)
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(wheel) as archive:
        (licensed,) = [
            n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")
        ]
        assert archive.read(licensed) == (ROOT / "LICENSE").read_bytes()


def test_sdist_carries_the_license(dist: Path) -> None:
    """The sdist has ``LICENSE`` at its root, next to ``pyproject.toml``."""
    (sdist,) = dist.glob("wool_pooling-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "pyproject.toml", "README.md"} <= names


def test_wheel_long_description_is_the_readme_with_project_urls(dist: Path) -> None:
    """The package index page shows the README, and links to the repository."""
    (wheel,) = dist.glob("wool_pooling-*.whl")
    metadata = _wheel_metadata(wheel)
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    assert f"Source, {REPOSITORY}" in metadata.get_all("Project-URL")


def test_readme_links_are_absolute_so_they_work_on_a_package_index_page() -> None:
    """Every link and image of the README is an absolute ``https://`` URL, and
    one into the repository names a file that exists in it."""
    targets = LINK.findall((ROOT / "README.md").read_text())
    assert targets
    for target in targets:
        assert target.startswith("https://"), target
        for prefix in (f"{REPOSITORY}/blob/main/", f"{REPOSITORY}/tree/main/"):
            if target.startswith(prefix):
                path = target.removeprefix(prefix).split("#")[0]
                assert (ROOT / path).exists(), target
        raw = REPOSITORY.replace("github.com", "raw.githubusercontent.com") + "/main/"
        if target.startswith(raw):
            assert (ROOT / target.removeprefix(raw)).is_file(), target


def test_version_comes_from_the_installed_metadata() -> None:
    """``wool_pooling.__version__`` is the installed distribution's version."""
    assert wool_pooling.__version__ == importlib.metadata.version("wool-pooling")
    assert wool_pooling.__version__ == PROJECT["version"]


def test_ci_builds_checks_and_installs_the_wheel_outside_the_repository() -> None:
    """The ``release`` session builds both distributions, runs ``twine check
    --strict``, installs the wheel (not editable) into a fresh venv outside
    the checkout and runs the demo and ``import wool_pooling.redis`` with it;
    ``.ci/run`` runs that session."""
    noxfile = (ROOT / "noxfile.py").read_text()
    release = noxfile[noxfile.index("def release(") :]
    for step in (
        '"python", "-m", "build", "--outdir"',
        '"twine", "check", "--strict"',
        '"python", "-m", "venv", str(venv)',
        '"install", "-q", f"{wheel}[redis]"',
        'python, "-m", "wool_pooling"',
        '"import wool_pooling.redis, wool_pooling; "',
        "with session.chdir(work):",
    ):
        assert step in release, step
    assert '"-e"' not in release
    assert " release\n" in (ROOT / ".ci" / "run").read_text()


def test_ci_runs_the_readme_test_command_first_then_the_nox_sessions() -> None:
    """``.ci/run`` runs the README's test command verbatim before any nox
    session, and every session ``nox -l`` lists by default runs in CI."""
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^python3 -m venv \.venv && .*pytest -q$", readme, re.M)
    assert command is not None
    script = (ROOT / ".ci" / "run").read_text()
    first_nox = script.index('"${nox[@]}" -s')
    assert script.index(command.group(0)) < first_nox
    for session in ("lint", "typecheck", "docs", "benchmarks-3.11", "release"):
        assert session in script[first_nox:], session
    assert '"tests-3.13(asyncio)"' in script
    for python in ("3.14", "3.15"):
        assert f'"tests-{python}(asyncio)"' in script, python
