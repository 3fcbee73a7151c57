"""The development sessions: ``nox -l`` lists them, ``nox -s NAME`` runs one.

- ``tests-3.12(asyncio)``: the test suite on one interpreter (3.11 to 3.15,
  those found on ``PATH`` as ``python3.X``) with one asyncio loop: ``asyncio``
  (a plain loop), ``eager`` (:func:`asyncio.eager_task_factory`, 3.12+) or
  ``uvloop``. Every async test also runs on trio in each. ``nox -s tests-3.12``
  runs the three loops of 3.12. The checks of files that read the same on
  every interpreter and loop (marker ``docs``) run in ``docs``, the benchmark
  scripts' smoke tests (marker ``benchmarks``) in ``benchmarks``; arguments
  after ``--`` go to pytest (``nox -s "tests-3.13(asyncio)" -- -m redis``).
- ``lint``: ruff check and ruff format --check.
- ``typecheck``: pyright, strict on ``src/``.
- ``docs``: the Sphinx docs with warnings as errors, their doctests, and the
  tests marked ``docs`` (README, API reference, types of the examples,
  packaging, import layers).
- ``benchmarks``: the tests marked ``benchmarks``: every benchmark script in
  quick mode, and the committed report checked against its result files.
- ``release``: the sdist and the wheel built in isolation, ``twine check
  --strict``, and the wheel installed in a fresh venv outside the checkout,
  where the demo and ``import wool_pooling.redis`` must work.

A session installs the project with the extras it needs (see
``pyproject.toml``). ``WOOL_POOLING_REQUIRE_REDIS=1`` and
``WOOL_POOLING_REQUIRE_TOOLS=1`` (CI sets both) turn the skip of a test that
lacks a redis-server or a tool into a failure.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "typecheck", "docs", "benchmarks", "release"]

PYTHONS = ["3.11", "3.12", "3.13", "3.14", "3.15"]
LOOPS = ["asyncio", "eager", "uvloop"]
CHECKED = ["src", "tests", "benchmarks", "examples", "noxfile.py"]


@nox.session(python=PYTHONS)
@nox.parametrize("loop", LOOPS, ids=LOOPS)
def tests(session: nox.Session, loop: str) -> None:
    """The suite on one interpreter and asyncio loop (and on trio)."""
    if loop == "eager" and session.python == "3.11":
        session.skip("asyncio.eager_task_factory needs CPython 3.12+")
    session.install("-e", ".[test]")
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        "-m",
        "not docs and not benchmarks",
        *session.posargs,
        env={"WOOL_POOLING_TEST_LOOP": loop},
    )


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff>=0.6,<0.18")
    session.run("ruff", "check", *CHECKED)
    session.run("ruff", "format", "--check", *CHECKED)


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """pyright, strict on src/ (the configuration in pyproject.toml)."""
    session.install("-e", ".[dev]")
    session.run("pyright", "--pythonpath", str(Path(session.bin) / "python"))


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """The docs (-W: a warning fails), their doctests, and the file checks."""
    session.install("-e", ".[dev]")
    out = Path(tempfile.mkdtemp(prefix="wool-pooling-docs-"))
    try:
        for builder in ("html", "doctest"):
            session.run(
                "sphinx-build", "-W", "--keep-going", "-q", "-b", builder,
                "docs", str(out / builder),
            )  # fmt: skip
    finally:
        shutil.rmtree(out, ignore_errors=True)
    session.run("python", "-m", "pytest", "-q", "-m", "docs", *session.posargs)


@nox.session(python=PYTHONS)
def benchmarks(session: nox.Session) -> None:
    """The benchmark scripts in quick mode, and the committed report."""
    session.install("-e", ".[test,bench]")
    # (their timeout, longer than the suite's, is the test module's own)
    session.run("python", "-m", "pytest", "-q", "-m", "benchmarks", *session.posargs)


@nox.session(python="3.11")
def release(session: nox.Session) -> None:
    """Build, check, and install the wheel where a stranger would."""
    session.install("build>=1.2,<2", "twine>=6.1,<8")
    work = Path(tempfile.mkdtemp(prefix="wool-pooling-release-"))
    try:
        dist = work / "dist"
        session.run("python", "-m", "build", "--outdir", str(dist), ".")
        session.run("twine", "check", "--strict", *map(str, dist.iterdir()))
        venv = work / "venv"
        session.run("python", "-m", "venv", str(venv))
        python = str(venv / "bin" / "python")
        wheel = next(dist.glob("wool_pooling-*.whl"))
        session.run(
            python, "-m", "pip", "install", "-q", f"{wheel}[redis]", external=True
        )
        with session.chdir(work):
            session.run(python, "-m", "wool_pooling", silent=True, external=True)
            session.run(
                python,
                "-c",
                "import wool_pooling.redis, wool_pooling; "
                "print('installed wheel:', wool_pooling.__version__, "
                "wool_pooling.__file__)",
                external=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
