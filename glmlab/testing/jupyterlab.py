"""A throw-away JupyterLab server and a headless Chromium for browser tests of the notebooks.

The server runs on 127.0.0.1 on a free port with a random token, with fresh config, runtime,
settings and workspace folders, so no developer setting leaks in and nothing is written next to
the notebooks (autosave is off: the committed notebooks keep no outputs). The browser is the
system's Chromium driven by Playwright; no browser build is ever downloaded.

It does not know what a notebook contains; ``glmlab.testing.notebook_browser`` drives one.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync")

# Settings a reader would not notice but a test needs: no autosave (the notebooks are run in
# place and must stay stripped), every cell laid out (windowing would leave off-screen outputs
# unmeasured), no news / update checks (network, pop-ups).
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"checkForUpdates": False, "fetchNews": "false"},
}


def find_chromium(explicit: str | None = None) -> str | None:
    """The system Chromium (Debian's package installs /usr/bin/chromium), or None."""
    for name in (explicit, "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    """``with LabServer(root) as lab: lab.url("lab/tree/x.ipynb")``; stops the server and its
    kernels on exit."""

    root: Path
    startup_timeout: float = 90.0
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(16))

    def __enter__(self) -> LabServer:
        self._tmp = Path(tempfile.mkdtemp(prefix="glmlab-lab-"))
        settings = self._tmp / "settings"
        for plugin, values in LAB_SETTINGS.items():
            path = settings / (plugin + ".jupyterlab-settings")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = {**_environ(), "JUPYTER_CONFIG_DIR": str(self._tmp / "config"),
               "JUPYTER_RUNTIME_DIR": str(self._tmp / "runtime"),
               "IPYTHONDIR": str(self._tmp / "ipython")}
        self._log = open(self._tmp / "server.log", "wb")  # noqa: SIM115 (closed in __exit__)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
             f"--port={self.port}", "--port-retries=0", f"--ServerApp.token={self.token}",
             f"--ServerApp.root_dir={self.root}", "--allow-root",
             "--LabApp.expose_app_in_browser=True", f"--LabApp.user_settings_dir={settings}",
             f"--LabApp.workspaces_dir={self._tmp / 'workspaces'}"],
            cwd=self.root, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({self._proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"jupyter lab not ready in {self.startup_timeout:.0f} s:\n{self.log()}")

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path}{sep}token={self.token}"

    def log(self) -> str:
        self._log.flush()
        return (self._tmp / "server.log").read_text(errors="replace")[-4000:]

    def __exit__(self, *exc) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM: the server shuts its kernels down first
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


def _environ() -> dict[str, str]:
    import os

    # NOTE: a JUPYTER_* variable of the caller's shell would point the server at its settings.
    return {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}


def launch_chromium(playwright, executable: str, user_data_dir: Path, width: int = 1280,
                    height: int = 1600):
    """A persistent headless Chromium context on a fresh profile folder. 1280 px wide with the
    file browser open leaves outputs about 850 px; the height only decides how much of a tall
    output one screenshot holds."""
    return playwright.chromium.launch_persistent_context(
        str(user_data_dir), executable_path=executable, headless=True, args=list(CHROMIUM_ARGS),
        viewport={"width": width, "height": height}, device_scale_factor=1)
