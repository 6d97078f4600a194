"""Small helpers to drive the local control plane with kubectl (no client library needed).

The kubectl binary is the one e2e/install-tools.sh builds into the cache (its
path comes from e2e/lib.sh, so versions live in one place); the kubeconfig is
``.e2e/kubeconfig`` written by e2e/cluster-up.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

E2E_DIR = Path(__file__).resolve().parent
REPO = E2E_DIR.parent
STATE_DIR = REPO / ".e2e"
KUBECONFIG = Path(os.environ.get("LOADLINE_KUBECONFIG", STATE_DIR / "kubeconfig"))

T = TypeVar("T")


class KubectlError(RuntimeError):
    """kubectl exited non-zero; ``stderr`` holds what it said."""

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str) -> None:
        self.args_ = args
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip() or stdout.strip()}")


@cache
def lib_var(name: str) -> str:
    """A variable from e2e/lib.sh (pinned versions and cache paths)."""
    out = subprocess.run(
        ["bash", "-c", f'source "$1" && printf %s "${{{name}}}"', "lib.sh", str(E2E_DIR / "lib.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


def kubectl_binary() -> Path:
    """kubectl from the cache (override with LOADLINE_KUBECTL)."""
    override = os.environ.get("LOADLINE_KUBECTL")
    return Path(override) if override else Path(lib_var("K8S_BIN")) / "kubectl"


@dataclass(frozen=True)
class Kubectl:
    """kubectl bound to one kubeconfig."""

    kubeconfig: Path = KUBECONFIG
    binary: Path | None = None

    def run(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        binary = self.binary or kubectl_binary()
        if not binary.exists():
            raise FileNotFoundError(
                f"kubectl not found at {binary}: run `make cluster-up` (or e2e/install-tools.sh)"
            )
        cmd = [str(binary), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise KubectlError(list(args), proc.returncode, proc.stdout, proc.stderr)
        return proc

    def __call__(self, *args: str, input: str | None = None, timeout: float = 60) -> str:
        """Run kubectl, fail on a non-zero exit, return stdout."""
        return self.run(*args, input=input, timeout=timeout).stdout

    def json(self, *args: str, timeout: float = 60) -> Any:
        """Run ``kubectl <args> -o json`` and decode the result."""
        return json.loads(self.run(*args, "-o", "json", timeout=timeout).stdout)

    def apply(self, manifest: str | dict[str, Any], namespace: str | None = None) -> str:
        body = manifest if isinstance(manifest, str) else json.dumps(manifest)
        ns = ["-n", namespace] if namespace else []
        return self("apply", *ns, "-f", "-", input=body)

    def ready(self) -> bool:
        """Whether the API server answers /readyz with this kubeconfig."""
        if not self.kubeconfig.exists():
            return False
        try:
            return self.run("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return False


def wait_for(check: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll ``check`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def answers(url: str, timeout: float = 2) -> bool:
    """Whether ``url`` answers a GET with a success (a refusal, a timeout or an error status: no)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except OSError:
        return False
