"""A script or ``-m`` module as a capture target: run fresh as ``__main__`` in every rank, its imports paid once.

Why: ``simnccl capture --world 512 train.py`` forks 512 ranks, and each used to import the script's framework
itself (Megatron-Core: ~5 s a rank, 512 ranks ~40 minutes of CPU). Importing is what a fork can share, so a
fork server (``simnccl.capture.forkserver``) runs ``ScriptTarget.preload_in()`` once and forks every rank from
the result; each rank still runs the whole script as ``__main__``, with its own environment, and finds the
modules already in ``sys.modules``.

What is preloaded, and why only that: the script's *leading imports* — the ``import``/``from ... import``
statements at the top of the module, before the first statement that does anything else (``try`` blocks of imports
count; docstrings, ``from __future__`` and plain ``def`` statements, with no decorators and constant defaults, are
skipped over, as they run no code). Every rank executes exactly those imports first, before any line of its own, so
importing them earlier in the server changes nothing a rank could see — except the environment, which differs per
rank: the preload runs with the environment all ranks share (``WORLD_SIZE``, ``MASTER_ADDR``... and ``--env``), not
``RANK``/``LOCAL_RANK``/``GROUP_RANK``, and watches ``os.environ``. A module that reads one of those at import may
hold per-rank state, so the preload is refused (``PreloadRefused``) and every rank imports the script's modules
itself, as before. An import after the script's own first statement (say, after ``os.environ["X"] = "1"``) or
inside a function is not preloaded: the rank imports it, in order. Imports that fail are left to the rank, which
then reports the error itself.

A module that keeps a copy of the whole environment at import (``ENV = dict(os.environ)``, a module-level mapping
holding every variable) is refused too: its copy lacks the per-rank variables, so a later ``ENV.get("RANK")`` would
give every rank the same answer. Walks that keep no such copy are not refused (libraries scan the environment for
their own prefixes).

Limits: a copy kept deeper than a module global (in an object's attribute) is not seen; environment reads below
Python (``getenv`` in a C extension at load time) are not seen; a script whose imports depend on such reads can be
captured with preloading off (``script_target(..., preload=False)``, ``simnccl capture --no-preload``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import os
import runpy
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simnccl.env_knobs import PER_RANK_VARIABLES  # the environment torchrun gives each rank its own value of


class PreloadRefused(Exception):
    """Importing the script's modules ahead of the ranks could give them state that is not theirs."""


