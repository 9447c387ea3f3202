"""vlmq-tiny: procedural visual-QA data, tokenizer, training and evaluation of the bundled model."""

import os

# OpenMP threads that spin while waiting crawl when other processes share the cores (a step
# measured 8x slower); passive waiting keeps training and eval fast on a busy machine. Only
# effective when set before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
