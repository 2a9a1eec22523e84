# kvgate: the gateway image. Build: docker build -t kvgate .
# Run, in front of an Ollama on the host (Linux needs the --add-host line; Docker Desktop has the name already):
#   docker run -p 127.0.0.1:11435:11435 -e KVGATE_SERVER__ADMIN_KEY=<long random key> \
#     -e KVGATE_BACKEND__URL=http://host.docker.internal:11434 --add-host=host.docker.internal:host-gateway kvgate
# (publish beyond 127.0.0.1 only with tenant API keys configured; README: Security). docker-compose.yml runs Ollama
# and kvgate together.
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
# In a container kvgate must listen on all interfaces: 127.0.0.1 there is the container's own loopback, unreachable
# from the host and from other containers. Who may connect is chosen where the port is published (127.0.0.1 in the
# examples); kvgate warns at start-up while it listens beyond loopback with no keys. Model management (pull,
# delete, ...) needs the admin key.
# The backend is config/docker.toml's, http://ollama:11434 (the "ollama" service of docker-compose.yml), or
# KVGATE_BACKEND__URL's; never 127.0.0.1, which here is this container. Unreachable, it is a WARNING at start-up
# naming the URL. Not set here: an image ENV applies to every config the image runs, and KVGATE_BACKEND__URL would
# replace the first backend of any of them (deploy/replicas/kvgate.toml's gpu-a, once).
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
CMD ["serve", "--config", "/etc/kvgate/docker.toml"]
