"""pip install <checkout> into a new virtualenv outside the tree, then `brooq migrate up`
and down to zero: the migrations ship inside the wheel."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

from tests.db.test_migrate import brooq_objects

ROOT = Path(__file__).resolve().parents[2]


def test_installed_package_migrates_outside_the_source_tree(tmp_path: Path, empty_dsn: str) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    brooq_cli = env_dir / "bin" / "brooq"
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(brooq_cli), "--database", empty_dsn, *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=workdir,
        )

    assert run("--version").stdout.startswith("brooq, version")
    out = run("migrate", "up")
    assert out.returncode == 0, out.stderr
    assert "relation job" in brooq_objects(empty_dsn)
    where = subprocess.run(
        [str(python), "-c", "import brooq.migrate as m; print(m.migrations_dir())"],
        capture_output=True,
        text=True,
        cwd=workdir,
        check=True,
    ).stdout
    assert str(env_dir) in where and str(ROOT) not in where
    # Typed for the users' type checkers (PEP 561), and under its licence.
    site = Path(where.strip()).parent.parent
    assert (site / "brooq" / "py.typed").is_file()
    assert list(site.glob("brooq-*.dist-info/licenses/LICENSE"))
    while "nothing to revert" not in run("migrate", "down").stdout:
        pass
    assert brooq_objects(empty_dsn) == []


def test_the_sdist_carries_what_the_readme_links_to(tmp_path: Path) -> None:
    """Every file of the repository the README links to is in the source distribution,
    with the licence."""
    import re
    import sys
    import tarfile

    built = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (sdist,) = tmp_path.glob("brooq-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    readme = (ROOT / "README.md").read_text()
    linked = {
        target.split("#")[0]
        for target in re.findall(r"\]\(([^)\s]+)\)", readme)
        if "://" not in target and not target.startswith("#")
    }
    assert linked, "the README links to no file"
    missing = sorted(t for t in linked if (ROOT / t).is_file() and t not in names)
    assert missing == [] and "LICENSE" in names, missing
