"""vlmq model-side code: the inference engine and model loading.

Importing this package registers the processor classes the bundled model needs with
``transformers.AutoProcessor`` (see ``services.vlm.registration``).
"""

from services.vlm import registration as _registration  # noqa: F401  (registers the processor)
