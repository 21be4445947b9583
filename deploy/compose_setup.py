"""One-shot set-up of the compose stack's Prefect server (mlflow/compose.yaml runs it).

Idempotent, so it runs on every ``up``:
- the ``alignflow-cpu`` process work pool;
- the ``retrain/compose`` deployment: the retraining flow on that pool, run in the worker's
  ``/work`` volume (data, DVC remote, checkpoints and caches outlive the container), logging
  to the MLflow server the worker's ``MLFLOW_TRACKING_URI`` names; its parameters are
  retrain's (``config_path``, ``overrides``, ``force``);
- an automation that marks a flow run Crashed when its heartbeats stop (a worker killed
  mid-run takes its flow run's process with it; without this the run would stay Running).
  Flow runs send heartbeats when PREFECT_FLOWS_HEARTBEAT_FREQUENCY is set (the worker sets it).
"""

from __future__ import annotations

import os
import sys

from prefect.automations import Automation
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.exceptions import ObjectNotFound

POOL = os.environ.get("ALIGNFLOW_WORK_POOL", "alignflow-cpu")
DEPLOYMENT = "compose"
WORKDIR = os.environ.get("ALIGNFLOW_WORKDIR", "/work")
ZOMBIE_AUTOMATION = "alignflow: crash flow runs whose heartbeats stopped"
# a run is a zombie after this many seconds without a heartbeat (3 missed beats at 30 s)
HEARTBEAT_GRACE_S = int(os.environ.get("ALIGNFLOW_HEARTBEAT_GRACE_S", "90"))


def ensure_pool() -> None:
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(POOL)
            print(f"work pool {POOL}: exists")
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
            print(f"work pool {POOL}: created (process)")


def deploy() -> None:
    """Through the client, not ``prefect deploy``: 3.8.8's CLI asks the server for the pool's
    workers with a null limit, which the server refuses (422)."""
    from prefect.utilities.callables import parameter_schema

    from alignflow.flows.retrain import retrain

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name(retrain.name)
        deployment_id = client.create_deployment(
            flow_id=flow_id,
            name=DEPLOYMENT,
            description="Retrain on the worker of the compose stack (mlflow/compose.yaml).",
            work_pool_name=POOL,
            # the installed package, not a file path: the flow runs from the /work volume
            entrypoint="alignflow.flows.retrain:retrain",
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": WORKDIR}}],
            parameters={},
            parameter_openapi_schema=parameter_schema(retrain).model_dump_for_openapi(),
            enforce_parameter_schema=True,
        )
    print(f"deployment {retrain.name}/{DEPLOYMENT} ({deployment_id}) on pool {POOL}, in {WORKDIR}")


def ensure_zombie_automation() -> None:
    try:
        Automation.read(name=ZOMBIE_AUTOMATION)
        print(f"automation '{ZOMBIE_AUTOMATION}': exists")
        return
    except (ValueError, ObjectNotFound):
        pass
    Automation(
        name=ZOMBIE_AUTOMATION,
        description="A flow run that stops sending heartbeats (its worker was killed) is marked Crashed.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=HEARTBEAT_GRACE_S,
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {HEARTBEAT_GRACE_S} s: the worker running it was lost",
            )
        ],
    ).create()
    print(f"automation '{ZOMBIE_AUTOMATION}': created")


def main() -> int:
    ensure_pool()
    deploy()
    ensure_zombie_automation()
    return 0


if __name__ == "__main__":
    sys.exit(main())
