"""The ``requests`` that spec 002's HTTP snippets use, pointed at a test's real server.

The snippets call ``requests.post("http://localhost:8000/...")`` with no credentials. This
stand-in sends every call over real HTTP (with httpx, a dependency of the project, whose
responses answer ``.status_code`` and ``.json()`` as requests' do) after swapping the
spec's address for the test server's and adding the test's bearer token, so the snippets
run as written but for their import line.
"""

from __future__ import annotations

from typing import Any

import httpx

SPEC_ADDRESS = "http://localhost:8000"


class SpecRequests:
    def __init__(self) -> None:
        self.base_url = SPEC_ADDRESS
        self.token: str | None = None

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        if not url.startswith(SPEC_ADDRESS):
            raise ValueError(f"{url}: the spec's snippets talk to {SPEC_ADDRESS}")
        headers = dict(kwargs.pop("headers", None) or {})
        if self.token:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        target = self.base_url + url[len(SPEC_ADDRESS) :]
        return httpx.request(method, target, headers=headers, timeout=None, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._call("POST", url, **kwargs)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._call("GET", url, **kwargs)


requests = SpecRequests()
