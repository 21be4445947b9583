"""Screenshots of the MLflow and Prefect UIs over a demo workspace, for the README.

Made from a workspace where the demo ran and one challenger was then rejected::

    make demo                                   # the champion: demo-policy v1
    alignflow run --config configs/demo.yaml \\
        --set dpo.learning_rate=0.5 --set dpo.max_steps=20   # a wrecked policy: rejected
    make screenshots                            # python -m tools.screenshots

It starts ``mlflow ui`` on the workspace's ``mlflow.db`` and ``prefect server start`` on
the Prefect database the runs went to (the workspace's ``.alignflow/prefect``, or the
``PREFECT_HOME`` set), each on a free loopback port,
opens the pages a person checks in headless Chromium (Debian's ``chromium``, driven over
the DevTools protocol with the ``websockets`` client that Prefect already installs), waits
for each page to show what it is taken for, and saves PNGs under ``docs/screenshots/``:

- ``mlflow-compare-runs.png``: the two parent runs side by side, their config difference
  (``dpo.learning_rate``, ``dpo.max_steps``) and headline metrics;
- ``mlflow-rejected-version.png``: the rejected policy version's page, its description
  saying why (the gate table);
- ``mlflow-evaluation-table.png``: the rejected run's pinned-set completions table;
- ``prefect-flow-run.png``: the rejected run's Prefect flow run, its name, tags and our
  log lines; ``prefect-summary.png``: the newest run summary (the rejected run's).

Each page is loaded until a text it must show is on the screen; a page that never shows
it fails the script (naming the page and the text) rather than saving a blank picture.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
OUT_DIR = Path("docs") / "screenshots"
PAGE_TIMEOUT_S = 60.0
# MLflow 3's assistant panel opens beside the page on a first visit: closed, as a user would
MLFLOW_SETTINGS = (("mlflow.assistant.panelOpen_v1", "false"),)


@dataclass
class Page:
    """One screenshot: the file, the URL, the texts the page must show, the window size."""

    file: str
    url: str
    shows: tuple[str, ...]
    width: int = 1600
    height: int = 1100
    click: tuple[str, ...] = ()  # texts of controls to click once the page shows (tabs, toggles)
    storage: tuple[tuple[str, str], ...] = ()  # the UI's saved settings, set before the picture


class Browser:
    """Headless Chromium driven over the DevTools protocol: open a page, wait, screenshot."""

    def __init__(self, executable: str, profile: Path):
        self.process = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",  # as root in a container there is no sandbox to enter
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.socket = self._connect(self._devtools_url())
        self._next_id = 0

    def _devtools_url(self) -> str:
        """The browser's ``ws://…/devtools/browser/…`` line on stderr; then its first page's."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            if found:
                port = urllib.parse.urlparse(found.group(1)).port
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
                    pages = [t for t in json.load(reply) if t["type"] == "page"]
                return pages[0]["webSocketDebuggerUrl"]
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError("chromium did not open its DevTools port")

    @staticmethod
    def _connect(url: str):
        from websockets.sync.client import connect

        return connect(url, max_size=None, open_timeout=30)

    def call(self, method: str, **params) -> dict:
        """One DevTools command and its result (events in between are skipped)."""
        self._next_id += 1
        self.socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=PAGE_TIMEOUT_S))
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def wait_for_texts(self, page: Page) -> None:
        """Until every one of ``page.shows`` is in the page's text (the data has loaded)."""
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        missing = list(page.shows)
        while time.monotonic() < deadline:
            text = self.evaluate("document.body ? document.body.innerText : ''") or ""
            missing = [shown for shown in page.shows if shown not in text]
            if not missing:
                return
            time.sleep(0.5)
        raise RuntimeError(f"{page.file}: {page.url} never showed {missing}")

    def click_text(self, text: str) -> None:
        """Click every visible element whose own text is ``text`` (the innermost of each
        nest): the page's toggles of one name ("Show diff only" on each table) all at once."""
        script = f"""(() => {{
            const want = {json.dumps(text)};
            const same = e => e.offsetParent && e.innerText && e.innerText.trim() === want;
            const hits = [...document.querySelectorAll('body *')]
                .filter(e => same(e) && ![...e.children].some(same));
            hits.forEach(e => e.click());
            return hits.length;
        }})()"""
        if not self.evaluate(script):
            raise RuntimeError(f"no control {text!r} to click")

    def shoot(self, page: Page, path: Path) -> None:
        """Open ``page``, wait for its texts, click its controls, and save the PNG."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=page.width,
            height=page.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.call("Page.navigate", url=page.url)
        self.wait_for_texts(page)
        if page.storage:  # the UI reads them as it loads: set on its origin, then reload
            for key, value in page.storage:
                self.evaluate(f"localStorage.setItem({json.dumps(key)}, {json.dumps(value)})")
            self.call("Page.reload")
            time.sleep(1.0)
            self.wait_for_texts(page)
        for text in page.click:
            self.click_text(text)
            time.sleep(1.0)
        time.sleep(1.5)  # charts and fonts settle after the data
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.socket.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()


def chromium() -> str:
    """The Chromium to drive: ``$CHROMIUM`` or one on PATH (``apt-get install -y chromium``)."""
    for name in (os.environ.get("CHROMIUM"), *CHROMIUM_NAMES):
        found = name and shutil.which(name)
        if found:
            return found
    raise SystemExit("no Chromium found: apt-get install -y chromium (or set CHROMIUM=/path/to/chrome)")


@contextmanager
def browser() -> Iterator[Browser]:
    with tempfile.TemporaryDirectory(prefix="screenshots-chromium-") as profile:
        opened = Browser(chromium(), Path(profile))
        try:
            yield opened
        finally:
            opened.close()


@dataclass
class DemoRuns:
    """What the pictures are of: the two parent runs and the rejected policy version."""

    experiment_id: str
    champion_run: str
    rejected_run: str
    rejected_evaluate_run: str | None
    policy_model: str
    rejected_version: str


def find_demo_runs(tracking_uri: str) -> DemoRuns:
    """The newest promoted and newest not-promoted pipeline runs and the rejected version."""
    from mlflow import MlflowClient

    from alignflow.flows.unchanged import OUTCOME_TAG as PIPELINE_OUTCOME_TAG
    from alignflow.registry.models import registered_name
    from alignflow.registry.pipeline_record import PIPELINE_TAG
    from alignflow.registry.promotion import OUTCOME_TAG
    from alignflow.registry.runs import child_runs

    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(
        experiments, f"tags.`{PIPELINE_TAG}` = 'retrain'", order_by=["attributes.start_time DESC"]
    )

    def newest(outcome: str):
        found = [r for r in runs if r.data.tags.get(PIPELINE_OUTCOME_TAG) == outcome]
        if not found:
            raise SystemExit(f"no pipeline run with {PIPELINE_OUTCOME_TAG}={outcome} in {tracking_uri}")
        return found[0]

    champion, rejected = newest("promoted"), newest("not_promoted")
    policy = registered_name(rejected.data.params["project"], "policy")
    versions = client.search_model_versions(f"name='{policy}'")
    turned_down = [v for v in versions if v.tags.get(OUTCOME_TAG) == "rejected"]
    if not turned_down:
        raise SystemExit(f"no rejected version of {policy} in {tracking_uri}")
    version = max(turned_down, key=lambda v: int(v.version))
    stages = child_runs(tracking_uri, rejected.info.run_id)
    evaluate = next((r.info.run_id for r in stages if r.info.run_name == "evaluate"), None)
    return DemoRuns(
        experiment_id=rejected.info.experiment_id,
        champion_run=champion.info.run_id,
        rejected_run=rejected.info.run_id,
        rejected_evaluate_run=evaluate,
        policy_model=policy,
        rejected_version=str(version.version),
    )


def mlflow_pages(url: str, runs: DemoRuns, run_names: tuple[str, str]) -> list[Page]:
    """The compare-runs page of the two parent runs, the rejected version's page, the
    rejected run's evaluation table."""
    ids = json.dumps([runs.champion_run, runs.rejected_run])
    query = urllib.parse.urlencode({"runs": ids, "experiments": json.dumps([runs.experiment_id])})
    pages = [
        Page(
            "mlflow-compare-runs.png",
            f"{url}/#/compare-runs?{query}",
            ("dpo.learning_rate", "eval/kl_to_reference", "pipeline.outcome", *run_names),
            height=1450,
            click=("Show diff only", "Visualizations", "Artifacts"),  # diffs on; plots, files folded
            storage=MLFLOW_SETTINGS,
        ),
        Page(
            "mlflow-rejected-version.png",
            f"{url}/#/models/{runs.policy_model}/versions/{runs.rejected_version}",
            ("Not promoted", "task_accuracy_vs_champion"),
            height=1500,
            storage=MLFLOW_SETTINGS,
        ),
    ]
    if runs.rejected_evaluate_run:
        pages.append(
            Page(
                "mlflow-evaluation-table.png",
                f"{url}/#/experiments/{runs.experiment_id}/runs/{runs.rejected_evaluate_run}"
                "/artifacts/eval/completions.json",
                ("completions.json", "prompt"),
                storage=MLFLOW_SETTINGS,
            )
        )
    return pages


