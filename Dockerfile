# kvgate: the gateway image. Build: docker build -t kvgate .
# Run: docker run -p 127.0.0.1:11435:11435 -e KVGATE_SERVER__ADMIN_KEY=<long random key> kvgate
# (publish beyond 127.0.0.1 only with tenant API keys configured; README: Security)
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/kvgate
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY kvsim ./kvsim
RUN pip install . \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin kvgate \
    && mkdir -p /var/cache/kvgate \
    && chown kvgate /var/cache/kvgate
COPY config /etc/kvgate

USER kvgate
# In a container kvgate must listen on all interfaces; the port is published by the runtime (kvgate warns at start-up
# while it has no keys). Model management (pull, delete, ...) needs the admin key.
ENV KVGATE_SERVER__HOST=0.0.0.0 \
    KVGATE_SERVER__ADMIN_ONLY_MANAGEMENT=true \
    KVGATE_SERVER__PORT=11435 \
    KVGATE_COUNTING__CACHE_DIR=/var/cache/kvgate/tokenizers
# Tokenizers converted from each model's GGUF vocabulary are kept here (one per model digest).
VOLUME /var/cache/kvgate
EXPOSE 11435

HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('KVGATE_SERVER__PORT', '11435') + '/kvgate/health', timeout=2)"

ENTRYPOINT ["kvgate"]
CMD ["serve", "--config", "/etc/kvgate/kvgate.toml"]
