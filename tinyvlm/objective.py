"""The training objective: answer-token loss plus a dense loss on the image tokens, computed with the
shared system prompt run once per batch.

Every row starts with the same ~115-token default system prompt. Its keys and values do not depend
on the rest of the row (causal attention), so the prompt runs once, batch 1, and its cache is
broadcast to all rows; gradients from every row flow back into that one pass. That removes about
40 % of the text tokens from each step and gives exactly the logits of the full forward
(``tests/tinyvlm`` checks it).
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, Glm4vForConditionalGeneration
from transformers.cache_utils import DynamicLayer

from tinyvlm import labels, pointers, referents
from tinyvlm.data import IGNORE


class TokenHeads(nn.Module):
    """Linear probes from the image tokens the language model reads to the per-token labels.

    Each attribute is scored only where the token shows something it names; what the token shows
    (nothing, an object, the glyph) is scored on every token, so glyph tokens share a direction the
    language model can look for."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.sizes = [labels.CLASSES[c] for c in labels.COLUMNS] + [labels.KINDS]
        self.hidden = hidden
        self.linear = nn.Linear(hidden, sum(self.sizes))

    def logits(self, features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One logits tensor per label column (in ``labels.COLUMNS`` order), then the kind."""
        # Normalised like the language model's own input norm, so the loss shapes the direction of
        # the features (what the model reads) and cannot be lowered by inflating their scale.
        normed = F.layer_norm(features, (self.hidden,))
        return torch.split(self.linear(normed), self.sizes, dim=-1)

    def loss(self, features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        *attributes, kind = self.logits(features)
        terms = []
        for column, logits in enumerate(attributes):
            present = targets[:, column] > 0
            if present.any():
                terms.append(F.cross_entropy(logits[present], targets[present, column]))
        terms.append(F.cross_entropy(kind, labels.kinds(targets)))
        return torch.stack(terms).mean()


@dataclass
class StepOutput:
    loss: torch.Tensor
    answer_loss: torch.Tensor
    question_loss: torch.Tensor
    token_loss: torch.Tensor
    referent_loss: torch.Tensor
    pointer_loss: torch.Tensor
    logits: torch.Tensor  # (B, L - prefix, V): the rows after the shared prefix
    labels: torch.Tensor  # (B, L - prefix)


def text_hidden_size(model: Glm4vForConditionalGeneration) -> int:
    text_config: Any = model.config.text_config
    return int(text_config.hidden_size)


def shared_prefix_len(input_ids: torch.Tensor, image_token_id: int) -> int:
    """Tokens every row starts with, up to the first image token (image tokens share an id, not an
    embedding); at least one token of each row stays outside the prefix."""
    same = (input_ids == input_ids[:1]).all(dim=0) & (input_ids != image_token_id).all(dim=0)
    differ = (~same).nonzero()
    return int(differ[0]) if len(differ) else input_ids.shape[1] - 1


def image_features(model: Glm4vForConditionalGeneration, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model.model.get_image_features(
        pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"]
    )
    feats = getattr(out, "pooler_output", out)
    return torch.cat(list(feats)) if isinstance(feats, list | tuple) else feats


def positions(model: Glm4vForConditionalGeneration, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    pos, _ = model.model.get_rope_index(
        batch["input_ids"],
        mm_token_type_ids=batch["mm_token_type_ids"],
        image_grid_thw=batch["image_grid_thw"],
        attention_mask=batch["attention_mask"],
    )
    return pos


@dataclass
class Forward:
    """What one forward pass gives the losses, for the row positions after the shared prefix."""

    logits: torch.Tensor  # (B, L - prefix, V)
    prefix: int
    hidden: torch.Tensor | None  # hidden states after ``hidden_layer`` text layers, if asked
    attentions: dict[int, torch.Tensor]  # text layer -> (B, heads, L - prefix, L) weights, if asked


def _record_attention(model: Glm4vForConditionalGeneration, layers: tuple[int, ...]) -> tuple[dict, list]:
    """Forward hooks that keep the attention weights of ``layers`` (eager attention only)."""
    kept: dict[int, torch.Tensor] = {}
    handles = []
    for index in layers:
        attention = model.model.language_model.layers[index].self_attn

        def keep(_module: Any, _inputs: Any, output: Any, index: int = index) -> None:
            assert output[1] is not None, "attention weights need the eager attention implementation"
            kept[index] = output[1]

        handles.append(attention.register_forward_hook(keep))
    return kept, handles


def forward_logits(
    model: Glm4vForConditionalGeneration,
    batch: dict[str, torch.Tensor],
    features: torch.Tensor,
    hidden_layer: int | None = None,
    attention_layers: tuple[int, ...] = (),
) -> Forward:
    """Logits for every row position after the shared prefix, and what else the losses ask for."""
    ids = batch["input_ids"]
    rows = ids.shape[0]
    prefix = shared_prefix_len(ids, model.config.image_token_id)
    embeds = model.get_input_embeddings()(ids)
    image_mask = (ids == model.config.image_token_id).unsqueeze(-1)
    embeds = embeds.masked_scatter(image_mask, features.to(embeds.dtype))
    pos = positions(model, batch)
    cache = DynamicCache(config=model.config)
    model(inputs_embeds=embeds[:1, :prefix], position_ids=pos[:, :1, :prefix], cache=cache, logits_to_keep=1)
    for layer in cache.layers:
        assert isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    attentions, handles = _record_attention(model, attention_layers)
    try:
        out = model(
            inputs_embeds=embeds[:, prefix:],
            position_ids=pos[:, :, prefix:],
            attention_mask=batch["attention_mask"],
            cache=cache,
            output_hidden_states=hidden_layer is not None,
        )
    finally:
        for handle in handles:
            handle.remove()
    hidden = None if hidden_layer is None else out.hidden_states[hidden_layer]
    return Forward(out.logits, prefix, hidden, attentions)


def pointer_loss(forward: Forward, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of each pointer head's attention over the image keys against its target."""
    rows, layers, heads = batch["pointer_batch_rows"], batch["pointer_layers"], batch["pointer_heads"]
    queries = batch["pointer_positions"] - forward.prefix
    keys = batch["image_keys"][rows]  # (P, G + 1) absolute positions
    total = torch.zeros(())
    for layer, weights in forward.attentions.items():
        mine = layers == layer
        attended = weights[rows[mine], heads[mine], queries[mine]]  # (p, L)
        on_keys = attended.gather(1, keys[mine])
        total = total - (batch["pointer_targets"][mine] * torch.log(on_keys + 1e-6)).sum()
    return total / max(1, len(rows))


def _next_token_loss(logits: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled positions."""
    flat = logits[:, :-1].reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat, gold[:, 1:].reshape(-1), ignore_index=IGNORE)


@dataclass(frozen=True)
class Weights:
    """How much each auxiliary loss adds to the answer loss."""

    token: float = 0.5  # the dense image-token labels (TokenHeads)
    question: float = 0.0  # next-token loss on the user's words
    referent: float = 0.0  # what each reference names (tinyvlm.referents), read after `referent_layer`
    referent_layer: int = 2
    pointer: float = 0.0  # where one head per layer looks (tinyvlm.pointers); needs eager attention


def step(
    model: Glm4vForConditionalGeneration,
    heads: TokenHeads,
    batch: dict[str, torch.Tensor],
    weights: Weights,
    features: torch.Tensor | None = None,
) -> StepOutput:
    """One step's losses; ``features`` stand in for the vision tower's (``tinyvlm.oracle``).
    ``heads.referents`` (a ``referents.ReferentHead``) is needed when ``weights.referent`` > 0."""
    features = image_features(model, batch) if features is None else features
    layer = weights.referent_layer if weights.referent else None
    attention_layers = (pointers.MENTION_LAYER, pointers.ANSWER_LAYER) if weights.pointer else ()
    forward = forward_logits(model, batch, features, layer, attention_layers)
    logits, prefix, hidden = forward.logits, forward.prefix, forward.hidden
    gold = batch["labels"][:, prefix:]
    answer_loss = _next_token_loss(logits, gold)
    question_loss = _next_token_loss(logits, batch["question_labels"][:, prefix:])
    token_loss = heads.loss(features, batch["token_labels"]) if weights.token else torch.zeros(())
    referent_loss = torch.zeros(())
    if hidden is not None:
        at = hidden[batch["ref_batch_rows"], batch["ref_positions"] - prefix]
        head = heads.get_submodule("referents")
        assert isinstance(head, referents.ReferentHead)
        referent_loss = head.loss(at, batch["ref_rows"])
    pointing = pointer_loss(forward, batch) if weights.pointer else torch.zeros(())
    loss = (
        answer_loss
        + weights.question * question_loss
        + weights.token * token_loss
        + weights.referent * referent_loss
        + weights.pointer * pointing
    )
    return StepOutput(loss, answer_loss, question_loss, token_loss, referent_loss, pointing, logits, gold)