@dataclass(frozen=True)
class ScriptTarget:
    """``-m module`` or ``script.py`` run as ``__main__`` with ``argv``; fresh in each rank.

    ``preload``: the fork server may import the leading imports once before forking the ranks (see above).
    """

    module: str | None
    path: str | None
    argv: Sequence[str] = ()
    preload: bool = True
    imported: list[str] = field(default_factory=list, compare=False)  # what preload() imported, in order

    def __call__(self) -> dict[str, Any]:
        """Run the script; returns the module's globals, which a captured ``step`` receives."""
        saved = sys.argv[:]
        try:
            with self.importing():
                if self.module is not None:
                    sys.argv = [self.module, *self.argv]
                    return runpy.run_module(self.module, run_name="__main__", alter_sys=True)
                assert self.path is not None
                sys.argv = [self.path, *self.argv]
                return runpy.run_path(self.path, run_name="__main__")
        finally:
            sys.argv = saved

    @contextlib.contextmanager
    def importing(self) -> Iterator[None]:
        """``sys.path`` as ``python script.py`` (the script's directory first) or ``python -m module`` (the working
        directory first) gives it, and the modules of that directory found there: one named like a module the
        capturing process imported already (``profile.py`` beside the script: the standard library's is loaded)
        is out of ``sys.modules`` meanwhile, so the script imports its own, as it would alone.

        Why: ``runpy`` adds neither directory, and a script importing a module beside it (``from common import
        init``) failed the capture with ModuleNotFoundError where torchrun runs it. The rank runs inside this
        (``ranks``), so its exit handlers and a ``--step`` import there too."""
        first = self.directory()
        sys.path.insert(0, first)
        shadowed = {name: sys.modules.pop(name) for name in _shadowed_by(first)}
        try:
            yield
        finally:
            for name, module in shadowed.items():
                sys.modules[name] = module  # the capturing process goes on with its own
            with contextlib.suppress(ValueError):
                sys.path.remove(first)  # the one inserted: the first equal entry from the front is it

    def shadows_torch_imports(self) -> str | None:
        """What is wrong where a module beside the script (``json.py``) is named like one ``import torch`` loads: run
        alone, torch's own import finds that file first and fails or changes. The capturing process imported torch
        before the script's directory was on ``sys.path``, so its ranks ran where the real processes cannot: a
        capture that passed. None where nothing is shadowed so (or where what ``import torch`` loads is unknown)."""
        directory = self.directory()
        shadowed = _shadowed_by(directory)
        loaded = _loaded_by_import_torch() if shadowed else None
        found = [f"{name}.py" for name in shadowed if loaded is not None and name in loaded]
        if not found:
            return None
        one = len(found) == 1
        return (
            f"{', '.join(found)} beside the script {'has' if one else 'have'} the name of a module import torch "
            f"loads: run alone (python {self.path or '-m ' + str(self.module)}), torch would import "
            f"{'it' if one else 'them'} from {directory!r}, first on sys.path; rename {'it' if one else 'them'}"
        )

    def directory(self) -> str:
        """The directory ``python`` puts first on ``sys.path`` for this target (``importing``)."""
        return os.getcwd() if self.module is not None else os.path.dirname(os.path.realpath(str(self.path)))

    def leading_imports(self) -> list[str]:
        """The modules the script imports before its first own statement, in order (parent packages first).

        ``"pkg.mod:name"`` stands for ``from pkg.mod import name``: a submodule ``pkg.mod.name`` is imported only
        if ``pkg.mod`` has no attribute ``name``, as Python's own ``from ... import`` does (importing it anyway
        would rebind the attribute to the submodule).
        """
        if self.module is None:
            source_path = self.path
        else:
            with self.importing():
                source_path = _module_origin(self.module)
        names: list[str] = []
        if self.module is not None:  # runpy imports the module's parent packages before running it
            parts = self.module.split(".")[:-1]
            names += [".".join(parts[: i + 1]) for i in range(len(parts))]
        if source_path is None:
            return names
        try:
            tree = ast.parse(Path(source_path).read_bytes(), source_path)
        except (OSError, SyntaxError, ValueError):
            return names  # the rank runs it and reports the error
        for statement in tree.body:
            found = _imports_of(statement)
            if found is None:
                break
            names += [n for n in found if n not in names]
        return names

    def preload_in(self, environment: Mapping[str, str]) -> list[str]:
        """Import the leading imports with ``environment`` as ``os.environ`` and this target's ``sys.argv``.

        Returns the modules imported; raises ``PreloadRefused`` when an import read a per-rank variable.
        """
        wanted = self.leading_imports()
        saved_argv = sys.argv[:]
        sys.argv = [self.module or self.path or "", *self.argv]
        try:
            with self.importing(), _watched_environment(environment) as (reads, walks):
                for name in wanted:
                    before = set(sys.modules)
                    with contextlib.suppress(Exception):  # the rank imports it again and reports the error
                        if _import(name):
                            self.imported.append(name)
                    if reads:
                        raise PreloadRefused(
                            f"importing {name!r} read {', '.join(sorted(reads))} from the environment, which differs "
                            "per rank: every rank imports the script's modules itself"
                        )
                    copy = _environment_copy(set(sys.modules) - before, environment) if walks else None
                    walks.clear()
                    if copy is not None:
                        raise PreloadRefused(
                            f"importing {name!r} kept a copy of the environment ({copy}), made without "
                            f"{'/'.join(PER_RANK_VARIABLES)}, which differ per rank: every rank imports the script's "
                            "modules itself"
                        )
        finally:
            sys.argv = saved_argv
        return list(self.imported)


def _import(name: str) -> bool:
    """Import ``name`` (``"pkg.mod:attr"``: the submodule only where ``from pkg.mod import attr`` would);
    False when there was nothing to import."""
    module, _, attribute = name.partition(":")
    if not attribute:
        importlib.import_module(module)
        return True
    parent = sys.modules.get(module)
    if parent is None or hasattr(parent, attribute):
        return False
    importlib.import_module(f"{module}.{attribute}")
    return True


def _shadowed_by(directory: str) -> list[str]:
    """The loaded top-level modules that a module file or package in ``directory`` would shadow on a fresh
    interpreter: found on the path (not built in or frozen), from elsewhere."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    names = {e[:-3] for e in entries if e.endswith(".py")}
    names |= {e for e in entries if os.path.isfile(os.path.join(directory, e, "__init__.py"))}
    found = []
    for name in sorted(names & set(sys.modules)):
        origin = getattr(getattr(sys.modules[name], "__spec__", None), "origin", None)
        if origin and os.path.isabs(origin) and not os.path.realpath(origin).startswith(directory + os.sep):
            found.append(name)
    return found


@functools.cache
def _loaded_by_import_torch() -> frozenset[str] | None:
    """The modules a fresh ``import torch`` loads, asked of a fresh interpreter once per process (a few seconds;
    only where a module beside a script shadows a loaded one). Why not this process's: what other code loaded
    since (a test suite, simnccl) is not what the script's own ``import torch`` would. None: could not tell."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import sys, torch; print(*sorted(sys.modules), sep=chr(10))"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=os.path.dirname(sys.executable) or None,  # not a directory of the user's that could shadow
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return frozenset(done.stdout.split()) if done.returncode == 0 else None


