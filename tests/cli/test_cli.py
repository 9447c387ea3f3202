"""``vlmq ask``, ``jobs``, ``status``, ``dead-letters``, ``bench`` against the real stack."""

from __future__ import annotations

import httpx

from shared.jobs import JobRecord
from tests.cli.conftest import EXAMPLES, vlmq
from tests.support.reference import Reference
from tests.support.stack import ServiceStack, wait_for


def spec_of(stack: ServiceStack, job_id: str) -> JobRecord:
    return JobRecord.from_hash(stack.redis.hgetall(stack.keys.job(job_id)))


def test_ask_streams_the_engines_answer_and_follows_up(
    service_stack: ServiceStack, reference: Reference
) -> None:
    image = EXAMPLES / "shapes.png"
    url = service_stack.base_url
    first = vlmq(url, "ask", "--json", "--no-cache", str(image), "What colour is the circle?")
    assert first.code == 0, first.err
    answer = first.json()
    assert answer["status"] == "done" and answer["usage"]["completion_tokens"] > 0
    assert answer["text"] == reference.answer(spec_of(service_stack, answer["id"]).spec, image.read_bytes())
    follow_up = vlmq(url, "ask", "--session", answer["session_id"], "And its size?")
    assert follow_up.code == 0, follow_up.err
    assert f"follow up: vlmq ask --session {answer['session_id']}" in follow_up.err
    job_id = follow_up.err.split("job ")[1].split(" ")[0]
    spec = spec_of(service_stack, job_id).spec
    assert [t.text for t in spec.messages] == ["What colour is the circle?", answer["text"], "And its size?"]
    assert follow_up.out == reference.answer(spec, image.read_bytes()) + "\n"


def test_ask_without_an_image_is_a_text_only_question(
    service_stack: ServiceStack, reference: Reference
) -> None:
    asked = vlmq(service_stack.base_url, "ask", "--json", "--no-cache", "What colour is the circle?")
    assert asked.code == 0, asked.err
    answer = asked.json()
    spec = spec_of(service_stack, answer["id"]).spec
    assert answer["status"] == "done" and spec.image_digests() == []
    assert answer["text"] == reference.answer(spec, None)


def test_ask_refusals_say_what_the_server_said(service_stack: ServiceStack) -> None:
    url = service_stack.base_url
    not_image = vlmq(url, "ask", str(EXAMPLES.parent / "README.md"), "What is it?")
    assert not_image.code == 1 and "415" in not_image.err and "accepted: JPEG, PNG, WebP" in not_image.err
    too_many = vlmq(url, "ask", str(EXAMPLES / "shapes.png"), "x", "--max-tokens", "4", "--min-tokens", "5")
    assert too_many.code == 1 and "min_tokens: at most max_tokens (4)" in too_many.err
    missing = vlmq(url, "ask", "/nonexistent.png", "x")
    assert missing.code == 2 and "no such file" in missing.err


def test_jobs_show_and_cancel_a_long_answer(service_stack: ServiceStack) -> None:
    files = {"image": ("s.png", (EXAMPLES / "shapes.png").read_bytes(), "image/png")}
    form = {"prompt": "What colour is the circle?", "max_tokens": "500", "ignore_eos": "true"}
    job = httpx.post(f"{service_stack.base_url}/v1/jobs", data=form, files=files).json()
    cancel = vlmq(service_stack.base_url, "jobs", "cancel", job["id"])
    assert cancel.code == 0 and job["id"] in cancel.out, cancel.err

    def shown() -> dict | None:  # type: ignore[type-arg]
        view = vlmq(service_stack.base_url, "jobs", "show", job["id"], "--json").json()
        return view if view["status"] == "cancelled" else None

    view = wait_for(shown, timeout_s=60, interval_s=0.5, what="the job cancelled")
    assert view["usage"]["completion_tokens"] < 500
    plain = vlmq(service_stack.base_url, "jobs", "show", job["id"])
    assert "status   cancelled" in plain.out and "generation" in plain.out


def test_status_names_the_worker_and_its_caches(service_stack: ServiceStack) -> None:
    vlmq(service_stack.base_url, "ask", str(EXAMPLES / "count.png"), "How many stars are there?")
    status = vlmq(service_stack.base_url, "status")
    assert status.code == 0, status.err
    assert f"inference-{service_stack.key_prefix}  healthy" in status.out
    for words in ("decode (decode tasks)", "inference backlog", "prefix", "session", "recent latency: last"):
        assert words in status.out
    assert vlmq(service_stack.base_url, "status", "--json").json()["workers"][0]["healthy"]


def test_dead_letters_list_and_retry(service_stack: ServiceStack) -> None:
    listed = vlmq(service_stack.base_url, "dead-letters", "list", "--json")
    assert listed.code == 0 and isinstance(listed.json(), list)
    unknown = vlmq(service_stack.base_url, "dead-letters", "retry", "0" * 32)
    assert unknown.code == 1 and "404" in unknown.err and "not found" in unknown.err


def test_bench_runs_the_gallery_and_reports(service_stack: ServiceStack) -> None:
    report = vlmq(service_stack.base_url, "bench", "--jobs", "12", "--concurrency", "3", "--json")
    assert report.code == 0, report.err
    figures = report.json()
    assert figures["outcomes"] == {"done": 12} and figures["jobs_per_s"] > 0
    assert figures["latency"]["total_s"]["p95"] >= figures["latency"]["total_s"]["p50"] > 0
    table = vlmq(service_stack.base_url, "bench", "--jobs", "4", "--concurrency", "2")
    assert table.code == 0 and "TTFT" in table.out and "4 (4 done)" in table.out
    assert "4/4" in table.err  # the progress bar


def test_key_from_the_environment_or_the_flag(stack_factory) -> None:  # type: ignore[no-untyped-def]
    stack = stack_factory(components=("gateway",), extra_env={"VLMQ_API_KEYS": "cli-test-key"})
    refused = vlmq(stack.base_url, "status")
    assert refused.code == 1 and "401 missing API key" in refused.err and "VLMQ_API_KEY" in refused.err
    wrong = vlmq(stack.base_url, "status", key="nope")
    assert wrong.code == 1 and "invalid API key" in wrong.err
    assert vlmq(stack.base_url, "status", key="cli-test-key").code == 0
    assert vlmq(stack.base_url, "status", "--key", "cli-test-key").code == 0
    assert vlmq("http://127.0.0.1:9", "--url", stack.base_url, "--key", "cli-test-key", "status").code == 0
    unreachable = vlmq("http://127.0.0.1:9", "status")
    assert unreachable.code == 1 and "cannot reach" in unreachable.err
