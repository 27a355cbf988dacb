# Sluice: a Kafka wire-protocol proxy. Slim Python, runs as a non-root user, health-checked through /healthz.
#
#   docker build -t sluice .        (podman: podman build --format docker -t sluice .; the docker format keeps
#                                    the HEALTHCHECK; `make test-image` builds and runs it all with Podman)
#   docker run --rm -p 19092-19100:19092-19100 -p 9644:9644 \
#       -e SLUICE_UPSTREAM__BOOTSTRAP_SERVERS=kafka:9092 -e SLUICE_LISTEN__ADVERTISED_HOST=localhost sluice
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies first, in a layer that changes only with pyproject.toml (read with the standard library's
# tomllib), then the code: a code change rebuilds only the last, small install.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
# The package, with its wire specs (proxy/codecs/, package data): `sluice` runs the installed copy.
COPY README.md ./
COPY proxy ./proxy
COPY config ./config
RUN pip install . \
 && rm -rf build ./*.egg-info \
 && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin sluice

USER sluice
# In a container the listeners bind every interface; clients are told the advertised host (set it to the
# name clients resolve, e.g. the compose service name "sluice").
ENV SLUICE_LISTEN__HOST=0.0.0.0 \
    SLUICE_ADMIN__HOST=0.0.0.0

# 19092: bootstrap listener; 19093+N: broker node N; 9644: /metrics /healthz /readyz
EXPOSE 19092 19093 19094 19095 9644

# The check runs every 10 s for the container's whole life, so it is bash's /dev/tcp (a few ms of CPU), not a
# Python interpreter (~100 ms of CPU each time, and on a busy node slower to start than the timeout allows).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9644 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && read -r -t 2 status <&3 && [[ $status == 'HTTP/1.'?' 200 '* ]]"]

# Exec form: Sluice is PID 1 and receives SIGTERM directly (graceful drain, see [shutdown] in sluice.toml).
ENTRYPOINT ["sluice"]
CMD ["run", "--config", "/app/config/sluice.toml"]