def script_target(module: str | None, path: str | None, argv: Sequence[str], *, preload: bool = True) -> ScriptTarget:
    """A target running ``-m module`` or ``script.py`` as ``__main__`` with ``argv`` (fresh in each rank).

    ``preload=False``: every rank imports the script's modules itself (slower; see this module's docstring).
    """
    return ScriptTarget(module, path, tuple(argv), preload)


def _module_origin(module: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    if spec.submodule_search_locations is not None:  # a package: runpy runs its __main__
        main = Path(spec.origin).with_name("__main__.py")
        return str(main) if main.is_file() else None
    return spec.origin


def _imports_of(statement: ast.stmt) -> list[str] | None:
    """The absolute modules ``statement`` imports; [] for a statement that runs no code; None for anything else
    (the end of the leading imports)."""
    if isinstance(statement, ast.Import):
        return [alias.name for alias in statement.names]
    if isinstance(statement, ast.ImportFrom):
        if statement.level or statement.module is None:
            return None  # a relative import: only meaningful inside the package, which the rank sets up
        if statement.module == "__future__":
            return []
        base = statement.module
        return [base, *(f"{base}:{alias.name}" for alias in statement.names if alias.name != "*")]
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return []  # the docstring
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and _inert_def(statement):
        return []  # binds a name, runs nothing of the script's
    if isinstance(statement, ast.Try) and not statement.finalbody:
        blocks = [statement.body, statement.orelse, *(h.body for h in statement.handlers)]
        names: list[str] = []
        for block in blocks:
            for inner in block:
                if isinstance(inner, ast.Pass):
                    continue
                found = _imports_of(inner) if isinstance(inner, ast.Import | ast.ImportFrom) else None
                if found is None:
                    return None
                names += found
        return names
    return None


def _inert_def(statement: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A ``def`` that runs no code when executed: no decorators, constant default values (a class body runs
    statements; it ends the leading imports)."""
    arguments = statement.args
    defaults = [*arguments.defaults, *(d for d in arguments.kw_defaults if d is not None)]
    return not statement.decorator_list and all(isinstance(d, ast.Constant) for d in defaults)


class _WatchedEnviron(os._Environ):  # type: ignore[misc,name-defined]
    """``os.environ`` over the same storage, noting reads of the per-rank variables by name (``[]``, ``get``,
    ``in``, ``os.getenv``) and walks over the whole of it (``walks``: ``dict(os.environ)``, ``.copy()``,
    ``.items()``). A walk alone is not refused: libraries scan the environment for their own prefixes at import
    (networkx does, under Megatron-Core), and the per-rank variables are absent then; only a walk that left a
    copy of the whole environment in a module is (``_environment_copy``)."""

    def __init__(self, base: Any, reads: set[str], walks: list[bool]) -> None:
        super().__init__(base._data, base.encodekey, base.decodekey, base.encodevalue, base.decodevalue)
        self._reads = reads
        self._walks = walks

    def __getitem__(self, key: str) -> str:
        if key in PER_RANK_VARIABLES:
            self._reads.add(key)
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[str]:
        self._walks.append(True)
        return super().__iter__()


def _environment_copy(modules: set[str], environment: Mapping[str, str]) -> str | None:
    """``module.NAME`` of a module-level mapping among ``modules`` holding every variable of ``environment``:
    a copy (``ENV = dict(os.environ)``) whose later ``ENV.get("RANK")`` would find no rank in any rank, where
    each rank importing it itself finds its own. Copies kept deeper (in a class or an object, in a nested
    container, as a list of items) are not seen, and README says so: finding them means walking everything
    the imports reach, and a str-to-str dict is not even tracked by the garbage collector (``gc`` cannot list
    it), so no cheap check exists; ``--no-preload`` is the remedy."""
    if not environment:
        return None
    for module_name in sorted(modules):
        namespace = getattr(sys.modules.get(module_name), "__dict__", None)
        for name, value in (namespace or {}).items():
            if not isinstance(value, Mapping) or isinstance(value, os._Environ):  # os.environ itself is live
                continue
            with contextlib.suppress(Exception):  # a mapping of the module's own that does not like being read
                if len(value) >= len(environment) and all(key in value for key in environment):
                    return f"{module_name}.{name}"
    return None


@contextlib.contextmanager
def _watched_environment(environment: Mapping[str, str]) -> Iterator[tuple[set[str], list[bool]]]:
    """``os.environ`` replaced by ``environment`` (watched) for the block; the process's own restored after.
    Yields the per-rank variables read by name, and the walks (one entry each; cleared by the caller)."""
    reads: set[str] = set()
    walks: list[bool] = []
    original = os.environ
    saved = dict(original)
    original.clear()
    original.update(environment)
    os.environ = _WatchedEnviron(original, reads, walks)  # noqa: B003 - same storage, only reads are watched
    try:
        yield reads, walks
    finally:
        os.environ = original  # noqa: B003 - the original object back
        original.clear()
        original.update(saved)
