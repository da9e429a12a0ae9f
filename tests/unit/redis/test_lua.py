"""Unit tests of dramatiq_unique.redis.lua: every Lua script lives in a ``.lua`` file that
documents its keys and arguments, and no Python module holds Lua (no services).

The registrations are exercised with Redis clients that never connect (redis-py connects
on the first command) and with the scripts' calls stubbed out.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

import dramatiq_unique
from dramatiq_unique.broker.publish import Delivery
from dramatiq_unique.locks.redlock import Locks
from dramatiq_unique.parking.lot import Flags
from dramatiq_unique.redis import lua, scripts
from dramatiq_unique.slots.gate import SlotGate

PACKAGE = Path(dramatiq_unique.__file__).parent
NAMES = sorted(path.stem for path in (PACKAGE / "redis" / "lua").glob("*.lua"))
SCRIPTS = [name for name in NAMES if not name.startswith("_")]
FRAGMENTS = [name for name in NAMES if name.startswith("_")]
#: The modules that may make a scripts.Script: the loader, and the publisher, which runs the Redis
#: broker's own dispatch script with the queue locks in one MULTI/EXEC.
REGISTERING = {"redis/lua.py", "broker/publish.py"}


def header(text: str) -> str:
    """The comment lines a file opens with."""
    lines = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_the_scripts_are_there():
    assert len(SCRIPTS) == 19
    assert FRAGMENTS == ["_slot_prelude", "_wakeup_flag"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_names_every_key_and_argument_it_uses_in_its_header(name):
    own = header(lua.file_text(name))
    assert own.startswith(f"-- {name}: ")
    assert "Returns" in own
    used = set(re.findall(r"\b(?:KEYS|ARGV)\[\d+\]", lua.source(name)))  # fragments' code included
    assert {"KEYS[1]", "ARGV[1]"} <= used
    for ref in sorted(used):
        assert re.search(rf"^-- {re.escape(ref)} ", own, re.MULTILINE), f"{name}.lua: {ref} is not in its header"


@pytest.mark.parametrize("name", FRAGMENTS)
def test_each_fragment_says_what_takes_it_in(name):
    assert header(lua.file_text(name)).startswith(f"-- {name}: a fragment, not a script")
    takers = [script for script in SCRIPTS if f"-- #include {name}.lua\n" in lua.file_text(script)]
    assert takers, f"{name}.lua is included nowhere"


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_loaded_text_has_its_fragments_joined_without_their_headers(name):
    text = lua.source(name)
    assert "#include" not in text and "a fragment, not a script" not in text
    assert lua.source(name) is text  # read once


def test_no_python_module_of_the_package_holds_lua():
    holders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "redis.call(" in p.read_text()]
    assert holders == []


def test_only_the_loader_registers_scripts():
    callers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Script":
                if isinstance(node.func.value, ast.Name) and node.func.value.id == "scripts":
                    callers.add(path.relative_to(PACKAGE).as_posix())
    assert callers == REGISTERING


def test_every_script_the_package_registers_comes_from_a_lua_file(monkeypatch):
    registered: list[str] = []
    run_on_masters: list[str] = []
    init = scripts.Script.__init__

    def recording_init(self: scripts.Script, client: Any, text: str) -> None:
        registered.append(text)
        init(self, client, text)

    def recording_call(self: scripts.Script, keys: Any = (), args: Any = ()) -> int:
        run_on_masters.append(self.text)
        return 1

    monkeypatch.setattr(scripts.Script, "__init__", recording_init)
    monkeypatch.setattr(scripts.Script, "__call__", recording_call)
    client = redis.Redis(host="127.0.0.1", port=1)  # never connected

    Locks([client])
    Flags(client, "prefix:wakeups")
    SlotGate(SimpleNamespace(redis=client), "prefix:wakeups")  # type: ignore[arg-type]
    broker = SimpleNamespace(client=client, namespace="dramatiq", broker_id="b")
    delivery = Delivery(lambda: broker)
    plan = SimpleNamespace(broker=broker, keys=["k1", "k2"], args=["id", "body"], complete=lambda: None)
    monkeypatch.setattr(delivery, "plan", lambda message, ref=None: plan)
    delivery.send(SimpleNamespace())  # type: ignore[arg-type]

    run_on_masters.clear()  # the masters' calls only
    several = Locks([redis.Redis(host="127.0.0.1", port=port) for port in (1, 2, 3)])
    token, _ = several.acquire("n", 1000)
    assert token is not None
    several.extend("n", token, 1000)
    several.ttl("n", token)
    several.transfer("n", token, "t2", 1000)
    several.release("n", "t2")

    sources = {lua.source(name): name for name in SCRIPTS}
    assert all(text in sources for text in registered + run_on_masters)
    assert {sources[text] for text in registered} == set(SCRIPTS)  # every file is in use
    assert {sources[text] for text in run_on_masters} == {
        "lock_acquire", "lock_extend", "lock_pttl", "lock_transfer", "lock_release",
    }
