"""Monitoring files generated from one definition (``python -m scripts.monitoring``; ``--check``):
the Grafana dashboard and the alert rules, for Kubernetes (``k8s/monitoring``) and compose
(``docker/monitoring``)."""
