"""The FastAPI application: feedback in, training estimates and jobs, the agent's policies out.

``create_app(settings, launcher)`` builds everything eagerly (engine, migrations, tokens,
job runner) so the app is ready the moment it is constructed, under uvicorn or a test
client alike.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Request, Response, status
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials

from alignflow.service.auth import Principal, authenticate, bearer_scheme, require_agent
from alignflow.service.jobs import JobRunner, TrainingLauncher, TrainingRequest, export_feedback
from alignflow.service.limits import BodySizeLimit
from alignflow.service.migrate import upgrade_database
from alignflow.service.policies import list_policies
from alignflow.service.schemas import (
    DryRunOut,
    ErrorOut,
    FeedbackIn,
    FeedbackOut,
    JobOut,
    PairwiseFeedbackIn,
    PolicyOut,
    TrainPolicyIn,
)
from alignflow.service.settings import AGENT_ID_PATTERN, ServiceSettings
from alignflow.service.storage import Feedback, IdempotencyConflict, Job, Store, make_engine

log = logging.getLogger(__name__)

AgentId = Annotated[
    str,
    PathParam(pattern=AGENT_ID_PATTERN, description="letters, digits, '_' and '-'; at most 64 characters"),
]
JobId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{32}$")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description="retries with the same key store the feedback once",
    ),
]
ERRORS = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 413, 422)
}  # 400: a body that is not JSON; 404: a path no route matches (e.g. a newline in an id)
_UNION_TAGS = {"scored", "pairwise"}


def principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> Principal:
    return authenticate(request, credentials)


def agent_access(agent_id: AgentId, who: Annotated[Principal, Depends(principal)]) -> str:
    """401 before anything else, then 422 for a bad agent id, then 403 for a foreign agent."""
    require_agent(who, agent_id)
    return agent_id


def _field_name(loc: tuple) -> str:
    parts = [str(p) for i, p in enumerate(loc) if not (i == 1 and loc[0] == "body" and p in _UNION_TAGS)]
    return ".".join(parts)


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [
        {"field": _field_name(tuple(e.get("loc", ()))), "message": str(e.get("msg", ""))}
        for e in exc.errors()
    ]
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return JSONResponse(status_code=422, content={"detail": f"invalid request: {summary}", "errors": errors})


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    incident = uuid.uuid4().hex[:12]
    log.error("unhandled error %s on %s %s", incident, request.method, request.url.path, exc_info=exc)
    return JSONResponse(status_code=500, content={"detail": f"internal server error (incident {incident})"})


def _job_out(job: Job) -> JobOut:
    result = job.result or {}
    return JobOut(
        job_id=job.id,
        agent_id=job.agent_id,
        status=job.status,
        created_at=job.created_at,
        updated_at=job.updated_at,
        feedback_count=result.get("feedback_count", job.feedback_count),
        error=job.error,
        **{
            k: result.get(k)
            for k in (
                "policy_id",
                "version",
                "model_path",
                "reward_model_path",
                "training_steps",
                "reward_mean",
                "reward_std",
                "data_version",
            )
        },
    )


def _feedback_out(row: Feedback) -> FeedbackOut:
    return FeedbackOut(
        id=row.id, agent_id=row.agent_id, kind=row.kind, score=row.score, created_at=row.created_at
    )


def _model_config(settings: ServiceSettings, body: TrainPolicyIn) -> dict:
    defaults = settings.training
    return {
        "base_model": defaults.base_model,
        "use_lora": defaults.use_lora,
        "learning_rate": body.learning_rate or defaults.learning_rate,
        "max_steps": body.max_steps or defaults.max_steps,
        "batch_size": defaults.batch_size,
        "algorithm": defaults.algorithm,
    }


def create_app(settings: ServiceSettings | None = None, launcher: TrainingLauncher | None = None) -> FastAPI:
    """The service over ``settings``; training jobs go to ``launcher`` (the library's own by default)."""
    settings = settings or ServiceSettings()
    engine = make_engine(settings.database_url, settings.sqlite_synchronous)
    if settings.run_migrations:
        upgrade_database(engine)
    store = Store(engine)
    for spec in settings.tokens:
        store.put_token(spec.token.get_secret_value(), spec.name, spec.agents)
    abandoned = store.fail_abandoned_jobs("the service restarted before this job finished")
    if abandoned:
        log.warning("marked %d unfinished training jobs as failed", abandoned)
    if launcher is None:
        from alignflow.service.local_launcher import LocalTrainingLauncher

        launcher = LocalTrainingLauncher(settings.tracking_uri)
    runner = JobRunner(store, launcher, settings.training_workers)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        runner.shutdown(wait=False)
        engine.dispose()

    app = FastAPI(
        title="alignflow feedback and policy service",
        version="1",
        description="Collect human feedback, estimate and start retraining, list trained policies.",
        lifespan=lifespan,
    )
    app.state.settings, app.state.store, app.state.runner, app.state.engine = settings, store, runner, engine
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)

    @app.get("/health", tags=["service"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(
        "/api/policies/feedback/{agent_id:path}",
        status_code=status.HTTP_201_CREATED,
        response_model=FeedbackOut,
        responses={
            200: {"model": FeedbackOut, "description": "a retry of an earlier request"},
            409: {"model": ErrorOut},
            **ERRORS,
        },
        tags=["feedback"],
    )
    def submit_feedback(
        body: FeedbackIn,
        response: Response,
        agent_id: Annotated[str, Depends(agent_access)],
        idempotency_key: IdempotencyKey = None,
    ) -> FeedbackOut:
        """Store a rating (prompt, response, score) or a comparison (prompt, chosen, rejected)."""
        kind = "pairwise" if isinstance(body, PairwiseFeedbackIn) else "scored"
        fields = {"kind": kind, **body.model_dump(exclude_none=True)}
        try:
            row, created = store.add_feedback(agent_id, fields, idempotency_key)
        except IdempotencyConflict as exc:
            raise HTTPException(
                status.HTTP_409_CONFLICT, "Idempotency-Key was already used with a different request body"
            ) from exc
        if not created:
            response.status_code = status.HTTP_200_OK
            response.headers["Idempotent-Replayed"] = "true"
        return _feedback_out(row)

    @app.post(
        "/api/policies/train_policy/{agent_id:path}",
        response_model=None,
        responses={
            200: {"model": DryRunOut, "description": "dry run: an estimate"},
            202: {"model": JobOut, "description": "training job started"},
            409: {"model": ErrorOut},
            **ERRORS,
        },
        tags=["training"],
    )
    def train_policy(
        agent_id: Annotated[str, Depends(agent_access)], body: TrainPolicyIn | None = None
    ) -> JSONResponse:
        """Estimate (``dryRun``) or start training a policy on the agent's feedback."""
        body = body or TrainPolicyIn()
        stats = store.feedback_stats(agent_id)
        if stats.count < settings.min_feedback:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                f"agent {agent_id!r} has {stats.count} feedback samples; training needs at least "
                f"{settings.min_feedback}",
            )
        model_config = _model_config(settings, body)
        steps = model_config["max_steps"]
        if body.dry_run:
            seconds = steps * settings.training.seconds_per_step + settings.training.overhead_seconds
            estimate = DryRunOut(
                feedback_count=stats.count,
                estimated_steps=steps,
                estimated_time_minutes=round(seconds / 60.0, 2),
                score_mean=stats.score_mean,
                score_std=stats.score_std,
                modelConfig=model_config,
            )
            return JSONResponse(estimate.model_dump(mode="json", by_alias=True))
        running = store.active_job(agent_id)
        if running is not None:
            raise HTTPException(
                status.HTTP_409_CONFLICT, f"agent {agent_id!r} already has job {running.id} running"
            )
        job = store.create_job(agent_id, model_config, stats.count)
        export = settings.exports_dir / agent_id / job.id / "feedback.jsonl"
        count, _digest = export_feedback(store, agent_id, export)
        store.update_job(job.id, dataset_path=str(export), feedback_count=count)
        runner.submit(
            TrainingRequest(
                job_id=job.id,
                agent_id=agent_id,
                dataset_path=export,
                output_dir=settings.models_dir / agent_id / job.id,
                feedback_count=count,
                max_steps=steps,
                learning_rate=model_config["learning_rate"],
                model_config_=model_config,
            )
        )
        accepted = _job_out(store.get_job(job.id))
        return JSONResponse(
            accepted.model_dump(mode="json", by_alias=True),
            status_code=status.HTTP_202_ACCEPTED,
            headers={"Location": f"/api/policies/jobs/{job.id}"},
        )

    @app.get(
        "/api/policies/jobs/{job_id}",
        response_model=JobOut,
        responses={404: {"model": ErrorOut}, **ERRORS},
        tags=["training"],
    )
    def get_job(job_id: JobId, who: Annotated[Principal, Depends(principal)]) -> JobOut:
        """A training job's status and, once trained, where its models are."""
        job = store.get_job(job_id)
        if job is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no training job {job_id}")
        require_agent(who, job.agent_id)
        return _job_out(job)

    @app.get(
        "/api/policies/{agent_id:path}", response_model=list[PolicyOut], responses=ERRORS, tags=["policies"]
    )
    def get_policies(agent_id: Annotated[str, Depends(agent_access)]) -> list[PolicyOut]:
        """The agent's trained policies from the model registry, newest first."""
        return list_policies(settings.tracking_uri, agent_id)

    return app
