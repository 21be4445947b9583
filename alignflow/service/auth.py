"""Bearer-token authentication with optional per-agent scopes.

Tokens are compared through their SHA-256 (the database never holds a usable token). A
missing or unknown token is 401; a valid token that is not scoped to the requested
agent is 403.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

bearer_scheme = HTTPBearer(auto_error=False, description="An API token issued by the service operator")


@dataclass(frozen=True)
class Principal:
    name: str
    agents: frozenset[str] | None  # None: every agent

    def may_access(self, agent_id: str) -> bool:
        return self.agents is None or agent_id in self.agents


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def authenticate(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise _unauthorized("missing bearer token (send 'Authorization: Bearer <token>')")
    row = request.app.state.store.find_token(credentials.credentials)
    if row is None:
        raise _unauthorized("unknown bearer token")
    return Principal(row.name, frozenset(row.agents) if row.agents is not None else None)


def require_agent(principal: Principal, agent_id: str) -> None:
    if not principal.may_access(agent_id):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"this token is not allowed to act for agent {agent_id!r}"
        )
