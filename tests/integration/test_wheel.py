"""The built wheel ships the Lua scripts (and the dashboard's templates), and the loader reads
the scripts from it (no services;
in integration for the time a build takes).

The scripts are package data, not modules: a wheel without them would import and then
fail on the first lock.  Built offline from a copy of the sources, so nothing is written
into the checkout; ``--no-build-isolation`` uses the installed setuptools and wheel (the
``test`` extra).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "dramatiq_unique" / "redis" / "lua"


def build_wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "dramatiq_unique", src / "dramatiq_unique", ignore=shutil.ignore_patterns("__pycache__"))
    command = [
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "--disable-pip-version-check", "--quiet", "-w", str(tmp_path / "dist"), str(src),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("dramatiq_unique-*.whl")
    return wheel


def test_the_wheel_ships_every_lua_file_and_the_loader_reads_them_from_it(tmp_path):
    wheel = build_wheel(tmp_path)
    files = sorted(path.name for path in LUA.glob("*.lua"))
    assert len(files) >= 20
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert [name for name in files if f"dramatiq_unique/redis/lua/{name}" not in shipped] == []
    # The dashboard's templates and stylesheet are package data too (the web extra).
    web = ROOT / "dramatiq_unique" / "web"
    data = sorted(str(path.relative_to(ROOT)) for folder in ("templates", "static")
                  for path in (web / folder).iterdir())
    assert len(data) >= 8 and [path for path in data if path not in shipped] == []

    # Imported from the wheel itself (a zip on sys.path): every script loads, fragments joined.
    check = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from dramatiq_unique.redis import lua\n"
        "assert lua.__file__.startswith(sys.argv[1]), lua.__file__\n"
        "folder = lua.resources.files(lua.PACKAGE) / 'lua'\n"
        "names = [e.name[:-4] for e in folder.iterdir() if e.name.endswith('.lua')]\n"
        "assert all('#include' not in lua.source(n) for n in names if not n.startswith('_'))\n"
        "print(len(names))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", check, str(wheel)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert int(result.stdout) == len(files)
