"""Image-only GLM-4V processor, registered so ``AutoProcessor.from_pretrained`` finds it by name.

Why: ``Glm4vProcessor`` always builds a video processor, which needs torchvision (not installed
here). The tiny model only takes images, so this subclass drops the video processor and keeps
everything else (image-token expansion, ``mm_token_type_ids``, chat template) from GLM-4V.

Importing ``services`` imports this module; checkpoints saved with this processor carry
``"processor_class": "VlmqGlm4vProcessor"`` and resolve to it.
"""

from typing import Any

from transformers import AutoProcessor, PretrainedConfig, ProcessorMixin
from transformers.models.glm4v.processing_glm4v import Glm4vProcessor


class VlmqGlm4vProcessor(Glm4vProcessor):
    """GLM-4V processor with an image processor and a tokenizer only (no video)."""

    def __init__(
        self,
        image_processor: Any = None,
        tokenizer: Any = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image|>"
        self.video_token = "<|video|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        # Skip Glm4vProcessor.__init__: it insists on a video processor.
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)
        self.video_start_id = tokenizer.convert_tokens_to_ids("<|begin_of_video|>")
        self.video_end_id = tokenizer.convert_tokens_to_ids("<|end_of_video|>")


class _VlmqProcessorKey(PretrainedConfig):
    """Registry key only: lets AutoProcessor look the processor up by class name without
    overriding the stock GLM-4V mapping (real GLM checkpoints keep ``Glm4vProcessor``)."""

    model_type = "vlmq_glm4v_processor_key"


def register() -> None:
    AutoProcessor.register(_VlmqProcessorKey, VlmqGlm4vProcessor, exist_ok=True)


register()
