"""The model side both workers share: loading, quantization, processor registration, image processor."""
