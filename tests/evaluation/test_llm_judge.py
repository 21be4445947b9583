"""OpenAIJudge against a real local HTTP server that speaks the chat-completions protocol."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from alignflow.evaluation.judges import Judge
from alignflow.evaluation.llm_judge import JudgeError, OpenAIJudge, parse_choice, render_prompt

GOOD = "3 plus 4 is 7. The answer is 7."
GOOD_TOO = "Adding gives 7. The answer is 7."
BAD = "I think it is 8."


def responses(body):
    """Responses A and B as the judge showed them to the server."""
    user = body["messages"][-1]["content"]
    return tuple(
        re.search(rf"\[Response {x}\]\n(.*?)\n\[End of Response {x}\]", user, re.DOTALL).group(1)
        for x in "AB"
    )


def prefers_the_answer(body):
    """A fair judge model: picks the response that states an answer."""
    a, b = (("The answer is" in r) for r in responses(body))
    return 200, "tie" if a == b else ("A" if a else "B")


class FakeServer:
    """Chat-completions endpoint whose reply is ``rule(body) -> (status, content)``; logs requests."""

    def __init__(self, rule):
        self.rule = rule
        self.requests = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, content = server.rule(body)
                payload = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": content}}]}
                    if status == 200
                    else {"error": "boom"}
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(rule):
        servers.append(FakeServer(rule))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(autouse=True)
def no_env_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def make_judge(server, **kwargs):
    return OpenAIJudge(server.base_url, "judge-model", retry_backoff=0.01, **kwargs)


@pytest.mark.parametrize("swap", [True, False])
def test_verdicts_follow_the_better_response(serve, swap):
    server = serve(prefers_the_answer)
    judge = make_judge(server, swap_positions=swap)
    verdicts = judge.compare(["What is 3 plus 4?"] * 3, [GOOD, BAD, GOOD], [BAD, GOOD, GOOD_TOO])
    assert verdicts == [1.0, 0.0, 0.5]
    assert len(server.requests) == (6 if swap else 3)
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "judge-model"
    assert request["body"]["temperature"] == 0
    assert isinstance(judge, Judge) and judge.name == "llm"


def test_swapping_cancels_a_position_biased_judge(serve):
    server = serve(lambda body: (200, "A"))
    verdicts = make_judge(server).compare(["p1", "p2"], [GOOD, BAD], [BAD, GOOD])
    assert verdicts == [0.5, 0.5]
    seen = {responses(r["body"]) for r in server.requests}
    assert seen == {(GOOD, BAD), (BAD, GOOD)}
    assert make_judge(server, swap_positions=False).compare(["p"], [BAD], [GOOD]) == [1.0]


def test_chat_prompts_are_shown_as_role_lines(serve):
    server = serve(prefers_the_answer)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 plus 4?"}]
    assert render_prompt(chat) == "system: Be brief.\nuser: What is 3 plus 4?"
    make_judge(server, swap_positions=False, system_prompt="Judge maths.").compare([chat], [GOOD], [BAD])
    messages = server.requests[0]["body"]["messages"]
    assert messages[0] == {"role": "system", "content": "Judge maths."}
    assert "system: Be brief.\nuser: What is 3 plus 4?" in messages[1]["content"]


def test_bearer_key_is_sent_only_when_there_is_one(serve, monkeypatch):
    server = serve(prefers_the_answer)
    make_judge(server, api_key="sk-test", swap_positions=False).compare(["p"], [GOOD], [BAD])
    make_judge(server, swap_positions=False).compare(["p"], [GOOD], [BAD])
    monkeypatch.setenv("JUDGE_KEY", "sk-env")
    make_judge(server, api_key_env="JUDGE_KEY", swap_positions=False).compare(["p"], [GOOD], [BAD])
    auth = [{k.lower(): v for k, v in r["headers"].items()}.get("authorization") for r in server.requests]
    assert auth == ["Bearer sk-test", None, "Bearer sk-env"]


def test_an_unreadable_reply_leaves_only_that_row_unjudged(serve):
    def rule(body):
        if "confusing" in body["messages"][-1]["content"]:
            return 200, "Both responses have merits and flaws."
        return prefers_the_answer(body)

    verdicts = make_judge(serve(rule)).compare(["p", "a confusing prompt", "p"], [GOOD, GOOD, BAD], [BAD] * 3)
    assert verdicts == [1.0, None, 0.5]


@pytest.mark.parametrize(
    ("reply", "choice"),
    [
        ("A", "A"),
        ("  b.\n", "B"),
        ("**Tie**", "tie"),
        ("Final verdict: B", "B"),
        ("<think>Response A looks longer, but</think>\nB", "B"),
        ("Neither response is good", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_choice(reply, choice):
    assert parse_choice(reply) == choice


def test_server_errors_are_retried(serve):
    calls = []

    def flaky(body):
        calls.append(1)
        return (500, "") if len(calls) <= 2 else prefers_the_answer(body)

    judge = make_judge(serve(flaky), swap_positions=False, max_retries=2)
    assert judge.compare(["p"], [GOOD], [BAD]) == [1.0]
    assert len(calls) == 3


def test_a_server_that_keeps_failing_raises(serve):
    server = serve(lambda body: (500, ""))
    judge = make_judge(server, max_retries=1, concurrency=1)
    with pytest.raises(JudgeError, match=r"127\.0\.0\.1.*/chat/completions.*HTTP 500"):
        judge.compare(["p"] * 3, [GOOD] * 3, [BAD] * 3)
    # 6 asks x 2 attempts if nothing stopped; the queued asks are cancelled after the first failure
    assert len(server.requests) < 12


def test_client_errors_are_not_retried(serve):
    server = serve(lambda body: (401, ""))
    with pytest.raises(JudgeError, match="HTTP 401"):
        make_judge(server, swap_positions=False).compare(["p"], [GOOD], [BAD])
    assert len(server.requests) == 1


def test_an_unreachable_server_raises(serve):
    server = serve(prefers_the_answer)
    server.close()
    with pytest.raises(JudgeError, match="failed after 2 attempts"):
        make_judge(server, max_retries=1, timeout=2).compare(["p"], [GOOD], [BAD])
