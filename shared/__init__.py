"""What several vlmq processes must agree on: settings, message schemas, Redis keys, tensor codec."""