def prefect_pages(url: str, run_name: str, project: str) -> list[Page]:
    """The rejected run's Prefect flow run (its Logs tab) and the newest run summary."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    from alignflow.flows.artifacts import artifact_key

    key = artifact_key(project, "retrain-summary")
    with get_client(sync_client=True) as client:
        found = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_name])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=1,
        )
        # the newest summary (explicit filters, sort and limit: the API refuses nulls)
        body = {"artifacts": {"key": {"any_": [key]}}, "sort": "CREATED_DESC", "limit": 1, "offset": 0}
        summaries = client.request("POST", "/artifacts/filter", json=body).json()
    if not found:
        raise SystemExit(f"no Prefect flow run named {run_name}: is PREFECT_HOME the one the runs used?")
    return [
        Page(
            "prefect-flow-run.png",
            f"{url}/runs/flow-run/{found[0].id}",
            (run_name, "outcome:not_promoted", "not promoted (failed:"),
            height=1300,
        ),
        *(
            Page(
                "prefect-summary.png",
                f"{url}/artifacts/artifact/{summary['id']}",
                ("Outcome:", "not promoted"),
                height=1500,
            )
            for summary in summaries
        ),
    ]


@contextmanager
def prefect_ui(workspace: Path) -> Iterator[str]:
    """``prefect server start`` on a free loopback port, on the database the runs went to."""
    from alignflow.flows.environment import PREFECT_STATE
    from alignflow.registry.server import free_port, stop_process_group, wait_until_healthy

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": f"{url}/api"}
    env.pop("PREFECT_API_URL", None)
    env.setdefault("PREFECT_HOME", str(workspace.resolve() / PREFECT_STATE))  # as the CLI's runs
    with tempfile.TemporaryFile() as log:
        command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
        command += ["--port", str(port)]
        process = subprocess.Popen(  # its own group: stopped with the workers it starts
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

        def tail() -> str:
            log.seek(0)
            return log.read().decode(errors="replace")[-3000:]

        try:
            wait_until_healthy(f"{url}/api/health", process, tail, 180.0, "prefect server")
            yield url
        finally:
            stop_process_group(process)


def take(workspace: Path, out: Path, with_prefect: bool = True) -> list[Path]:
    """Every screenshot of the demo workspace, saved under ``out``; returns their paths."""
    from mlflow import MlflowClient

    from alignflow.registry.server import local_mlflow_server

    uri = f"sqlite:///{(workspace / 'mlflow.db').resolve()}"
    runs = find_demo_runs(uri)
    client = MlflowClient(uri)
    names = (client.get_run(runs.champion_run).info.run_name, client.get_run(runs.rejected_run).info.run_name)
    out.mkdir(parents=True, exist_ok=True)
    saved = []
    with tempfile.TemporaryDirectory(prefix="screenshots-mlflow-") as scratch, browser() as chrome:
        with local_mlflow_server(scratch, backend_store_uri=uri) as server:
            for page in mlflow_pages(server.url, runs, names):
                chrome.shoot(page, out / page.file)
                saved.append(out / page.file)
        if with_prefect:
            with prefect_ui(workspace) as url:
                from prefect.settings import PREFECT_API_URL, temporary_settings

                with temporary_settings(updates={PREFECT_API_URL: f"{url}/api"}):
                    pages = prefect_pages(url, names[1], runs.policy_model.removesuffix("-policy"))
                for page in pages:
                    chrome.shoot(page, out / page.file)
                    saved.append(out / page.file)
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("."), help="where the demo ran (mlflow.db)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="folder for the PNGs")
    parser.add_argument("--no-prefect", action="store_true", help="MLflow pages only")
    args = parser.parse_args(argv)
    for path in take(args.workspace, args.out, with_prefect=not args.no_prefect):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
