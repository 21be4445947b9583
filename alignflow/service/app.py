"""The FastAPI application: feedback in, training estimates and jobs, the agent's policies out.

``create_app(settings, launcher)`` builds everything eagerly (engine, migrations, tokens,
job runner) so the app is ready the moment it is constructed, under uvicorn or a test
client alike.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Any, get_args

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response, status
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel

from alignflow.service.ab import CHALLENGER, CHAMPION, AliasCache, assign_arm, hashed_user, online_out
from alignflow.service.auth import Principal, authenticate, bearer_scheme, require_agent
from alignflow.service.estimate import estimate_training_time, job_timing_tags
from alignflow.service.jobs import JobRunner, TrainingLauncher, TrainingRequest, export_feedback
from alignflow.service.limits import BodySizeLimit
from alignflow.service.migrate import upgrade_database
from alignflow.service.policies import list_policies, policy_model_name
from alignflow.service.schemas import (
    DryRunOut,
    ErrorOut,
    FeedbackIn,
    FeedbackOut,
    GenerateIn,
    GenerateOut,
    JobOut,
    PairwiseFeedbackIn,
    PolicyOut,
    TrafficIn,
    TrafficOut,
    TrainedOut,
    TrainPolicyIn,
)
from alignflow.service.serving import PolicyNotFound, PolicyPool, PromptTooLong
from alignflow.service.settings import AGENT_ID_PATTERN, ServiceSettings
from alignflow.service.storage import (
    Feedback,
    FeedbackWriter,
    IdempotencyConflict,
    Job,
    Store,
    make_engine,
)
from alignflow.service.training_plan import JobPlanError, plan_job
from alignflow.training.feedback_plan import FeedbackCounts

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
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 413, 422)
}  # 400: a body that is not JSON; 404: a path no route matches (e.g. a newline in an id)
_UNION_TAGS = {"scored", "pairwise"}
JSON_CONTENT_TYPE = "Content-Type: application/json"


def principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> Principal:
    return authenticate(request, credentials)


def agent_access(agent_id: AgentId, who: Annotated[Principal, Depends(principal)]) -> str:
    """401 before anything else, then 422 for a bad agent id, then 403 for a foreign agent."""
    require_agent(who, agent_id)
    return agent_id


async def feedback_principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> Principal:
    """:func:`principal` on the event loop: the write path's token is almost always remembered
    (Store.find_token), so no thread hop per request."""
    return authenticate(request, credentials)


async def feedback_access(agent_id: AgentId, who: Annotated[Principal, Depends(feedback_principal)]) -> str:
    """:func:`agent_access` for the feedback write path (same checks, same order)."""
    require_agent(who, agent_id)
    return agent_id


def _field_name(loc: tuple) -> str:
    parts = [str(p) for i, p in enumerate(loc) if not (i == 1 and loc[0] == "body" and p in _UNION_TAGS)]
    return ".".join(parts)


def _unparsed_body(errors: Sequence[Mapping[str, Any]]) -> bool:
    """FastAPI parses a body as JSON only under a JSON content type; otherwise the model gets
    the raw bytes (``curl -d`` sends form-encoded), and pydantic's message does not say why."""
    return any(
        _field_name(tuple(e.get("loc", ()))) == "body" and isinstance(e.get("input"), bytes) for e in errors
    )


def _content_type_hint(request: Request) -> str:
    sent = request.headers.get("content-type") or "none"
    return f"the body was not read as JSON (Content-Type: {sent}); send the header {JSON_CONTENT_TYPE}"


def _body_models(annotation: Any) -> list[type[BaseModel]]:
    """The request models a body annotation may hold (through ``X | None`` and tagged unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _body_models(arg)]


def _body_fields(request: Request) -> list[str]:
    """The JSON fields the route's body accepts, spelt as on the wire (``batchSize``)."""
    body = getattr(request.scope.get("route"), "body_field", None)
    models = _body_models(body.field_info.annotation) if body is not None else []
    return sorted({field.alias or name for model in models for name, field in model.model_fields.items()})


def _message(error: Mapping[str, Any], request: Request) -> str:
    """pydantic's message; an unknown body field also gets the closest field this request has."""
    message = str(error.get("msg", ""))
    loc = tuple(error.get("loc", ()))
    if error.get("type") != "extra_forbidden" or not loc or loc[0] != "body":
        return message
    close = difflib.get_close_matches(str(loc[-1]), _body_fields(request), n=1)
    return f"not a field of this request; did you mean {close[0]}?" if close else message


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    raw = exc.errors()
    errors = [{"field": _field_name(tuple(e.get("loc", ()))), "message": _message(e, request)} for e in raw]
    if _unparsed_body(raw):
        hint = _content_type_hint(request)
        errors = [{**e, "message": f"{e['message']}: {hint}"} if e["field"] == "body" else e for e in errors]
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


def feedback_counts(store: Store, agent_id: str) -> FeedbackCounts:
    """The agent's feedback by kind, and the pairs its ratings form per prompt."""
    return FeedbackCounts.of(
        {"prompt": row.prompt, "chosen": row.chosen}
        if row.kind == "pairwise"
        else {"prompt": row.prompt, "score": row.score}
        for row in store.iter_feedback(agent_id)
    )


