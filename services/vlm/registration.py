"""Image-only GLM-4V processor classes, registered so ``AutoProcessor`` / ``AutoImageProcessor``
find them by the names a checkpoint's config gives.

Why: ``Glm4vProcessor`` always builds a video processor, which needs torchvision (not installed
here). The tiny model only takes images, so ``VlmqGlm4vProcessor`` drops the video processor and
keeps everything else (image-token expansion, ``mm_token_type_ids``, chat template) from GLM-4V.
``VlmqGlm4vImageProcessor`` is GLM-4V's image processor with one option more: ``square_side``
resizes every picture to one fixed square (as CLIP-style processors do), so every picture gives
the same token grid; unset, it resizes like GLM-4V (aspect ratio kept).

Importing ``services`` imports this module; checkpoints saved with these classes carry
``"processor_class": "VlmqGlm4vProcessor"`` / ``"image_processor_type": "VlmqGlm4vImageProcessor"``
and resolve to them. Real GLM checkpoints keep their stock classes.
"""

from typing import Any

from transformers import AutoImageProcessor, AutoProcessor, PretrainedConfig, ProcessorMixin
from transformers.image_processing_utils import SizeDict
from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil
from transformers.models.glm4v.processing_glm4v import Glm4vProcessor


class VlmqGlm4vImageProcessor(Glm4vImageProcessorPil):
    """GLM-4V's image processor; with ``square_side`` every picture is resized to that square."""

    square_side: int | None = None

    def __init__(self, square_side: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.square_side = square_side

    # GLM-4V's own resize signature (its parent's differs), kept so its callers work unchanged.
    def resize(  # type: ignore[override]
        self, image: Any, size: SizeDict, resample: Any, factor: int, temporal_factor: int, **kwargs: Any
    ) -> Any:
        side = self.square_side
        if side is None:
            return super().resize(image, size, resample, factor, temporal_factor, **kwargs)
        if side % factor:
            raise ValueError(f"square_side {side} is not a multiple of patch_size * merge_size ({factor})")
        square = SizeDict(height=side, width=side)
        return super(Glm4vImageProcessorPil, self).resize(image=image, size=square, resample=resample)


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


class _VlmqImageProcessorKey(PretrainedConfig):
    """The same, for AutoImageProcessor."""

    model_type = "vlmq_glm4v_image_processor_key"


def register() -> None:
    AutoProcessor.register(_VlmqProcessorKey, VlmqGlm4vProcessor, exist_ok=True)
    AutoImageProcessor.register(
        _VlmqImageProcessorKey, image_processor_classes={"pil": VlmqGlm4vImageProcessor}, exist_ok=True
    )


register()
