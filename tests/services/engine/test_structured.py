"""Structured output in the engine: JSON under a grammar, per sequence, in batches shared with free
text. Greedy constrained output is token-identical to a batch-of-one ``model.generate`` under
xgrammar's own Hugging Face logits processor; every constrained answer parses and validates."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import xgrammar as xgr

from bench.common import draw_image, image_input
from services.engine import GenerationRequest, RequestRejected, SamplingParams
from services.engine.api import StructuredOutput
from services.engine.grammar import ANY_OBJECT, SEPARATORS, reason_of
from tests.services.engine.reference import assert_greedy_match, reference, run_all, tokens_of, user

COLOURS = ["red", "green", "blue", "yellow", "orange", "purple", "pink", "cyan"]
COLOUR = {
    "type": "object",
    "properties": {"colour": {"enum": COLOURS}},
    "required": ["colour"],
    "additionalProperties": False,
}
SHAPE = {
    "type": "object",
    "properties": {
        "shape": {"type": "string", "maxLength": 10},
        "count": {"type": "integer", "minimum": 0, "maximum": 6},
        "tags": {"type": "array", "items": {"enum": ["big", "small"]}, "maxItems": 2},
    },
    "required": ["shape", "count", "tags"],
    "additionalProperties": False,
}


def structured(schema: dict[str, Any] | None) -> StructuredOutput:
    return StructuredOutput("json_schema", json.dumps(schema)) if schema else StructuredOutput("json_object")


def request(proc: Any, rid: str, i: int, schema: Any = None, free: bool = False, **kw: Any) -> Any:
    png = draw_image(i)
    sampling = SamplingParams(max_tokens=40, structured=None if free else structured(schema), **kw)
    msgs = [user(["What colour is the circle?", "How many shapes are there?", "Describe it."][i % 3])]
    return GenerationRequest(rid, msgs, [image_input(proc, png)], sampling), [png]


def hf_reference(model: Any, proc: Any, req: GenerationRequest, pngs: list[bytes]) -> Any:
    """``model.generate`` batch of one, masked by xgrammar's own logits processor."""
    vocab_size = model.config.text_config.vocab_size  # the logits' width, not the tokenizer's length
    info = xgr.TokenizerInfo.from_huggingface(proc.tokenizer, vocab_size=vocab_size, stop_token_ids=[0])
    spec = req.sampling.structured
    assert spec is not None
    schema = ANY_OBJECT if spec.kind == "json_object" else (spec.schema or "")
    grammar = xgr.GrammarCompiler(info).compile_json_schema(
        schema, any_whitespace=False, separators=SEPARATORS
    )
    processors = [xgr.contrib.hf.LogitsProcessor(grammar)]
    return reference(model, proc, req.messages, pngs, req.sampling.max_tokens, logits_processor=processors)


def assert_valid(text: str, schema: dict[str, Any] | None) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema or {"type": "object"})
    return value


def test_constrained_and_free_rows_share_a_batch(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled
    engine = make_engine(model, proc)
    reqs = [
        request(proc, "colour", 0, COLOUR),
        request(proc, "shape", 1, SHAPE),
        request(proc, "object", 2, None),
        request(proc, "free-1", 0, free=True),
        request(proc, "free-2", 1, free=True),
    ]
    out = run_all(engine, [r for r, _ in reqs])
    assert max(engine.stats().batch_sizes) >= 5
    for (req, pngs), schema in zip(reqs[:3], (COLOUR, SHAPE, None), strict=True):
        events = out[req.request_id]
        # the tiny model, never trained on JSON, can fill a free-form key past max_tokens
        if schema is not None or events[-1].finish_reason == "stop":
            assert events[-1].finish_reason == "stop"
            assert_valid("".join(e.text for e in events), schema)
        assert_greedy_match(tokens_of(events), hf_reference(model, proc, req, pngs), bundled_tie_tol)
    for req, pngs in reqs[3:]:  # free rows are untouched by their neighbours' grammars
        ref = reference(model, proc, req.messages, pngs, req.sampling.max_tokens)
        assert_greedy_match(tokens_of(out[req.request_id]), ref, bundled_tie_tol)


def test_batched_equals_alone_uncached(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    reqs = [request(proc, f"b{i}", i, [COLOUR, SHAPE, None][i % 3]) for i in range(6)]
    batched = run_all(engine, [r for r, _ in reqs])
    for req, _ in reqs:
        alone = GenerationRequest(
            f"{req.request_id}-alone", req.messages, req.images, req.sampling, use_cache=False
        )
        assert tokens_of(engine.generate_sync(alone)) == tokens_of(batched[req.request_id])


def test_sampled_constrained_output_validates_and_ignores_the_batch(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    reqs = [request(proc, f"s{i}", i, SHAPE, temperature=1.3, top_k=40, seed=i) for i in range(4)]
    batched = run_all(engine, [r for r, _ in reqs])
    for req, _ in reqs:
        events = batched[req.request_id]
        if events[-1].finish_reason == "stop":
            assert_valid("".join(e.text for e in events), SHAPE)
        alone = GenerationRequest(f"{req.request_id}-1", req.messages, req.images, req.sampling)
        assert tokens_of(engine.generate_sync(alone)) == tokens_of(events)


def test_no_special_token_nor_control_character_is_ever_allowed(bundled, make_engine):
    model, proc = bundled
    engine = make_engine(model, proc)
    grammars = engine.grammars.get()
    matcher = grammars.matcher(StructuredOutput("json_object"))
    for token in proc.tokenizer('{"a', add_special_tokens=False)["input_ids"]:  # inside a string
        assert matcher.accept_token(token)
    allowed = grammars.allowed([matcher], engine.arch.device)[0]
    assert allowed is not None and bool(allowed.any())
    for token in range(allowed.numel()):
        text = proc.tokenizer.decode([token])
        if token in proc.tokenizer.all_special_ids or any(ord(c) < 0x20 for c in text):
            assert not allowed[token], (token, text)


@pytest.mark.parametrize("schema", ['{"type": "nope"}', '{"$ref": "#/$defs/missing"}', ""])
def test_a_schema_that_does_not_compile_is_rejected(bundled, make_engine, schema):
    model, proc = bundled
    engine = make_engine(model, proc)
    req = GenerationRequest(
        "bad",
        [user("Hi", image=False)],
        [],
        SamplingParams(structured=StructuredOutput("json_schema", schema)),
    )
    with pytest.raises(RequestRejected, match="schema") as info:
        engine.submit(req, lambda _e: None)
    assert ".cc:" not in str(info.value) and "Check failed" not in str(info.value), info.value


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ('{"$ref": "#/$defs/missing"}', "Cannot find field '$defs' in #/$defs/missing"),
        ('{"type": "integer", "maximum": 1e20}', "Integer exceeds maximum limit"),
    ],
)
def test_the_reason_names_no_cpp_source(schema, reason):
    """xgrammar's message starts with its log time and C++ source, and may hold a failed check."""
    with pytest.raises(RuntimeError, match=r"\.cc:\d+: ") as info:
        xgr.Grammar.from_json_schema(schema)
    assert reason_of(info.value) == reason
