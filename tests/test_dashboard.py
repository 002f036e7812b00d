"""The dashboard, as a browser shows it: during a fit, /status renders dkern's task
prefixes in its progress bars, each one distinct as the bars cut it.

Headless Chromium (the OS package) loads the page and is driven over the DevTools
protocol; the test waits, with a deadline, until the page's Bokeh document (fed over the
dashboard's websocket) holds the progress bars' labels. Skipped, saying why, where no
Chromium is installed.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import numpy as np
import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "headless_shell")
BROWSER = next((path for name in BROWSERS if (path := shutil.which(name))), None)

#: What the page holds once rendered: the labels of every progress bar (distributed's
#: progress_stream "show-name" column), read from the Bokeh documents of the page.
LABELS_JS = """(() => {
  if (!window.Bokeh || !Bokeh.documents.length) return null;
  const out = [];
  for (const doc of Bokeh.documents) for (const m of doc.all_models) {
    const d = m.data;
    if (!d) continue;
    const col = d instanceof Map ? d.get("show-name") : d["show-name"];
    if (col) out.push(...Array.from(col));
  }
  return JSON.stringify(out);
})()"""


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DevTools:
    """A page of a headless Chromium, driven over the DevTools protocol's websocket."""

    def __init__(self, port: int):
        from tornado.ioloop import IOLoop

        self.loop = IOLoop()
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json",
                                                  timeout=10).read())
        url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        from tornado.websocket import websocket_connect

        self.socket = self.loop.run_sync(lambda: websocket_connect(url), timeout=30)
        self.ids = iter(range(1, 10**6))

    def call(self, method: str, **params):
        message_id = next(self.ids)

        async def exchange():
            await self.socket.write_message(json.dumps({"id": message_id, "method": method,
                                                        "params": params}))
            while True:  # events come in between; the answer carries our id
                reply = json.loads(await self.socket.read_message())
                if reply.get("id") == message_id:
                    return reply

        return self.loop.run_sync(exchange, timeout=60)

    def evaluate(self, expression: str):
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return reply["result"]["result"].get("value")

    def close(self):
        self.socket.close()
        self.loop.close()


@pytest.fixture
def browser():
    if BROWSER is None:
        pytest.skip(f"no Chromium to load the dashboard with (looked for {', '.join(BROWSERS)}"
                    "; Debian/Ubuntu: apt install chromium)")
    port = _free_port()
    profile = tempfile.mkdtemp(prefix="dkern-chromium-")
    proc = subprocess.Popen([BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu",
                             f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
                             "about:blank"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                tools = DevTools(port)
                break
            except (OSError, StopIteration):
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"{BROWSER} did not open its DevTools port")
                time.sleep(0.2)
        yield tools
        tools.close()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


def test_status_page_renders_dkern_prefixes_during_a_fit(browser, record_figures):
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    from dkern.kernels import Gaussian
    from dkern.models import KernelRidge

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40_000, 4))
    y = np.sin(X[:, 0])
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=f"127.0.0.1:{_free_port()}") as cluster, \
            Client(cluster, set_as_default=False) as client, dask.config.set(scheduler=client):
        Xd = da.from_array(X, chunks=(5_000, 4))
        done = threading.Event()

        errors = []

        def fit():  # many short Falkon iterations: the page loads while they run
            try:
                while not done.is_set():
                    KernelRidge(Gaussian(1.0), alpha=1e-3, solver="nystrom", n_centers=200,
                                tol=1e-30, max_iter=20, random_state=0).fit(Xd, y)
            except Exception as err:  # reported below
                errors.append(err)
            finally:
                done.set()

        worker = threading.Thread(target=fit, daemon=True)
        worker.start()
        try:
            browser.call("Page.navigate", url=f"{client.dashboard_link.rsplit('/', 1)[0]}"
                                                "/status")
            labels, deadline = [], time.monotonic() + 90
            while time.monotonic() < deadline and not done.is_set():
                labels = json.loads(browser.evaluate(LABELS_JS) or "[]")
                if any(label.startswith("dk-ktk-v") for label in labels):
                    break
                time.sleep(0.5)
        finally:
            done.set()
            worker.join(timeout=120)
    assert not errors, errors
    own = [label for label in labels if label.startswith("dk-")]
    record_figures("dashboard", browser=os.path.basename(BROWSER), progress_bar_labels=own)
    # one Falkon iteration's pass, from the kernel or (-c) from cached blocks, alone, as
    # its tree sum, or fused with it
    assert any(label.startswith("dk-ktk-v") for label in own), labels
    assert len(set(own)) == len(own), own  # one bar per prefix, none sharing a label