def _trained_out(job: Job) -> JSONResponse:
    """Spec 002's synchronous answer for a finished job, or an error that says why it is not one."""
    if job.status == "trained":
        body = TrainedOut(job_id=job.id, **(job.result or {}))
        return JSONResponse(body.model_dump(mode="json", by_alias=True), status_code=status.HTTP_200_OK)
    if job.status == "failed":
        detail = f"training job {job.id} failed: {job.error}"
        return JSONResponse({"detail": detail}, status_code=status.HTTP_500_INTERNAL_SERVER_ERROR)
    accepted = _job_out(job)  # still running when the wait ran out: the job, as without ?wait
    return JSONResponse(
        accepted.model_dump(mode="json", by_alias=True),
        status_code=status.HTTP_202_ACCEPTED,
        headers={"Location": f"/api/policies/jobs/{job.id}"},
    )


def create_app(
    settings: ServiceSettings | None = None,
    launcher: TrainingLauncher | None = None,
    pool: PolicyPool | None = None,
) -> FastAPI:
    """The service over ``settings``; training jobs go to ``launcher`` (the library's own by default)."""
    settings = settings or ServiceSettings()
    engine = make_engine(settings.database_url, settings.sqlite_synchronous)
    if settings.run_migrations:
        upgrade_database(engine)
    store = Store(engine)
    writer = FeedbackWriter(store)
    for spec in settings.tokens:
        store.put_token(spec.token.get_secret_value(), spec.name, spec.agents)
    abandoned = store.fail_abandoned_jobs("the service restarted before this job finished")
    if abandoned:
        log.warning("marked %d unfinished training jobs as failed", abandoned)
    if launcher is None:
        from alignflow.service.local_launcher import LocalTrainingLauncher

        launcher = LocalTrainingLauncher(settings.tracking_uri, config_path=settings.pipeline_config)
    runner = JobRunner(store, launcher, settings.training_workers)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        writer.close()
        runner.shutdown(wait=False)
        app.state.pool.close()
        engine.dispose()

    app = FastAPI(
        title="alignflow feedback and policy service",
        version="1",
        description="Collect human feedback, estimate and start retraining, list trained policies.",
        lifespan=lifespan,
    )
    app.state.settings, app.state.store, app.state.runner, app.state.engine = settings, store, runner, engine
    app.state.feedback_writer = writer
    app.state.pool = pool or PolicyPool(
        settings.tracking_uri, settings.work_dir / "serving", **settings.serving.model_dump()
    )
    aliases = AliasCache(settings.tracking_uri)
    # Starlette types every handler as taking any Exception; this one is registered for its own class only
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
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
    async def submit_feedback(
        body: FeedbackIn,
        agent_id: Annotated[str, Depends(feedback_access)],
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        """Store a rating (prompt, response, score) or a comparison (prompt, chosen, rejected).

        The row goes to the group-commit writer; the answer waits for its commit, so an
        acknowledged row is durable (one commit serves every request waiting with it).
        """
        kind = "pairwise" if isinstance(body, PairwiseFeedbackIn) else "scored"
        fields = {"kind": kind, **body.model_dump(exclude_none=True)}
        try:
            row, created = await asyncio.wrap_future(writer.submit(agent_id, fields, idempotency_key))
        except IdempotencyConflict as exc:
            raise HTTPException(
                status.HTTP_409_CONFLICT, "Idempotency-Key was already used with a different request body"
            ) from exc
        # serialised here (FeedbackOut, by alias, as response_model would) to skip a second validation
        answer = Response(_feedback_out(row).model_dump_json(by_alias=True), media_type="application/json")
        answer.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        if not created:
            answer.headers["Idempotent-Replayed"] = "true"
        return answer

    @app.post(
        "/api/policies/train_policy/{agent_id:path}",
        response_model=None,
        responses={
            200: {
                "model": DryRunOut | TrainedOut,
                "description": "dry run: an estimate; ?wait=true: the trained policy",
            },
            202: {"model": JobOut, "description": "training job started"},
            409: {"model": ErrorOut},
            500: {"model": ErrorOut, "description": "?wait=true: the job failed"},
            **ERRORS,
        },
        tags=["training"],
    )
    def train_policy(
        agent_id: Annotated[str, Depends(agent_access)],
        body: TrainPolicyIn | None = None,
        wait: Annotated[
            bool | None, Query(description="answer when the job has ended (spec 002's synchronous shape)")
        ] = None,
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
        try:
            job_plan = plan_job(settings, body, feedback_counts(store, agent_id))
        except JobPlanError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, str(exc)) from exc
        model_config = job_plan.model_config()
        if body.dry_run:
            estimate = estimate_training_time(
                settings.tracking_uri,
                job_plan.config.model,
                job_plan.plan.algorithm,
                job_plan.max_steps,
                settings.training,
            )
            answer = DryRunOut(
                feedback_count=stats.count,
                estimated_steps=job_plan.max_steps,
                estimated_time_minutes=estimate.minutes,
                estimate_basis=estimate.basis,
                score_mean=stats.score_mean,
                score_std=stats.score_std,
                plan=job_plan.plan.describe(),
                model_config_=model_config,
            )
            return JSONResponse(answer.model_dump(mode="json", by_alias=True))
        running = store.active_job(agent_id)
        if running is not None:
            raise HTTPException(
                status.HTTP_409_CONFLICT, f"agent {agent_id!r} already has job {running.id} running"
            )
        job = store.create_job(agent_id, model_config, stats.count)
        export = settings.exports_dir / agent_id / job.id / "feedback.jsonl"
        count, _digest = export_feedback(store, agent_id, export)
        store.update_job(job.id, dataset_path=str(export), feedback_count=count)
        future = runner.submit(
            TrainingRequest(
                job_id=job.id,
                agent_id=agent_id,
                dataset_path=export,
                output_dir=settings.models_dir / agent_id / job.id,
                feedback_count=count,
                max_steps=job_plan.max_steps,
                learning_rate=job_plan.learning_rate,
                algorithm=job_plan.plan.algorithm,
                overrides=job_plan.overrides,
                model_config_=model_config,
                timing_tags=job_timing_tags(job_plan.config.model, job_plan.plan.algorithm),
            )
        )
        if wait if wait is not None else settings.training.wait_by_default:
            with suppress(FutureTimeout):
                future.result(timeout=settings.training.wait_timeout_s)
            finished = store.get_job(job.id)
            assert finished is not None  # created above; jobs are never deleted
            return _trained_out(finished)
        current = store.get_job(job.id)
        assert current is not None  # created above; jobs are never deleted
        accepted = _job_out(current)
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

    @app.post(
        "/api/policies/generate/{agent_id:path}",
        response_model=GenerateOut,
        responses={409: {"model": ErrorOut}, **ERRORS},
        tags=["serving"],
    )
    async def generate(body: GenerateIn, agent_id: Annotated[str, Depends(agent_access)]) -> GenerateOut:
        """A completion from the agent's champion, or its challenger for the share the split gives it."""
        share = await asyncio.to_thread(store.challenger_share, agent_id)
        hashed = hashed_user(agent_id, body.user_key) if body.user_key else None
        arm = assign_arm(hashed, share)
        versions = await asyncio.to_thread(aliases.versions, agent_id)
        if versions.get(CHAMPION) is None:
            raise HTTPException(
                status.HTTP_409_CONFLICT, f"agent {agent_id!r} has no champion policy to serve"
            )
        if arm == CHALLENGER and versions.get(CHALLENGER) in (None, versions[CHAMPION]):
            arm = CHAMPION  # no distinct challenger: everyone gets the champion
        version = versions[arm]
        assert version is not None  # the champion exists (checked above); a challenger is served only if set
        try:
            completion = await app.state.pool.generate(policy_model_name(agent_id), version, body.prompt)
        except PromptTooLong as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, f"prompt: {exc}") from exc
        except PolicyNotFound as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
        row = await asyncio.to_thread(
            store.add_generation, agent_id, version, arm, hashed, body.prompt, completion
        )
        return GenerateOut(completion=completion, policy_version=f"v{version}", arm=arm, run_id=row.id)

    def _traffic(agent_id: str) -> TrafficOut:
        split = store.traffic_split(agent_id)
        share = split.challenger_share if split is not None else 0.0
        versions = aliases.versions(agent_id)
        return TrafficOut(
            agent_id=agent_id,
            champion_share=1.0 - share,
            challenger_share=share,
            champion_version=f"v{versions[CHAMPION]}" if versions.get(CHAMPION) else None,
            challenger_version=f"v{versions[CHALLENGER]}" if versions.get(CHALLENGER) else None,
            updated_at=split.updated_at if split is not None else None,
        )

    @app.get(
        "/api/policies/traffic/{agent_id:path}", response_model=TrafficOut, responses=ERRORS, tags=["serving"]
    )
    def get_traffic(agent_id: Annotated[str, Depends(agent_access)]) -> TrafficOut:
        """How the agent's traffic is split between champion and challenger (default 100/0)."""
        return _traffic(agent_id)

    @app.put(
        "/api/policies/traffic/{agent_id:path}", response_model=TrafficOut, responses=ERRORS, tags=["serving"]
    )
    def set_traffic(body: TrafficIn, agent_id: Annotated[str, Depends(agent_access)]) -> TrafficOut:
        """Give the challenger a share of the agent's traffic (0 ends the experiment)."""
        store.set_challenger_share(agent_id, body.challenger_share)
        return _traffic(agent_id)

    @app.get(
        "/api/policies/{agent_id:path}", response_model=list[PolicyOut], responses=ERRORS, tags=["policies"]
    )
    def get_policies(agent_id: Annotated[str, Depends(agent_access)]) -> list[PolicyOut]:
        """The agent's trained policies from the model registry, newest first, with their live ratings."""
        online = {v: online_out(scores) for v, scores in store.online_scores(agent_id).items()}
        return list_policies(settings.tracking_uri, agent_id, online)

    return app
