"""The records that tell the gateway which worker holds a picture decoded follow the worker's cache:
written for a done job's pictures it holds, deleted for those it does not hold or evicted, never
when another worker wrote them since; per tenant unless tenants share cached results."""

from __future__ import annotations

from typing import Any

import torch

from services.inference_worker.image_inputs import ImageInputCache, Wire, wire_bytes
from services.inference_worker.input_owners import InputOwners
from shared.keys import Keys
from shared.schemas import ChatTurn, JobSpec


def image(digest: str) -> Wire:
    """A picture as a decode worker ships it (``digest`` only names it in the tests' dicts)."""
    return {"pixels": torch.zeros(3, 4, 4, dtype=torch.uint8)}


def spec(*digests: str, tenant: str | None = None, use_cache: bool = True) -> JobSpec:
    turn = ChatTurn(role="user", text="What is it?", image=True, images=list(digests))
    return JobSpec(
        job_id="j",
        created_at=0.0,
        messages=[turn],
        image_digest=digests[0],
        tenant=tenant,
        use_cache=use_cache,
    )


def owner(r: Any, keys: Keys, scope: str, digest: str) -> Any:
    return r.get(keys.image_input_owner(scope, digest))


def record(r: Any, owners: InputOwners, job: JobSpec) -> None:
    pipe = r.pipeline(transaction=True)
    owners.record(pipe, job)
    pipe.execute()


def test_records_follow_what_the_cache_holds(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    cache = ImageInputCache(max_bytes=2 * wire_bytes(image("x")))
    owners = InputOwners(keys, "w-1", cache, shared=False, ttl_s=60)
    cache.put_all({"a": image("a"), "b": image("b")})
    record(r, owners, spec("a", "b"))
    assert (
        r.get(keys.image_input_owner("", "a")) == b"w-1" and r.get(keys.image_input_owner("", "b")) == b"w-1"
    )
    assert 0 < r.ttl(keys.image_input_owner("", "a")) <= 60

    cache.put_all({"c": image("c")})  # evicts a: its record goes with the next done job's
    r.set(keys.image_input_owner("", "b"), "w-2")  # another worker has since decoded b itself
    cache.put_all({"b": image("b")})  # (and so does this one again: c and b held, a evicted)
    record(r, owners, spec("c"))
    assert not r.exists(keys.image_input_owner("", "a"))
    assert r.get(keys.image_input_owner("", "c")) == b"w-1"
    assert r.get(keys.image_input_owner("", "b")) == b"w-2"  # not this worker's record: kept

    r.set(keys.image_input_owner("", "z"), "w-1")  # a stale record of a picture no longer held
    record(r, owners, spec("c", "z"))  # a conversation showing it: the record goes
    assert not r.exists(keys.image_input_owner("", "z")) and r.get(keys.image_input_owner("", "c")) == b"w-1"


def test_a_tenants_pictures_are_recorded_for_that_tenant_unless_results_are_shared(
    redis_client: Any, keys: Keys
) -> None:
    r = redis_client
    cache = ImageInputCache(max_bytes=4 * wire_bytes(image("x")))
    cache.put_all({"a": image("a")})
    record(r, InputOwners(keys, "w-1", cache, shared=False, ttl_s=60), spec("a", tenant="acme"))
    assert r.get(keys.image_input_owner("acme", "a")) == b"w-1" and not r.exists(
        keys.image_input_owner("", "a")
    )
    record(r, InputOwners(keys, "w-1", cache, shared=True, ttl_s=60), spec("a", tenant="acme"))
    assert r.get(keys.image_input_owner("", "a")) == b"w-1"


def test_nothing_is_recorded_without_the_cache_or_for_uncached_jobs(redis_client: Any, keys: Keys) -> None:
    r = redis_client
    held = ImageInputCache(max_bytes=4 * wire_bytes(image("x")))
    held.put_all({"a": image("a")})
    record(r, InputOwners(keys, "w-1", held, shared=False, ttl_s=60), spec("a", use_cache=False))
    record(r, InputOwners(keys, "w-1", ImageInputCache(max_bytes=0), shared=False, ttl_s=60), spec("a"))
    assert not r.exists(keys.image_input_owner("", "a"))


def test_an_evicted_pictures_record_goes_even_when_the_first_multi_is_lost(
    redis_client: Any, keys: Keys
) -> None:
    """The writer builds a MULTI anew when a connection error lost it: the deletion is queued again
    until a MULTI with it went through (``written``), and not after."""
    r = redis_client
    cache = ImageInputCache(max_bytes=wire_bytes(image("x")))
    owners = InputOwners(keys, "w-1", cache, shared=False, ttl_s=60)
    cache.put_all({"a": image("a")})
    record(r, owners, spec("a"))
    owners.written()
    cache.put_all({"b": image("b")})  # evicts a
    owners.record(r.pipeline(transaction=True), spec("b"))  # built, never executed (connection lost)
    assert owner(r, keys, "", "a") == b"w-1"
    record(r, owners, spec("b"))  # the retry
    owners.written()
    assert owner(r, keys, "", "a") is None and owner(r, keys, "", "b") == b"w-1"
    r.set(keys.image_input_owner("", "a"), "w-1")  # (as if written again meanwhile)
    record(r, owners, spec("b"))
    assert owner(r, keys, "", "a") == b"w-1"  # its deletion went through once: not sent again


def test_a_job_handed_over_for_pictures_not_held_takes_their_records_with_it(
    redis_client: Any, keys: Keys
) -> None:
    r = redis_client
    cache = ImageInputCache(max_bytes=4 * wire_bytes(image("x")))
    owners = InputOwners(keys, "w-1", cache, shared=False, ttl_s=60)
    cache.put_all({"a": image("a")})
    r.mset({keys.image_input_owner("acme", "a"): "w-1", keys.image_input_owner("acme", "b"): "w-1"})
    r.set(keys.image_input_owner("acme", "c"), "w-2")
    pipe = r.pipeline(transaction=False)
    owners.forget_unheld(pipe, spec("a", "b", "c", tenant="acme"))  # a restarted worker holds only a
    pipe.execute()
    assert owner(r, keys, "acme", "a") == b"w-1" and owner(r, keys, "acme", "b") is None
    assert owner(r, keys, "acme", "c") == b"w-2"  # another worker's record stays
